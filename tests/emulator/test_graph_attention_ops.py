"""The stand-in's FIA `.out` with a max workspace, and `npu_mrope`, against independent math:
what full ACL graphs (FIA captured with a workspace, lengths updated per replay) and q/k
rotary in one launch rest on."""

from __future__ import annotations

import pytest
import torch
from support.npu_inputs import BF16, MASK

from vllm_npu_ext import emulator


def rand(*shape, dtype=BF16):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape))).to(dtype)


def fia_kwargs(lengths=(3, 7), tokens=7, **changes):
    kwargs = dict(
        query=rand(tokens, 4, 128), key=rand(tokens, 2, 128), value=rand(tokens, 2, 128),
        atten_mask=MASK, actual_seq_lengths=list(lengths), actual_seq_lengths_kv=list(lengths),
        num_heads=4, num_key_value_heads=2, scale=128**-0.5, input_layout="TND", sparse_mode=3,
    )  # fmt: skip
    return {**kwargs, **changes}


@pytest.mark.parametrize("lse_flag", [False, True])
def test_out_writes_the_result_into_the_given_tensors(lse_flag):
    kwargs = fia_kwargs(softmax_lse_flag=lse_flag)
    expected, expected_lse = emulator.npu_fused_infer_attention_score(**kwargs)
    output = torch.full_like(expected, 7.0)
    lse = torch.full((7, 4, 1), 7.0) if lse_flag else torch.full((1,), 7.0, dtype=BF16)
    result = emulator.npu_fused_infer_attention_score.out(**kwargs, out=[output, lse])
    assert result[0].data_ptr() == output.data_ptr() and result[1].data_ptr() == lse.data_ptr()
    assert torch.equal(output, expected)
    if lse_flag:
        assert torch.equal(lse, expected_lse)
    else:  # the dummy vllm-ascend passes stays as it was
        assert torch.equal(lse, torch.full((1,), 7.0, dtype=BF16))


@pytest.mark.parametrize(
    "out, match",
    [([torch.empty(7, 4, 128, dtype=BF16)], "must hold"),
     ([torch.empty(7, 4, 64, dtype=BF16), torch.empty(1)], "out\\[0\\]"),
     ([torch.empty(7, 4, 128), torch.empty(1)], "out\\[0\\]")],
)  # fmt: skip
def test_out_refuses_tensors_that_cannot_take_the_result(out, match):
    with pytest.raises(ValueError, match=match):
        emulator.npu_fused_infer_attention_score.out(**fia_kwargs(), out=out)


def test_the_default_overload_takes_no_out_list():
    with pytest.raises(TypeError, match="unexpected keyword argument 'out'"):
        emulator.npu_fused_infer_attention_score.default(**fia_kwargs(), out=[])


def test_a_max_workspace_serves_every_length_assignment_of_its_shapes():
    """Sized once (at capture) for 7 tokens in three sequences, then used with other lengths
    of at most three sequences (emulator/operators/attention_workspace.py says why not more)."""
    workspace = emulator._npu_fused_infer_attention_score_get_max_workspace(**fia_kwargs([1, 2, 7]))
    assert workspace.dim() == 1 and workspace.dtype == BF16
    for lengths in ([7], [3, 7], [1, 2, 7]):
        kwargs = fia_kwargs(lengths)
        output = torch.empty(7, 4, 128, dtype=BF16)
        emulator.npu_fused_infer_attention_score.out(
            **kwargs, workspace=workspace, out=[output, torch.empty(1, dtype=BF16)])
        assert torch.equal(output, emulator.npu_fused_infer_attention_score(**kwargs)[0])


@pytest.mark.parametrize(
    "workspace, match",
    [(lambda: torch.zeros(4096, dtype=BF16), "was not made by"),
     (lambda: torch.zeros(2, 8, dtype=BF16), "1-D"),
     (lambda: emulator._npu_fused_infer_attention_score_get_max_workspace(
         **fia_kwargs([5], tokens=5)), "was sized for"),
     (lambda: emulator._npu_fused_infer_attention_score_get_max_workspace(
         **fia_kwargs([7])), "sized for 1 sequences, not for this call's 2")],
)  # fmt: skip
def test_a_workspace_the_stand_in_did_not_size_for_the_call_is_refused(workspace, match):
    out = [torch.empty(7, 4, 128, dtype=BF16), torch.empty(1, dtype=BF16)]
    with pytest.raises(ValueError, match=match):
        emulator.npu_fused_infer_attention_score.out(**fia_kwargs(), workspace=workspace(), out=out)


def test_the_max_workspace_checks_its_call_as_fia_does():
    fp16 = torch.float16
    with pytest.raises(TypeError, match="bfloat16 only"):
        emulator._npu_fused_infer_attention_score_get_max_workspace(**fia_kwargs(
            query=rand(7, 4, 128, dtype=fp16), key=rand(7, 2, 128, dtype=fp16),
            value=rand(7, 2, 128, dtype=fp16)))


