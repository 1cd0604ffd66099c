"""The torch_npu stand-in's ATB operators (vllm_npu_ext/emulator/operators/atb.py), against
independent formulations: transformers' rotary embedding (neox halves), complex multiplication
(interleaved pairs), MindSpeed's documented decomposition of `_npu_matmul_add_fp32`, and a
token-by-token loop for `_npu_reshape_and_cache`."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from vllm_npu_ext.emulator.operators import atb

HEAD, MAX_POS = 16, 64


def cos_sin_cache(dtype=torch.float32):
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD, 2, dtype=torch.float32) / HEAD))
    freqs = torch.outer(torch.arange(MAX_POS, dtype=torch.float32), inv)  # [MAX_POS, HEAD/2]
    return torch.cat((freqs.cos(), freqs.sin()), dim=-1).to(dtype)


def test_rotary_embedding_neox_equals_transformers():
    torch.manual_seed(0)
    positions = torch.tensor([0, 5, 9, 63])
    q, k = torch.randn(4, 3 * HEAD), torch.randn(4, 1 * HEAD)
    cache = cos_sin_cache()
    cos_half, sin_half = cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat((cos_half, cos_half), -1)[None], torch.cat((sin_half, sin_half), -1)[None]
    want_q, want_k = apply_rotary_pos_emb(
        q.view(1, 4, 3, HEAD).transpose(1, 2), k.view(1, 4, 1, HEAD).transpose(1, 2), cos, sin
    )
    atb._npu_rotary_embedding(positions, q, k, HEAD, cache, True)  # in place
    torch.testing.assert_close(q.view(4, 3, HEAD), want_q.transpose(1, 2)[0])
    torch.testing.assert_close(k.view(4, 1, HEAD), want_k.transpose(1, 2)[0])


def test_rotary_embedding_interleaved_is_complex_multiplication():
    torch.manual_seed(1)
    positions = torch.tensor([1, 2, 30])
    q, k = torch.randn(3, 2 * HEAD), torch.randn(3, HEAD)
    cache = cos_sin_cache()
    cos, sin = cache[positions].chunk(2, dim=-1)
    rotation = torch.polar(torch.ones_like(cos), torch.atan2(sin, cos))[:, None]  # [T, 1, D/2]

    def rotated(x, heads):
        pairs = torch.view_as_complex(x.view(3, heads, HEAD // 2, 2).contiguous())
        return torch.view_as_real(pairs * rotation).flatten(-2)

    want_q, want_k = rotated(q, 2), rotated(k, 1)
    atb._npu_rotary_embedding(positions, q, k, HEAD, cache, False)
    torch.testing.assert_close(q.view(3, 2, HEAD), want_q)
    torch.testing.assert_close(k.view(3, 1, HEAD), want_k)


@pytest.mark.parametrize(
    ("change", "error"),
    [({"positions": torch.tensor([[0]])}, "positions"), ({"head_size": 5}, "head_size"),
     ({"cos_sin_cache": torch.zeros(MAX_POS, 8)}, "cos_sin_cache"),
     ({"positions": torch.tensor([MAX_POS])}, "exceeds")],
)  # fmt: skip
def test_rotary_embedding_refuses_what_its_contract_excludes(change, error):
    args = {"positions": torch.tensor([0]), "query": torch.zeros(1, HEAD),
            "key": torch.zeros(1, HEAD), "head_size": HEAD, "cos_sin_cache": cos_sin_cache(),
            "is_neox_style": True, **change}  # fmt: skip
    with pytest.raises(ValueError, match=error):
        atb._npu_rotary_embedding(**args)


def test_matmul_add_fp32_is_x_transposed_times_weight_plus_c():
    torch.manual_seed(2)
    x, weight = torch.rand(6, 4, dtype=torch.float16), torch.rand(6, 5, dtype=torch.float16)
    c = torch.rand(4, 5)
    want = torch.mm(x.T.float(), weight.float()) + c
    assert atb._npu_matmul_add_fp32(x, weight, c) is None  # `-> ()`: C is written in place
    torch.testing.assert_close(c, want)
    with pytest.raises(TypeError, match="C must be float32"):
        atb._npu_matmul_add_fp32(x, weight, c.half())
    with pytest.raises(ValueError, match="shape"):
        atb._npu_matmul_add_fp32(x, weight, torch.zeros(5, 4))


def _caches(dtype=torch.bfloat16, blocks=4, block_size=8, heads=2, k_dim=HEAD, v_dim=HEAD):
    key_cache = torch.full((blocks, block_size, heads, k_dim), 7.0, dtype=dtype)
    value_cache = torch.full((blocks, block_size, heads, v_dim), -7.0, dtype=dtype)
    return key_cache, value_cache


def test_reshape_and_cache_writes_each_token_at_its_slot_and_nothing_else():
    torch.manual_seed(3)
    key_cache, value_cache = _caches(v_dim=8)  # key and value head sizes may differ
    slots = torch.tensor([9, 0, 31, 17, 8], dtype=torch.int32)  # block * 8 + offset
    key = torch.randn(5, 2, HEAD).bfloat16()
    value = torch.randn(5, 2, 8).bfloat16()
    want_k, want_v = key_cache.clone(), value_cache.clone()
    for token, slot in enumerate(slots.tolist()):
        want_k[slot // 8, slot % 8] = key[token]
        want_v[slot // 8, slot % 8] = value[token]
    atb._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache,
                               value_cache=value_cache, slot_indices=slots)  # fmt: skip
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)


def test_reshape_and_cache_skips_negative_slots_as_atbs_kernel_does():
    """Context-parallel slot mappings hold -1 for tokens another rank stores; ATB's kernel
    skips them (`if (slotValue < 0) continue;`): only the other tokens land in the cache."""
    key_cache, value_cache = _caches()
    slots = torch.tensor([-1, 5, -1, 30], dtype=torch.int32)
    key = torch.randn(4, 2, HEAD).bfloat16()
    value = torch.randn(4, 2, HEAD).bfloat16()
    want_k, want_v = key_cache.clone(), value_cache.clone()
    for token, slot in ((1, 5), (3, 30)):
        want_k[slot // 8, slot % 8] = key[token]
        want_v[slot // 8, slot % 8] = value[token]
    atb._npu_reshape_and_cache(key=key, value=value, key_cache=key_cache,
                               value_cache=value_cache, slot_indices=slots)  # fmt: skip
    assert torch.equal(key_cache, want_k) and torch.equal(value_cache, want_v)
    every_other = torch.tensor([5, 99, -1, 99, 30, 99], dtype=torch.int32)[::2]  # strided
    atb._npu_reshape_and_cache(key=key[:3], value=value[:3], key_cache=key_cache,
                               value_cache=value_cache, slot_indices=every_other)  # fmt: skip
    assert torch.equal(key_cache[0, 5], key[0]) and torch.equal(key_cache[3, 6], key[2])


@pytest.mark.parametrize(
    ("change", "error", "kind"),
    [({"key": torch.zeros(2, 2, HEAD)}, "float16, bfloat16, int8", TypeError),
     ({"slot_indices": torch.tensor([0, 1], dtype=torch.int64)}, "int32", TypeError),
     ({"slot_indices": torch.tensor([0, 32], dtype=torch.int32)}, "below 32", ValueError),
     ({"key_cache": torch.zeros(4, 8, 1, HEAD, dtype=torch.bfloat16)}, "key_cache", ValueError),
     ({"value": torch.zeros(3, 2, HEAD, dtype=torch.bfloat16)}, "'value'", ValueError)],
)  # fmt: skip
def test_reshape_and_cache_refuses_what_its_contract_excludes(change, error, kind):
    """float32 is not among ATB ReshapeAndCache's dtypes; slots are int32 and below the
    caches' end."""
    key_cache, value_cache = _caches()
    args = {"key": torch.zeros(2, 2, HEAD, dtype=torch.bfloat16),
            "value": torch.zeros(2, 2, HEAD, dtype=torch.bfloat16), "key_cache": key_cache,
            "value_cache": value_cache, "slot_indices": torch.tensor([0, 1], dtype=torch.int32),
            **change}  # fmt: skip
    with pytest.raises(kind, match=error):
        atb._npu_reshape_and_cache(**args)
    assert torch.all(key_cache == 7)  # nothing written before the refusal
