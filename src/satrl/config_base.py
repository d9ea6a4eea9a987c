"""Moved to :mod:`satrl.config.base` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.config.base as _new
from satrl.moved import alias

alias(__name__, _new)
