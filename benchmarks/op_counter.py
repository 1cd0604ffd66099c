"""The device-operator counter `count_ops.py` and `_vllm_ascend_engine.py` share.

A torch dispatch mode that counts every operator that launches work on the device, as a
dispatch mode sees them: each torch_npu operator (one opaque `npu::` torch operator under the
emulator, as on a real NPU) and every ATen operator that launches work on activations (views,
aliases and bare allocations excluded).
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Allocations and reshapes that move no data launch no device work.
FREE_OPS = {
    "empty.memory_format", "empty_like.default", "empty_strided.default", "_unsafe_view.default",
}


class OpCounter(TorchDispatchMode):
    """Counts operators, under the name of the graph piece running (`piece`).

    A torch_npu operator counts once (what it does inside is the device's). Our own Python
    ops (`vllm_npu_ext::`) count once as operators, and the operators they issue are counted
    apart, as `device_ops` of the piece.
    """

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.by_piece: dict[str, Counter[str]] = {}
        self.device_ops: dict[str, Counter[str]] = {}
        self.piece: str | None = None
        self._inside: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _launches_work(func):
            return func(*args, **kwargs)
        name = _op_name(func)
        if self._inside is not None:  # issued by one of our ops
            self.device_ops.setdefault(self.piece, Counter())[name] += 1
            return func(*args, **kwargs)
        self.ops[name] += 1
        if self.piece is not None:
            self.by_piece.setdefault(self.piece, Counter())[name] += 1
        if func.namespace != "vllm_npu_ext":
            return func(*args, **kwargs)
        self._inside = name
        try:
            with self:  # its kernel (one for every backend), with its operators seen
                return func._op_dk(torch._C.DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
        finally:
            self._inside = None


def _op_name(func) -> str:
    namespace = {"npu": "torch_npu"}.get(func.namespace, func.namespace)
    return f"{namespace}.{func._opname}" if namespace != "aten" else f"aten.{func.__name__}"


def _launches_work(func) -> bool:
    """False for views (a result aliasing an input, unwritten) and bare allocations."""
    if func.__name__ in FREE_OPS:
        return False
    returns = func._schema.returns
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in returns)
