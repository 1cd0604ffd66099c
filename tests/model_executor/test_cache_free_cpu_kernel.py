"""vLLM 0.23's CPU backend: cache-free causal layers on its batched kernel (`ScratchKV`).

0.23 runs encoder-only layers through SDPA, one call per request; the cache-free builder gives
each step a scratch K/V buffer so that they run the kernel stock vLLM's decoder layers use.
These tests hold that path to per-request causal attention, across block boundaries and
steps that reuse the buffer, and check the steps it leaves to SDPA. On vLLM 0.32 (no
`_run_sdpa_forward`) the backend is left as it is, which the first test checks.
"""

from __future__ import annotations

import types

import pytest
import torch
import torch.nn.functional as F
from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends import cpu_attn

from vllm_npu_ext.model_executor.layers import cpu_causal_attention as causal

VLLM_0_23_CPU = causal.needs_causal_impl(cpu_attn.CPUAttentionBackendImpl)
# Only vLLM 0.23's CPU backend runs encoder-only layers through SDPA (0.32's kernel takes
# metadata.causal: no scratch buffer, test_the_scratch_path_is_0_23s_only): the rest of this
# module runs on the .venv-ascend stack and is deselected on the other (tests/conftest.py).
only_0_23 = pytest.mark.vllm_0_23

HEADS, KV_HEADS, HEAD_DIM = 4, 2, 32
DTYPE = torch.float32


def test_the_scratch_path_is_0_23s_only():
    """0.23: a subclass whose SDPA path takes the scratch buffer; 0.32: vLLM's class unchanged."""
    impl_cls = causal.causal_impl_cls(cpu_attn.CPUAttentionBackendImpl)
    import vllm

    assert vllm.__version__.startswith("0.23") == VLLM_0_23_CPU
    assert (impl_cls is cpu_attn.CPUAttentionBackendImpl) == (not VLLM_0_23_CPU)


def make_builder(block_size: int = 128) -> types.SimpleNamespace:
    """The attributes of vLLM 0.23's CPUAttentionMetadataBuilder that the scratch buffer uses."""
    cache_config = types.SimpleNamespace(cache_dtype="auto")
    return types.SimpleNamespace(
        block_size=block_size, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, dtype=DTYPE,
        isa=cpu_attn._get_attn_isa(DTYPE, block_size, HEAD_DIM),
        vllm_config=types.SimpleNamespace(cache_config=cache_config),
    )  # fmt: skip


def make_metadata(builder, lens: list[int], seq_lens: list[int] | None = None):
    """What 0.23's builder builds for one causal prefill step of requests of `lens` tokens."""
    query_start_loc = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)
    seq_lens_t = torch.tensor(seq_lens or lens, dtype=torch.int32)
    scheduler_metadata = cpu_attn.ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(lens), num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM,
        seq_lens=seq_lens_t, dtype=DTYPE, query_start_loc=query_start_loc, causal=True,
        sliding_window_size=-1, isa=builder.isa, enable_kv_split=False,
    )  # fmt: skip
    return cpu_attn.CPUAttentionMetadata(
        isa=builder.isa, num_actual_tokens=sum(lens), max_query_len=max(lens),
        query_start_loc=query_start_loc, max_seq_len=max(seq_lens or lens), seq_lens=seq_lens_t,
        block_table=torch.zeros((len(lens), 1), dtype=torch.int32),
        slot_mapping=torch.zeros(sum(lens), dtype=torch.long),
        scheduler_metadata=scheduler_metadata, causal=True, sdpa_start_loc=query_start_loc,
    )  # fmt: skip


def make_impl():
    impl_cls = causal.causal_impl_cls(cpu_attn.CPUAttentionBackendImpl)
    return impl_cls(
        HEADS, HEAD_DIM, HEAD_DIM**-0.5, KV_HEADS, None, None, "auto",
        attn_type=AttentionType.ENCODER_ONLY,
    )  # fmt: skip


