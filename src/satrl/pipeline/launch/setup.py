"""Moved to :mod:`satrl.launch.setup` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.launch.setup as _new
from satrl.moved import alias

alias(__name__, _new)
