"""A vLLM worker extension (`worker_extension_cls`) for the CP decode engine tests: methods
each worker runs on `collective_rpc`, to read what its decode steps called.

Probes are wrappers around the stand-in's `torch_npu` functions, which vllm-ascend looks up
on every call (`torch_npu.npu_fused_infer_attention_score`, `torch_npu.npu_attention_update`,
`torch_npu._npu_reshape_and_cache`) and around `AscendAttentionCPImpl._forward_decode_pcp_dcp`,
looked up on the class: they count and pass every call through unchanged.
"""

from __future__ import annotations

import collections
import functools
import importlib
import sys

ATTENTION_CP = "vllm_ascend.attention.context_parallel.attention_cp"
counts: collections.Counter[str] = collections.Counter()
_state = {"in_decode": False, "replays_at_reset": 0, "updates_at_reset": 0}
CAPTURED_OURS = "npu_ext_cann.npu_ext_attention_update.default"


def _counting(name, function, observe=None):
    @functools.wraps(function)
    def probe(*args, **kwargs):
        counts[name] += 1
        if _state["in_decode"]:
            counts[f"{name} in CP decode"] += 1
        if observe is not None:
            observe(*args, **kwargs)
        return function(*args, **kwargs)

    probe.__wrapped_by_cp_probe__ = function
    return probe


def _fia_observed(*args, block_table=None, **kwargs):
    if block_table is not None:
        counts["paged FIA"] += 1


def _slots_observed(*args, slot_indices=None, **kwargs):
    if slot_indices is not None:
        counts["negative slots"] += int((slot_indices < 0).sum())
        counts["slots"] += slot_indices.numel()


def _logits_observed(function):
    """The largest |logit| the model computed (bf16: what bounds logprob differences)."""

    @functools.wraps(function)
    def probe(*args, **kwargs):
        logits = function(*args, **kwargs)
        if logits is not None and logits.numel():
            largest = float(logits.float().abs().max())
            counts["largest |logit|"] = max(counts["largest |logit|"], largest)
        return logits

    probe.__wrapped_by_cp_probe__ = function
    return probe


def _flag(value) -> bool:
    """A bool from collective_rpc: a bool in process, a string over HTTP (dev mode)."""
    return value is True or str(value).lower() in ("1", "true")


def _decode(function):
    @functools.wraps(function)
    def probe(self, *args, **kwargs):
        counts["CP decode layer-steps"] += 1
        _state["in_decode"] = True
        try:
            return function(self, *args, **kwargs)
        finally:
            _state["in_decode"] = False

    probe.__wrapped_by_cp_probe__ = function
    return probe


def _context_observed(compute):
    """Counts context-chunk attention calls, and those where FIA ran for a request with
    context on another rank but none here."""

    @functools.wraps(compute)
    def probe(self, query, kv_cache, attn_metadata):
        from vllm_npu_ext.patches.vllm_ascend_cp import masks

        counts["context chunks"] += 1
        chunked = attn_metadata.prefill.chunked_context
        rows = masks.empty_context_rows(chunked, masks.Ranks(self.pcp_rank, self.dcp_rank))
        if chunked.local_total_toks and rows is not None:
            counts["context chunks with a request without context here"] += 1
        return compute(self, query, kv_cache, attn_metadata)

    probe.__wrapped_by_cp_probe__ = compute
    return probe


def _masks_observed(refresh):
    """Counts the CP builder's writes of the graph masks, and those where a request of the
    step has no key on this rank."""

    @functools.wraps(refresh)
    def probe(self, lengths, ranks):
        refresh(self, lengths, ranks)
        counts["graph masks written"] += 1
        rows = min(len(lengths), self.capacity)
        if bool(self.host_empty()[:rows].any()):
            counts["graph masks written with a request without keys here"] += 1

    probe.__wrapped_by_cp_probe__ = refresh
    return probe


