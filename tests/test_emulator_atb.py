"""The torch_npu stand-in's ATB operators (vllm_npu_ext/emulator/atb.py), against independent
formulations: transformers' rotary embedding (neox halves), complex multiplication (interleaved
pairs) and MindSpeed's documented decomposition of `_npu_matmul_add_fp32`."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3.modeling_qwen3 import apply_rotary_pos_emb

from vllm_npu_ext.emulator import atb

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
    assert atb._npu_matmul_add_fp32(x, weight, c) is c
    torch.testing.assert_close(c, want)
    with pytest.raises(TypeError, match="C must be float32"):
        atb._npu_matmul_add_fp32(x, weight, c.half())
    with pytest.raises(ValueError, match="shape"):
        atb._npu_matmul_add_fp32(x, weight, torch.zeros(5, 4))
