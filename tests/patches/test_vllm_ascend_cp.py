"""The CP patch's merges on both CPU stacks, without vllm-ascend on the path.

Here vLLM's CPU platform is current, so vllm-ascend's modules are not imported: its originals
(`_npu_attention_update`, `_npu_attn_out_lse_update`) are taken verbatim from its sdist and run
with vLLM's group accessors replaced by stand-ins and torch_npu by the emulator, against our
`CPMerge` on the same inputs; the masks for ranks without keys are read from forward contexts
as vllm-ascend's CP builder leaves them. vllm-ascend's real modules, in gloo ranks, run in
tests/with_vllm_ascend; the import hook and its checks on a fake package in
`test_vllm_ascend_cp_hook.py`. The sdist is found through VLLM_ASCEND_SDIST, build/sdist, or
downloaded from PyPI by scripts/check_vllm_ascend_patch.py (sha256-pinned).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace

import numpy
import pytest
import torch
import torch.distributed as dist
from support.scripts import load_script
from support.vllm_ascend_sdist import find_or_download_sdist

from vllm_npu_ext import emulator
from vllm_npu_ext.ops.attention_update import MergeKernel
from vllm_npu_ext.patches.vllm_ascend_cp import masks
from vllm_npu_ext.patches.vllm_ascend_cp import merge as merge_module
from vllm_npu_ext.patches.vllm_ascend_cp.kernel import KernelChoice
from vllm_npu_ext.patches.vllm_ascend_cp.merge import CPMerge
from vllm_npu_ext.patches.vllm_ascend_cp.patching import COMMON_MODULE, TARGET_SIGNATURES

check_script = load_script("scripts/check_vllm_ascend_patch.py")


@pytest.fixture(scope="module")
def sources() -> dict[str, str]:
    return check_script.read_sources(find_or_download_sdist())


@dataclass
class Coordinator:
    """The part of vLLM's GroupCoordinator that the CP merges use."""

    world_size: int
    rank_in_group: int = 0
    device_group: object = None

    def all_gather(self, tensor, dim=-1):
        parts = [torch.empty_like(tensor) for _ in range(self.world_size)]
        dist.all_gather(parts, tensor.contiguous(), group=self.device_group)
        return torch.cat(parts, dim=dim)


def load_originals(sources, dcp: Coordinator, pcp: Coordinator):
    """vllm-ascend's `common_cp` functions, run against stand-ins for its module globals."""
    namespace = {"torch": torch, "dist": dist, "torch_npu": emulator,
                 "get_dcp_group": lambda: dcp, "get_pcp_group": lambda: pcp,
                 "get_decode_context_model_parallel_world_size": lambda: dcp.world_size}
    for name in (*TARGET_SIGNATURES, "_out_lse_reshape"):
        text = check_script.function_source(sources, COMMON_MODULE, name)
        exec(compile(text, COMMON_MODULE, "exec"), namespace)
    return namespace


def cp_merge(monkeypatch, coordinators, kernel="auto") -> CPMerge:
    monkeypatch.setattr(merge_module, "cp_group_coordinators", lambda: coordinators)
    return CPMerge(kernel=KernelChoice(MergeKernel(kernel)))


def vllm_ascend_buffer(dcp, pcp, bs, heads, head_dim, seed=0):
    """A gathered buffer in vllm-ascend's `[pcp*bs, dcp*H, D+1]` layout, as it produces it."""
    generator = torch.Generator().manual_seed(seed)
    if pcp == 1 and dcp > 1:  # the all_to_all output, permuted (not copied) back
        received = torch.randn(dcp * heads, head_dim + 1, bs, generator=generator)
        return received.permute(2, 0, 1)
    return torch.randn(pcp * bs, dcp * heads, head_dim + 1, generator=generator)


