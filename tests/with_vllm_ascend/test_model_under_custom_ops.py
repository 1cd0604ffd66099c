"""Our Qwen3 built under vllm-ascend's layer substitutions, run on the emulated NPU path.

In a vLLM worker on Ascend, `NPUWorker.__init__` calls `register_ascend_customop(vllm_config)`
(vllm-ascend 0.23.0.post1 `NPUWorker.__init__`, `vllm_ascend.utils.register_ascend_customop`): every
layer vLLM builds through `CustomOp`/`PluggableLayer` from then on is vllm-ascend's subclass
(RMSNorm, rotary embedding, the parallel linear layers with their `AscendUnquantizedLinearMethod`,
SiluAndMul, the vocabulary embedding). Here that registration runs for real, with the worker's other
steps that the stand-in can run (`_worker_steps`), on a VllmConfig of a pooling run resolved by
NPUPlatform; then vLLM's own loader (`get_model`) builds our Qwen3 from a tiny checkpoint on the
CPU, the emulated NPU, and vllm-ascend's linear method post-processes its weights. Checked:

- which vllm-ascend classes replaced vLLM's inside our model;
- the NPU path (`forward_packed` on a packed batch of texts of different lengths, last-token
  pooled, L2-normalised) against Hugging Face: cosine >= 0.99999 per text in float32 (>= 0.999
  in bfloat16), and bit for bit what the same model built with vLLM's own classes gives;
- device operators per decoder layer: 9 launches where vllm-ascend's `vllm.qkv_rmsnorm_rope`
  takes the model (bf16, head_dim 128), 12 in float32, and every operator (aten ones
  included) the same as with vLLM's own classes;
- the NPU path's norms against vllm-ascend's RMSNorm forward when that norm has a bias.

Two checkpoints: float32, whose weights vllm-ascend keeps in ND, and bfloat16 shaped like
Qwen3-Embedding's attention with `weight_nz_mode: 2`, where vllm-ascend casts every linear weight to
FRACTAL_NZ (`npu_format_cast`, `AscendUnquantizedLinearMethod.process_weights_after_loading`) after
loading and the NPU path reads the cast weights. The model is eager (`enforce_eager`):
`forward_packed` runs outside vLLM's compiled forward either way.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from types import ModuleType

import pytest
import torch
import torch.nn.functional as F
from support.hf_oracle import cosines, hf_embeddings
from support.scripts import load_script
from support.vllm_ascend_env import engine_config

from vllm_npu_ext import emulator
from vllm_npu_ext.model_executor.layers.npu_plan import QK_FUSED
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

TEXTS = [
    "a",
    "Hello world, the query!",
    "The document is long and has many tokens in it; it keeps going for a while 12345.",
    "retrieval " * 17,
]
# name -> checkpoint shape overrides, dtype, vllm-ascend's additional_config.
CONFIGS = {
    "fp32": ({}, "float32", {}),
    # Qwen3-Embedding's head_dim and dtype: fused-infer attention and grouped q/k/v on the NPU
    # path; every linear weight cast to FRACTAL_NZ by vllm-ascend after loading.
    "bf16_nz": (
        {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128,
         "hidden_size": 160, "intermediate_size": 352},
        "bfloat16", {"weight_nz_mode": 2},
    ),
}  # fmt: skip
LINEARS_PER_LAYER = 4  # qkv_proj, o_proj, gate_up_proj, down_proj
LAUNCHES_PER_LAYER = {"fp32": 12, "bf16_nz": 9}
# vllm-ascend ops registered for PrivateUse1 only that these tests reach: the vocabulary
# embedding's reduction (vllm-ascend 0.23.0.post1 `AscendVocabParallelEmbedding._forward_origin`, on
# our NPU path) and RMSNorm's residual chunking (`AscendRMSNorm.forward_oot`, in its own forward).
PRIVATEUSE1_ONLY_OPS = ("maybe_pad_and_reduce", "maybe_chunk_residual")


def _substitutions() -> dict[type, type]:
    """vLLM class -> the vllm-ascend class `register_ascend_customop` registers for it."""
    from vllm.model_executor.layers.activation import SiluAndMul
    from vllm.model_executor.layers.layernorm import RMSNorm
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        QKVParallelLinear,
        RowParallelLinear,
    )
    from vllm.model_executor.layers.rotary_embedding import RotaryEmbedding
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm_ascend.ops.activation import AscendSiluAndMul
    from vllm_ascend.ops.layernorm import AscendRMSNorm
    from vllm_ascend.ops.linear import (
        AscendMergedColumnParallelLinear,
        AscendQKVParallelLinear,
        AscendRowParallelLinear,
    )
    from vllm_ascend.ops.rotary_embedding import AscendRotaryEmbedding
    from vllm_ascend.ops.vocab_parallel_embedding import AscendVocabParallelEmbedding

    return {
        RMSNorm: AscendRMSNorm, RotaryEmbedding: AscendRotaryEmbedding,
        QKVParallelLinear: AscendQKVParallelLinear,
        MergedColumnParallelLinear: AscendMergedColumnParallelLinear,
        RowParallelLinear: AscendRowParallelLinear, SiluAndMul: AscendSiluAndMul,
        VocabParallelEmbedding: AscendVocabParallelEmbedding,
    }  # fmt: skip


def _vllm_class(module: torch.nn.Module, substitutions: dict[type, type]) -> type | None:
    """The most derived vLLM class of `substitutions` that `module` is an instance of."""
    return next((cls for cls in type(module).__mro__ if cls in substitutions), None)


@pytest.fixture(scope="module")
def distributed(vllm_ascend_started):
    """`ensure(vllm_config)`: one-rank world and model-parallel groups on the `hccl` backend
    (gloo here), as `NPUWorker` sets them up (vllm-ascend 0.23.0.post1
    `NPUWorker._init_worker_distributed_environment`); torn down if made here.

    The groups are vLLM's own `GroupCoordinator`s. vllm-ascend's worker patches replace that
    class (`vllm.distributed.parallel_state.GroupCoordinator = GroupCoordinatorPatch` in
    `vllm_ascend/patch/worker/patch_distributed.py`) in every process that imports its worker
    package (importing its model runner does: `vllm_ascend.worker.model_runner_v1` imports from
    `vllm_ascend.patch.worker`), and the replacement
    builds each group with `torch_npu._C._distributed_c10d.ProcessGroupHCCL.Options()`
    (`GroupCoordinatorPatch._init_device_groups` -> `vllm_ascend.utils.create_hccl_pg_options`),
    which the stand-in does not construct
    (`emulator/surface.py`). With one rank, what the layers here ask of the groups (ranks,
    sizes, reductions that are the identity) does not depend on that class.
    """
    from vllm.config import set_current_vllm_config
    from vllm.distributed import parallel_state
    from vllm.utils.network_utils import get_open_port

    own = next(
        cls for cls in parallel_state.GroupCoordinator.__mro__
        if cls.__module__ == parallel_state.__name__ and cls.__name__ == "GroupCoordinator"
    )  # fmt: skip
    made = []

    def ensure(vllm_config) -> None:
        if parallel_state._WORLD is not None:
            return
        with set_current_vllm_config(vllm_config), pytest.MonkeyPatch.context() as patch:
            patch.setattr(parallel_state, "GroupCoordinator", own)
            parallel_state.init_distributed_environment(
                1, 0, f"tcp://127.0.0.1:{get_open_port()}", 0, "hccl"
            )
            parallel_state.ensure_model_parallel_initialized(1, 1)
        made.append(True)

    yield ensure
    if made:
        parallel_state.destroy_model_parallel()
        parallel_state.destroy_distributed_environment()


@pytest.fixture(scope="module")
def npu_kernels_on_the_host(vllm_ascend_started):
    """vllm-ascend registers its `torch.ops.vllm.*` ops for PrivateUse1 only, the NPU's
    dispatch key (`direct_register_custom_op(..., dispatch_key="PrivateUse1")`,
    the module-level registrations of `vllm_ascend/ops/register_custom_ops.py`); the emulated
    NPU's tensors are CPU
    tensors, so the stand-in's CPU fallback runs those kernels and counts the calls
    (`emulator.surface.npu_kernels_on_host`)."""
    from vllm_npu_ext.emulator import surface

    for name in PRIVATEUSE1_ONLY_OPS:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(f"vllm::{name}", "CPU"), name
    return surface.npu_kernels_on_host


def _worker_steps(vllm_config) -> None:
    """`register_ascend_customop` and `init_ascend_config`, as `NPUWorker.__init__` calls them
    (vllm-ascend 0.23.0.post1 `NPUWorker.__init__`), and the weight-prefetch method its model
    runner sets up before it
    loads the model (vllm-ascend's RMSNorm reads it in its forward).

    Not run here: `adapt_patch()` (also `NPUWorker.__init__`), vllm-ascend's worker patches (see
    `distributed` for their process groups). Its loader patch
    (patch_process_weights_after_loading.py) runs the same `quant_method.
    process_weights_after_loading` loop as vLLM's for a model without DSA attention, so the
    weights are processed by the same vllm-ascend code whether or not another test module
    applied the patches already.
    """
    from vllm.config import set_current_vllm_config
    from vllm_ascend.ascend_config import init_ascend_config
    from vllm_ascend.utils import register_ascend_customop, set_weight_prefetch_method

    register_ascend_customop(vllm_config)
    ascend_config = init_ascend_config(vllm_config)
    with set_current_vllm_config(vllm_config):  # as NPUModelRunner.__init__ does
        set_weight_prefetch_method(ascend_config.weight_prefetch_config)


@contextlib.contextmanager
def _fresh_rope_cache():
    """`get_rope` caches instances process-wide; a worker builds its model with none cached."""
    from vllm.model_executor.layers import rotary_embedding

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rotary_embedding, "_ROPE_DICT", {})
        yield


def _load(vllm_config):
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader import get_model

    with set_current_vllm_config(vllm_config), _fresh_rope_cache():
        return get_model(vllm_config=vllm_config)


def _engine_config(model_dir, dtype: str, additional: dict):
    """The VllmConfig of a pooling run, as NPUPlatform resolves it, loading onto the CPU."""
    vllm_config = engine_config(
        model_dir, runner="pooling", dtype=dtype, max_model_len=256, seed=0,
        enforce_eager=True, additional_config=additional,
    )  # fmt: skip
    vllm_config.load_config.device = "cpu"  # the loader's target device: the emulated NPU
    return vllm_config


@pytest.fixture(scope="module")
def count_ops() -> ModuleType:
    """`benchmarks/count_ops.py` (it sets VLLM_ENABLE_V1_MULTIPROCESSING=0 on import; the
    variable is restored here, for the processes other tests start)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        return load_script("benchmarks/count_ops.py")


