"""One version's weights as the trainer side keeps them (the snapshot store, a transport's mirror), in the form its
source made them: the trainer's bucket stream (``WeightExport.buckets``, in the engine's dtype), or a full state
dict (the trainer's fp32 copy, ``WeightExport.weights``, or one read from a checkpoint).

Each reader takes the form it uses, and nothing converts on the way: a broadcast sends the kept buckets as they are
(:meth:`Snapshot.stream`), and only a reader of a full state dict (``inproc``, the Δπ/Δimpl split, a checkpoint)
has them unpacked, once (:meth:`Snapshot.state`: views into the buckets, no copy).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import cached_property

import torch

from satrl.weights.buckets import Bucket, state_aliases, state_buckets, unpack


@dataclass(frozen=True, eq=False)
class Snapshot:
    """``full``: a state dict; or ``packed``: buckets cut as ``cut`` says (their dtype and bucket size), with
    ``tied``, the aliases the stream leaves out (:func:`~satrl.weights.buckets.aliases`). Build one with
    :meth:`of_state` or :meth:`of_buckets`; treat it as read-only."""

    full: dict[str, torch.Tensor] | None = None
    packed: tuple[Bucket, ...] = ()
    tied: dict[str, str] = field(default_factory=dict)
    cut: tuple[torch.dtype | None, int] | None = None

    @classmethod
    def of_state(cls, state: dict[str, torch.Tensor]) -> Snapshot:
        return cls(full=state)

    @classmethod
    def of_buckets(cls, stream: Iterable[Bucket], tied: dict[str, str], dtype: torch.dtype | None,
                   bucket_bytes: int) -> Snapshot:  # fmt: skip
        """The buckets of ``stream``, read to its end now (``WeightExport.buckets`` must be, before the next
        step), cut in ``dtype`` at ``bucket_bytes``."""
        return cls(packed=tuple(stream), tied=dict(tied), cut=(dtype, bucket_bytes))

    def state(self) -> dict[str, torch.Tensor]:
        """The full state dict, tied names sharing a tensor (a packed snapshot unpacks once, then returns the same
        dict)."""
        return self.full if self.full is not None else self._unpacked

    @cached_property
    def _unpacked(self) -> dict[str, torch.Tensor]:
        return unpack(self.packed, self.tied)

    def stream(self, dtype: torch.dtype | None, bucket_bytes: int) -> tuple[Iterable[Bucket], dict[str, str]]:
        """What a broadcast in ``dtype`` at ``bucket_bytes`` sends: ``(buckets, aliases)``. The kept buckets
        themselves where they were cut so; otherwise cut from the state dict
        (:func:`~satrl.weights.buckets.state_buckets`: an fp32 copy is cast one bucket at a time)."""
        if self.full is None and self.cut == (dtype, bucket_bytes):
            return self.packed, self.tied
        state = self.state()
        return state_buckets(state, dtype, bucket_bytes), state_aliases(state)
