"""Moved to :mod:`satrl.rundir.files` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.rundir.files as _new
from satrl.moved import alias

alias(__name__, _new)
