"""Stop before `make` pulls PyTorch's CUDA build onto a machine without a GPU (issue 60: `make demo` run first, before
the README's Installation step, downloaded several GB).

    python tools/torch_wheel.py PIP SPEC     # e.g. .venv/bin/pip torch==2.13.0

Asks pip what it would install (``pip install --dry-run --report``: metadata only, no wheel is downloaded). Exits 0
when torch is already installed, when this machine has an NVIDIA GPU (``nvidia-smi`` runs), or when the wheel pip
would take is a CPU build (a ``+cpu`` local version, and no ``nvidia-*`` package with it); else prints one line
saying what to run first and exits 2.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

CPU_FIRST = "{pip} install {spec} --index-url https://download.pytorch.org/whl/cpu"


def would_install(pip: str, spec: str) -> list[tuple[str, str]]:
    """(name, version) of every package ``pip install SPEC`` would install now."""
    out = subprocess.run([pip, "install", "--dry-run", "--quiet", "--report", "-", spec], capture_output=True,
                         text=True, check=True).stdout  # fmt: skip
    return [(i["metadata"]["name"], i["metadata"]["version"]) for i in json.loads(out or "{}").get("install", [])]


def cuda_without_gpu(plan: list[tuple[str, str]], has_gpu: bool) -> bool:
    """Whether ``plan`` brings a CUDA build of torch to a machine without a GPU."""
    if has_gpu:
        return False
    torch = [v for n, v in plan if n.lower() == "torch"]
    nvidia = any(n.lower().startswith("nvidia-") for n, _ in plan)
    return bool(torch) and (nvidia or not torch[0].endswith("+cpu"))


def has_nvidia_gpu() -> bool:
    smi = shutil.which("nvidia-smi")
    return smi is not None and subprocess.run([smi], capture_output=True).returncode == 0


def main(argv: list[str]) -> int:
    pip, spec = argv
    if cuda_without_gpu(would_install(pip, spec), has_nvidia_gpu()):
        print(f"make: this machine has no NVIDIA GPU and pip would install PyTorch's CUDA build (several GB); "
              f"install the CPU build first: {CPU_FIRST.format(pip=pip, spec=spec)} (README: Installation)",
              file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
