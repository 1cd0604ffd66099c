"""The CP patch's replacements for vllm-ascend's merges, and the state they share.

`CPMerge` is one process's patch: created by `install()`, dropped by `uninstall()`. Its bound
methods are what the patched vllm-ascend modules call in place of `common_cp`'s functions:

- `process_attn_out_lse` / `npu_attention_update` (decode, the pair vllm-ascend 0.23.0.post1's
  `AscendAttentionCPImpl._forward_decode_pcp_dcp` ends with): one rank's partial results are
  written once into a `[dcp, bs, H, D+1]` send buffer, exchanged into
  `[pcp*dcp, bs, H, D+1]` and merged from strided views of that buffer by our tensor-input
  operator (`ops.cp_merge`); contract kept: `(attn_output [bs, dcp*H, D], softmax_lse
  [bs, dcp*H, 1]) -> fp32 [bs, H, D]`;
- `npu_attn_out_lse_update` (prefill: PCP's mask/nomask halves, and a chunk's merge with its
  context in `_update_chunk_attn_out_lse_with_current_attn_out_lse`): the two partials into
  one `[2, T*N, D+1]`-shaped pair of tensors, merged by the same operator instead of
  torch_npu's TensorList `npu_attention_update`.

Rows of a rank without keys go out as 0 / `fill` (`masks`): outside graphs from the step's host
key counts, inside full decode graphs from `GraphMasks`, which `refresh_graph_masks` (after the
CP builder's `build`) writes before each replay.
"""

from __future__ import annotations

import dataclasses

import numpy
import torch

from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.patches.vllm_ascend_cp import masks
from vllm_npu_ext.patches.vllm_ascend_cp.kernel import KernelChoice

logger = get_logger(__name__)


def cp_group_coordinators():
    """vLLM's (DCP, PCP) GroupCoordinators (`.world_size`, `.rank_in_group`, `.device_group`)."""
    from vllm.distributed import get_dcp_group, get_pcp_group

    return get_dcp_group(), get_pcp_group()


def capturing() -> bool:
    capturing = getattr(getattr(torch, "npu", None), "is_current_stream_capturing", None)
    return capturing is not None and bool(capturing())


def local_kv_lengths(num_tokens: int):
    """Every CP rank's key count per decode request of this step, int `[bs, pcp, dcp]`
    (`decode_meta.num_computed_tokens_of_pcp_dcp` of the step's metadata), or None where the
    step's metadata has none for `num_tokens` decode rows (MLA, a prefill-only step, no
    forward context). The array is the metadata's own, so a step is known by its identity."""
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


class GraphMasksMissing(RuntimeError):
    """A full decode graph that needs empty-shard masks is captured without them."""


