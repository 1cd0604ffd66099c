"""The device-launch counter `count_ops.py` and `_vllm_ascend_engine.py` share.

A torch dispatch mode that counts every operator that launches work on the device, as a
dispatch mode sees them: each torch_npu operator (one opaque `npu::` torch operator under the
emulator, as on a real NPU), each vllm-ascend library or Triton kernel (one launch), and every
ATen operator that launches work on activations (views, aliases and bare allocations excluded).

Custom operators whose kernel is host code issuing device work (`HOST_CODE_OPS`: ours, and
vLLM's and vllm-ascend's Python custom ops) are not launches themselves: the counter enters
them and counts what they issue, attributed to them (`inside`), so stock's attention op shows
as its ReshapeAndCache, FIA and result copy. With `measure_bytes`, each launch's bytes are
summed from tensor sizes: read = its tensor arguments, written = its results and the
arguments it writes (in place, `out=`), a result that is a written argument counted once; a
table read by position and a cache written by slot count the rows touched. FIA's compressed
causal mask (2048 x 2048 bool, 4 MiB) counts whole on every call, though the kernel reads only
the tiles its sequences need.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

# Allocations and reshapes that move no data launch no device work.
FREE_OPS = {
    "empty.memory_format", "empty_like.default", "empty_strided.default", "_unsafe_view.default",
}
# Custom operators whose kernel is host code (sources: ours `model_executor/layers/
# cache_free/op.py`; vLLM 0.23 `attention/layer.py` unified_attention(_with_output), vllm-ascend
# 0.23 `ops/register_custom_ops.py` maybe_chunk_residual, maybe_pad_and_reduce: Python
# functions registered for the NPU key that call torch_npu / ATB / collectives).
HOST_CODE_OPS = {
    "vllm_npu_ext::cache_free_attention", "vllm_npu_ext::cache_free_attention_in_graph",
    "vllm::unified_attention_with_output", "vllm::unified_attention",
    "vllm::maybe_chunk_residual", "vllm::maybe_pad_and_reduce",
}  # fmt: skip


class OpCounter(TorchDispatchMode):
    """Counts launches (module docstring), under the name of the graph piece running (`piece`).

    ops: the operators the host dispatched at the top level (a host-code op once, by name);
    launches: device launches, those inside host-code ops included; inside: host-code op ->
    the launches it issued; device_ops: piece -> launches issued inside host-code ops there;
    bytes: launch -> [bytes read, bytes written] (with `measure_bytes`).
    """

    def __init__(self, measure_bytes: bool = False):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.launches: Counter[str] = Counter()
        self.inside: dict[str, Counter[str]] = defaultdict(Counter)
        self.by_piece: dict[str, Counter[str]] = {}
        self.device_ops: dict[str, Counter[str]] = {}
        self.bytes: dict[str, list[int]] = defaultdict(lambda: [0, 0])
        self.piece: str | None = None
        self.measure_bytes = measure_bytes
        self._inside: str | None = None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not _launches_work(func) or _copies_onto_itself(func, args):
            return func(*args, **kwargs)
        name = _op_name(func)
        if self._inside is None:
            self.ops[name] += 1
            if self.piece is not None:
                self.by_piece.setdefault(self.piece, Counter())[name] += 1
        if func.name() in HOST_CODE_OPS and self._inside is None:
            return self._enter(func, name, args, kwargs)
        if self._inside is not None:
            self.inside[self._inside][name] += 1
            self.device_ops.setdefault(self.piece, Counter())[name] += 1
        self.launches[name] += 1
        out = func(*args, **kwargs)
        if self.measure_bytes:
            read, written = _bytes(func, args, kwargs, out)
            self.bytes[name][0] += read
            self.bytes[name][1] += written
        return out

    def _enter(self, func, name: str, args, kwargs):
        """Run a host-code op's kernel with this counter on, its launches attributed to it."""
        key = next(k for k in ("PrivateUse1", "CompositeExplicitAutograd", "CPU")
                   if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), k))  # fmt: skip
        self._inside = name
        self.inside.setdefault(name, Counter())
        try:
            with self:
                return func._op_dk(getattr(torch._C.DispatchKey, key), *args, **kwargs)
        finally:
            self._inside = None


