"""Patch: vllm-ascend 0.23's context-parallel decode merge -> our tensor-input AttentionUpdate.

What it replaces. vllm-ascend's CP decode (`attention_cp.py`, and `mla_cp.py` for MLA) ends
with the pair, imported from `common_cp`:

    attn_out_lse = _process_attn_out_lse(attn_out, attn_lse)   # cat, permute+copy, all_to_all
                                                               # [dcp*H, D+1, bs], PCP all-gather
    attn_out = _npu_attention_update(head_size, attn_out_lse)  # permute+copy, split, unbind,
                                                               # torch_npu TensorList operator
It is replaced in those two caller modules by `process_attn_out_lse` / `npu_attention_update`
below: the local results are written once into a `[dcp, bs, H, D+1]` send buffer, exchanged
into `[pcp*dcp, bs, H, D+1]` and merged from strided views of that one buffer by
`torch.ops.vllm_npu_ext.attention_update` (no permute copy, no per-shard lists). Contract kept:
`(attn_output [bs, dcp*H, D], softmax_lse [bs, dcp*H, 1]) -> fp32 [bs, H, D]`.

A rank that holds no key of a request (requests shorter than the CP group, with
`cp_kv_cache_interleave_size` larger ones too) still gets FIA's result for it, which no document
defines. Outside graph capture the pair reads every rank's key counts of the step
(`decode_meta.num_computed_tokens_of_pcp_dcp`, from vLLM's forward context) and sends such rows as
out 0, lse -inf, and returns 0 for a request of which no rank holds a key (`empty_shard_masks`).
In a full decode graph no host code runs, so the masks are device memory (`GraphMasks`): the CP
metadata builder's `build` is wrapped to write the step's masks into it (before the forward, as
vllm-ascend's PCP runner writes the SFA DCP key lengths a graph reads, `pcp_utils.py:1958-1968`)
and the captured pair writes the lse through `torch.where` from them, in place of its lse copy.
Our merge gives a shard with lse -inf weight 0 without reading its out (kernel and reference),
so that is all the graph adds; with torch_npu's TensorList kernel (`list`), which reads it, the
out rows and all-empty rows are zeroed as outside graphs. Graphs carry the masks only where a
decode step can leave a rank without keys: rank r holds none while the sequence has at most
r * interleave tokens (`pcp_utils._get_cp_local_seq_lens`), and a decode step's sequence has at
least 2, so with (pcp*dcp - 1) * cp_kv_cache_interleave_size < 2 (DCP or PCP 2 at interleave 1,
vLLM's default) the graph is left as vllm-ascend's (its padding rows, 0 keys everywhere, are
discarded). MLA (`mla_cp`) gets the pair without masks: its metadata carries no key counts here.

The same holds for a prefill chunk's context: vllm-ascend runs FIA over each rank's part of the
requests' context and merges the ranks' results (`_update_out_and_lse`, which reads every
shard's out); a request with context on another rank but none here (a first chunk shorter than
the CP group, or than interleave x rank) gets FIA's result for 0 keys. `_compute_prefill_context`
is wrapped to send those rows as out 0, lse -inf (`_masking_empty_context`; eager, as prefill
attention always is).

When it applies. vLLM 0.23 loads general plugins in `WorkerWrapperBase.init_worker` before
the worker exists, with the config only in a local variable: the DCP/PCP sizes are not
known to `register()`. vllm-ascend imports `attention_cp`/`mla_cp` only from its backends'
`get_impl_cls`/`get_builder_cls` when `enable_cp()` (PCP or DCP > 1 in the current config),
which happens in workers while the model is built. So `install()` only adds an import hook
(cheap, imports nothing); the patch is applied when vllm-ascend itself imports a caller
module, i.e. in CP workers only. Each target is verified first (both functions present with
the expected parameters, and their sources those pinned in the patch table,
`patches/__init__.py`); if not, a warning is logged and that module is left untouched.
`VLLM_NPU_EXT_CP_PATCH=0` turns it off. The merge kernel
(VLLM_NPU_EXT_ATTENTION_UPDATE_KERNEL/_CONTIGUOUS) is read once, when the first module is patched.
`scripts/check_vllm_ascend_patch.py` checks the targets against vllm-ascend's sdist.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from types import ModuleType

import numpy

from vllm_npu_ext import patches
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.patches import on_import

logger = get_logger(__name__)

NAME = "vllm_ascend_cp"  # its row in the patch table
TESTED_VERSION = "0.23.0.post1"
COMMON_MODULE = "vllm_ascend.attention.context_parallel.common_cp"
CALLER_MODULES = (
    "vllm_ascend.attention.context_parallel.attention_cp",
    "vllm_ascend.attention.context_parallel.mla_cp",
)
# name -> parameters of vllm-ascend's function; replaced as a pair, never one alone.
TARGET_SIGNATURES = {
    "_process_attn_out_lse": ("attn_output", "softmax_lse"),
    "_npu_attention_update": ("head_size", "attn_out_lse"),
}
# Wrapped where defined (attention_cp): the CP builder's build, to refresh the graph masks
# every step, and the context chunk's attention, to mask requests without context here.
WRAPPED = {
    "AscendAttentionCPMetadataBuilder": "build",
    "AscendAttentionCPImpl": "_compute_prefill_context",
}
WRAPPED_MARKER = "__vllm_npu_ext_cp_wrapped__"
PATCHED_MARKER = "__vllm_npu_ext_cp_originals__"


# The AttentionUpdate kernel of the patched merge (`ops.attention_update.MergeKernel`), read
# from the environment once, when the first caller module is patched.
_merge_kernel = None


def cp_group_coordinators():
    """vLLM's (DCP, PCP) GroupCoordinators (`.world_size`, `.device_group`)."""
    from vllm.distributed import get_dcp_group, get_pcp_group

    return get_dcp_group(), get_pcp_group()


