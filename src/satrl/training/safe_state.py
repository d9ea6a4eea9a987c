"""Python state as JSON plus a safetensors file: a format whose loading cannot run code (unlike pickle).

:func:`encode` turns a tree of ``None``/``bool``/``int``/``float``/``str``, lists, tuples, dicts, tensors
and registered dataclasses into a JSON-ready tree and a ``{name: tensor}`` dict; :func:`decode` inverts
it. Tensors become ``{"__tensor__": name}``; tuples ``{"__tuple__": [...]}``; dicts whose keys are not all
strings ``{"__items__": [[key, value], ...]}``; non-finite floats ``{"__float__": "nan" | "inf" | "-inf"}``
(the file stays strict JSON); a dataclass ``{"__dataclass__": class name, "fields": {...}}``, rebuilt only
if its name is in the ``classes`` allow-list the reader passes. Anything else is refused on both sides.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

_MARKERS = ("__tensor__", "__tuple__", "__items__", "__float__", "__dataclass__")


class UnsafeStateError(ValueError):
    """The state holds (or a file claims) something outside the safe format."""


def _cpu(t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to("cpu")
    # safetensors refuses views and tensors sharing storage: give each its own compact storage
    if not t.is_contiguous() or t.untyped_storage().nbytes() != t.numel() * t.element_size():
        t = t.clone(memory_format=torch.contiguous_format)
    return t


def encode(obj: Any) -> tuple[Any, dict[str, torch.Tensor]]:
    """``(json_tree, tensors)`` for ``obj``; see the module docstring."""
    tensors: dict[str, torch.Tensor] = {}

    def enc(x: Any) -> Any:
        if x is None or isinstance(x, (bool, str)):
            return x
        if isinstance(x, int):
            return int(x)
        if isinstance(x, float):
            return x if math.isfinite(x) else {"__float__": str(x)}
        if isinstance(x, torch.Tensor):
            name = f"t{len(tensors)}"
            tensors[name] = _cpu(x)
            return {"__tensor__": name}
        if isinstance(x, tuple):
            return {"__tuple__": [enc(v) for v in x]}
        if isinstance(x, list):
            return [enc(v) for v in x]
        if isinstance(x, dict):
            if all(isinstance(k, str) for k in x) and not any(k in _MARKERS for k in x):
                return {k: enc(v) for k, v in x.items()}
            return {"__items__": [[enc(k), enc(v)] for k, v in x.items()]}
        if dataclasses.is_dataclass(x) and not isinstance(x, type):
            fields = {f.name: enc(getattr(x, f.name)) for f in dataclasses.fields(x)}
            return {"__dataclass__": type(x).__name__, "fields": fields}
        raise UnsafeStateError(f"cannot store a {type(x).__name__} in a checkpoint (not a plain value)")

    return enc(obj), tensors


def decode(tree: Any, tensors: dict[str, torch.Tensor], classes: dict[str, type] = {}) -> Any:  # noqa: B006
    """Invert :func:`encode`; dataclasses are rebuilt only for names in ``classes``."""

    def dec(x: Any) -> Any:
        if isinstance(x, list):
            return [dec(v) for v in x]
        if not isinstance(x, dict):
            return x
        if "__tensor__" in x:
            if x["__tensor__"] not in tensors:
                raise UnsafeStateError(f"checkpoint names a tensor {x['__tensor__']!r} its tensor file lacks")
            return tensors[x["__tensor__"]]
        if "__tuple__" in x:
            return tuple(dec(v) for v in x["__tuple__"])
        if "__items__" in x:
            return {_hashable(dec(k)): dec(v) for k, v in x["__items__"]}
        if "__float__" in x:
            return float(x["__float__"])
        if "__dataclass__" in x:
            cls = classes.get(x["__dataclass__"])
            if cls is None:
                raise UnsafeStateError(f"checkpoint holds a {x['__dataclass__']!r}, not an allowed type {sorted(classes)}")
            known = {f.name for f in dataclasses.fields(cls)}  # fields a later version removed are dropped
            return cls(**{k: dec(v) for k, v in x["fields"].items() if k in known})
        return {k: dec(v) for k, v in x.items()}

    return dec(tree)


def _hashable(k: Any) -> Any:
    if isinstance(k, (dict, list)):
        raise UnsafeStateError(f"checkpoint has an unhashable key {k!r}")
    return k
