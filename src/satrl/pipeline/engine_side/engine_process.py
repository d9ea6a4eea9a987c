"""Moved: ``satrl.pipeline.engines_host.engine_process`` (issue 61). This old path is that module itself."""

import sys

from satrl.pipeline.engines_host import engine_process as _new

sys.modules[__name__] = _new
