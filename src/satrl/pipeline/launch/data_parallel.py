"""Moved to :mod:`satrl.launch.data_parallel` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.launch.data_parallel as _new
from satrl.moved import alias

alias(__name__, _new)