def _device_groups():
    """(DCP, PCP) torch.distributed groups, None where the group has one rank."""
    return tuple(g.device_group if g.world_size > 1 else None for g in cp_group_coordinators())


# Rows of the current merge where no CP rank holds a key (bool `[bs]` on the device), set by
# `process_attn_out_lse` for the `npu_attention_update` call that follows it in the same layer.
_rows_without_keys = None
# The masks of the step being run: (its key-count array, bs, device, masks). Every layer of a
# step reads the same metadata object (one per KV-cache group), so they are computed once; the
# CP builder makes a new array every step (`np.array(...)` in AscendAttentionCPMetadataBuilder
# .build; the PCP manager's refresh assigns a new `.numpy()` view), so its identity names the step.
_step_masks = None


class GraphMasks:
    """The empty-shard masks full decode graphs read: device memory written outside the graph.

    masks: bool `[2, capacity]`, row 0 this rank's empty rows, row 1 rows empty on every rank;
    rows past a step's requests read as empty everywhere (a graph's padding: FIA is given 0
    keys there, `attention_cp.py:383-389`). neg_inf: the fp32 -inf the lse is written from.
    Allocated outside capture (at the eager warm-up vllm-ascend runs before each capture,
    `cudagraph_num_of_warmups = 1`, platform.py:533; vLLM captures the largest size first),
    and never reallocated once a graph has read it."""

    def __init__(self, capacity: int, device):
        import torch

        self.masks = torch.ones((2, capacity), dtype=torch.bool, device=device)
        self.neg_inf = torch.full((), float("-inf"), dtype=torch.float32, device=device)
        self.captured = False
        self._host = None  # the host copy last written, alive until the next write

    @property
    def capacity(self) -> int:
        return self.masks.shape[1]

    def on(self, device) -> bool:
        """Whether the masks are on `device` (`npu` names the current one)."""
        mine = self.masks.device
        return mine.type == device.type and device.index in (None, mine.index)

    def refresh(self, lengths) -> None:
        """Write the masks of a step's key counts (int `[bs, pcp, dcp]`), non-blocking."""
        import torch

        host = numpy.ones((2, self.capacity), dtype=bool)
        rows = min(len(lengths), self.capacity)
        if rows:
            host[0, :rows], host[1, :rows] = rank_and_all_empty(numpy.asarray(lengths)[:rows])
        # Non-blocking, as vllm-ascend copies per-step key lengths into the buffer its graphs
        # read (pcp_utils.py:1962-1967); the source is kept until the next step's.
        self._host = torch.from_numpy(host)
        self.masks.copy_(self._host, non_blocking=True)


_graph_masks: GraphMasks | None = None
# Whether a decode step can leave a rank without keys (module docstring), settled when the
# first caller module is patched, from the vLLM config being loaded; None: not known (masks).
_decode_shards_can_be_empty: bool | None = None


