"""One version's weights as the trainer side keeps them (:class:`SnapshotStore`, the store of those that pending
batches need, beside them here; a transport's mirror), in the form its
source made them: the trainer's bucket stream (``WeightExport.buckets``, in the engine's dtype), or a full state
dict (the trainer's fp32 copy, ``WeightExport.weights``, or one read from a checkpoint).

Each reader takes the form it uses, and nothing converts on the way: a broadcast sends the kept buckets as they are
(:meth:`Snapshot.stream`), and only a reader of a full state dict (``inproc``, the Δπ/Δimpl split, a checkpoint)
has them unpacked, once (:meth:`Snapshot.state`: views into the buckets, no copy).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
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


class SnapshotStore:
    """Weights by version, kept while some batch not yet finished training needs them, each as its source made it
    (a :class:`Snapshot`: the trainer's buckets or a full state dict).

    ``needed(b)`` gives the versions batch ``b`` is generated with; the store keeps a version while any batch
    from the one in training up to ``horizon`` batches ahead needs it. ``source()`` makes the current version's
    snapshot (the trainer's ``WeightExport.snapshot``, whose form the run set once); the store calls it only for a
    version it keeps.
    """

    def __init__(self, needed: Callable[[int], set[int]], horizon: int, source: Callable[[], Snapshot]) -> None:
        self.needed, self.horizon, self.source = needed, horizon, source
        self.states: dict[int, Snapshot] = {}

    def wanted(self, b_training: int) -> set[int]:
        return set().union(*(self.needed(b) for b in range(b_training, b_training + self.horizon + 1)))

    def wants(self, version: int, b_training: int) -> bool:
        """Whether the store reads the weights of ``version`` now (:meth:`update`, ``Rollouts.restore``): a
        pending batch needs them and they are not kept yet. Data parallel gathers them only then."""
        return version in self.wanted(b_training) and version not in self.states

    def update(self, version: int, b_training: int) -> None:
        """Store the weights of ``version`` (just trained: the source's current one) if a pending batch needs
        them; forget versions no one needs any more."""
        if self.wants(version, b_training):
            self.states[version] = self.source()
        wanted = self.wanted(b_training)
        self.states = {v: s for v, s in self.states.items() if v in wanted}

    def get(self, version: int) -> Snapshot | None:
        return self.states.get(version)

    def state(self, version: int) -> dict[str, torch.Tensor] | None:
        """The full state dict of ``version`` (the Δπ/Δimpl split's forward), None if it is not kept."""
        kept = self.states.get(version)
        return None if kept is None else kept.state()

    def saved(self) -> dict[int, dict[str, torch.Tensor]]:
        """What a checkpoint saves of the kept versions: their state dicts, as they are."""
        return {v: s.state() for v, s in self.states.items()}