def _op_name(func) -> str:
    namespace = {"npu": "torch_npu"}.get(func.namespace, func.namespace)
    return f"{namespace}.{func._opname}" if namespace != "aten" else f"aten.{func.__name__}"


def _launches_work(func) -> bool:
    """False for views (a result aliasing an input, unwritten), bare allocations and the
    stand-in device's own control calls (`npu_host::`, no device work)."""
    if func.__name__ in FREE_OPS or func.namespace == "npu_host":
        return False
    returns = func._schema.returns
    return not any(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _copies_onto_itself(func, args) -> bool:
    """`dst.copy_(src)` of the same data (memory, sizes, strides, dtype): PyTorch's copy_
    returns before any kernel (aten/src/ATen/native/Copy.cpp, copy_impl's `is_same_data`).
    vllm-ascend's attention does one per layer (vllm-ascend 0.23.0.post1
    `AscendAttentionBackendImpl.forward`'s `output[:num_tokens] = attn_output[:num_tokens]`, after
    `forward_fused_infer_attention` copied FIA's result into the same output rows)."""
    if func.__name__ != "copy_.default" or len(args) < 2:
        return False
    dst, src = args[0], args[1]
    return (isinstance(src, torch.Tensor) and dst.data_ptr() == src.data_ptr()
            and dst.shape == src.shape and dst.stride() == src.stride()
            and dst.dtype == src.dtype)  # fmt: skip


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def _tensors(value) -> list[torch.Tensor]:
    return [leaf for leaf in tree_flatten(value)[0] if isinstance(leaf, torch.Tensor)]


# Arguments a kernel touches only in part, by index (the rest of the tensor moves nothing):
# a cos/sin table read at `positions` (vLLM's `cos_sin_cache`: npu_mrope, vllm-ascend's
# rotary and q/k norm + RoPE kernels), and paged caches written at `slot_indices` /
# `slot_mapping` (ATB ReshapeAndCache, `reshape_and_cache_nd.cpp`: one row per token).
TABLES_BY_POSITION = ("cos_sin_cache",)
SLOT_INDICES = ("slot_indices", "slot_mapping")


def _touched(name: str, tensor: torch.Tensor, bound: dict, writes: bool) -> int:
    """Bytes of `tensor` (argument `name`, written or read) a launch touches: the rows it
    indexes, else all."""
    positions = bound.get("positions")
    if name in TABLES_BY_POSITION and isinstance(positions, torch.Tensor):
        return positions.shape[-1] * tensor[0].numel() * tensor.element_size()
    slots = next((bound[k] for k in SLOT_INDICES if isinstance(bound.get(k), torch.Tensor)), None)
    if writes and slots is not None and tensor.dim() >= 3:
        row = tensor.numel() // (tensor.shape[0] * tensor.shape[1])  # [blocks, block_size, ...]
        return slots.numel() * row * tensor.element_size()
    return tensor.numel() * tensor.element_size()


def _bytes(func, args, kwargs, out) -> tuple[int, int]:
    """(read, written) of one launch from tensor sizes (module docstring), indexed tables and
    caches counted by the rows touched (`_touched`)."""
    read = written = 0
    seen: set[int] = set()
    bound = dict(zip((a.name for a in func._schema.arguments), args, strict=False))
    bound.update(kwargs)
    for argument in func._schema.arguments:
        writes = argument.name == "out" or (
            argument.alias_info is not None and argument.alias_info.is_write)  # fmt: skip
        for tensor in _tensors(bound.get(argument.name)):
            size = _touched(argument.name, tensor, bound, writes)
            if writes:
                written += size
                seen.add(tensor.data_ptr())
            else:
                read += size
    fresh = [t for t in _tensors(out) if t.data_ptr() not in seen]
    return read, written + _nbytes(fresh)