def _capturing() -> bool:
    import torch

    capturing = getattr(getattr(torch, "npu", None), "is_current_stream_capturing", None)
    return capturing is not None and bool(capturing())


def rank_and_all_empty(lengths):
    """(this rank's rows without keys, rows without keys on every rank) of int `[bs, pcp, dcp]`
    key counts, as bool numpy `[bs]` arrays."""
    dcp, pcp = cp_group_coordinators()
    local = lengths[:, pcp.rank_in_group, dcp.rank_in_group] == 0
    everywhere = (lengths == 0).reshape(len(lengths), -1).all(axis=1)
    return local, everywhere


def decode_shards_can_be_empty(config) -> bool:
    """Whether a decode step (at least 2 tokens per sequence) can leave a CP rank without
    keys under `config` (a VllmConfig, or None: assume it can)."""
    if config is None:
        return True
    parallel = config.parallel_config
    ranks = parallel.decode_context_parallel_size * parallel.prefill_context_parallel_size
    return (ranks - 1) * parallel.cp_kv_cache_interleave_size >= 2


def local_kv_lengths(num_tokens: int):
    """Every CP rank's key count per decode request of this step, as vllm-ascend's CP builder
    computed it: int `[bs, pcp, dcp]` (`decode_meta.num_computed_tokens_of_pcp_dcp`, the lengths
    FIA is called with, `attention_cp.py:610-612`), or None where the step's metadata has none
    for `num_tokens` decode rows (MLA, a prefill-only step, no forward context). The array is
    the metadata's own (rows past `num_tokens` included), so a step is known by its identity."""
    from vllm.forward_context import get_forward_context, is_forward_context_available

    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    for per_layer in metadata if isinstance(metadata, list) else [metadata]:
        for layer_metadata in (per_layer or {}).values():
            decode = getattr(layer_metadata, "decode_meta", None)
            lengths = getattr(decode, "num_computed_tokens_of_pcp_dcp", None)
            if lengths is not None and getattr(layer_metadata, "num_decodes", None) == num_tokens:
                return lengths
    return None


def empty_shard_masks(num_tokens: int, device) -> tuple[object, object]:
    """(this rank's empty rows, rows empty on every rank): bool `[bs]` device tensors, each
    None when no row is so. A rank holds no key of a request while the request is shorter
    than its first key on that rank (`pcp_utils._get_cp_local_seq_lens`). Read from the host
    lengths of this step, so never while a graph is captured: a replay would reuse the masks
    of the capture (there the merge runs as vllm-ascend's does, on what FIA wrote)."""
    import torch

    if _capturing():
        return None, None
    global _step_masks
    step = local_kv_lengths(num_tokens)
    if step is None:
        return None, None
    _reserve_graph_masks(num_tokens, device)
    if _step_masks is not None and _step_masks[0] is step and _step_masks[1:3] == (
        num_tokens, device
    ):
        return _step_masks[3]
    local, everywhere = rank_and_all_empty(numpy.asarray(step)[:num_tokens])
    masks = tuple(
        torch.from_numpy(rows).to(device) if rows.any() else None for rows in (local, everywhere)
    )
    _step_masks = (step, num_tokens, device, masks)
    return masks


def _reserve_graph_masks(num_tokens: int, device) -> None:
    """At an eager decode step (the warm-up before a capture is one): make the graph masks
    hold `num_tokens` rows, unless no graph needs them or one already reads them."""
    global _graph_masks
    if _decode_shards_can_be_empty is False or device.type != "npu":
        return
    if _graph_masks is None or (not _graph_masks.captured and _graph_masks.capacity < num_tokens):
        _graph_masks = GraphMasks(num_tokens, device)


def graph_masks(num_tokens: int, device):
    """While a graph is captured: (this rank's empty rows, rows empty everywhere) as views of
    `GraphMasks`, and its -inf; (None, None, None) where no decode step can leave a rank
    without keys, or (with a warning) where no masks were reserved for `num_tokens` rows."""
    if _decode_shards_can_be_empty is False:
        return None, None, None
    holder = _graph_masks
    if holder is None or holder.capacity < num_tokens or not holder.on(device):
        logger.warning_once(
            "vllm-npu-ext: no empty-shard masks for a %d-row decode graph (none reserved at "
            "an eager step before it); it merges what FIA wrote for a rank without keys",
            num_tokens,
        )
        return None, None, None
    holder.captured = True
    return holder.masks[0, :num_tokens], holder.masks[1, :num_tokens], holder.neg_inf


