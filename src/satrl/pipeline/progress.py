"""Moved to :mod:`satrl.loop.progress` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.loop.progress as _new
from satrl.moved import alias

alias(__name__, _new)
