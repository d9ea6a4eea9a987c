"""Issue 46, item 3: every file that steers a resume is covered by a checksum, in a manifest that checks itself.

A flipped bit in ``state.json`` (a learning rate, a pending sample's reward), in the manifest's key names or its
entries, a lost entry, a file not listed, a lost manifest: each refused in one line naming the checkpoint (exit 2
under ``satrl train --resume``, the folder byte-identical). Checkpoints of the format before the manifest
(``state.json`` with ``files_sha256``) still load and resume, unless that key is gone. ``checkpoints/latest`` never
leads outside the checkpoint root. Each damage test failed before the manifest (the legacy ones are the guard
that the change keeps old checkpoints usable)."""

import contextlib
import hashlib
import io
import json
import shutil
from pathlib import Path

import pytest
import torch

from run_helpers import TINY, read_jsonl, stable
from satrl import cli
from satrl.training import checkpoint as ckpt

STATE = {"trainer": {"opt": {"lr": 0.0001}}, "ready": [{"id": "s0", "reward": 0.0}], "wall_s": 1.5}
WEIGHTS = {"w": torch.arange(6, dtype=torch.float32)}


def _saved(tmp_path: Path, extra=None) -> Path:
    return ckpt.save_checkpoint(tmp_path / "checkpoints", 2, WEIGHTS, STATE, write_extra=extra)


def _flip(path: Path, find: bytes, at: int, bit: int = 0) -> bytes:
    """Flip one bit of ``path``: bit ``bit`` of the byte ``at`` past the first ``find``; the new bytes."""
    data = bytearray(path.read_bytes())
    where = data.index(find) + at
    data[where] ^= 1 << bit
    path.write_bytes(bytes(data))
    return bytes(data)


def _refused(step: Path, *says: str) -> str:
    with pytest.raises(ckpt.CheckpointError) as err:
        ckpt.load_checkpoint(step)
    line = str(err.value)
    assert "\n" not in line and line.startswith(str(step)), line
    assert all(s in line for s in says), line
    return line


def _rewrite_manifest(step: Path, change) -> None:
    """The manifest with ``change`` applied and written as a consistent writer would (its self checksum redone):
    what the listing checks must catch on their own."""
    m = json.loads((step / "manifest.json").read_text())
    body = change({k: v for k, v in m.items() if k != "self_sha256"})
    canon = lambda o: json.dumps(o, sort_keys=True, separators=(",", ":")).encode()  # noqa: E731
    full = {**body, "self_sha256": hashlib.sha256(canon(body)).hexdigest()}
    (step / "manifest.json").write_bytes(canon(full) + b"\n")


def _to_legacy(step: Path, key: str | None = "files_sha256") -> None:
    """Rewrite checkpoint ``step`` the way satrl wrote it before the manifest: no manifest.json, and state.json's
    top-level ``files_sha256`` holding the sha256 of every other file (``key``: under another name; None: none)."""
    (step / "manifest.json").unlink(missing_ok=True)  # missing_ok: the test also runs against the old satrl
    tree = json.loads((step / "state.json").read_text())
    digests = {str(p.relative_to(step)): hashlib.sha256(p.read_bytes()).hexdigest()
               for p in sorted(step.rglob("*")) if p.is_file() and p.name != "state.json"}  # fmt: skip
    tree = tree if key is None else {**tree, key: digests}
    (step / "state.json").write_text(json.dumps(tree, allow_nan=False))


# -- format 2: the manifest --------------------------------------------------------------------------------------
def test_a_new_checkpoint_round_trips_and_its_manifest_covers_state_json(tmp_path):
    step = _saved(tmp_path)
    manifest = json.loads((step / "manifest.json").read_text())
    assert manifest["format"] == 2 and set(manifest["files"]) == set(ckpt.FILES)
    # format 2 never writes files_sha256: else a lost manifest would read as the old format
    assert "files_sha256" not in json.loads((step / "state.json").read_text())
    weights, state = ckpt.load_checkpoint(step)
    assert torch.equal(weights["w"], WEIGHTS["w"]) and state == STATE


