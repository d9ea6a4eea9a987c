"""The loop's leaves (floor 4): the one-line errors (:mod:`.errors`), the lag schedules and ``lag:`` section
(:mod:`.schedules`), what a backend reads of the run config (:mod:`.backend_config`), samples collated into batches
(:mod:`.buffer`) and the evaluator (:mod:`.evaluator`); and, a floor up, the engines host (:mod:`.engines_host`),
which imports of them only the errors, the schedules and the backend's config.

The run config, the run directory, the launch wiring and the loop have folders of their own (:mod:`satrl.config`,
:mod:`satrl.rundir`, :mod:`satrl.launch`, :mod:`satrl.loop`; issue 61); their old paths here are aliases that warn
once (:mod:`satrl.moved`)."""

# Every old name is under this package, so the finder is installed here rather than by `import satrl`: the
# command line's first imports (before `satrl.__main__` installs its Ctrl-C handler) stay free of it.
from satrl import moved as _moved  # noqa: E402

_moved.install()