def rope_reference(x, positions, cache, head_size, neox):
    """x `[T, N*head_size]` rotated in float64, written from the aclnn doc's formula."""
    x = x.double().view(x.shape[0], -1, head_size)
    cos, sin = cache.double()[positions].chunk(2, dim=-1)
    rotary = 2 * cos.shape[-1]
    out = x.clone()
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            rot = x[t, h, :rotary]
            x1, x2 = (rot[: rotary // 2], rot[rotary // 2:]) if neox else (rot[0::2], rot[1::2])
            o1, o2 = x1 * cos[t] - x2 * sin[t], x2 * cos[t] + x1 * sin[t]
            if neox:
                out[t, h, :rotary] = torch.cat((o1, o2))
            else:
                out[t, h, :rotary:2], out[t, h, 1:rotary:2] = o1, o2
    return out.view(x.shape[0], -1)


def rope_cache(max_pos, rotary_dim, dtype):
    inv_freq = 1.0 / (10000 ** (torch.arange(0, rotary_dim, 2).double() / rotary_dim))
    angles = torch.outer(torch.arange(max_pos).double(), inv_freq)
    return torch.cat((angles.cos(), angles.sin()), dim=-1).to(dtype)


@pytest.mark.parametrize("dtype", [BF16, torch.float16, torch.float32])
@pytest.mark.parametrize("rotary_dim", [128, 64])
@pytest.mark.parametrize("mode", ["half", "interleave"])
def test_mrope_rotates_q_and_k_as_the_aclnn_formula_says(dtype, rotary_dim, mode):
    head_size, positions = 128, torch.tensor([0, 5, 1, 30, 7])
    q, k, cache = rand(5, 4 * head_size, dtype=dtype), rand(5, 2 * head_size, dtype=dtype), \
        rope_cache(32, rotary_dim, dtype)
    q_out, k_out = emulator.npu_mrope(positions, q, k, cache, head_size, rotary_mode=mode)
    assert (q_out.dtype, k_out.dtype) == (dtype, dtype)
    tolerance = {torch.float32: 1e-6}.get(dtype, 2 ** -7)
    for out, x in ((q_out, q), (k_out, k)):
        expected = rope_reference(x, positions, cache, head_size, mode == "half")
        assert (out.double() - expected).abs().max() <= tolerance * (1 + expected.abs().max())
        assert torch.equal(out.view(5, -1, head_size)[..., rotary_dim:],
                           x.view(5, -1, head_size)[..., rotary_dim:])


def test_mrope_half_mode_is_the_neox_rotation_of_npu_rotary_mul():
    """The two rotary operators agree in float32: the fallback and the fused path compute the
    same thing."""
    head_size, positions = 128, torch.arange(6)
    q, k = rand(6, 2 * head_size, dtype=torch.float32), rand(6, head_size, dtype=torch.float32)
    cache = rope_cache(8, head_size, torch.float32)
    cos, sin = cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    q_out, _ = emulator.npu_mrope(positions, q, k, cache, head_size)
    by_rotary_mul = emulator.npu_rotary_mul(q.view(1, 6, 2, head_size),
                                            cos.view(1, 6, 1, head_size),
                                            sin.view(1, 6, 1, head_size))
    torch.testing.assert_close(q_out, by_rotary_mul.view(6, -1), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize(
    "changes, error, match",
    [({"query": rand(5, 4, 128)}, ValueError, "query"),
     ({"key": rand(5, 256, dtype=torch.float16)}, TypeError, "one dtype"),
     ({"cos_sin_cache": rope_cache(32, 48, BF16)}, ValueError, "multiple of 32"),
     ({"head_size": 96}, ValueError, "multiple of 32"),
     ({"positions": torch.tensor([0, 1, 2, 3, 40])}, ValueError, "positions must lie"),
     ({"positions": torch.tensor([0, 1, 2, 3, 4.0])}, TypeError, "positions"),
     ({"positions": torch.zeros(3, 5, dtype=torch.long)}, NotImplementedError, "mrope mode"),
     ({"cache_mode": "interleave"}, NotImplementedError, "cache_mode")],
)  # fmt: skip
def test_mrope_refuses_what_the_operator_does_not_take(changes, error, match):
    kwargs = dict(positions=torch.arange(5), query=rand(5, 512), key=rand(5, 256),
                  cos_sin_cache=rope_cache(32, 128, BF16), head_size=128)
    kwargs.update(changes)
    with pytest.raises(error, match=match):
        emulator.npu_mrope(**kwargs)


def test_mrope_fake_kernel_matches_its_cpu_kernel():
    args = (torch.arange(5), rand(5, 512), rand(5, 256), rope_cache(32, 128, BF16), 128)
    torch.library.opcheck(torch.ops.npu.npu_mrope.default, args,
                          test_utils=("test_schema", "test_faketensor"))