@pytest.fixture(scope="module", params=list(CONFIGS))
def built(request, distributed, npu_kernels_on_the_host, tmp_path_factory):
    """The config's checkpoint and two models loaded from it, each with its VllmConfig:
    `ascend` (after the worker steps) and `vllm` (the same build with vLLM's own classes: no
    out-of-tree registrations), to compare against. `load_calls`: the emulated operators
    loading `ascend` called; `cast`: the tensors its npu_format_cast calls returned."""
    from vllm.model_executor import custom_op

    from vllm_npu_ext.tiny_model import make_tiny_model

    overrides, dtype, additional = CONFIGS[request.param]
    model_dir = make_tiny_model(tmp_path_factory.mktemp(request.param) / "tiny", **overrides)
    plain_config = _engine_config(model_dir, dtype, additional)
    vllm_config = _engine_config(model_dir, dtype, additional)
    _worker_steps(vllm_config)
    distributed(vllm_config)
    emulator.reset_counts()
    cast: list[torch.Tensor] = []
    with emulator.corrupted("npu_format_cast", lambda out: cast.append(out) or out):
        ascend = _load(vllm_config)
    load_calls = dict(emulator.calls)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(custom_op, "op_registry_oot", {})
        plain = _load(plain_config)
    return {
        "name": request.param, "dir": model_dir, "dtype": dtype, "load_calls": load_calls,
        "cast": cast,
        "ascend": (ascend, vllm_config), "vllm": (plain, plain_config),
    }  # fmt: skip