class CPProbe:
    """Mixed into vllm-ascend's NPUWorker by vLLM (`--worker-extension-cls`)."""

    def cp_probe_install(self, our_cann_operator: bool) -> dict:
        """Wrap the probes (once); with `our_cann_operator`, our CANN AttentionUpdate (its
        AscendC kernel built for the host, `emulator.operators.npu_ext_cann`) stands in for
        the compiled extension on the stand-in's npu device, as the built package provides
        it on Ascend."""
        torch_npu = sys.modules["torch_npu"]
        probes = {
            "npu_fused_infer_attention_score": _fia_observed,
            "npu_attention_update": None,
            "_npu_reshape_and_cache": _slots_observed,
        }
        for name, observe in probes.items():
            function = getattr(torch_npu, name)
            if not hasattr(function, "__wrapped_by_cp_probe__"):
                setattr(torch_npu, name, _counting(name, function, observe))
        if ATTENTION_CP in sys.modules:
            impl = sys.modules[ATTENTION_CP].AscendAttentionCPImpl
            if not hasattr(impl._forward_decode_pcp_dcp, "__wrapped_by_cp_probe__"):
                impl._forward_decode_pcp_dcp = _decode(impl._forward_decode_pcp_dcp)
            if not hasattr(impl._compute_prefill_context, "__wrapped_by_cp_probe__"):
                impl._compute_prefill_context = _context_observed(impl._compute_prefill_context)
        model = self.model_runner.model
        if not hasattr(model.compute_logits, "__wrapped_by_cp_probe__"):
            model.compute_logits = _logits_observed(model.compute_logits)
        from vllm_npu_ext.patches.vllm_ascend_cp.masks import GraphMasks

        if not hasattr(GraphMasks.refresh, "__wrapped_by_cp_probe__"):
            GraphMasks.refresh = _masks_observed(GraphMasks.refresh)
        if _flag(our_cann_operator):
            _install_our_cann_operator()
        return self.cp_probe_counts()

    def cp_probe_counts(self) -> dict:
        from vllm_npu_ext.emulator.device import graphs
        from vllm_npu_ext.emulator.operators import atb, npu_ext_cann
        from vllm_npu_ext.emulator.runtime import registry
        from vllm_npu_ext.patches import vllm_ascend_pcp_input_ids
        from vllm_npu_ext.patches.vllm_ascend_cp import patching

        module = sys.modules.get(ATTENTION_CP)
        return {
            **counts, "graph replays": graphs.stats["replays"] - _state["replays_at_reset"],
            "PCP placeholder ids set to 0": vllm_ascend_pcp_input_ids.placeholder_ids_set(
                self.model_runner),
            "our CANN operator": npu_ext_cann.calls[npu_ext_cann.OP_NAME],
            # Updates of captured FIA tasks (one per layer per full-graph replay, `graph_tasks`)
            # and the merge operators the graphs captured since start (one task per layer
            # per captured batch size).
            "FIA task updates": graphs.stats["task_updates"] - _state["updates_at_reset"],
            # ATB's paged cache load: chunked context's KV (vllm-ascend 0.23.0.post1
            # `AscendAttentionCPImpl._load_kv_for_chunk`)
            "KV loads for chunked context": registry.calls[atb.PAGED_CACHE_LOAD],
            "captured: our operator": graphs.captured_operators[CAPTURED_OURS],
            "captured: TensorList npu_attention_update": graphs.captured_operators[
                "npu.npu_attention_update.default"],
            # the graph masks' lse write (`vllm_ascend_cp.masks.GraphMasks`)
            "captured: masked lse": graphs.captured_operators["aten.where.self_out"],
            "attention_cp imported": module is not None,
            "merge patched": module is not None and patching.patched(module),
        }

    def cp_probe_reset(self) -> None:
        from vllm_npu_ext.emulator.device import graphs
        from vllm_npu_ext.emulator.operators import atb, npu_ext_cann
        from vllm_npu_ext.emulator.runtime import registry

        counts.clear()
        npu_ext_cann.calls.clear()
        registry.calls[atb.PAGED_CACHE_LOAD] = 0
        _state["replays_at_reset"] = graphs.stats["replays"]
        _state["updates_at_reset"] = graphs.stats["task_updates"]

    def cp_set_patch(self, on: bool) -> bool:
        """Our merge (on) or vllm-ascend's own pair (off) in this worker's attention_cp."""
        from vllm_npu_ext.patches import vllm_ascend_cp
        from vllm_npu_ext.patches.vllm_ascend_cp import patching

        module = importlib.import_module(ATTENTION_CP)
        if _flag(on):
            return patching.patch(vllm_ascend_cp.active(), module)
        patching.unpatch(module)
        return not patching.patched(module)


def _install_our_cann_operator() -> None:
    """Our CANN operator on the stand-in's npu device (`npu_ext_cann.install_on_npu`), as
    VLLM_NPU_EXT_EMULATE_OPS=1 (the default) installs it in every vLLM process at start."""
    from vllm_npu_ext.emulator.operators import npu_ext_cann

    npu_ext_cann.install_on_npu()
