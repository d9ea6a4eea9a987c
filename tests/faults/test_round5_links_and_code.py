"""Issue 60, first items: no code from a model folder whatever stdin answers; nothing written or deleted through a
link out of a run folder; ``satrl eval RUN`` and ``satrl export RUN OUT`` check config.yaml as ``--resume`` does."""

import builtins
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from run_helpers import REPO, TINY
from satrl import cli

TINY_ARITH = REPO / "src" / "satrl" / "models" / "checkpoints" / "tiny-arith"


def _satrl(capsys, *argv) -> tuple[int, str]:
    rc = cli.main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err[-2000:]
    return lines[0]


# -- 1: a model folder's own code never runs, even with "y" on stdin ------------------------------------------
def _evil(folder: Path, marker: Path) -> Path:
    """Make the HF folder ``folder`` ask for its own code (auto_map), code that writes ``marker``."""
    config = json.loads((folder / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilModel",
                          "AutoTokenizer": ["evil.EvilTokenizer", None]}  # fmt: skip
    config["model_type"] = "evil"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    return folder


@pytest.fixture
def say_yes(monkeypatch, tmp_path):
    """Every question on stdin answered "y" (transformers asks "Do you wish to run the custom code? [y/N]")."""
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(builtins, "input", lambda *a, **k: "y")


def test_loaders_refuse_remote_code_with_yes_on_stdin(tmp_path, say_yes):
    from satrl.models.loading import PolicyLoadError, empty_model, load_model, load_tokenizer

    marker = tmp_path / "pwned"
    model = _evil(shutil.copytree(TINY_ARITH, tmp_path / "evil-model"), marker)
    for load in (load_model, empty_model, load_tokenizer):
        with pytest.raises(PolicyLoadError) as err:
            load(str(model))
        assert str(model) in str(err.value) and "\n" not in str(err.value), err.value
        assert not marker.exists(), f"{load.__name__} executed the model folder's code"


def test_eval_model_refuses_remote_code_with_yes_on_stdin(tmp_path):
    marker = tmp_path / "pwned"
    model = _evil(shutil.copytree(TINY_ARITH, tmp_path / "evil-model"), marker)
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "HF_MODULES_CACHE": str(tmp_path / "hf-modules")}
    r = subprocess.run([sys.executable, "-m", "satrl", "eval", "--model", str(model)], input="y\n" * 5, env=env,
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert not marker.exists(), "satrl eval --model executed the model folder's code"
    assert r.returncode == 2 and str(model) in _one_line(r.stderr), r.stderr[-2000:]


def test_train_model_path_refuses_remote_code_with_yes_on_stdin(tmp_path, capsys, say_yes):
    marker = tmp_path / "pwned"
    model = _evil(shutil.copytree(TINY_ARITH, tmp_path / "evil-model"), marker)
    rc, err = _satrl(capsys, "train", REPO / "configs" / "grpo.yaml", *TINY, "steps=2", f"model.path={model}",
                     f"out={tmp_path / 'run'}", "--no-progress")  # fmt: skip
    assert not marker.exists(), "satrl train executed the model folder's code"
    assert rc == 2 and str(model) in _one_line(err), err


def test_export_refuses_a_run_whose_model_asks_for_its_code(tmp_path, capsys, run_tiny, monkeypatch):
    model = shutil.copytree(TINY_ARITH, tmp_path / "model")
    run = run_tiny("steps=2", f"model.path={model}")
    marker = tmp_path / "pwned"
    _evil(model, marker)
    monkeypatch.setenv("HF_MODULES_CACHE", str(tmp_path / "hf-modules"))
    monkeypatch.setattr(builtins, "input", lambda *a, **k: "y")
    rc, err = _satrl(capsys, "export", run, tmp_path / "hf")
    assert not marker.exists(), "satrl export executed the model folder's code"
    assert rc == 2 and str(model) in _one_line(err), err
    assert not (tmp_path / "hf").exists()


# -- 2: train never writes or deletes through a link out of the run folder ------------------------------------
def _tree(folder: Path) -> dict[str, str]:
    """Every entry under ``folder`` (links not followed): a file's sha256, a link's target, "dir"."""
    out = {}
    for root, dirs, files in os.walk(folder):
        for name in [*dirs, *files]:
            p = Path(root) / name
            key = str(p.relative_to(folder))
            out[key] = (f"-> {os.readlink(p)}" if p.is_symlink() else "dir" if p.is_dir()
                        else hashlib.sha256(p.read_bytes()).hexdigest())  # fmt: skip
    return out


@pytest.fixture
def two_runs(shared_tiny, tmp_path):
    done = shared_tiny("steps=6", "eval.every=2")
    return (shutil.copytree(done, tmp_path / "run", symlinks=True),
            shutil.copytree(done, tmp_path / "other", symlinks=True))  # fmt: skip


LINKED = ["checkpoints", "metrics.jsonl", "eval.jsonl", "summary.json", "config.yaml", "environment.json",
          "checkpoints/latest", "checkpoints/best", "checkpoints/step-000006"]  # fmt: skip


@pytest.mark.parametrize("name", LINKED)
def test_resume_refuses_a_run_file_that_links_out(two_runs, capsys, name):
    run, other = two_runs
    link, target = run / name, other / name
    if not target.exists():
        target.write_text("step-000006\n") if name.startswith("checkpoints/") else target.write_text("")
    if link.is_dir() and not link.is_symlink():
        shutil.rmtree(link)
    else:
        link.unlink(missing_ok=True)
    link.symlink_to(target)
    before = _tree(run), _tree(other)
    rc, err = _satrl(capsys, "train", "--resume", run, "steps=8", "--no-progress")
    line = _one_line(err)
    assert rc == 2 and str(link) in line and "link" in line, err
    assert (_tree(run), _tree(other)) == before, "a refused resume changed a file"


def test_resume_refuses_checkpoints_resolving_outside_the_run(two_runs, capsys, tmp_path):
    """A relative link (``../other/checkpoints``) is refused like an absolute one."""
    run, other = two_runs
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").symlink_to(Path("..") / "other" / "checkpoints")  # relative: still out of the run
    before = _tree(run), _tree(other)
    rc, err = _satrl(capsys, "train", "--resume", run, "steps=8", "--no-progress")
    assert rc == 2 and str(run / "checkpoints") in _one_line(err), err
    assert (_tree(run), _tree(other)) == before


@pytest.mark.parametrize("name", [".satrl.lock", "config.yaml.tmp"])
def test_a_fresh_run_refuses_a_linked_file_it_would_write(tmp_path, capsys, name):
    """A fresh run refuses any run file already there, but the lock and config.yaml's temporary file it writes
    first: through a link they would truncate or overwrite the file the link names."""
    run, elsewhere = tmp_path / "run", tmp_path / "elsewhere.txt"
    run.mkdir()
    elsewhere.write_text("keep\n")
    (run / name).symlink_to(elsewhere)
    rc, err = _satrl(capsys, "train", REPO / "configs" / "grpo.yaml", *TINY, "steps=2", f"out={run}", "--no-progress")
    assert rc == 2 and str(run / name) in _one_line(err), err
    assert elsewhere.read_text() == "keep\n" and _tree(run) == {name: f"-> {elsewhere}"}


# -- 3: eval RUN and export RUN OUT check config.yaml as --resume does ------------------------------------------
def _emptied(cfg: Path) -> None:
    cfg.write_text("")


def _edited(cfg: Path) -> None:
    text = cfg.read_text()
    assert "  lr: " in text
    cfg.write_text(text.replace("  lr: ", "  lr: 0.5 #", 1))


@pytest.mark.parametrize("spoil", [_emptied, _edited], ids=["emptied", "edited"])
@pytest.mark.parametrize("command", ["eval", "export"])
def test_eval_and_export_refuse_a_changed_config_yaml(shared_tiny, tmp_path, capsys, spoil, command):
    run = shutil.copytree(shared_tiny("steps=2"), tmp_path / "run", symlinks=True)
    spoil(run / "config.yaml")
    before = _tree(run)
    out = tmp_path / "hf"
    rc, err = _satrl(capsys, command, run, *([out] if command == "export" else []))
    assert rc == 2 and str(run / "config.yaml") in _one_line(err), err
    assert _tree(run) == before and not out.exists()


def test_a_resumable_change_is_accepted_by_export(shared_tiny, tmp_path, capsys):
    """What resume may change (steps, the cadences) is no reason to refuse: export still writes the folder."""
    run = shutil.copytree(shared_tiny("steps=2"), tmp_path / "run", symlinks=True)
    cfg = run / "config.yaml"
    cfg.write_text(cfg.read_text().replace("steps: 2\n", "steps: 4\n", 1))
    rc, err = _satrl(capsys, "export", run, tmp_path / "hf")
    assert rc == 0 and (tmp_path / "hf" / "config.json").is_file(), err