def _packed_batch(model_dir):
    from transformers import AutoTokenizer

    from vllm_npu_ext.ops.packed import PackedSeqs

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    token_ids = [tokenizer(text)["input_ids"] for text in TEXTS]
    assert len({len(ids) for ids in token_ids}) == len(TEXTS)  # different lengths
    input_ids = torch.tensor([i for ids in token_ids for i in ids])
    positions = torch.cat([torch.arange(len(ids)) for ids in token_ids])
    return input_ids, positions, PackedSeqs.from_seq_lens([len(ids) for ids in token_ids])


def _embed(built, which: str) -> tuple[torch.Tensor, dict[str, int]]:
    """Last-token L2-normalised embeddings of TEXTS from the NPU path of model `which`, and
    the emulated operator calls of that forward."""
    from vllm.config import set_current_vllm_config

    from vllm_npu_ext.ops.pooling import last_token_pool

    model, vllm_config = built[which]
    input_ids, positions, seqs = _packed_batch(built["dir"])
    emulator.reset_counts()
    with set_current_vllm_config(vllm_config), torch.no_grad():
        hidden = model.model.forward_packed(input_ids, positions, seqs)
    calls = dict(emulator.calls)
    pooled = last_token_pool(hidden, seqs.cu_seqlens_tensor(hidden.device), normalize=False)
    return F.normalize(pooled.float(), dim=-1), calls


