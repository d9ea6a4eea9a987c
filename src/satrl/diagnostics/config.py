"""The ``diagnostics:`` section of the run config (the collapse rules' ``collapse:`` section is
:class:`satrl.diagnostics.collapse.CollapseConfig`)."""

from __future__ import annotations

from pydantic import Field

from satrl.config_base import Section


class DiagnosticsConfig(Section):
    decompose: bool = Field(True, description="Split d into policy lag and implementation mismatch (extra forward).")
