"""The gate-capacity rule both plug-ins warn with (``satrl.integrations._gate``); needs no framework."""

import pytest

from satrl.integrations._gate import gate_capacity


@pytest.mark.parametrize("n,shortest,alpha,per_sequence,expected", [
    (48, 12, 0.9, True, 4),      # 4 x 12 tokens: budget 48 - 44 = 4 < 12
    (120, 12, 0.9, True, None),  # 10 x 12: budget 12 = one sequence
    (9, 1, 0.9, False, 0),       # tokens: budget 9 - ceil(8.1) = 0
    (10, 1, 0.9, False, None),   # budget 10 - 9 = 1 token
    (10, 1, 0.7, False, None),   # exact rank: ceil(0.7 * 10) = 7, not 8
    (48, 12, 1.0, True, None),   # gate off on purpose: no warning
    (0, 0, 0.9, True, None),     # empty call
])
def test_gate_capacity(n, shortest, alpha, per_sequence, expected):
    assert gate_capacity(n, shortest, alpha, per_sequence) == expected