def _layer_ops(count_ops: ModuleType, built, which: str) -> dict[str, int]:
    """Every operator one decoder layer of model `which` issues on the NPU path with the
    model's fusions (`benchmarks/count_ops.py`: torch_npu operators and the aten operators
    that launch work)."""
    from vllm.config import set_current_vllm_config

    model, vllm_config = built[which]
    _, _, seqs = _packed_batch(built["dir"])
    with set_current_vllm_config(vllm_config):
        return count_ops.count_layer_ops(model, model.model.plan.fusions, seqs.seq_lens)["ops"]


def _expected_ops(inner) -> Counter[str]:
    """The launches of one decoder layer (after the first) with all fusions on: 9 where
    vllm-ascend's `vllm.qkv_rmsnorm_rope` takes the model (bf16, head_dim 128: the q/k/v
    split, q/k norms and RoPE after one merged projection), else 11 (q/k norms apart, q and k
    rotated by one npu_mrope; float32 q/k/v come from one merged matmul, v copied out)."""
    expected = Counter({
        "torch_npu.npu_add_rms_norm": 2, f"torch_npu.npu_{inner.plan.fusions.attention_op}": 1,
        "torch_npu.npu_swiglu": 1, "torch_npu.npu_linear": 3,
    })  # fmt: skip
    if inner.plan.qk_path == QK_FUSED:
        expected.update({"vllm.qkv_rmsnorm_rope": 1, "torch_npu.npu_linear": 1})
        return expected
    expected.update({"torch_npu.npu_rms_norm": 2, "torch_npu.npu_mrope": 1})
    if inner.plan.fusions.grouped_qkv and inner.layers[0].self_attn.qkv_weights_kn is not None:
        expected["torch_npu.npu_grouped_matmul"] += 1
    else:  # one merged matmul, and v (a strided view of its result) made contiguous
        expected.update({"torch_npu.npu_linear": 1, "aten.clone.default": 1})
    return expected