def _refresh_graph_masks(metadata) -> None:
    """After the CP builder's build: the step's masks into `GraphMasks`, for the graphs."""
    holder = _graph_masks
    decode = getattr(metadata, "decode_meta", None)
    lengths = getattr(decode, "num_computed_tokens_of_pcp_dcp", None)
    if holder is None or not holder.captured or _capturing():
        return
    if lengths is None:  # a step without decodes: every row empty (such a step replays none)
        lengths = numpy.zeros((0, 1, 1), dtype=numpy.int64)
    holder.refresh(lengths)


def process_attn_out_lse(attn_output, softmax_lse):
    """Replaces `_process_attn_out_lse`: pack and exchange one rank's partial results.

    attn_output: `[bs, dcp*H, D]`; softmax_lse: `[bs, dcp*H, 1]`. A request of which this
    rank holds no key is sent as out 0, lse -inf (`empty_shard_masks`), whatever FIA wrote.
    Returns fp32 `[pcp*dcp, bs, H, D+1]` (see `vllm_npu_ext.ops.cp_merge`).
    """
    from vllm_npu_ext.ops.attention_update import merge_reads_empty_out
    from vllm_npu_ext.ops.cp_merge import exchange, group_size, pack_out_lse

    global _rows_without_keys
    rows, device = attn_output.shape[0], attn_output.device
    neg_inf, zero_out = None, True
    if _capturing():
        empty, _rows_without_keys, neg_inf = graph_masks(rows, device)
        zero_out = merge_reads_empty_out(_merge_kernel, device)
        if not zero_out:
            _rows_without_keys = None  # our merge gives 0 there itself
    else:
        empty, _rows_without_keys = empty_shard_masks(rows, device)
    dcp_group, pcp_group = _device_groups()
    buffer = pack_out_lse(
        attn_output, softmax_lse, group_size(dcp_group), empty, neg_inf=neg_inf, zero_out=zero_out
    )
    return exchange(buffer, dcp_group, pcp_group)


def npu_attention_update(head_size, attn_out_lse):
    """Replaces `_npu_attention_update`: merge the exchanged buffer into fp32 `[bs, H, D]`.

    attn_out_lse: `[pcp*dcp, bs, H, D+1]` from `process_attn_out_lse`, or vllm-ascend's own
    `[pcp*bs, dcp*H, D+1]` (then reordered with one copy, as vllm-ascend does).
    """
    from vllm_npu_ext.ops.cp_merge import merge_cp_buffer

    if attn_out_lse.shape[-1] != head_size + 1:
        raise ValueError(
            f"attn_out_lse's last dim must be head_size + 1 = {head_size + 1}, "
            f"got shape {tuple(attn_out_lse.shape)}"
        )
    if attn_out_lse.dim() == 3:
        dcp, pcp = cp_group_coordinators()
        attn_out_lse = _from_vllm_ascend_layout(attn_out_lse, dcp.world_size, pcp.world_size)
    global _rows_without_keys
    rows, _rows_without_keys = _rows_without_keys, None
    merged = merge_cp_buffer(attn_out_lse, _merge_kernel)
    if rows is not None and rows.shape[0] == merged.shape[0]:
        # Our kernel and the reference give 0 there already; torch_npu's TensorList kernel
        # evaluates exp(-inf - -inf) (NaN), so the `list` choice needs this.
        merged.masked_fill_(rows.view(-1, 1, 1), 0.0)
    return merged


