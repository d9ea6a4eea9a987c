"""Moved: ``satrl.pipeline.engines_host.worker`` (issue 61). This old path is that module itself."""

import sys

from satrl.pipeline.engines_host import worker as _new

sys.modules[__name__] = _new