@pytest.mark.parametrize("value, at, became", [(b'"lr": 0.0001', 9, 0.0101), (b'"reward": 0.0', 10, 1.0)])
def test_a_flipped_bit_in_a_value_of_state_json_is_refused(tmp_path, value, at, became):
    step = _saved(tmp_path)
    _flip(step / "state.json", value, at)
    tree = json.loads((step / "state.json").read_text())  # still valid JSON, another number: silent before
    assert became in (tree["trainer"]["opt"]["lr"], tree["ready"][0]["reward"])
    _refused(step, "state.json does not match the checksum")


@pytest.mark.parametrize("key", ["files", "format", "self_sha256", "state.json", "model.safetensors"])
def test_a_flipped_bit_in_a_key_of_the_manifest_is_refused(tmp_path, key):
    step = _saved(tmp_path)
    _flip(step / "manifest.json", f'"{key}"'.encode(), 1)
    _refused(step, "manifest.json")


@pytest.mark.parametrize("where", [b'"self_sha256":"', b'"state.json":"', b'"format":'])
def test_a_flipped_bit_in_a_value_of_the_manifest_is_refused(tmp_path, where):
    step = _saved(tmp_path)
    _flip(step / "manifest.json", where, len(where), bit=1 if where.endswith(b":") else 0)
    _refused(step, "manifest.json")


@pytest.mark.parametrize("name", ["state.json", "model.safetensors", "state.safetensors"])
@pytest.mark.parametrize("redone", [False, True], ids=["as-is", "self-checksum-redone"])
def test_an_entry_removed_from_the_manifest_is_refused(tmp_path, name, redone):
    step = _saved(tmp_path)
    if redone:
        _rewrite_manifest(step, lambda m: {**m, "files": {k: v for k, v in m["files"].items() if k != name}})
    else:
        m = json.loads((step / "manifest.json").read_text())
        del m["files"][name]  # the self checksum left as it was
        (step / "manifest.json").write_text(json.dumps(m, sort_keys=True, separators=(",", ":")) + "\n")
    _refused(step, "manifest.json")
    if redone:
        _refused(step, name, "no checksum")


def test_a_key_removed_from_the_manifest_is_refused(tmp_path):
    step = _saved(tmp_path)
    _rewrite_manifest(step, lambda m: {"files": m["files"]})
    _refused(step, "manifest.json", "keys")


def test_a_file_not_listed_is_refused(tmp_path):
    def shards(folder):
        (folder / "shards").mkdir()
        (folder / "shards" / "model-00001.safetensors").write_bytes(b"x" * 100)

    step = _saved(tmp_path, shards)
    assert "shards/model-00001.safetensors" in json.loads((step / "manifest.json").read_text())["files"]
    (step / "shards" / "model-00002.safetensors").write_bytes(b"y" * 100)
    _refused(step, "shards/model-00002.safetensors", "not listed")


def test_an_unknown_format_is_refused(tmp_path):
    step = _saved(tmp_path)
    _rewrite_manifest(step, lambda m: {**m, "format": 3})
    _refused(step, "manifest.json", "format 3")


def test_a_lost_manifest_is_refused_not_read_as_the_old_format(tmp_path):
    step = _saved(tmp_path)
    (step / "manifest.json").unlink()
    _refused(step, "manifest.json is missing", "files_sha256")
    assert ckpt.latest_checkpoint(step.parent) == step  # complete by its files: refused on loading


def test_a_damaged_weight_is_refused_as_a_mismatch(tmp_path):
    step = _saved(tmp_path)
    _flip(step / "model.safetensors", b"\x00", 0)  # somewhere in the header's padding or the tensor
    with pytest.raises(ckpt.ChecksumMismatch) as err:
        ckpt.verify(step)
    assert err.value.file == step / "model.safetensors"