def test_vllm_ascend_classes_replace_vllms_inside_our_model(built):
    from vllm_ascend.ops.linear import AscendUnquantizedLinearMethod

    from vllm_npu_ext.model_executor.models.qwen3 import Qwen3Model

    substitutions = _substitutions()
    model, vllm_config = built["ascend"]
    inner = model.model
    assert type(inner) is Qwen3Model  # ours, built by vLLM's pooling adapter around our class
    found = Counter()
    for name, module in model.named_modules(remove_duplicate=False):
        base = _vllm_class(module, substitutions)
        if base is None:
            continue
        assert type(module) is substitutions[base], f"{name}: {type(module)}"
        found[type(module).__name__] += 1
        if hasattr(module, "quant_method") and "proj" in name:
            assert type(module.quant_method) is AscendUnquantizedLinearMethod, name
    layers = vllm_config.model_config.hf_config.num_hidden_layers
    assert found == {
        "AscendVocabParallelEmbedding": 1,
        "AscendRMSNorm": 4 * layers + 1,  # input, post-attention, q and k norms; final norm
        "AscendRotaryEmbedding": layers,  # one instance, shared by every layer (get_rope)
        "AscendQKVParallelLinear": layers, "AscendMergedColumnParallelLinear": layers,
        "AscendRowParallelLinear": 2 * layers, "AscendSiluAndMul": layers,
    }  # fmt: skip
    assert inner.layers[0].self_attn.rotary_emb is inner.layers[-1].self_attn.rotary_emb


def test_the_comparison_model_has_vllms_own_classes(built):
    substitutions = _substitutions()
    for name, module in built["vllm"][0].named_modules():
        base = _vllm_class(module, substitutions)
        assert base is None or type(module) is base, f"{name}: {type(module)}"


def test_the_npu_path_reads_the_weights_vllm_ascends_linear_method_left(built):
    """float32: vllm-ascend keeps the ND weights (no cast). bfloat16 with weight_nz_mode 2:
    each linear weight went through npu_format_cast once, and the tensor the NPU path reads
    (`fused.npu_weight`) is the cast's result."""
    from vllm_npu_ext.model_executor.layers import fused

    inner = built["ascend"][0].model
    linears = [
        linear for layer in inner.layers for linear in (
            layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.mlp.gate_up_proj,
            layer.mlp.down_proj)
    ]  # fmt: skip
    assert len(linears) == LINEARS_PER_LAYER * len(inner.layers)
    cast = {out.untyped_storage().data_ptr() for out in built["cast"]}
    assert built["load_calls"].get("npu_format_cast", 0) == len(built["cast"])
    assert len(cast) == (len(linears) if built["name"] == "bf16_nz" else 0)
    for linear in linears:
        assert fused.supports_npu_linear(linear), linear.prefix
        weight = fused.npu_weight(linear)
        assert weight.dtype == getattr(torch, built["dtype"])
        assert (weight.untyped_storage().data_ptr() in cast) is bool(cast), linear.prefix


def test_npu_path_matches_hugging_face(built):
    embeddings, calls = _embed(built, "ascend")
    worst = cosines(embeddings, hf_embeddings(built["dir"], TEXTS)).min().item()
    assert worst >= min_embedding_cosine(getattr(torch, built["dtype"])), worst
    layers = len(built["ascend"][0].model.layers)
    emulated = [n for op, n in _expected_ops(built["ascend"][0].model).items()
                if not op.startswith("aten.")]  # fmt: skip
    assert sum(calls.values()) == sum(emulated) * layers + 1, calls  # + the final norm


def test_same_embeddings_as_with_vllms_own_classes(built, npu_kernels_on_the_host):
    """Same weights, same operators: the result is bit for bit the same. vllm-ascend's
    embedding layer ran (its PrivateUse1 reduction op was called once per forward)."""
    before = npu_kernels_on_the_host["vllm::maybe_pad_and_reduce"]
    ascend, ascend_calls = _embed(built, "ascend")
    assert npu_kernels_on_the_host["vllm::maybe_pad_and_reduce"] == before + 1
    plain, plain_calls = _embed(built, "vllm")
    assert npu_kernels_on_the_host["vllm::maybe_pad_and_reduce"] == before + 1
    assert torch.equal(ascend, plain)
    assert ascend_calls == plain_calls


def test_a_layer_launches_the_same_operators_as_without_vllm_ascend(built, count_ops):
    ascend_ops = _layer_ops(count_ops, built, "ascend")
    inner = built["ascend"][0].model
    assert ascend_ops == _expected_ops(inner), ascend_ops
    assert sum(ascend_ops.values()) == LAUNCHES_PER_LAYER[built["name"]]
    assert ascend_ops == _layer_ops(count_ops, built, "vllm")


