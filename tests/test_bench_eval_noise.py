"""benchmarks/eval_noise.py: the noise-versus-cost curve from per-problem scores, worked by hand."""

from __future__ import annotations

import math

import pytest
from benchmarks.eval_noise import curve, table


def _record() -> dict:
    # k = 2, two sampling seeds, four problems; p_i (pooled over seeds) = 1, 0.25, 0, 0.5
    return {"task": "arithmetic", "model": "m", "k": 2, "problems": 4, "run": None,
            "seeds": [{"seed": 1000, "seconds": 4.0, "per_problem": [1.0, 0.5, 0.0, 0.5], "greedy": [1, 0, 0, 1]},
                      {"seed": 1001, "seconds": 8.0, "per_problem": [1.0, 0.0, 0.0, 0.5], "greedy": [1, 0, 0, 1]}]}  # fmt: skip


def test_curve_matches_the_hand_worked_values():
    (row,) = curve(_record(), [2])
    # mean p(1-p) = (0 + 0.1875 + 0 + 0.25) / 4 = 0.109375; over k n = 4 samples: sqrt(0.02734375)
    assert row["sd_sampling"] == pytest.approx(100 * math.sqrt(0.109375 / 4))
    # the two blocks of 2 problems: seed means 0.75 vs 0.5 and 0.25 vs 0.25; sqrt(mean(d^2) / 2) = sqrt(0.03125 / 2)
    assert row["sd_sampling_seen"] == pytest.approx(12.5)
    # population variance of p: 0.546875 / 4 = 0.13671875, over n = 2 problems
    assert row["sd_problems"] == pytest.approx(100 * math.sqrt(0.13671875 / 2))
    assert row["seconds"] == pytest.approx(3.0)  # median 6 s for 4 problems: 1.5 s a problem


def test_noise_falls_as_one_over_root_n_and_a_size_past_the_record_has_no_seen_value():
    small, large = curve(_record(), [1, 8])
    assert small["sd_sampling"] / large["sd_sampling"] == pytest.approx(math.sqrt(8))
    assert large["sd_sampling_seen"] is None and small["sd_sampling_seen"] is not None
    assert "| 8 |" in table(_record(), [small, large])


def test_the_committed_tables_are_their_records():
    """docs/benchmarks.md's "Evaluation noise" tables are what curve() and table() make of the committed records."""
    import json
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    doc = (root / "docs" / "benchmarks.md").read_text()
    names = re.findall(r"<!-- eval-noise: (\S+) -->", doc)
    assert sorted(names) == ["arithmetic_grpo32_step600", "countdown_base"]
    for name in names:
        record = json.loads((root / "docs" / "results" / "eval_noise" / f"{name}.json").read_text())
        sizes = [int(s) for s in re.search(r"--sizes (\S+)", doc.split(f"<!-- eval-noise: {name} -->")[1]).group(1).split(",")]
        rows = table(record, curve(record, sizes)).split("\n", 2)[2]  # the markdown table, its header line on
        assert rows in doc, name
