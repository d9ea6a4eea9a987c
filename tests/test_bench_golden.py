"""benchmarks.golden's digest: the same tensors give the same digest whatever the shard files' metadata order;
one changed bit, a changed metric or a tensor at other offsets changes it; timings do not."""

import json

import torch
from benchmarks.golden import digest
from safetensors.torch import save_file


def _run(root, metadata: dict, weight: torch.Tensor, loss: float = 1.0, wall: float = 3.0):
    (root / "shards").mkdir(parents=True)
    (root / "metrics.jsonl").write_text(json.dumps({"step": 1, "loss": loss, "wall_s": wall}) + "\n")
    (root / "eval.jsonl").write_text(json.dumps({"step": 1, "avg_at_k": 0.5}) + "\n")
    save_file({"w": weight}, root / "shards" / "shard-1.safetensors", metadata=metadata)
    return digest(root)


def test_digest_sees_tensors_and_metrics_not_metadata_order_or_timings(tmp_path):
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    info = json.dumps({"w": {"saved_offsets": [0, 0]}})
    base = _run(tmp_path / "a", {"format": "pt", "DCP_SHARDING_INFO": info}, w)
    assert _run(tmp_path / "b", {"DCP_SHARDING_INFO": info, "format": "pt"}, w.clone(), wall=9.0) == base
    flipped = w.clone()
    flipped.view(torch.int32)[0, 0] ^= 1  # one bit of one weight
    assert _run(tmp_path / "c", {"format": "pt", "DCP_SHARDING_INFO": info}, flipped)["shards"] != base["shards"]
    assert _run(tmp_path / "d", {"format": "pt", "DCP_SHARDING_INFO": info}, w, loss=1.5)["metrics.jsonl"] != (
        base["metrics.jsonl"])  # fmt: skip
    moved = json.dumps({"w": {"saved_offsets": [2, 0]}})  # the same bytes at another place of the full tensor
    assert _run(tmp_path / "e", {"format": "pt", "DCP_SHARDING_INFO": moved}, w)["shards"] != base["shards"]
