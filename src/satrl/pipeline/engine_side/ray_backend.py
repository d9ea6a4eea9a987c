"""Moved: ``satrl.pipeline.engines_host.ray_backend`` (issue 61). This old path is that module itself."""

import sys

from satrl.pipeline.engines_host import ray_backend as _new

sys.modules[__name__] = _new