def reference(query, key, value, lens: list[int]) -> torch.Tensor:
    """Causal attention within each request, in float64."""
    out, start = [], 0
    for length in lens:
        q, k, v = (t[start : start + length].transpose(0, 1).double() for t in (query, key, value))
        k, v = (t.repeat_interleave(HEADS // KV_HEADS, dim=0) for t in (k, v))
        out.append(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(0, 1))
        start += length
    return torch.cat(out).to(query.dtype)


def run_step(impl, builder, lens: list[int], seed: int):
    generator = torch.Generator().manual_seed(seed)
    tokens = sum(lens)
    query = torch.randn(tokens, HEADS, HEAD_DIM, generator=generator, dtype=DTYPE)
    key, value = (torch.randn(tokens, KV_HEADS, HEAD_DIM, generator=generator) for _ in range(2))
    metadata = make_metadata(builder, lens)
    causal.attach_scratch_kv(builder, metadata)
    output = torch.empty_like(query)
    impl._run_sdpa_forward(query, key, value, output, metadata, AttentionType.ENCODER_ONLY)
    return metadata, output, reference(query, key, value, lens)


@only_0_23
@pytest.mark.parametrize("block_size", [128, 48])
def test_kernel_path_is_causal_per_request_across_steps(block_size):
    builder, impl = make_builder(block_size), make_impl()
    # block edges (31/32/33 with 32-slot scratch blocks), a one-token request, then later
    # steps that reuse the buffer with other boundaries: nothing leaks between requests.
    for seed, lens in enumerate([[1, 31, 32, 33, 100], [7], [64, 3, 65], [200, 1]]):
        metadata, output, expected = run_step(impl, builder, lens, seed)
        scratch = getattr(metadata, causal.SCRATCH_KV_ATTR)
        assert scratch.slot_mapping.shape == (sum(lens),)
        torch.testing.assert_close(output, expected, atol=2e-5, rtol=1e-4)


@only_0_23
def test_scratch_buffer_kept_and_grown_by_the_builder():
    builder = make_builder()
    small = getattr(run_step(make_impl(), builder, [5, 6], 0)[0], causal.SCRATCH_KV_ATTR)
    buffer = getattr(builder, causal._SCRATCH_BUFFER_ATTR)
    again = getattr(run_step(make_impl(), builder, [3], 1)[0], causal.SCRATCH_KV_ATTR)
    assert getattr(builder, causal._SCRATCH_BUFFER_ATTR) is buffer  # reused, no new memory
    assert again.key_cache.data_ptr() == small.key_cache.data_ptr()
    run_step(make_impl(), builder, [300, 300], 2)
    assert getattr(builder, causal._SCRATCH_BUFFER_ATTR).shape[0] >= 2 * 300 // 32


@only_0_23
def test_steps_the_kernel_cannot_serve_keep_sdpa():
    builder = make_builder()
    prefixed = make_metadata(builder, [4, 5], seq_lens=[4, 9])  # a cached or earlier prefix
    causal.attach_scratch_kv(builder, prefixed)
    assert not hasattr(prefixed, causal.SCRATCH_KV_ATTR)
    builder.vllm_config.cache_config.cache_dtype = "fp8"
    quantised = make_metadata(builder, [4, 5])
    causal.attach_scratch_kv(builder, quantised)
    assert not hasattr(quantised, causal.SCRATCH_KV_ATTR)


@only_0_23
def test_sdpa_fallback_stays_causal():
    impl, builder = make_impl(), make_builder()
    lens = [5, 9]
    query = torch.randn(14, HEADS, HEAD_DIM)
    key, value = torch.randn(14, KV_HEADS, HEAD_DIM), torch.randn(14, KV_HEADS, HEAD_DIM)
    metadata = make_metadata(builder, lens)  # no scratch attached: SDPA
    output = torch.empty_like(query)
    impl._run_sdpa_forward(query, key, value, output, metadata, AttentionType.ENCODER_ONLY)
    torch.testing.assert_close(output, reference(query, key, value, lens), atol=2e-5, rtol=1e-4)
