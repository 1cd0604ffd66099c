"""Contracts of the strict torch_npu emulator: schema binding, rejection rules, call counting
and installation. Numeric checks live in tests/emulator/test_math.py, the schema
extraction in tests/emulator/test_schemas.py."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from support.dispatch_record import RecordOps
from support.npu_inputs import BF16, MASK, rand

from vllm_npu_ext import emulator
from vllm_npu_ext.emulator.runtime import schema as _schema
from vllm_npu_ext.ops import dispatch


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def fia(**changes):
    """A valid TND causal GQA FIA call (T=7, N=4, N_kv=2, D=128, bf16) with `changes` applied."""
    kwargs = dict(
        query=rand(7, 4, 128), key=rand(7, 2, 128), value=rand(7, 2, 128), atten_mask=MASK,
        actual_seq_lengths=[3, 7], actual_seq_lengths_kv=[3, 7], num_heads=4,
        num_key_value_heads=2, scale=0.25, input_layout="TND", sparse_mode=3,
    )
    return lambda: emulator.npu_fused_infer_attention_score(**{**kwargs, **changes})


def fia_bsnd(dim=16, dtype=BF16):
    """A valid BSND FIA call (B=1, S=7): the TND-only limits do not apply."""
    q, kv = rand(1, 7, 4, dim, dtype=dtype), rand(1, 7, 2, dim, dtype=dtype)
    return lambda: emulator.npu_fused_infer_attention_score(
        q, kv, kv, num_heads=4, num_key_value_heads=2, scale=dim**-0.5, input_layout="BSND"
    )


def many_seqs(batch):
    """Cumulative lengths of `batch` one-token sequences, and q/k/v of that many tokens."""
    return list(range(1, batch + 1)), rand(batch, 4, 128), rand(batch, 2, 128)


def fa(**changes):
    """A valid TND causal GQA npu_fusion_attention call with `changes` applied."""
    kwargs = dict(
        query=rand(7, 4, 16), key=rand(7, 2, 16), value=rand(7, 2, 16), head_num=4,
        input_layout="TND", atten_mask=MASK, scale=0.25, actual_seq_qlen=[3, 7],
        actual_seq_kvlen=[3, 7], sparse_mode=3,
    )
    return lambda: emulator.npu_fusion_attention(**{**kwargs, **changes})


def rotary(**changes):
    kwargs = dict(input=rand(1, 5, 2, 8), r1=rand(1, 5, 1, 8).clamp(-1, 1),
                  r2=rand(1, 5, 1, 8).clamp(-1, 1))
    kwargs.update(changes)
    x = kwargs.pop("input")
    return lambda: emulator.npu_rotary_mul(x, **kwargs)


def gmm(x=None, weight=None, **kwargs):
    x = [rand(3, 8), rand(2, 8)] if x is None else x
    weight = [rand(8, 5), rand(8, 6)] if weight is None else weight
    kwargs.setdefault("group_type", -1)
    return lambda: emulator.npu_grouped_matmul(x, weight, **kwargs)


def update(lse=None, out=None, update_type=0):
    lse = [torch.randn(6), torch.randn(6)] if lse is None else lse
    out = [rand(6, 16), rand(6, 16)] if out is None else out
    return lambda: emulator.npu_attention_update(lse, out, update_type)


VALID_CALLS = {
    "fia": fia(), "fa": fa(), "rotary": rotary(), "gmm": gmm(), "update": update(),
    "fia tnd head_dim 192": fia(query=rand(7, 4, 192), key=rand(7, 2, 192), value=rand(7, 2, 192)),
    "fia bsnd float16 head_dim 64": fia_bsnd(64, torch.float16),
    "fia 4096 sequences": (lambda lens, q, kv: fia(
        query=q, key=kv, value=kv, actual_seq_lengths=lens, actual_seq_lengths_kv=lens))(
        *many_seqs(4096)),
    "fa 1024 sequences": (lambda lens, q, kv: fa(
        query=q, key=kv, value=kv, actual_seq_qlen=lens, actual_seq_kvlen=lens))(
        *many_seqs(1024)),
    "gmm float32 single tensors": gmm(x=[rand(3, 8, dtype=torch.float32)],
                                      weight=[rand(8, 5, dtype=torch.float32)]),
    "add_rms_norm 1-D": lambda: emulator.npu_add_rms_norm(rand(8), rand(8), rand(8)),
    "rms_norm": lambda: emulator.npu_rms_norm(rand(3, 8), rand(8)),
    "add_rms_norm": lambda: emulator.npu_add_rms_norm(rand(3, 8), rand(3, 8), rand(8)),
    "swiglu": lambda: emulator.npu_swiglu(rand(3, 8)),
    "linear": lambda: emulator.npu_linear(rand(3, 8), rand(5, 8), rand(5)),
    "dynamic_quant": lambda: emulator.npu_dynamic_quant(rand(2, 3, 8)),
    "add_rms_norm_dynamic_quant": lambda: emulator.npu_add_rms_norm_dynamic_quant(
        rand(3, 8), rand(3, 8), rand(8), output_mask=[True, False]),
    "add_rms_norm_dynamic_quant two outputs": lambda: emulator.npu_add_rms_norm_dynamic_quant(
        rand(3, 8), rand(3, 8), rand(8), smooth_scale1=rand(8), smooth_scale2=rand(8),
        output_mask=[True, True]),
    "quantize": lambda: emulator.npu_quantize(rand(3, 8), rand(8), rand(8), torch.qint8, -1, False),
    "add_rms_norm_quant": lambda: emulator.npu_add_rms_norm_quant(
        rand(3, 8), rand(3, 8), rand(8), rand(8), rand(8), epsilon=1e-6),
}

REJECTIONS = [
    # npu_fused_infer_attention_score
    ("fia unknown layout", fia(input_layout="THD"), ValueError, "input_layout"),
    ("fia layout not emulated", fia(input_layout="BNSD_BSND"), NotImplementedError, "BNSD_BSND"),
    ("fia lengths as float tensor", fia(actual_seq_lengths=torch.tensor([3.0, 7.0])), TypeError,
     "sequence of integers"),
    ("fia lengths not cumulative", fia(actual_seq_lengths=[5, 3, 7]), ValueError, "cumulative"),
    ("fia kv lengths not cumulative", fia(actual_seq_lengths_kv=[4, 2, 7]), ValueError,
     "actual_seq_lengths_kv"),
    ("fia last length != T", fia(actual_seq_lengths=[3, 6]), ValueError, r"last entry == T"),
    ("fia lengths missing", fia(actual_seq_lengths=None), ValueError, "required"),
    ("fia batch counts differ", fia(actual_seq_lengths_kv=[1, 3, 7]), ValueError, "entries"),
    ("fia num_heads mismatch", fia(num_heads=2, num_key_value_heads=1), ValueError, "heads"),
    ("fia heads do not divide", fia(num_key_value_heads=3), ValueError, "not divisible"),
    ("fia GQA ratio > 64", fia(num_heads=130, num_key_value_heads=2), ValueError, "exceeds 64"),
    ("fia key heads mismatch", fia(key=rand(7, 4, 128), value=rand(7, 4, 128)), ValueError,
     "'key' has 4 heads"),
    ("fia sparse 3 without mask", fia(atten_mask=None), ValueError, "needs atten_mask"),
    ("fia mask wrong shape", fia(atten_mask=MASK[:1024, :1024]), ValueError, "shape"),
    ("fia mask lower triangle", fia(atten_mask=MASK.T.contiguous()), ValueError, "compressed"),
    ("fia mask float", fia(atten_mask=MASK.half()), TypeError, "atten_mask"),
    ("fia scale left at 1.0", fia(scale=1.0), ValueError, "scale"),
    ("fia sparse mode not emulated", fia(sparse_mode=2), NotImplementedError, "sparse_mode=2"),
    ("fia sparse mode invalid", fia(sparse_mode=7), ValueError, "sparse_mode"),
    ("fia mask with sparse 0", fia(sparse_mode=0), NotImplementedError, "sparse_mode=0"),
    ("fia float32", fia(query=rand(7, 4, 128, dtype=torch.float32)), TypeError, "dtype"),
    ("fia mixed dtypes", fia(key=rand(7, 2, 128, dtype=torch.float16)), TypeError, "one dtype"),
    ("fia non-contiguous", fia(query=rand(4, 7, 128).transpose(0, 1)), ValueError, "contiguous"),
    ("fia tnd float16", fia(**{n: rand(7, h, 128, dtype=torch.float16) for n, h in
     (("query", 4), ("key", 2), ("value", 2))}), TypeError, "TND' takes bfloat16 only"),
    ("fia tnd head_dim 64", fia(query=rand(7, 4, 64), key=rand(7, 2, 64), value=rand(7, 2, 64)),
     ValueError, "Q_D = K_D = V_D = 128"),
    ("fia tnd head_dim 32", fia(query=rand(7, 4, 32), key=rand(7, 2, 32), value=rand(7, 2, 32)),
     ValueError, "Q_D = K_D = V_D = 128"),
    ("fia tnd 4097 sequences", (lambda lens, q, kv: fia(
        query=q, key=kv, value=kv, actual_seq_lengths=lens, actual_seq_lengths_kv=lens))(
        *many_seqs(4097)), ValueError, "at most 4096"),
    ("fia head_dim not 16-aligned", lambda: emulator.npu_fused_infer_attention_score(
        rand(1, 7, 4, 24), rand(1, 7, 2, 24), rand(1, 7, 2, 24), num_heads=4,
        num_key_value_heads=2, scale=0.2, input_layout="BSND"), ValueError, "multiple of 16"),
    ("fia query row sees no key", fia(actual_seq_lengths_kv=[1, 7]), ValueError, "see no key"),
    ("fia paged cache not [blocks, block_size, N_kv x D]",
     fia(block_table=torch.zeros(2, 1, dtype=torch.int32)), ValueError, "last axis"),
    ("fia off the CPU", fia(query=torch.empty(7, 4, 128, dtype=BF16, device="meta")), ValueError,
     "CPU"),
    # npu_fusion_attention
    ("fa sparse 3 without mask", fa(atten_mask=None), ValueError, "needs atten_mask"),
    ("fa sparse 2 without mask", fa(sparse_mode=2, atten_mask=None), ValueError, "full attention"),
    ("fa lengths as floats", fa(actual_seq_qlen=[3.0, 7.0]), TypeError, "sequence of integers"),
    ("fa last length != T", fa(actual_seq_kvlen=[3, 8]), ValueError, "last entry"),
    ("fa trailing zero batches", fa(actual_seq_qlen=[3, 7, 0], actual_seq_kvlen=[3, 7, 0]),
     NotImplementedError, "trailing zeros"),
    ("fa padding_mask", fa(padding_mask=rand(7, 7)), ValueError, "padding_mask"),
    ("fa dropout", fa(keep_prob=0.9), NotImplementedError, "dropout"),
    ("fa keep_prob 0", fa(keep_prob=0.0), ValueError, "keep_prob"),
    ("fa heads do not divide", fa(head_num=4, key=rand(7, 3, 16), value=rand(7, 3, 16)),
     ValueError, "multiple"),
    ("fa scale left at 1.0", fa(scale=1.0), ValueError, "scale"),
    ("fa softmax_layout without TND", fa(softmax_layout="BSND"), ValueError, "softmax_layout"),
    ("fa uint8 mask wrong shape", fa(atten_mask=MASK.to(torch.uint8)[None]), ValueError, "shape"),
    ("fa tnd 1025 sequences", (lambda lens, q, kv: fa(
        query=q, key=kv, value=kv, actual_seq_qlen=lens, actual_seq_kvlen=lens))(
        *many_seqs(1025)), ValueError, "at most 1024"),
    # npu_rotary_mul
    ("rotary 3-D input", rotary(input=rand(5, 2, 8)), ValueError, "4 dimensions"),
    ("rotary mode", rotary(rotary_mode="full"), ValueError, "rotary_mode"),
    ("rotary odd head_dim", rotary(input=rand(1, 5, 2, 7), r1=rand(1, 5, 1, 7).clamp(-1, 1),
     r2=rand(1, 5, 1, 7).clamp(-1, 1)), ValueError, "even"),
    ("rotary undocumented broadcast", rotary(input=rand(2, 5, 2, 8), r1=rand(1, 1, 1, 8).clamp(
        -1, 1)), ValueError, "documented broadcast"),
    ("rotary cos out of range", rotary(r2=torch.full((1, 5, 1, 8), 2.0, dtype=BF16)), ValueError,
     r"\[-1, 1\]"),
    ("rotary int input", rotary(input=torch.ones(1, 5, 2, 8, dtype=torch.int32)), TypeError,
     "dtype"),
    # norms and swiglu
    ("rms_norm 1-D input", lambda: emulator.npu_rms_norm(rand(8), rand(8)), ValueError,
     "dimensions"),
    ("rms_norm gamma shape", lambda: emulator.npu_rms_norm(rand(3, 8), rand(4)), ValueError,
     "gamma"),
    ("rms_norm gamma dtype", lambda: emulator.npu_rms_norm(rand(3, 8), torch.ones(8)), TypeError,
     "one dtype"),
    ("rms_norm float64", lambda: emulator.npu_rms_norm(torch.ones(3, 8, dtype=torch.float64),
     torch.ones(8, dtype=torch.float64)), TypeError, "dtype"),
    ("add_rms_norm shapes", lambda: emulator.npu_add_rms_norm(rand(3, 8), rand(2, 8), rand(8)),
     ValueError, "one shape"),
    ("swiglu odd size", lambda: emulator.npu_swiglu(rand(3, 7)), ValueError, "even"),
    ("swiglu dim out of range", lambda: emulator.npu_swiglu(rand(3, 8), dim=2), ValueError, "dim"),
    ("swiglu non-contiguous", lambda: emulator.npu_swiglu(rand(8, 3).t()), ValueError,
     "contiguous"),
    ("add_rms_norm 9-D", lambda: emulator.npu_add_rms_norm(rand(*[1] * 8, 8), rand(*[1] * 8, 8),
     rand(8)), ValueError, "1 or 2 or 3"),
    # npu_grouped_matmul
    ("gmm bare tensor x", gmm(x=rand(3, 8), weight=[rand(8, 5)]), TypeError, "list"),
    ("gmm F.linear weight layout", gmm(weight=[rand(5, 8), rand(6, 8)]), ValueError,
     r"pre-transposed \[K, N\]"),
    ("gmm group_type None", gmm(group_type=None), ValueError, "group_type"),
    ("gmm split_item for -1", gmm(split_item=2), ValueError, "split_item"),
    ("gmm List overload", gmm(group_list=[3, 5], group_type=None), NotImplementedError, "List"),
    ("gmm bf16 bias must be fp32", gmm(bias=[rand(5), rand(6)]), TypeError, "bias"),
    ("gmm float32 with three x/weight", gmm(x=[rand(3, 8, dtype=torch.float32)] * 3,
     weight=[rand(8, n, dtype=torch.float32) for n in (4, 2, 2)]), TypeError,
     "single x, weight and y"),
    ("gmm activation", gmm(act_type=1), NotImplementedError, "act_type"),
    ("gmm quantisation", gmm(scale=[torch.ones(5)]), NotImplementedError, "scale"),
    ("gmm group_list sum", gmm(x=[rand(5, 8)], weight=[rand(2, 8, 4)], group_type=0,
     split_item=2, group_list=torch.tensor([2, 4])), ValueError, "group_list"),
    # npu_linear
    ("linear 3-D input", lambda: emulator.npu_linear(rand(2, 3, 8), rand(5, 8)), ValueError,
     "dimensions"),
    ("linear [K, N] weight", lambda: emulator.npu_linear(rand(3, 8), rand(8, 5)), ValueError,
     r"\[N, K\]"),
    ("linear int8", lambda: emulator.npu_linear(torch.ones(3, 8, dtype=torch.int8),
     torch.ones(5, 8, dtype=torch.int8)), NotImplementedError, "integer"),
    # npu_attention_update
    ("update bare tensors", lambda: emulator.npu_attention_update(torch.zeros(2, 6), rand(2, 6, 16),
     0), TypeError, "list"),
    ("update sp > 16", update(lse=[torch.zeros(6)] * 17, out=[rand(6, 16)] * 17), ValueError,
     "1..16"),
    ("update head_dim not 8k", update(out=[rand(6, 12), rand(6, 12)]), ValueError, "multiple of 8"),
    ("update head_dim > 512", update(out=[rand(6, 520), rand(6, 520)]), ValueError, "8..512"),
    ("update lse float16", update(lse=[torch.zeros(6, dtype=torch.float16)] * 2), TypeError,
     "float32"),
    ("update N differs", update(lse=[torch.zeros(6), torch.zeros(5)]), ValueError, "one N"),
    ("update out dtypes differ", update(out=[rand(6, 16), rand(6, 16, dtype=torch.float16)]),
     TypeError, "dtype"),
    ("update update_type", update(update_type=2), ValueError, "update_type"),
]


@pytest.mark.parametrize("name", sorted(VALID_CALLS))
def test_base_calls_are_accepted(name):
    result = VALID_CALLS[name]()
    assert result is not None


@pytest.mark.parametrize(("thunk", "error", "match"), [case[1:] for case in REJECTIONS],
                         ids=[case[0] for case in REJECTIONS])
def test_contract_violation_raises_clear_error(thunk, error, match):
    with pytest.raises(error, match=match):
        thunk()


def test_fia_without_a_mask_lets_a_sequence_without_keys_through_as_nan():
    """vllm-ascend's CP chunked context (0.23.0.post1 `AscendAttentionCPImpl`,
    `_update_chunk_attn_out_lse_with_current_attn_out_lse`, sparse_mode 0) gives FIA
    every prefill request, those without context on this rank with 0 keys, and drops their
    rows afterwards: FIA takes key lengths that are only non-negative (torch-npu
    2.10.0.post4 `_op_plugin_docs.py`), what it writes there is undocumented, so the stand-in
    writes NaN in those rows and computes the others as usual. Causal, it still raises."""
    query, key, value = rand(7, 4, 128), rand(7, 2, 128), rand(7, 2, 128)
    common = dict(num_heads=4, num_key_value_heads=2, scale=0.25, input_layout="TND",
                  sparse_mode=0)  # fmt: skip
    out, lse = emulator.npu_fused_infer_attention_score(
        query, key[:4], value[:4], actual_seq_lengths=[3, 7], actual_seq_lengths_kv=[0, 4],
        softmax_lse_flag=True, **common)  # fmt: skip
    alone, alone_lse = emulator.npu_fused_infer_attention_score(
        query[3:], key[:4], value[:4], actual_seq_lengths=[4], actual_seq_lengths_kv=[4],
        softmax_lse_flag=True, **common)  # fmt: skip
    assert out[:3].isnan().all() and lse[:3].isnan().all()
    assert torch.equal(out[3:], alone) and torch.equal(lse[3:], alone_lse)
    with pytest.raises(ValueError, match="see no key"):
        fia(actual_seq_lengths_kv=[0, 4], key=key[:4], value=value[:4])()


@pytest.mark.parametrize(("call", "match"), [
    (lambda: emulator.npu_rms_norm(rand(3, 8), rand(8), eps=1e-6),
     "unexpected keyword argument 'eps'"),
    (lambda: emulator.npu_rms_norm(rand(3, 8)), "missing required argument 'gamma'"),
    (lambda: emulator.npu_rms_norm(rand(3, 8), rand(8), 1e-6, 1), "positional"),
    (lambda: emulator.npu_fused_infer_attention_score(rand(7, 4, 16), rand(7, 2, 16),
                                                      rand(7, 2, 16), MASK), "keyword-only"),
    (lambda: emulator.npu_swiglu(rand(3, 8), -1, dim=-1), "multiple values for argument 'dim'"),
    (lambda: emulator.npu_swiglu(rand(3, 8), dim=1.0), "must be int"),
    (lambda: emulator.npu_swiglu(rand(3, 8), dim=True), "must be int"),
    (lambda: emulator.npu_linear(torch.ones(3, 8).numpy(), rand(5, 8)), "must be Tensor"),
    (lambda: emulator.npu_fusion_attention(rand(7, 4, 16), rand(7, 2, 16), rand(7, 2, 16), 4,
                                           "TND", pre_tokens=0),
     "unexpected keyword argument 'pre_tokens'"),
])
def test_schema_binding_rejects_bad_calls(call, match):
    with pytest.raises(TypeError, match=match):
        call()


def test_schema_defaults_and_positional_arguments_bind():
    call = _schema.bind("npu_fusion_attention", (rand(1), rand(1), rand(1), 4, "TND"), {})
    assert call.arguments["scale"] == 1.0 and call.arguments["pre_tockens"] == 2147483647
    assert call.arguments["softmax_layout"] == "" and call.overload == ""
    fia_call = _schema.bind("npu_fused_infer_attention_score", (rand(1),) * 3, {})
    assert fia_call.num_heads == 1 and fia_call.input_layout == "BSH"
    assert fia_call.num_key_value_heads == 0 and fia_call.softmax_lse_flag is False


def test_binding_follows_the_schema_data(monkeypatch):
    document = json.loads(_schema.SCHEMA_FILE.read_text())
    document["operators"]["npu_swiglu"][0]["arguments"][1]["name"] = "axis"
    monkeypatch.setattr(_schema, "schema_document", lambda: document)
    with pytest.raises(TypeError, match="unexpected keyword argument 'dim'"):
        emulator.npu_swiglu(rand(3, 8), dim=-1)


def test_calls_are_counted_per_operator():
    emulator.reset_counts()
    emulator.npu_swiglu(rand(3, 8))
    emulator.npu_swiglu(rand(3, 8))
    emulator.npu_rms_norm(rand(3, 8), rand(8))
    with pytest.raises(ValueError):
        emulator.npu_swiglu(rand(3, 7))
    assert emulator.calls == {"npu_swiglu": 3, "npu_rms_norm": 1}
    emulator.reset_counts()
    assert sum(emulator.calls.values()) == 0


def test_an_emulated_operator_is_one_opaque_torch_operator(monkeypatch):
    """As with torch_npu, callers see one `npu::` operator, never the emulator's own aten ops;
    inside_operator() is True only while its CPU kernel runs."""
    from vllm_npu_ext.emulator.operators import norm

    x, gamma = rand(3, 8), rand(8)
    inside = []
    original = norm._rms_norm
    monkeypatch.setattr(norm, "_rms_norm", lambda *a: inside.append(emulator.inside_operator())
                        or original(*a))
    with RecordOps() as mode:
        emulator.npu_rms_norm(x, gamma)
    assert [func for func, _, _ in mode.seen] == [torch.ops.npu.npu_rms_norm.default]
    assert inside == [True] and not emulator.inside_operator()


@pytest.mark.parametrize("op", sorted(_schema.schema_document()["operators"]))
def test_operators_are_registered_with_the_wheels_schema_strings(op):
    for schema in _schema.schema_document()["operators"][op]:
        overload = getattr(getattr(torch.ops.npu, op), schema["overload"] or "default")
        assert overload._schema == torch._C.parse_schema("npu::" + schema["schema"])


def test_registration_is_safe_to_repeat():
    from vllm_npu_ext.emulator.operators import pointwise
    from vllm_npu_ext.emulator.runtime import registry as _runtime

    _runtime.register_operator("npu_swiglu", lambda call: 1 / 0)  # kept: the first one stays
    emulator.reset_counts()
    out = emulator.npu_swiglu(rand(3, 8))
    assert out.shape == (3, 4) and emulator.calls == {"npu_swiglu": 1}
    assert pointwise.npu_swiglu is emulator.OPERATORS["npu_swiglu"]


@pytest.mark.parametrize("name", sorted(VALID_CALLS))
def test_fake_kernels_match_the_cpu_kernels(name):
    """torch.library.opcheck: the schema's alias/mutation claims hold, and the fake kernel (the
    wheel's meta shapes) gives the CPU kernel's output shapes, dtypes and strides."""
    # update_type 0: the wheel's meta returns an lse-shaped second output where eager returns
    # None (the kernel allocates it only for update_type 1), so that case cannot agree.
    call = update(update_type=1) if name == "update" else VALID_CALLS[name]
    with RecordOps() as mode:
        call()
    (func, args, kwargs), = [seen for seen in mode.seen if seen[0].namespace == "npu"]
    torch.library.opcheck(func, args, kwargs, test_utils=("test_schema", "test_faketensor"))


def test_compiled_calls_count_once_and_stay_corruptible():
    """Under torch.compile the graph calls the operator's kernel: counted once per execution,
    the corruption hook still applies, and the operator causes no graph break."""
    import torch._dynamo.utils as dynamo_utils

    torch._dynamo.reset()
    dynamo_utils.counters.clear()

    def layer(x, gamma):
        return emulator.npu_swiglu(emulator.npu_rms_norm(x, gamma)[0]) * 2

    compiled = torch.compile(layer, fullgraph=True, backend="inductor")
    x, gamma = rand(3, 8), rand(8)
    emulator.reset_counts()
    with torch.no_grad():
        results = [compiled(x, gamma) for _ in range(3)]
        with emulator.corrupted("npu_swiglu", lambda y: y + 1):
            corrupted = compiled(x, gamma)
    assert emulator.calls == {"npu_rms_norm": 4, "npu_swiglu": 4}
    torch.testing.assert_close(results[0], layer(x, gamma))
    torch.testing.assert_close(corrupted, results[0] + 2)
    assert not dynamo_utils.counters["graph_break"]


def test_corrupted_perturbs_one_operator_while_active():
    x, weight = rand(3, 8), rand(5, 8)
    clean, linear = emulator.npu_swiglu(x), emulator.npu_linear(x, weight)
    with emulator.corrupted("npu_swiglu", lambda y: y + 1):
        assert torch.equal(emulator.npu_swiglu(x), clean + 1)
        assert torch.equal(emulator.npu_linear(x, weight), linear)
    assert torch.equal(emulator.npu_swiglu(x), clean)
    with pytest.raises(ValueError, match="unknown operator"), emulator.corrupted("npu_nope", abs):
        pass


def test_install_and_uninstall_restore_sys_modules():
    sentinel = object()
    saved = sys.modules.get("torch_npu")
    sys.modules["torch_npu"] = sentinel
    try:
        with emulator.emulated() as module:
            assert sys.modules["torch_npu"] is module and dispatch.emulator() is module
            assert module.__vllm_npu_ext_emulator__ is True
            assert dispatch.npu_ops(torch.zeros(1)).npu_rms_norm is emulator.npu_rms_norm
        assert sys.modules["torch_npu"] is sentinel and dispatch.emulator() is None
        del sys.modules["torch_npu"]
        emulator.install()
        emulator.uninstall()
        assert "torch_npu" not in sys.modules
        with pytest.raises(RuntimeError, match="without a matching install"):
            emulator.uninstall()
    finally:
        sys.modules.pop("torch_npu", None)
        if saved is not None:
            sys.modules["torch_npu"] = saved