def _from_vllm_ascend_layout(buffer, dcp_size: int, pcp_size: int):
    """`[pcp*bs, dcp*H, D+1]` -> contiguous `[pcp*dcp, bs, H, D+1]` (one copy)."""
    rows, heads, width = buffer.shape
    shards = buffer.view(pcp_size, rows // pcp_size, dcp_size, heads // dcp_size, width)
    shards = shards.transpose(1, 2).contiguous()
    return shards.view(pcp_size * dcp_size, rows // pcp_size, heads // dcp_size, width)


REPLACEMENTS = {
    "_process_attn_out_lse": process_attn_out_lse,
    "_npu_attention_update": npu_attention_update,
}


def target_problem(module: ModuleType) -> str | None:
    """Why `module` cannot be patched (a missing or changed target), or None."""
    for name, expected in TARGET_SIGNATURES.items():
        original = getattr(module, name, None)
        if original is None or not callable(original):
            return f"{module.__name__}.{name} does not exist"
        params = tuple(inspect.signature(original).parameters)
        if params != expected:
            return f"{module.__name__}.{name}{params} no longer takes {expected}"
    return None


def patch_module(module: ModuleType) -> bool:
    """Replace the merge pair in one caller module; warn and leave it alone if unverified."""
    if all(getattr(module, name, None) is new for name, new in REPLACEMENTS.items()):
        return True
    problem = target_problem(module)
    if problem is not None:
        logger.warning(
            "vllm-npu-ext: CP merge patch not applied, vllm-ascend left as is: %s", problem
        )
        return False
    targets = [target for target in patches.PATCHES[NAME].pins
               if target.startswith((COMMON_MODULE + ":", module.__name__ + ":"))]  # fmt: skip
    if patches.refusals(NAME, lambda target: _pinned_object(module, target), targets):
        return False
    _choose_merge_kernel()
    _settle_empty_shards()
    setattr(module, PATCHED_MARKER, {name: getattr(module, name) for name in REPLACEMENTS})
    for name, replacement in REPLACEMENTS.items():
        setattr(module, name, replacement)
    for class_name, method in WRAPPED.items():
        owner = getattr(module, class_name, None)
        if owner is not None and method in vars(owner):
            setattr(owner, WRAPPED_MARKER, vars(owner)[method])
            setattr(owner, method, WRAPPERS[method](vars(owner)[method]))
    logger.info(
        "vllm-npu-ext: %s CP decode merge -> vllm_npu_ext.attention_update", module.__name__
    )
    _register_graph_converter()
    return True


def _pinned_object(module: ModuleType, target: str):
    """The object a pin names, as `module` (a caller) holds it: the pair as it imported it,
    its own classes' methods by qualified name."""
    qualname = target.rpartition(":")[2]
    if target.startswith(COMMON_MODULE + ":"):
        return getattr(module, qualname)
    owner = module
    for part in qualname.split("."):
        owner = getattr(owner, part)
    return owner


def _refreshing_masks(build):
    """vllm-ascend's CP builder `build`, then the step's masks into `GraphMasks`."""

    @functools.wraps(build)
    def build_and_refresh_masks(self, *args, **kwargs):
        metadata = build(self, *args, **kwargs)
        _refresh_graph_masks(metadata)
        return metadata

    return build_and_refresh_masks


def _masking_empty_context(compute):
    """vllm-ascend's `_compute_prefill_context` (FIA of a prefill chunk's queries over this
    rank's part of their context), then the rows of a request with context on another rank
    but none here sent as out 0, lse -inf, whatever FIA wrote for its 0 keys (vllm-ascend
    merges them with `_update_out_and_lse`, which reads them; requests without context
    anywhere are dropped after it, `chunk_seq_mask_filtered_indices`)."""

    @functools.wraps(compute)
    def compute_prefill_context(self, query, kv_cache, attn_metadata):
        output, lse = compute(self, query, kv_cache, attn_metadata)
        chunked = attn_metadata.prefill.chunked_context
        if not chunked.local_total_toks:  # no FIA ran: vllm-ascend returned 0 / -inf
            return output, lse
        rows = _context_rows_on(chunked, self.pcp_rank, self.dcp_rank, output.device)
        if rows is None:
            return output, lse
        return output.masked_fill(rows, 0.0), lse.masked_fill(rows, float("-inf"))

    return compute_prefill_context


# The context rows of the step being run: (its chunked-context metadata, rank, rows). Every
# layer of a step reads the same metadata object, so the rows are read from it once.
_context_rows = None


def _context_rows_on(chunked, pcp_rank: int, dcp_rank: int, device):
    """`empty_context_rows` as a bool `[tokens, 1, 1]` tensor on `device`, once per step."""
    global _context_rows
    key = (pcp_rank, dcp_rank, device)
    if _context_rows is None or _context_rows[0] is not chunked or _context_rows[1] != key:
        rows = empty_context_rows(chunked, pcp_rank, dcp_rank)
        rows = None if rows is None else rows.to(device).view(-1, 1, 1)
        _context_rows = (chunked, key, rows)
    return _context_rows[2]


def empty_context_rows(chunked, pcp_rank: int, dcp_rank: int):
    """Bool host `[query tokens]`: the tokens of requests with context on another rank but
    none on this one, from vllm-ascend's chunked-context metadata (`local_context_lens_allranks`
    `[reqs, pcp, dcp]`, `actual_chunk_seq_lengths` the cumulative query lengths FIA took);
    None when there is no such request."""
    import torch

    lengths = chunked.local_context_lens_allranks.cpu()
    somewhere = lengths.flatten(1).sum(dim=1) > 0
    empty = (lengths[:, pcp_rank, dcp_rank] == 0) & somewhere
    if not bool(empty.any()):
        return None
    ends = torch.as_tensor(chunked.actual_chunk_seq_lengths).cpu().long()
    tokens = torch.diff(ends, prepend=ends.new_zeros(1))
    return torch.repeat_interleave(empty, tokens)


WRAPPERS = {"build": _refreshing_masks, "_compute_prefill_context": _masking_empty_context}


def _settle_empty_shards() -> None:
    global _decode_shards_can_be_empty
    if _decode_shards_can_be_empty is None:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        _decode_shards_can_be_empty = decode_shards_can_be_empty(config)
        if config is not None:
            logger.info(
                "vllm-npu-ext: CP decode graphs %s empty-shard masks (a decode step %s leave "
                "a rank without keys at this CP size and cp_kv_cache_interleave_size)",
                "carry" if _decode_shards_can_be_empty else "need no",
                "can" if _decode_shards_can_be_empty else "cannot",
            )


def _choose_merge_kernel() -> None:
    global _merge_kernel
    if _merge_kernel is None:
        from vllm_npu_ext.ops.attention_update import MergeKernel

        _merge_kernel = MergeKernel.from_env()
        logger.info("vllm-npu-ext: CP merge kernel %s", _merge_kernel)


def _register_graph_converter() -> None:
    """vllm-ascend may compile the decode step with torchair: teach it our operator."""
    from vllm_npu_ext.cann_ops import binding

    if binding.register_graph_converter():
        logger.info("vllm-npu-ext: torchair converter for NpuExtAttentionUpdate registered")


def unpatch_module(module: ModuleType) -> None:
    """Restore vllm-ascend's functions in a patched module."""
    for name, original in (getattr(module, PATCHED_MARKER, None) or {}).items():
        setattr(module, name, original)
    if hasattr(module, PATCHED_MARKER):
        delattr(module, PATCHED_MARKER)
    for class_name, method in WRAPPED.items():
        owner = getattr(module, class_name, None)
        if owner is not None and WRAPPED_MARKER in vars(owner):
            setattr(owner, method, vars(owner)[WRAPPED_MARKER])
            delattr(owner, WRAPPED_MARKER)


class PatchOnImport(on_import.PatchOnImport):
    """Patches vllm-ascend's CP caller modules when vllm-ascend imports them."""

    def __init__(self):
        super().__init__(dict.fromkeys(CALLER_MODULES, patch_module))


def _vllm_ascend_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm-ascend")
    except PackageNotFoundError:
        return "unknown"


def install() -> list[str]:
    """Arrange for the patch (see the module docstring); returns what was arranged."""
    if importlib.util.find_spec("vllm_ascend") is None:
        return []
    version = _vllm_ascend_version()
    if version != TESTED_VERSION:
        logger.warning(
            "vllm-npu-ext: CP merge patch written for vllm-ascend %s, found %s; "
            "targets are still verified before patching",
            TESTED_VERSION,
            version,
        )
    on_import.install(PatchOnImport())
    return [
        f"vllm-ascend {version} CP decode merge -> attention_update (on import of "
        "attention_cp/mla_cp, i.e. when DCP or PCP > 1)"
    ]


def uninstall() -> None:
    """Remove the import hook and restore every patched module."""
    global _merge_kernel, _graph_masks, _decode_shards_can_be_empty, _context_rows
    on_import.uninstall(PatchOnImport)
    _merge_kernel = _graph_masks = _decode_shards_can_be_empty = _context_rows = None
    for name in CALLER_MODULES:
        if name in sys.modules:
            unpatch_module(sys.modules[name])
