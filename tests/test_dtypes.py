"""The one dtype table (satrl.dtypes): names round-trip, and a header cannot name anything else of torch."""

import pytest
import torch

from satrl.dtypes import CONFIG_DTYPES, WIRE, dtype_name, named_dtype


def test_wire_names_round_trip_and_match_torch():
    assert dtype_name(torch.bfloat16) == "bfloat16"
    for dtype in WIRE:
        assert named_dtype(dtype_name(dtype)) is dtype


@pytest.mark.parametrize("name", ["nn", "load", "complex64", "torch.float32", ""])
def test_a_name_outside_the_wire_table_is_refused(name):
    with pytest.raises(ValueError, match="unknown dtype"):
        named_dtype(name)


def test_wire_codes_are_append_only():
    """The data-parallel channel sends a dtype's index: the first eight keep their codes."""
    assert WIRE[:8] == (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16,
                        torch.float16, torch.uint8)  # fmt: skip
    assert CONFIG_DTYPES == {"fp32": torch.float32, "bf16": torch.bfloat16}