@pytest.mark.parametrize(("dcp", "pcp"), [(1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (2, 4)])
def test_replacement_reproduces_npu_attention_update(sources, monkeypatch, dcp, pcp):
    from vllm_npu_ext.ops.cp_merge import from_vllm_ascend_layout

    coordinators = (Coordinator(dcp), Coordinator(pcp))
    merge = cp_merge(monkeypatch, coordinators)
    original = load_originals(sources, *coordinators)["_npu_attention_update"]
    bs, heads, head_dim = 3, 4, 128
    buffer = vllm_ascend_buffer(dcp, pcp, bs, heads, head_dim, seed=dcp * 10 + pcp)
    expected = original(head_dim, buffer)
    ours_layout = from_vllm_ascend_layout(buffer, dcp, pcp)
    assert ours_layout.shape == (dcp * pcp, bs, heads, head_dim + 1)
    for attn_out_lse in (buffer, ours_layout):
        result = merge.npu_attention_update(head_dim, attn_out_lse)
        assert result.shape == expected.shape == (bs, heads, head_dim)
        torch.testing.assert_close(result, expected, atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kernel", ["custom", "list"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_prefill_merge_reproduces_npu_attn_out_lse_update(sources, monkeypatch, kernel, dtype):
    """PCP's mask/nomask halves (and a chunk with its context): ours, one tensor-input call,
    equals vllm-ascend's TensorList merge of the same partials, in shard order (nomask, mask)."""
    from vllm_npu_ext.emulator.operators import npu_ext_cann

    merge = cp_merge(monkeypatch, (Coordinator(1), Coordinator(1)), kernel)
    original = load_originals(sources, Coordinator(1), Coordinator(1))["_npu_attn_out_lse_update"]
    generator = torch.Generator().manual_seed(3)
    outs = [torch.randn(5, 4, 64, generator=generator).to(dtype) for _ in range(2)]
    lses = [torch.randn(5, 4, 1, generator=generator) * 2 for _ in range(2)]
    args = (lses[0], lses[1], outs[0], outs[1])  # mask, nomask as vllm-ascend names them
    with emulator.emulated(), npu_ext_cann.emulated():
        emulator.reset_counts()
        ours = merge.npu_attn_out_lse_update(*args)
        ours_calls = emulator.calls["npu_attention_update"]
        theirs = original(*args)
    assert ours_calls == (kernel == "list") and ours.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, atol=1e-6, rtol=1e-6)
    with pytest.raises(ValueError, match="lses must be"):
        merge.npu_attn_out_lse_update(lses[0][:4], lses[1], outs[0], outs[1])


# --- requests of which a rank holds no key ---------------------------------------------


def cp_step(monkeypatch, lengths, dcp_rank=0, pcp_rank=0, num_decodes=None, kernel="custom"):
    """A decode step as vllm-ascend's CP builder leaves it in vLLM's forward context: one
    layer whose `decode_meta.num_computed_tokens_of_pcp_dcp` is `lengths` [bs, pcp, dcp]
    (the key counts FIA is called with); the rank's patch state."""
    from vllm import forward_context

    lengths = numpy.asarray(lengths)
    bs, pcp, dcp = lengths.shape
    layer = SimpleNamespace(
        num_decodes=bs if num_decodes is None else num_decodes,
        decode_meta=SimpleNamespace(num_computed_tokens_of_pcp_dcp=lengths),
    )
    context = SimpleNamespace(attn_metadata={"model.layers.0.self_attn.attn": layer})
    monkeypatch.setattr(forward_context, "_forward_context", context)
    return cp_merge(monkeypatch, (Coordinator(dcp, dcp_rank), Coordinator(pcp, pcp_rank)),
                    kernel)  # fmt: skip


CPU = torch.device("cpu")
LENGTHS = [[[3, 0], [2, 5]], [[0, 0], [0, 0]], [[1, 2], [0, 4]]]  # [bs, pcp, dcp]


@pytest.mark.parametrize(("pcp_rank", "dcp_rank", "empty"), [
    (0, 1, [True, True, False]), (1, 0, [False, True, True]), (0, 0, [False, True, False])])
def test_eager_masks_read_this_rank_s_key_counts(monkeypatch, pcp_rank, dcp_rank, empty):
    """This rank's column of the counts; request 1 has no key anywhere. Our kernel: its lse
    -inf like every empty row; TensorList's (which reads out at weight 0): 0 from every rank."""
    for kernel, everywhere_fill in (("custom", float("-inf")), ("list", 0.0)):
        merge = cp_step(monkeypatch, LENGTHS, dcp_rank, pcp_rank, kernel=kernel)
        rows, fill = merge.eager_rows_for(3, CPU, kernel == "list")
        assert rows.tolist() == empty
        assert fill[1].item() == everywhere_fill
        assert all(fill[r].item() == float("-inf") for r in (0, 2) if empty[r])


def test_no_masks_without_empty_rows_or_this_merge_s_metadata(monkeypatch):
    assert cp_step(monkeypatch, [[[3, 1]], [[2, 2]]]).eager_rows_for(2, CPU, False) == (
        None, None)  # fmt: skip
    merge = cp_step(monkeypatch, [[[0, 1]], [[2, 2]]], num_decodes=5)  # not this merge's rows
    assert merge.eager_rows_for(2, CPU, False) == (None, None)


def test_eager_masks_are_computed_once_per_step(monkeypatch):
    """Every layer of a step reads the same metadata: the masks of its first layer serve the
    others; the next step's metadata (a new array) gets its own."""
    merge = cp_step(monkeypatch, [[[0, 1]], [[2, 2]]])
    first, again = (merge.eager_rows_for(2, CPU, False) for _ in range(2))
    assert first[0] is again[0] and first[0].tolist() == [True, False]
    cp_step(monkeypatch, [[[2, 1]], [[0, 2]]])
    assert merge.eager_rows_for(2, CPU, False)[0].tolist() == [False, True]


@pytest.mark.parametrize("kernel", ["custom", "list"])
def test_patched_merge_gives_zero_for_a_request_without_keys_whatever_fia_wrote(
    monkeypatch, kernel
):
    """One rank (no group to exchange with): request 1 has no key anywhere; FIA's result for
    it is garbage (NaN out, an lse of 50). The patched pair sends it with out 0 and an lse
    that merges to 0 on both kernels (torch_npu's TensorList kernel would give NaN for -inf
    alone), and the attention of the others unchanged."""
    from vllm_npu_ext.emulator.operators import npu_ext_cann

    merge = cp_step(monkeypatch, [[[4]], [[0]], [[1]]], kernel=kernel)
    attn_out = torch.randn(3, 4, 64)
    attn_out[1] = float("nan")
    attn_lse = torch.randn(3, 4, 1)
    attn_lse[1] = 50.0
    with emulator.emulated(), npu_ext_cann.emulated():
        buffer = merge.process_attn_out_lse(attn_out, attn_lse)
        merged = merge.npu_attention_update(64, buffer)
    assert buffer[0, 1, :, 64].tolist() == [0.0 if kernel == "list" else float("-inf")] * 4
    assert torch.all(merged[1] == 0) and not merged.isnan().any()
    if kernel == "list":  # out read at weight 1: zeroed
        assert torch.all(buffer[0, 1, :, :64] == 0)
    torch.testing.assert_close(merged[[0, 2]], attn_out[[0, 2]])


def chunked_context(lengths, query_lens, total):
    """vllm-ascend's chunked-context metadata as the CP builder makes it: every rank's context
    lengths `[reqs, pcp, dcp]`, the cumulative query lengths FIA takes, this rank's total of
    context keys."""
    return SimpleNamespace(prefill=SimpleNamespace(chunked_context=SimpleNamespace(
        local_context_lens_allranks=torch.tensor(lengths, dtype=torch.int32),
        actual_chunk_seq_lengths=torch.cumsum(torch.tensor(query_lens), dim=0),
        local_total_toks=total,
    )))  # fmt: skip


def test_a_context_chunk_sends_a_request_without_context_here_as_zero():
    """DCP rank 1 of 2: request 0 has context here, request 1 on rank 0 only (FIA's rows for
    its 0 keys here: NaN, lse 50), request 2 none anywhere (vllm-ascend drops its rows after
    the merge: left alone). Request 1's rows go out as 0 / -inf; the others as FIA wrote them."""
    out, lse = torch.randn(6, 4, 64), torch.randn(6, 4, 1)
    out[2:], lse[2:] = float("nan"), 50.0
    merge = CPMerge()
    wrapped = merge.mask_empty_context(lambda self, q, kv, meta: (out, lse))
    rank = SimpleNamespace(pcp_rank=0, dcp_rank=1)
    metadata = chunked_context([[[4, 3]], [[1, 0]], [[0, 0]]], [2, 3, 1], total=3)
    masked_out, masked_lse = wrapped(rank, None, None, metadata)
    assert torch.all(masked_out[2:5] == 0) and masked_lse[2:5].isneginf().all()
    torch.testing.assert_close(masked_out[:2], out[:2])
    torch.testing.assert_close(masked_lse[:2], lse[:2])
    assert masked_out[5].isnan().all() and torch.all(masked_lse[5] == 50.0)
    rows = merge.context_rows.masks
    wrapped(rank, None, None, metadata)
    assert merge.context_rows.masks is rows  # read once per step
    wrapped(rank, None, None, chunked_context([[[4, 3]], [[1, 0]], [[0, 0]]], [2, 3, 1], 3))
    assert merge.context_rows.masks is not rows  # the next step's metadata: read again
    # No request without context here, or no FIA at all (vllm-ascend's 0 / -inf): untouched.
    for lengths, total in (([[[4, 3]], [[1, 2]], [[0, 0]]], 5), ([[[4, 0]], [[1, 0]]], 0)):
        result = wrapped(rank, None, None, chunked_context(lengths, [2, 3, 1][:len(lengths)],
                                                           total))  # fmt: skip
        assert result[0] is out and result[1] is lse


def test_masks_reject_counts_of_the_wrong_rank():
    with pytest.raises(ValueError, match=r"\[bs, pcp, dcp\]"):
        masks.rank_and_all_empty(numpy.zeros((3, 2)), masks.Ranks(0, 0))
