"""`satrl export` and `satrl eval RUN_DIR` on a data-parallel run (`torchrun --nproc_per_node=2`, FSDP2 on CPU):
the exported weights equal the checkpoint's DCP shards bit for bit (read back with no process group), and both
the run directory and the exported folder score what the run's evaluator logged at the last step. The commands
run in this process (``satrl.cli.main``): what is tested is what they compute, not a fresh interpreter (each
`python -m satrl` pays seconds of imports), and the export is made once for both tests."""

import contextlib
import io
import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from run_helpers import DP_ARGS, DP_CONFIG, read_jsonl

# the shared 2-rank run (run_helpers.DP_ARGS), then satrl export and eval; the export reads the DCP shards with no
# process group, which torch warns about
pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:torch.distributed is disabled")]

LAST = "step-000006"  # DP_ARGS' last step: evaluated (eval.every=3), and its scores differ from step 0's
SCORES = ("avg_at_k", "greedy_acc", "val_avg_at_k", "val_greedy_acc", "test_avg_at_k", "test_greedy_acc", "k")


def _satrl(*argv) -> str:
    """``satrl *argv`` in this process (its torch thread count restored after): its stdout."""
    from satrl import cli

    out, err, threads = io.StringIO(), io.StringIO(), torch.get_num_threads()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main([*map(str, argv)])
    finally:
        torch.set_num_threads(threads)
    assert rc == 0, err.getvalue()[-3000:]
    return out.getvalue()


@pytest.fixture(scope="module")
def dp_run(shared_dp) -> Path:
    """The 2-rank run tests/e2e/test_data_parallel.py compares with one process (read only)."""
    out = shared_dp(DP_CONFIG, *DP_ARGS)
    assert (out / "checkpoints" / LAST / "shards").is_dir()  # a sharded checkpoint
    return out


@pytest.fixture(scope="module")
def exported(dp_run, tmp_path_factory) -> Path:
    """``satrl export`` of the run (its last checkpoint), made once for both tests (read only)."""
    out = tmp_path_factory.mktemp("export") / "hf"
    _satrl("export", dp_run, out)
    return out


def _shard_weights(ckpt: Path, like: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The policy as the DCP shards hold it (``model.<name>``, a tied weight once), assembled in one process."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    reader = HuggingFaceStorageReader(str(ckpt / "shards"))
    names = [k for k in reader.read_metadata().state_dict_metadata if k.startswith("model.")]
    state = {k: torch.empty_like(like[k.removeprefix("model.")]) for k in names}
    dcp.load(state, storage_reader=reader, no_dist=True)
    return {k.removeprefix("model."): v for k, v in state.items()}


def test_export_of_a_sharded_checkpoint_equals_its_shards(dp_run, exported):
    from transformers import AutoModelForCausalLM

    got = AutoModelForCausalLM.from_pretrained(exported, local_files_only=True).state_dict()
    ckpt = dp_run / "checkpoints" / LAST
    full = load_file(ckpt / "model.safetensors")
    shards = _shard_weights(ckpt, full)
    assert set(got) == set(full) and set(full) - set(shards) <= {"lm_head.weight"}  # the tied head once
    assert all(torch.equal(got[k], full[k]) for k in full)
    assert all(torch.equal(got[k], shards[k]) for k in shards)


def test_eval_of_a_dp_run_and_its_export_equal_its_last_eval(dp_run, exported):
    logged = read_jsonl(dp_run / "eval.jsonl")[-1]
    assert logged["step"] == 6
    from_run = json.loads(_satrl("eval", dp_run, "--json").splitlines()[-1])
    assert {k: from_run[k] for k in SCORES} == {k: logged[k] for k in SCORES}
    flags = json.loads((exported / "satrl_export.json").read_text())["eval_flags"]
    from_export = json.loads(_satrl("eval", "--model", exported, *flags, "--json").splitlines()[-1])
    assert {k: from_export[k] for k in SCORES} == {k: logged[k] for k in SCORES}
    base = read_jsonl(dp_run / "eval.jsonl")[0]
    assert {k: base[k] for k in SCORES} != {k: logged[k] for k in SCORES}  # the match tells the weights apart
