"""The programs behind ``satrl COMMAND``, one module per command, above every library layer.

Each module defines ``add_<cmd>_args(parser)`` and ``run_<cmd>(args) -> int`` (:mod:`satrl.cli` wires them, importing
only the module of the command being run): ``train``, ``eval``, ``export``, ``pretrain``, ``grid``, ``report`` and
``demo``; ``runs`` reads a run's checkpoints for ``eval`` and ``export``. A program turns flags into library calls,
and library errors into one line and an exit code; what it drives stays in the layers below (the loop in
:mod:`satrl.pipeline`, pretraining in :mod:`satrl.training.pretrain`, the grid runner and the report builder in
:mod:`satrl.experiments`), which never import a program (docs/design.md, "Layers and the rules between them").
"""
