"""Write one benchmark's section of docs/benchmarks.md, leaving the other sections as they are."""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
from pathlib import Path

import torch

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nEach section is rewritten by the command named in it. Numbers are never edited by hand.\n"


def machine() -> str:
    """One line naming the machine: CPU model, cores, torch build, accelerator."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    acc = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__}, {acc}"


def write_section(name: str, command: str, body: str, doc: Path = DOC) -> None:
    """Replace (or append) the section ``name`` of the benchmarks doc with ``body``."""
    stamp = _dt.date.today().isoformat()
    block = (
        f"<!-- BEGIN {name} -->\n## {name}\n\nCommand: `{command}`  \n"
        f"Machine: {machine()}  \nDate: {stamp}\n\n{body.rstrip()}\n<!-- END {name} -->\n"
    )
    text = doc.read_text() if doc.exists() else HEADER
    pattern = re.compile(rf"<!-- BEGIN {re.escape(name)} -->.*?<!-- END {re.escape(name)} -->\n", re.S)
    text = pattern.sub(lambda _: block, text) if pattern.search(text) else text.rstrip() + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(text)