# -- format 1: state.json's files_sha256 -------------------------------------------------------------------------
def test_a_checkpoint_of_the_format_before_the_manifest_loads(tmp_path):
    step = _saved(tmp_path)
    _to_legacy(step)
    assert ckpt.verify(step) == 1
    weights, state = ckpt.load_checkpoint(step)
    assert torch.equal(weights["w"], WEIGHTS["w"]) and state == STATE  # files_sha256 not in the state


@pytest.mark.parametrize("key", [None, "giles_sha256", "files_sha257"], ids=["removed", "flip-f", "flip-7"])
def test_an_old_checkpoint_without_files_sha256_is_refused(tmp_path, key):
    step = _saved(tmp_path)
    _to_legacy(step, key)
    _refused(step, "manifest.json is missing", "files_sha256")


def test_an_old_checkpoint_with_a_damaged_weight_is_refused(tmp_path):
    step = _saved(tmp_path)
    _to_legacy(step)
    _flip(step / "state.safetensors", b"\x00", 0)
    _refused(step, "state.safetensors does not match the checksum")


def test_an_old_checkpoint_with_a_lost_entry_is_refused(tmp_path):
    step = _saved(tmp_path)
    _to_legacy(step)
    tree = json.loads((step / "state.json").read_text())
    del tree["files_sha256"]["model.safetensors"]
    (step / "state.json").write_text(json.dumps(tree))
    _refused(step, "model.safetensors has no checksum")


# -- checkpoints/latest stays inside the checkpoint root ---------------------------------------------------------
def _outside_copy(tmp_path: Path) -> tuple[Path, Path]:
    """A run's checkpoint root with step-000002, and a copy of that checkpoint in ``tmp_path/outside``."""
    step = _saved(tmp_path / "run")
    outside = tmp_path / "outside" / step.name
    shutil.copytree(step, outside)
    return step.parent, outside


@pytest.mark.parametrize("pointer", ["step-000002/../../../outside/step-000002", "ABS", ".."])
def test_a_latest_that_holds_a_path_is_refused(tmp_path, pointer):
    root, outside = _outside_copy(tmp_path)
    (root / "latest").write_text(str(outside) if pointer == "ABS" else pointer)
    for read in (ckpt.damage, ckpt.latest_checkpoint):
        with pytest.raises(ckpt.CheckpointError, match="latest: names") as err:
            read(root)
        assert "\n" not in str(err.value) and "refusing" in str(err.value)


def test_a_latest_naming_a_folder_symlinked_outside_is_refused(tmp_path):
    root, outside = _outside_copy(tmp_path)
    shutil.rmtree(root / "step-000002")
    (root / "step-000002").symlink_to(outside)
    with pytest.raises(ckpt.CheckpointError, match="outside"):
        ckpt.latest_checkpoint(root)
    (root / "latest").unlink()  # no pointer: the newest folder is chosen, and it leads outside too
    with pytest.raises(ckpt.CheckpointError, match="outside"):
        ckpt.latest_checkpoint(root)


def test_a_plain_latest_still_resolves(tmp_path):
    root, _ = _outside_copy(tmp_path)
    assert ckpt.latest_checkpoint(root) == root / "step-000002" and ckpt.damage(root) is None


# -- satrl export / eval read the same record (satrl.apps.runs) -------------------------------------------------------
def test_runs_reads_both_formats_through_the_manifest_check(tmp_path):
    from satrl.apps.runs import RunReadError, checkpoint_weights

    step = _saved(tmp_path)
    assert torch.equal(checkpoint_weights(step)["w"], WEIGHTS["w"])
    _flip(step / "manifest.json", b'"files"', 1)
    with pytest.raises(RunReadError, match="manifest.json"):
        checkpoint_weights(step)
    step = _saved(tmp_path / "old")
    _to_legacy(step)
    assert torch.equal(checkpoint_weights(step)["w"], WEIGHTS["w"])
    tree = json.loads((step / "state.json").read_text())
    tree["giles_sha256"] = tree.pop("files_sha256")  # renamed: no longer read unchecked
    (step / "state.json").write_text(json.dumps(tree))
    with pytest.raises(RunReadError, match="files_sha256"):
        checkpoint_weights(step)


