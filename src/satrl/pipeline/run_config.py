"""Moved to :mod:`satrl.config.run` (issue 61); this old path names it and warns once (:mod:`satrl.moved`)."""

import satrl.config.run as _new
from satrl.moved import alias

alias(__name__, _new)
