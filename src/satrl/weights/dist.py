"""Moved: the wire (``send``, ``receive``) lives in :mod:`satrl.weights.link` beside the link it runs on (issue
61). This old path is that module itself, and warns once per process."""

import sys

from satrl.moved import moved
from satrl.weights import link as _new

moved("satrl.weights.dist", "satrl.weights.link")
sys.modules[__name__] = _new
