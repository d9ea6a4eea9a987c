"""Test-suite root. Its presence puts tests/ on sys.path (pytest's default import mode), so every test
folder can import the shared helpers in tests/run_helpers.py."""

import pytest


@pytest.fixture
def trained_ids(monkeypatch):
    """Ids of every sample the trainer steps on, in order."""
    from satrl.training import trainer as trainer_mod

    seen: list[str] = []
    original = trainer_mod.Trainer.step

    def spy(self, mb, *args, **kwargs):
        seen.extend(mb.sample_ids)
        return original(self, mb, *args, **kwargs)

    monkeypatch.setattr(trainer_mod.Trainer, "step", spy)
    return seen