@dataclasses.dataclass
class CPMerge:
    """One process's CP patch. `kernel`: settled when the first module is patched;
    `shards_can_be_empty`: whether a decode step can leave a rank without keys at this CP
    size and interleave (`masks.decode_shards_can_be_empty`); `graph_rows`: the rows the
    graph masks are reserved for (the largest decode graph vLLM captures)."""

    kernel: KernelChoice | None = None
    shards_can_be_empty: bool = True
    graph_rows: int = 0
    graph_masks: masks.GraphMasks | None = None
    step_masks: masks.StepMasks = dataclasses.field(default_factory=masks.StepMasks)
    context_rows: masks.StepMasks = dataclasses.field(default_factory=masks.StepMasks)

    def ranks(self) -> masks.Ranks:
        dcp, pcp = cp_group_coordinators()
        return masks.Ranks(pcp.rank_in_group, dcp.rank_in_group)

    # -- decode -------------------------------------------------------------------------------

    def process_attn_out_lse(self, attn_output, softmax_lse):
        """Replaces `_process_attn_out_lse`: pack and exchange one rank's partial results.

        attn_output: `[bs, dcp*H, D]`; softmax_lse: `[bs, dcp*H, 1]`. Returns fp32
        `[pcp*dcp, bs, H, D+1]` (see `vllm_npu_ext.ops.cp_merge`)."""
        from vllm_npu_ext.ops.cp_merge import exchange, pack_out_lse

        rows, device = attn_output.shape[0], attn_output.device
        reads_empty_out = self.kernel.reads_empty_out(device)
        if capturing():
            empty, fill = self.graph_rows_for(rows, device)
        else:
            empty, fill = self.eager_rows_for(rows, device, reads_empty_out)
        dcp, pcp = cp_group_coordinators()
        groups = [g.device_group if g.world_size > 1 else None for g in (dcp, pcp)]
        buffer = pack_out_lse(attn_output, softmax_lse, dcp.world_size, empty, fill=fill,
                              zero_out=reads_empty_out)  # fmt: skip
        return exchange(buffer, *groups)

    def npu_attention_update(self, head_size, attn_out_lse):
        """Replaces `_npu_attention_update`: merge the exchanged buffer into fp32 `[bs, H, D]`.

        attn_out_lse: `[pcp*dcp, bs, H, D+1]` from `process_attn_out_lse`, or vllm-ascend's own
        `[pcp*bs, dcp*H, D+1]` (then reordered with one copy, as vllm-ascend does)."""
        from vllm_npu_ext.ops.cp_merge import from_vllm_ascend_layout, merge_cp_buffer

        if attn_out_lse.shape[-1] != head_size + 1:
            raise ValueError(f"attn_out_lse's last dim must be head_size + 1 = {head_size + 1}, "
                             f"got shape {tuple(attn_out_lse.shape)}")  # fmt: skip
        if attn_out_lse.dim() == 3:
            dcp, pcp = cp_group_coordinators()
            attn_out_lse = from_vllm_ascend_layout(attn_out_lse, dcp.world_size, pcp.world_size)
        return merge_cp_buffer(attn_out_lse, self.kernel.kernel)

    def eager_rows_for(self, rows: int, device, reads_empty_out: bool):
        """(empty, fill) of this step's decode rows from its host key counts, once per step
        (None, None where every row has keys here, or no CP metadata is in the context). At
        an eager step the graph masks are reserved too (the warm-up before a capture is one)."""
        step = local_kv_lengths(rows)
        if step is None:
            return None, None
        self.reserve_graph_masks(rows, device, reads_empty_out)
        ranks = self.ranks()
        return self.step_masks.get(step, (rows, device, ranks, reads_empty_out), lambda: (
            masks.eager_masks(step[:rows], ranks, reads_empty_out, device)))  # fmt: skip

    def reserve_graph_masks(self, rows: int, device, reads_empty_out: bool) -> None:
        """At an eager decode step on the NPU: the graph masks for the largest decode graph,
        unless no graph needs them or one already reads them."""
        if not self.shards_can_be_empty or device.type != "npu":
            return
        capacity = max(rows, self.graph_rows)
        holder = self.graph_masks
        if holder is None or (not holder.captured and holder.capacity < capacity):
            self.graph_masks = masks.GraphMasks(capacity, device, reads_empty_out)

    def graph_rows_for(self, rows: int, device):
        """While a graph is captured: views of `GraphMasks` for its `rows`, or (None, None)
        where no decode step can leave a rank without keys. A graph that needs masks and has
        none reserved is an error (it would merge what FIA wrote for a rank without keys)."""
        if not self.shards_can_be_empty:
            return None, None
        holder = self.graph_masks
        if holder is None or holder.capacity < rows or not holder.on(device):
            reserved = ("none" if holder is None else
                        f"{holder.capacity} rows on {holder.device_buffer.device}")
            raise GraphMasksMissing(
                f"vllm-npu-ext: a {rows}-row CP decode graph needs empty-shard masks and "
                f"{reserved} are reserved (they are reserved at the eager warm-up step vLLM runs "
                "before each capture). Capture with vLLM's warm-ups (cudagraph_num_of_warmups "
                f"at least 1), or set {_switch_name()}=0 to decode with vllm-ascend's own merge"
            )
        return holder.rows(rows)

    def refresh_graph_masks(self, metadata) -> None:
        """After the CP builder's `build`: the step's masks into `GraphMasks`, for the graphs
        (a step without decodes: every row empty, such a step replays none)."""
        holder = self.graph_masks
        if holder is None or not holder.captured or capturing():
            return
        decode = getattr(metadata, "decode_meta", None)
        lengths = getattr(decode, "num_computed_tokens_of_pcp_dcp", None)
        if lengths is None:
            lengths = numpy.zeros((0, 1, 1), dtype=numpy.int64)
        holder.refresh(lengths, self.ranks())

    # -- prefill ------------------------------------------------------------------------------

    def npu_attn_out_lse_update(self, attn_lse_mask, attn_lse_nomask, attn_out_mask,
                                attn_out_nomask):  # fmt: skip
        """Replaces `_npu_attn_out_lse_update`: two partials over disjoint keys (lse `[T, N, 1]`,
        out `[T, N, D]`, any float dtype) merged into fp32 `[T, N, D]` by our operator, in
        vllm-ascend's shard order (nomask, mask)."""
        from vllm_npu_ext.ops.cp_merge import merge_pair

        return merge_pair((attn_lse_nomask, attn_lse_mask), (attn_out_nomask, attn_out_mask),
                          self.kernel.kernel)  # fmt: skip

    def mask_empty_context(self, compute):
        """vllm-ascend's `_compute_prefill_context`, then the rows of a request with context on
        another rank but none here sent as out 0, lse -inf, whatever FIA wrote for its 0 keys
        (vllm-ascend merges them, reading them; requests without context anywhere are dropped
        after it, `chunk_seq_mask_filtered_indices`)."""
        patch = self

        def compute_prefill_context(self, query, kv_cache, attn_metadata):
            output, lse = compute(self, query, kv_cache, attn_metadata)
            chunked = attn_metadata.prefill.chunked_context
            if not chunked.local_total_toks:  # no FIA ran: vllm-ascend returned 0 / -inf
                return output, lse
            rows = patch.context_rows_on(chunked, masks.Ranks(self.pcp_rank, self.dcp_rank),
                                         output.device)  # fmt: skip
            if rows is None:
                return output, lse
            return output.masked_fill(rows, 0.0), lse.masked_fill(rows, masks.NEG_INF)

        return compute_prefill_context

    def context_rows_on(self, chunked, ranks: masks.Ranks, device):
        """`masks.empty_context_rows` as a bool `[tokens, 1, 1]` tensor on `device`, once per
        step (every layer of a step reads the same chunked-context metadata object)."""

        def compute():
            rows = masks.empty_context_rows(chunked, ranks)
            return None if rows is None else rows.to(device).view(-1, 1, 1)

        return self.context_rows.get(chunked, (ranks, device), compute)

    def refresh_after(self, build):
        """vllm-ascend's CP builder `build`, then the step's masks into `GraphMasks`."""
        patch = self

        def build_and_refresh_masks(self, *args, **kwargs):
            metadata = build(self, *args, **kwargs)
            patch.refresh_graph_masks(metadata)
            return metadata

        return build_and_refresh_masks


def _switch_name() -> str:
    from vllm_npu_ext import envs

    return envs.CP_PATCH.name
