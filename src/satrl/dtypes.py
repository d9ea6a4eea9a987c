"""The one table of dtypes satrl names: how a dtype is spelled on a wire or in a header, and in the config.

A dtype crosses a process boundary by name (the weight wire's JSON headers, ``satrl.weights.link``; rank 0's
broadcasts to the other data-parallel ranks, ``satrl.training.dp.broadcast_tensors``, by its index in
:data:`WIRE`) and reaches vLLM by name; the config spells the trainer's compute dtype ``fp32`` / ``bf16``.
Imports nothing of satrl.
"""

from __future__ import annotations

import torch

# Every dtype that may cross a wire. Data parallel's broadcasts send the index: append, never reorder.
WIRE: tuple[torch.dtype, ...] = (torch.float32, torch.float64, torch.int64, torch.int32, torch.bool, torch.bfloat16,
                                 torch.float16, torch.uint8)  # fmt: skip
# ``train.dtype``: the config's spelling of the trainer's compute dtype.
CONFIG_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16}


def set_tf32(enabled: bool) -> None:
    """``train.tf32``: fp32 matmuls (and cuDNN convolutions) on CUDA's TF32 tensor cores (10-bit mantissa inputs),
    or not. These are process-wide switches, so a program sets them once where it starts (``satrl train`` and each
    data-parallel rank), never a trainer (two trainers in one process would fight over them). No effect on CPU."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.bfloat16`` -> ``"bfloat16"``: torch's own name, as headers and vLLM spell it."""
    return str(dtype).removeprefix("torch.")


def named_dtype(name: str) -> torch.dtype:
    """The wire dtype called ``name`` (:func:`dtype_name`'s inverse); ValueError for any other name, so a header
    cannot make the receiver build an arbitrary attribute of ``torch``."""
    for dtype in WIRE:
        if dtype_name(dtype) == name:
            return dtype
    raise ValueError(f"unknown dtype {name!r} on the wire; expected one of {[dtype_name(d) for d in WIRE]}")
