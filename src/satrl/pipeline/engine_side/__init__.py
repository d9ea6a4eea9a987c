"""Moved: the engines host is ``satrl.pipeline.engines_host`` (issue 61). This alias package warns once per
process (``DeprecationWarning``); each of its modules is the new module itself (``satrl.moved``)."""

from satrl.moved import moved

moved("satrl.pipeline.engine_side", "satrl.pipeline.engines_host")