# -- end to end: satrl train --resume ----------------------------------------------------------------------------
@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A finished 2-step tiny run (one batch, checkpoint step-000002)."""
    from satrl.config import load_config
    from satrl.loop.orchestrator import train

    out = tmp_path_factory.mktemp("manifest") / "run"
    train(load_config(None, [*TINY, "steps=2", f"out={out}"]))
    return out


def _tree(out: Path) -> dict[str, str]:
    return {str(p.relative_to(out)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(out.rglob("*")) if p.is_file() and p.name != ".satrl.lock"}  # fmt: skip


def _lr_flipped(step: Path, tmp: Path) -> None:
    """The learning rate's last digit, one bit off (a digit still: valid JSON, another number)."""
    key = b'"lr": '
    data = (step / "state.json").read_bytes()
    number = data[data.index(key) + len(key) :].split(b",")[0].split(b"}")[0]
    assert number[-1:].isdigit(), number
    _flip(step / "state.json", key, len(key) + len(number) - 1)


def _latest_escapes(step: Path, tmp: Path) -> None:
    shutil.copytree(step, tmp / "outside" / step.name)
    (step.parent / "latest").write_text(f"{step.name}/../../../outside/{step.name}")


def _symlinked_outside(step: Path, tmp: Path) -> None:
    shutil.copytree(step, tmp / "outside" / step.name)
    shutil.rmtree(step)
    step.symlink_to(tmp / "outside" / step.name)


RESUME_CASES = {  # name -> (damage to the latest checkpoint of a copy of the run, what the line says)
    "lr flipped in state.json": (_lr_flipped, "state.json does not match the checksum"),
    "manifest key flipped": (lambda step, tmp: _flip(step / "manifest.json", b'"files"', 1), "manifest.json"),
    "manifest deleted": (lambda step, tmp: (step / "manifest.json").unlink(), "manifest.json is missing"),
    "latest escapes": (_latest_escapes, "refusing to read a checkpoint from outside"),
    "checkpoint symlinked outside": (_symlinked_outside, "outside"),
    # issue 46, item 9: the run's only checkpoint deleted, latest still naming it (it restarted at step 0 and
    # rewrote its logs, exit 0)
    "only checkpoint deleted": (lambda step, tmp: shutil.rmtree(step), "which is gone (no checkpoint is left)"),
}


@pytest.mark.parametrize("case", list(RESUME_CASES))
def test_resume_refuses_in_one_line_and_leaves_the_folder(finished, tmp_path, case):
    damage, says = RESUME_CASES[case]
    out = tmp_path / "run"
    shutil.copytree(finished, out)
    (out / "summary.json").unlink()
    step = out / "checkpoints" / "step-000002"
    damage(step, tmp_path)
    before = _tree(out)
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        rc = cli.main(["train", "--resume", str(out), "--no-progress"])
    lines = [x for x in err.getvalue().splitlines() if x.strip()]
    assert rc == 2 and len(lines) == 1 and says in lines[0], (rc, lines[:5])
    assert str(out / "checkpoints") in lines[0]
    assert _tree(out) == before


def test_an_old_format_run_resumes_as_the_unbroken_run(finished, tmp_path, run_tiny_steps4):
    """A run whose checkpoints were written before the manifest, extended from 2 to 4 steps, equals a 4-step run."""
    from satrl.loop.orchestrator import train
    from satrl.rundir.files import RunDir

    out = tmp_path / "run"
    shutil.copytree(finished, out)
    for step in (out / "checkpoints").glob("step-*"):
        _to_legacy(step)
    train(RunDir.config_of(out, ["steps=4"]), resume=True)
    assert stable(read_jsonl(out / "metrics.jsonl")) == stable(read_jsonl(run_tiny_steps4 / "metrics.jsonl"))
    assert (out / "checkpoints" / "step-000004" / "manifest.json").is_file()  # the new checkpoint: format 2


@pytest.fixture
def run_tiny_steps4(shared_tiny):
    return shared_tiny("steps=4")
