"""The trainer's weight stream and the `dist` transport: hand-checked packing, tied weights once, the bucket size
bound, and two-process round trips over gloo (a sharded model's gathered stream; a broadcast to an engine rank)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from satrl.weights.buckets import aliases, buckets, state_aliases, state_buckets, unpack


def tiny_qwen3(seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                      intermediate_size=64, vocab_size=100, tie_word_embeddings=True)  # fmt: skip
    return Qwen3ForCausalLM(cfg)


def test_bucket_packs_views_in_order():
    lin = torch.nn.Linear(3, 2)
    with torch.no_grad():
        lin.weight.copy_(torch.arange(6.0).view(2, 3))
        lin.bias.copy_(torch.tensor([10.0, 11.0]))
    (b,) = list(buckets(lin, dtype=None))
    assert b.names == ("weight", "bias") and b.shapes == ((2, 3), (2,))
    assert b.flat.tolist() == [0, 1, 2, 3, 4, 5, 10, 11]
    assert b.header() == {"names": ["weight", "bias"], "shapes": [[2, 3], [2]], "dtype": "float32"}
    with torch.no_grad():
        lin.weight.zero_()
    assert b.flat[0:6].tolist() == [0, 1, 2, 3, 4, 5]  # a copy: the next optimizer step does not reach it


def test_tied_weights_travel_once_and_come_back_shared():
    model = tiny_qwen3()
    assert aliases(model) == {"lm_head.weight": "model.embed_tokens.weight"}
    stream = list(buckets(model, dtype=torch.bfloat16))
    assert all("lm_head.weight" not in b.names for b in stream)
    state = unpack(stream, aliases(model))
    assert state.keys() == model.state_dict().keys()
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    for k, v in model.state_dict().items():
        assert torch.equal(state[k], v.to(torch.bfloat16)), k  # bf16 rounding, nothing else
    with pytest.raises(KeyError, match="tied to 'model.embed_tokens.weight'"):
        unpack([b for b in stream if "model.embed_tokens.weight" not in b.names], aliases(model))


def test_a_kept_snapshot_is_resent_without_a_copy_but_a_model_never_is():
    model = tiny_qwen3()
    stream = list(buckets(model, dtype=torch.bfloat16, bucket_bytes=3000))
    kept = unpack(stream, aliases(model))
    again = list(state_buckets(kept, torch.bfloat16, bucket_bytes=3000))
    assert [b.names for b in again] == [b.names for b in stream]
    assert all(a.flat.data_ptr() == b.flat.data_ptr() and torch.equal(a.flat, b.flat) for a, b in zip(again, stream))
    assert unpack(again, state_aliases(kept)).keys() == kept.keys()
    fp32 = list(state_buckets(kept, torch.float32, bucket_bytes=3000))  # another dtype: cast into new memory
    assert all(b.flat.dtype == torch.float32 and b.flat.data_ptr() != a.flat.data_ptr() for a, b in zip(stream, fp32))
    bf16 = model.to(torch.bfloat16)  # a model already in the bucket dtype is still copied: its weights change
    for b in buckets(bf16, dtype=torch.bfloat16):
        first = dict(bf16.named_parameters())[b.names[0]]
        assert b.flat.data_ptr() != first.data_ptr()


def test_a_kept_version_is_broadcast_as_the_buckets_it_was_kept_as():
    """A :class:`Snapshot` of the trainer's buckets sends them as they are (no unpack, no re-cut) and unpacks
    only for a reader of the full state dict, once; cut otherwise, or kept as a full dict, it is cut again."""
    from satrl.weights.snapshot import Snapshot

    model = tiny_qwen3()
    stream = list(buckets(model, dtype=torch.bfloat16, bucket_bytes=3000))
    kept = Snapshot.of_buckets(iter(stream), aliases(model), torch.bfloat16, 3000)
    sent, tied = kept.stream(torch.bfloat16, 3000)
    assert sent == tuple(stream) and all(a is b for a, b in zip(sent, stream)) and tied == aliases(model)
    state = kept.state()
    assert state is kept.state() and state.keys() == unpack(stream, aliases(model)).keys()
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    recut, tied = kept.stream(torch.bfloat16, 6000)  # another size: cut from the unpacked views
    assert [n for b in recut for n in b.names] == [n for b in stream for n in b.names] and tied == aliases(model)
    full = Snapshot.of_state(model.state_dict())
    assert full.state() is full.full
    again, tied = full.stream(torch.bfloat16, 3000)
    assert [b.names for b in again] == [b.names for b in stream] and tied == aliases(model)
    assert all(torch.equal(a.flat, b.flat) for a, b in zip(again, stream))


def test_buckets_respect_the_size_bound():
    model = tiny_qwen3()
    biggest = max(v.numel() for v in model.state_dict().values()) * 2
    limit = 3000  # bytes: smaller than the embedding (100 x 32 x 2), larger than most tensors
    stream = list(buckets(model, dtype=torch.bfloat16, bucket_bytes=limit))
    sizes = [b.flat.numel() * 2 for b in stream]
    assert len(stream) > 3 and max(sizes) <= max(limit, biggest)
    assert all(s <= limit or len(b.names) == 1 for s, b in zip(sizes, stream))  # only a lone big tensor exceeds it
    assert [n for b in stream for n in b.names] == [n for n in model.state_dict() if n != "lm_head.weight"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, port: int, fn) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        fn(rank)
    finally:
        dist.destroy_process_group()


def _spawn(fn) -> None:
    mp.spawn(_worker, args=(_free_port(), fn), nprocs=2, join=True)


def _broadcast_one_version(rank: int) -> None:
    from satrl.weights.link import receive, send

    model = tiny_qwen3(seed=3)  # both ranks build the same weights: the receiver checks against its own copy
    if rank == 0:
        sent = send(7, buckets(model, bucket_bytes=4096), aliases(model))
        assert sent == sum(p.numel() for p in model.parameters()) * 2
    else:
        version, state = receive()
        assert version == 7 and state["lm_head.weight"] is state["model.embed_tokens.weight"]
        want = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
        assert state.keys() == want.keys()
        assert all(torch.equal(state[k], want[k]) for k in want)
        model.load_state_dict(state)  # an engine loads it as it arrives


def _sharded_stream(rank: int) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    model = tiny_qwen3(seed=5)
    want = {k: v.to(torch.bfloat16) for k, v in model.state_dict().items()}
    mesh = init_device_mesh("cpu", (2,))
    with torch.no_grad():  # shard every parameter over the two ranks, as FSDP2 does (dim 0)
        for mod in model.modules():
            for name, p in list(mod.named_parameters(recurse=False)):
                mod.register_parameter(name, torch.nn.Parameter(distribute_tensor(p.data, mesh, [Shard(0)])))
    model.lm_head.weight = model.model.embed_tokens.weight  # re-tie after the embedding was replaced
    state = unpack(buckets(model, bucket_bytes=4096), aliases(model))  # every rank walks the stream
    assert all(torch.equal(state[k], want[k]) for k in want), rank


def _broadcast_then_sharded_stream(rank: int) -> None:
    _broadcast_one_version(rank)
    _sharded_stream(rank)


def test_dist_broadcasts_a_version_bit_for_bit_and_a_sharded_model_streams_its_full_weights():
    """Two checks on one pair of gloo ranks (each pair of spawned interpreters costs seconds of imports): the dist
    transport's broadcast of a version, then a model sharded over the ranks (as FSDP2 shards) streaming its full
    weights. A failure in either raises here, its traceback naming the function."""
    _spawn(_broadcast_then_sharded_stream)


def test_the_data_parallel_trainer_streams_its_full_weights(tmp_path):
    """``WeightExport.buckets`` on the sharded trainer under torchrun (2 ranks): cut on rank 0 from the copy every
    rank gathered at a sync point; asked for outside one, the weights are refused (one line), not a hang."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    from run_helpers import REPO

    out = tmp_path / "report.json"
    torchrun = Path(sys.executable).with_name("torchrun")
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    worker = Path(__file__).with_name("dp_buckets_worker.py")
    done = subprocess.run([str(torchrun), "--standalone", "--nproc_per_node=2", str(worker), str(out)], env=env,
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(out.read_text())
    assert got["keys_equal"] and got["max_diff"] < 1e-5 and got["bf16_is_rounded_fp32"]
    assert got["bf16_dtypes"] == ["torch.bfloat16"]
    assert all("outside a sync point" in e for e in got["outside_sync"]), got["outside_sync"]
