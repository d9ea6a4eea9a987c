"""SAT's gate and fix-up as compiled loops, for float32 CPU tensors: the same results as the torch path, faster.

On CPU, SAT's extra cost over PPO is mostly the number of passes its sparse steps make over the gated
tokens (about twenty torch ops: compares, gathers, nonzeros, the kernel, the fix-up's tests), not the
arithmetic. ``_sat_kernels.c`` does the same steps in two loops (see its header): one pass over d that
keeps the candidates with d, the ratio and the advantage there, and one pass over the candidates for the
gate, the kernel, the fix-up and the Table 10 terms. :func:`sat_trust_region <satrl.objectives.sat.sat_trust_region>`
uses it when :func:`usable` says so and otherwise runs the torch path; the two agree bit for bit (loss,
gradient and every metric; ``tests/objectives/test_obj_native.py``), so which one ran never changes a result.

The C file is compiled on first use with the system C compiler (``cc``, else ``gcc`` or ``clang``; about a
second) into ``$XDG_CACHE_HOME/satrl`` (default ``~/.cache/satrl``), keyed by the source's hash, and loaded
with ctypes. One build serves every x86-64 CPU: the AVX2 loops are chosen at run time, with scalar loops
elsewhere, which are slower than the torch path and therefore run only in tests: without AVX2, without a
compiler, or if the build fails, the torch path runs; :func:`status` says which and why.
``set_enabled(False)`` turns the compiled path off (for comparisons; results do not change).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import Tensor

SOURCE = Path(__file__).with_name("_sat_kernels.c")
FLAGS = ["-O3", "-ffp-contract=off", "-fno-strict-aliasing", "-shared", "-fPIC"]

# avx2: what the CPU offers, read once at load. Without AVX2 the scalar loops are slower than the torch path
# (the benchmark's gate line times both), so they run only where a test asks for them (scalar_ok).
_state: dict = {"enabled": True, "lib": None, "tried": False, "reason": "not loaded yet", "avx2": False,
                "scalar_ok": False}


def set_enabled(on: bool) -> None:
    """Use the compiled loops when they are available (default), or always the torch path."""
    _state["enabled"] = bool(on)


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "satrl"


def _compiler() -> str | None:
    for name in ("cc", "gcc", "clang"):
        path = shutil.which(name)
        if path:
            return path
    return None


def _build() -> ctypes.CDLL:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(source + " ".join(FLAGS).encode() + sys.platform.encode()).hexdigest()[:16]
    lib_path = cache_dir() / f"sat_kernels-{key}.so"
    if not lib_path.exists():
        cc = _compiler()
        if cc is None:
            raise OSError("no C compiler (cc, gcc or clang) on PATH")
        lib_path.parent.mkdir(parents=True, exist_ok=True)
        # build beside the target and rename: concurrent first uses (grid workers) never load a partial file
        fd, tmp = tempfile.mkstemp(suffix=".so", dir=lib_path.parent)
        os.close(fd)
        try:
            res = subprocess.run([cc, *FLAGS, str(SOURCE), "-o", tmp], capture_output=True, text=True)
            if res.returncode != 0:
                raise OSError(f"{Path(cc).name} failed: {res.stderr.strip().splitlines()[-1:] or res.returncode}")
            os.replace(tmp, lib_path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    lib = ctypes.CDLL(str(lib_path))
    P, I, F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
    lib.sat_candidates.restype = I
    lib.sat_candidates.argtypes = [P, P, P, I, I, ctypes.c_int32, P, P, P, P, I]
    lib.sat_gate_fixup.restype = None
    lib.sat_gate_fixup.argtypes = [P, P, P, P, I, F, F, F, F, F, P, P, P, P, P, P, P, P, P, P]
    lib.sat_kernel_isa.restype = ctypes.c_int
    lib.sat_force_scalar.argtypes = [ctypes.c_int]
    lib.sat_kernel_isa()  # builds the lookup tables now, in one thread
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, or None (disabled, or no build: :func:`status` says why). Built once per process."""
    if not _state["enabled"]:
        return None
    if not _state["tried"]:
        _state["tried"] = True
        try:
            _state["lib"] = _build()
            _state["avx2"] = bool(_state["lib"].sat_kernel_isa())
        except OSError as e:
            _state["reason"] = f"torch path: {e}"
    return _state["lib"]


def status() -> str:
    """One line: which SAT path runs on CPU float32 tensors, and why."""
    if not _state["enabled"]:
        return "torch path (compiled loops turned off)"
    lib = library()
    if lib is None:
        return _state["reason"]
    return "compiled SAT loops (AVX2)" if _state["avx2"] else "torch path (no AVX2: the scalar loops are slower)"


