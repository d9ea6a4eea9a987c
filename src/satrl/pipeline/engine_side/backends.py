"""Moved: ``satrl.pipeline.engines_host.backends`` (issue 61). This old path is that module itself."""

import sys

from satrl.pipeline.engines_host import backends as _new

sys.modules[__name__] = _new
