"""Moved to :mod:`satrl.rundir.resume_check` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.rundir.resume_check as _new
from satrl.moved import alias

alias(__name__, _new)