def active() -> bool:
    """Whether the loops run here at all: enabled, built, and AVX2 (or a test asked for the scalar loops)."""
    return library() is not None and (_state["avx2"] or _state["scalar_ok"])


def usable(d: Tensor, ratio: Tensor, adv: Tensor) -> bool:
    """Whether the compiled loops can run these tensors: float32, CPU, row-major (``policy_loss`` makes its
    inputs so), an advantage of [B, 1] or [B, T], and a library with AVX2 loops to run them."""
    return (
        d.dtype == ratio.dtype == adv.dtype == torch.float32
        and d.device.type == ratio.device.type == adv.device.type == "cpu"
        and d.is_contiguous() and ratio.is_contiguous() and adv.is_contiguous()
        and adv.dim() == 2 and adv.shape[-1] in (1, d.shape[-1]) and ratio.shape == d.shape
        and active()
    )


def _ptr(t: Tensor) -> int:
    return t.data_ptr()


def candidates(d: Tensor, ratio: Tensor, adv: Tensor, v_bits: int, expect: int) -> tuple[Tensor, ...]:
    """(pos, d, ratio, adv) at the flat positions whose |d| bits are >= ``v_bits``, ascending. ``expect``:
    about how many there are (the buffers' first size; a second pass with room for all if it was short)."""
    lib = library()
    flat = d.reshape(-1)
    n = flat.numel()
    cols = d.shape[-1] if adv.shape[-1] == 1 and n > 0 else 0
    for cap in (min(n, expect) + 16, n + 16):
        pos = torch.empty(cap, dtype=torch.int64)
        d_c, r_c = torch.empty(cap, dtype=torch.int32), torch.empty(cap, dtype=torch.int32)
        a_c = torch.empty(cap, dtype=torch.float32)
        m = lib.sat_candidates(_ptr(flat), _ptr(ratio), _ptr(adv), cols, n, v_bits, _ptr(pos), _ptr(d_c),
                               _ptr(r_c), _ptr(a_c), cap)  # fmt: skip
        if m >= 0:
            return pos[:m], d_c[:m].view(torch.float32), r_c[:m].view(torch.float32), a_c[:m]
    raise RuntimeError("sat_candidates: no room with a buffer for every position")  # cannot happen


def gate_fixup(pos: Tensor, d_c: Tensor, r_c: Tensor, a_c: Tensor, q: Tensor, eps_low: float, eps_high: float,
               shape: torch.Size) -> dict[str, Tensor]:
    """Gate, kernel and fix-up over the candidates; see ``_sat_kernels.c``. Returns the [B, T] ``gate`` map,
    the gated tokens' ``idx``, ``d``, ``psi``, ``def_pos``/``def_neg`` (1 - psi where d > 0 / d < 0, else 0),
    ``c_min``, the hits' ``hit``/``value``, and ``new_high``/``new_low`` (hits PPO's interval keeps)."""
    lib = library()
    m = pos.numel()
    gate = torch.zeros(shape, dtype=torch.bool)
    idx, hit = torch.empty(m + 8, dtype=torch.int64), torch.empty(m + 8, dtype=torch.int64)
    d_g, psi, def_pos, def_neg, val = (torch.empty(m + 8, dtype=torch.float32) for _ in range(5))
    counts, cmin = torch.zeros(4, dtype=torch.int64), torch.empty(1, dtype=torch.float32)
    # the bounds as torch rounds them: eps * psi in float32, PPO's bounds as float32 scalars
    f32 = lambda x: float(torch.tensor(x, dtype=torch.float32))  # noqa: E731
    lib.sat_gate_fixup(_ptr(pos), _ptr(d_c), _ptr(r_c), _ptr(a_c), m, float(q), f32(eps_high), f32(eps_low),
                       f32(1.0 + eps_high), f32(1.0 - eps_low), _ptr(gate), _ptr(idx), _ptr(d_g), _ptr(psi),
                       _ptr(def_pos), _ptr(def_neg), _ptr(hit), _ptr(val), _ptr(counts), _ptr(cmin))  # fmt: skip
    g, h, new_high, new_low = counts.tolist()
    return {
        "gate": gate, "idx": idx[:g], "d": d_g[:g], "psi": psi[:g], "def_pos": def_pos[:g], "def_neg": def_neg[:g],
        "c_min": cmin[0], "hit": hit[:h], "value": val[:h], "new_high": new_high, "new_low": new_low,
    }