def _norm_with_loaded_bias(vllm_config, hidden_size: int, eps: float):
    """An RMSNorm built as vLLM builds ours (vllm-ascend's, here), in the model's dtype, with
    the bias vllm-ascend's RMSNorm carries for quantised checkpoints whose description lists
    norm biases (vllm-ascend 0.23.0.post1 `AscendRMSNorm.__init__`), loaded by its own weight
    loader."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.layernorm import RMSNorm

    generator = torch.Generator().manual_seed(3)
    with set_current_vllm_config(vllm_config):
        norm = RMSNorm(hidden_size, eps=eps)
    norm.weight.data.copy_(torch.rand(hidden_size, generator=generator) + 0.5)
    norm.bias = torch.nn.Parameter(torch.zeros(hidden_size), requires_grad=False)
    norm.bias.weight_loader = norm._bias_weight_loader
    norm.bias.weight_loader(norm.bias, torch.randn(hidden_size, generator=generator))
    return norm.to(vllm_config.model_config.dtype), generator


def test_npu_path_norms_match_vllm_ascends_rmsnorm_with_a_bias(built, monkeypatch):
    """Our NPU path runs vllm-ascend's RMSNorm parameters through torch_npu itself
    (`fused.rms_norm` / `fused.add_rms_norm`); it must give what that layer's own forward
    (`AscendRMSNorm.forward_oot`, on the emulated torch_npu too) gives, bias included: to the
    bit where vllm-ascend adds the residual with torch_npu's `npu_add_rms_norm` and then the
    bias (its path without its operator library), and within one rounding of the dtype where
    it calls its library's `npu_add_rms_norm_bias` (the Ascend path: that kernel rounds the
    normalised value to bf16 before the weight, `emulator/operators/vllm_ascend_library.py`)."""
    import vllm_ascend.utils
    from vllm.config import set_current_vllm_config
    from vllm_ascend.ops.layernorm import AscendRMSNorm

    from vllm_npu_ext.model_executor.layers import fused
    from vllm_npu_ext.model_executor.layers.npu_plan import QK_REFERENCE
    from vllm_npu_ext.model_executor.layers.npu_step import NpuStep

    model, vllm_config = built["ascend"]
    config = vllm_config.model_config.hf_config
    norm, generator = _norm_with_loaded_bias(vllm_config, config.hidden_size, config.rms_norm_eps)
    assert type(norm) is AscendRMSNorm and norm.bias_loaded
    dtype = vllm_config.model_config.dtype
    assert norm.weight.dtype == norm.bias.dtype == dtype
    x = torch.randn(7, config.hidden_size, generator=generator).to(dtype)
    residual = torch.randn(7, config.hidden_size, generator=generator).to(dtype)
    empty = torch.empty(0)
    step = NpuStep(emulator, model.model.plan.fusions, QK_REFERENCE, empty, None, None, None)
    with set_current_vllm_config(vllm_config), torch.no_grad():
        assert vllm_ascend.utils.enable_custom_op()  # the stand-in's vllm_ascend_C
        theirs = norm.forward_oot(x.clone())
        library_sum = norm.forward_oot(x.clone(), residual.clone())
        monkeypatch.setattr(vllm_ascend.utils, "_CUSTOM_OP_ENABLED", False)
        theirs_sum = norm.forward_oot(x.clone(), residual.clone())
        ours = fused.rms_norm(norm, x.clone(), step)
        ours_sum = fused.add_rms_norm(norm, x.clone(), residual.clone(), step)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0)
    for mine, reference in zip(ours_sum, theirs_sum, strict=True):
        torch.testing.assert_close(mine, reference, rtol=0, atol=0)
    torch.testing.assert_close(ours_sum[1], library_sum[1], rtol=0, atol=0)  # the residual
    # Rounding the normalised value, the product and the sum in another order: at most a
    # rounding of the output and of the product before the bias (output - bias) on each side.
    library = library_sum[0].float()
    ulp = {torch.float32: 2.0**-23, torch.bfloat16: 2.0**-8}[dtype]
    bound = ulp * (library.abs() + (library - norm.bias.float()).abs()) * 2
    diff = (ours_sum[0].float() - library).abs()
    assert (diff <= bound).all(), (diff - bound).max()
