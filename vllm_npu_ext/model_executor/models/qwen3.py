"""Qwen3 for vLLM, built from vllm-npu-ext's fused layers.

Pooling runs of a `Qwen3ForCausalLM` checkpoint get this class (`patches.vllm_model_registry`),
so `--runner pooling --convert embed` turns it into an embedding model (last-token pooling,
L2 normalisation); generation runs vLLM's own Qwen3 unless `VLLM_NPU_EXT_GENERATION=1`. The
layers live in `vllm_npu_ext.model_executor.layers`; this file only wires them.

Two classes differ only in `attn_type`, which vLLM reads (and caches per class) for pooling
runs: `Qwen3ForCausalLM` pools without a KV cache (vLLM then also turns prefix caching and
chunked prefill off), `Qwen3KVCacheForCausalLM` keeps vLLM's KV cache.
`VLLM_NPU_EXT_KV_CACHE_FREE` selects which one `register()` installs. Generation always
uses the KV cache.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from itertools import islice

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.config import VllmConfig
from vllm.distributed import get_pp_group
from vllm.model_executor.layers.layernorm import RMSNorm
from vllm.model_executor.layers.logits_processor import LogitsProcessor
from vllm.model_executor.layers.vocab_parallel_embedding import (
    ParallelLMHead,
    VocabParallelEmbedding,
)
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader,
    maybe_remap_kv_scale_name,
)
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    PPMissingLayer,
    is_pp_missing_parameter,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
)
from vllm.sequence import IntermediateTensors

from vllm_npu_ext import compat, envs
from vllm_npu_ext.envs import FusionConfig
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.model_executor.layers import cpu_matmul, cpu_matmul_choice, fused
from vllm_npu_ext.model_executor.layers.attention import Qwen3Attention
from vllm_npu_ext.model_executor.layers.cache_free.full_graph import FullGraphAttention
from vllm_npu_ext.model_executor.layers.cache_free.op import SPLITTING_OP
from vllm_npu_ext.model_executor.layers.mlp import Qwen3MLP
from vllm_npu_ext.model_executor.layers.npu_step import (
    QK_FUSED,
    QK_MROPE,
    QK_REFERENCE,
    QK_ROTARY_MUL,
    NpuStep,
    RotaryTables,
)
from vllm_npu_ext.model_executor.models import qwen3_config
from vllm_npu_ext.ops import attention, dispatch, linear, qk_norm_rope, rotary
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.patches import vllm_ascend_cos_sin

logger = get_logger(__name__)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config, cache_config, quant_config, prefix: str, cache_free: bool):
        super().__init__()
        self.self_attn = Qwen3Attention(
            config, cache_config, quant_config, f"{prefix}.self_attn", cache_free
        )
        self.mlp = Qwen3MLP(config, quant_config, f"{prefix}.mlp")
        self.input_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps=config.rms_norm_eps)

    def forward(self, positions, hidden_states, residual, step: NpuStep | None):
        if residual is None:
            residual = hidden_states
            hidden_states = fused.rms_norm(self.input_layernorm, hidden_states, step)
        else:
            hidden_states, residual = fused.add_rms_norm(
                self.input_layernorm, hidden_states, residual, step
            )
        hidden_states = self.self_attn(positions, hidden_states, step)
        hidden_states, residual = fused.add_rms_norm(
            self.post_attention_layernorm, hidden_states, residual, step
        )
        return self.mlp(hidden_states, step), residual


def _fusions_for(dtype: torch.dtype, attn: Qwen3Attention) -> tuple[FusionConfig, list[str]]:
    """The environment's fusions, minus what the NPU operators do not take for this model,
    and one note per change (the model logs them when it runs the NPU path).

    Both limits are documented ones (ops/linear.py, ops/attention.py): npu_grouped_matmul
    takes float32 only as one x/weight/y, so float32 q/k/v use the merged projection; the
    attention operator follows `attention.choose_operator` for the layer's dtype and heads.
    """
    fusions, notes = FusionConfig.from_env(), []
    if fusions.grouped_qkv and not linear.grouped_linear_supports(dtype):
        notes.append(
            f"npu_grouped_matmul takes {dtype} only with a single x/weight/y tensor; q/k/v use "
            "the merged projection"
        )
        fusions = dataclasses.replace(fusions, grouped_qkv=False)
    notes += _qk_path(fusions, dtype, attn)[1]
    if not fusions.attention:
        return fusions, notes
    shape = (attn.head_dim, attn.num_heads, attn.num_kv_heads)
    choice = attention.choose_operator(fusions.attention_op, dtype, *shape)
    described = f"{dtype}, head_dim {shape[0]}, {shape[1]} q / {shape[2]} kv heads"
    if choice.operator is None:
        notes.append(f"{choice.reason} ({described}); attention runs unfused")
        return dataclasses.replace(fusions, attention=False), notes
    if choice.operator != fusions.attention_op:
        notes.append(f"{choice.reason} ({described}); fused attention uses npu_{choice.operator}")
        fusions = dataclasses.replace(fusions, attention_op=choice.operator)
    return fusions, notes


QK_PATH_NAMES = {
    QK_FUSED: f"vllm.{qk_norm_rope.OP} (one launch)",
    QK_MROPE: "npu_rms_norm x2 + npu_mrope",
    QK_ROTARY_MUL: "npu_rms_norm x2 + npu_rotary_mul x2",
    QK_REFERENCE: "norms as rms_norm says, PyTorch rotary",
}


def _qk_path(fusions: FusionConfig, dtype: torch.dtype, attn: Qwen3Attention):
    """(one of QK_PATHS, notes on why a fusion that is on was not taken)."""
    notes = []
    if fusions.qk_norm_rope:
        reason = qk_norm_rope.unsupported_reason(dtype, attn.head_dim, attn.neox)
        if reason is None and not qk_norm_rope.registered():
            reason = f"vllm.{qk_norm_rope.OP} is not registered (vllm-ascend's NPU worker does)"
        if reason is None:
            return QK_FUSED, notes
        notes.append(f"{reason}; q/k norms and rotary run as separate operators")
    if not fusions.rotary:
        return QK_REFERENCE, notes
    rotary_dim = attn.rotary_emb.cos_sin_cache.shape[-1]
    reason = rotary.mrope_unsupported_reason(dtype, attn.head_dim, rotary_dim)
    if reason is None:
        return QK_MROPE, notes
    notes.append(f"{reason}; rotary runs as npu_rotary_mul on q and on k")
    return QK_ROTARY_MUL, notes


def _use_float32_matmul(model: Qwen3Model, dtype: torch.dtype) -> str | None:
    """Float32 projections on the CPU platform path where `cpu_matmul_choice.choose` says so; the
    reason when on (for the build log), else None."""
    from vllm.platforms import current_platform

    cpu_path = not model.npu_possible and current_platform.is_cpu()
    on, why = cpu_matmul_choice.choose(dtype, cpu_path)
    if not on:
        return None
    projections = []
    for layer in islice(model.layers, model.start_layer, model.end_layer):
        attn, mlp = layer.self_attn, layer.mlp
        projections += [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
    count = cpu_matmul.use_float32_matmul(projections)
    return f"{count} projections in float32 ({why})" if count else None


def _compiles(vllm_config: VllmConfig) -> bool:
    """Whether vLLM may compile the model (both paths; `--enforce-eager` still wins).

    The NPU path is traceable: host-side sequence lengths are read only inside the attention
    op (`layers/cache_free/op.py`), where vLLM splits the graph. `VLLM_NPU_EXT_COMPILE=0`
    runs it eagerly.
    """
    return envs.flag(envs.COMPILE_SWITCH)


@support_torch_compile(
    dynamic_arg_dims={
        "input_ids": 0,
        "positions": -1,
        "intermediate_tensors": 0,
        "inputs_embeds": 0,
    },
    enable_if=_compiles,
)
class Qwen3Model(nn.Module):
    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "", cache_free: bool = False):
        super().__init__()
        config = vllm_config.model_config.hf_config.get_text_config()
        self.config = config
        self.cache_free = cache_free
        self.model_dtype = vllm_config.model_config.dtype
        self.npu_possible = compat.npu_path_expected()
        self.rotary_tables = RotaryTables()
        pp_group = get_pp_group()
        if pp_group.is_first_rank or (config.tie_word_embeddings and pp_group.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, prefix=f"{prefix}.embed_tokens"
            )
        else:
            self.embed_tokens = PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: Qwen3DecoderLayer(
                config, vllm_config.cache_config, vllm_config.quant_config, prefix, cache_free
            ),
            prefix=f"{prefix}.layers",
        )
        first_attention = self.layers[self.start_layer].self_attn
        self.fusions, notes = _fusions_for(self.model_dtype, first_attention)
        self.default_qk_path = self.qk_path(self.fusions)
        self.float32_matmul = _use_float32_matmul(self, self.model_dtype)
        for note in notes if self.npu_possible else ():
            logger.info("vllm-npu-ext: %s", note)
        self.norm = (
            RMSNorm(config.hidden_size, eps=config.rms_norm_eps)
            if pp_group.is_last_rank
            else PPMissingLayer()
        )
        self.make_empty_intermediate_tensors = make_empty_intermediate_tensors_factory(
            ["hidden_states", "residual"], config.hidden_size
        )
        self.full_graph: FullGraphAttention | None = None

    def capture_attention_in_graphs(self, max_num_seqs: int) -> None:
        """Graphs of this model's forward capture attention too, updated per replay
        (`layers/cache_free/full_graph.py`): one state shared by every layer's attention; a
        replay carries at most `max_num_seqs` requests."""
        self.full_graph = FullGraphAttention(max_num_seqs)
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            layer.self_attn.attn.full_graph = self.full_graph

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: IntermediateTensors | None = None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor | IntermediateTensors:
        if get_pp_group().is_first_rank:
            hidden_states = (
                inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
            )
            residual = None
        else:
            hidden_states = intermediate_tensors["hidden_states"]
            residual = intermediate_tensors["residual"]
        step = None
        if self.npu_possible and (npu := dispatch.npu_ops(hidden_states)) is not None:
            step = self.npu_step(npu, positions, hidden_states.dtype, None, self.fusions)
        hidden_states, residual = self._run_layers(positions, hidden_states, residual, step)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        hidden_states, _ = fused.add_rms_norm(self.norm, hidden_states, residual, step)
        return hidden_states

    def npu_step(self, npu, positions, dtype, seqs, fusions: FusionConfig) -> NpuStep:
        """The NPU path's per-forward state: the rotary cache, and for the paths that need them
        the cos/sin tables gathered once for all layers.

        `seqs`: explicit sequence boundaries (`forward_packed`), or None (vLLM's forward).
        """
        rotary_emb = self.layers[self.start_layer].self_attn.rotary_emb
        cache = self.rotary_tables.cache(rotary_emb.cos_sin_cache, positions.device, dtype)
        # Decided once at build for the model's own fusions: a compiled forward reads it as a
        # constant (the decision looks up registered operators, which dynamo cannot trace).
        qk_path = self.default_qk_path if fusions is self.fusions else self.qk_path(fusions)
        cos = sin = None
        if qk_path in (QK_ROTARY_MUL, QK_REFERENCE):
            cos, sin = self.rotary_tables.gather(positions)
        return NpuStep(npu, fusions, qk_path, positions, cache, cos, sin, seqs)

    def qk_path(self, fusions: FusionConfig) -> str:
        """How q and k are normed and rotated on the NPU path under `fusions` (QK_PATHS)."""
        return _qk_path(fusions, self.model_dtype, self.layers[self.start_layer].self_attn)[0]

    def forward_packed(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seqs: PackedSeqs,
        fusions: FusionConfig | None = None,
    ) -> torch.Tensor:
        """The NPU path on an explicit packed batch, outside vLLM's scheduler.

        input_ids, positions `[T]`; `seqs` their sequence boundaries -> final hidden states
        `[T, H]`. Used by `selfcheck`, `benchmarks/count_ops.py` and the tests, which compare
        fusion configurations on one loaded model. Needs the NPU path (`ops.dispatch`).
        """
        hidden_states = self.embed_input_ids(input_ids)
        npu = dispatch.npu_ops(hidden_states)
        if npu is None:
            raise ValueError("forward_packed needs tensors that take the NPU path (ops.dispatch)")
        fusions = fusions or self.fusions
        step = self.npu_step(npu, positions, hidden_states.dtype, seqs, fusions)
        hidden_states, residual = self._run_layers(positions, hidden_states, None, step)
        return fused.add_rms_norm(self.norm, hidden_states, residual, step)[0]

    def _run_layers(self, positions, hidden_states, residual, step: NpuStep | None):
        for layer in islice(self.layers, self.start_layer, self.end_layer):
            hidden_states, residual = layer(positions, hidden_states, residual, step)
        return hidden_states, residual

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters(remove_duplicate=False))
        loaded: set[str] = set()
        for name, tensor in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            name, shard_id = _stacked_name(name)
            if name.endswith("scale"):
                name = maybe_remap_kv_scale_name(name, params)
            if name is None or name not in params or is_pp_missing_parameter(name, self):
                continue
            param = params[name]
            loader = getattr(param, "weight_loader", default_weight_loader)
            loader(param, tensor) if shard_id is None else loader(param, tensor, shard_id)
            loaded.add(name)
        return loaded

    def prepare_npu_weights(self) -> None:
        """NPU-path weight layouts and rotary tables, made once after loading (before platform
        post-processing), so that a compiled forward only reads them."""
        rotary_emb = self.layers[self.start_layer].self_attn.rotary_emb
        self.rotary_tables.prepare(rotary_emb.cos_sin_cache, self.model_dtype)
        if self.fusions.grouped_qkv and self.default_qk_path != QK_FUSED:
            for layer in islice(self.layers, self.start_layer, self.end_layer):
                layer.self_attn.prepare_npu_weights()


def _stacked_name(name: str) -> tuple[str, str | int | None]:
    """Checkpoint name -> (merged parameter name, shard id) for q/k/v and gate/up."""
    for merged, part, shard_id in compat.STACKED_PARAMS:
        if f".{part}." in name:
            return name.replace(f".{part}.", f".{merged}."), shard_id
    return name, None


class Qwen3ForCausalLM(nn.Module, SupportsPP):
    """Pooling runs of this class allocate no KV cache (see the module docstring)."""

    attn_type = "encoder_only"  # read by vLLM for pooling runs only
    packed_modules_mapping = {
        "qkv_proj": ["q_proj", "k_proj", "v_proj"],
        "gate_up_proj": ["gate_proj", "up_proj"],
    }

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = ""):
        super().__init__()
        config = vllm_config.model_config.hf_config.get_text_config()
        self.config = config
        pooling = vllm_config.model_config.runner_type == "pooling"
        cache_free = pooling and self.attn_type == "encoder_only"
        cache_free = cache_free and _cache_free_allowed(vllm_config)
        self.model = Qwen3Model(
            vllm_config=vllm_config, prefix=maybe_prefix(prefix, "model"), cache_free=cache_free
        )
        if get_pp_group().is_last_rank:
            self.lm_head = ParallelLMHead(
                config.vocab_size, config.hidden_size, prefix=maybe_prefix(prefix, "lm_head")
            )
            if config.tie_word_embeddings:
                self.lm_head = self.lm_head.tie_weights(self.model.embed_tokens)
        else:
            self.lm_head = PPMissingLayer()
        self.logits_processor = LogitsProcessor(config.vocab_size)
        self.make_empty_intermediate_tensors = self.model.make_empty_intermediate_tensors
        self.graph_mode = "none"
        if cache_free and self.model.npu_possible:
            self.graph_mode = qwen3_config.check_graph_mode(vllm_config, _compiled(self.model))
        if self.graph_mode == "full":
            self.model.capture_attention_in_graphs(vllm_config.scheduler_config.max_num_seqs)
        if pooling and self.model.npu_possible:  # our q/k path reads its own rotary tables
            logger.info("vllm-npu-ext: %s", vllm_ascend_cos_sin.stop_cos_sin_updates())
        _log_built(self, cache_free, pooling)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_input_ids(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None):
        full_graph = self.model.full_graph
        if full_graph is None:
            return self.model(input_ids, positions, intermediate_tensors, inputs_embeds)
        npu = dispatch.npu_ops(positions)
        full_graph.begin_forward(npu)
        hidden_states = self.model(input_ids, positions, intermediate_tensors, inputs_embeds)
        # A replayed graph's attention waits for this step's sequence lengths (full_graph.py).
        full_graph.after_forward(npu, positions.shape[-1])
        return hidden_states

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor | None:
        return self.logits_processor(self.lm_head, hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.config.tie_word_embeddings:  # lm_head shares embed_tokens' weight
            weights = ((name, w) for name, w in weights if not name.startswith("lm_head."))
        loaded = AutoWeightsLoader(self).load_weights(weights)
        if compat.npu_path_expected():
            self.model.prepare_npu_weights()
        return loaded


class Qwen3KVCacheForCausalLM(Qwen3ForCausalLM):
    """Pooling runs keep vLLM's KV cache (prefix caching and chunked prefill available)."""

    attn_type = "decoder"


def _cache_free_allowed(vllm_config: VllmConfig) -> bool:
    """Prefix caching and chunked prefill need keys from earlier steps: a KV cache.

    vLLM turns both off for our cache-free pooling class unless the user asked for them;
    then the user's choice wins and pooling keeps the KV cache.
    """
    wanted = qwen3_config.kv_cache_features(vllm_config)
    if wanted:
        logger.warning(
            "vllm-npu-ext: %s requested, so pooling keeps the KV cache (cache-free pooling "
            "cannot serve it)", " and ".join(wanted),
        )  # fmt: skip
    return not wanted


def _compiled(model: Qwen3Model) -> bool:
    """Whether vLLM's `support_torch_compile` will compile this model's forward."""
    return not getattr(model, "do_not_compile", True)


def _log_built(model: nn.Module, cache_free: bool, pooling: bool) -> None:
    inner: Qwen3Model = model.model
    if inner.npu_possible:
        active = ", ".join(inner.fusions.active()) or "none"
        backend = f"NPU path ({dispatch.npu_ops_name()}), fusions: {active}"
        backend += f", q/k norms and rotary: {QK_PATH_NAMES[inner.default_qk_path]}"
        if inner.fusions.attention:
            backend += f", attention operator npu_{inner.fusions.attention_op}"
    else:
        from vllm.platforms import current_platform

        backend = f"platform kernels ({current_platform.device_type})"
        if inner.float32_matmul:
            backend += f", {inner.float32_matmul}"
    if not _compiled(inner):
        backend += "; eager (not compiled)"
    elif model.graph_mode == "full":
        backend += ("; compiled by vLLM, one graph per forward with attention inside (FIA's "
                    "sequence lengths updated after each replay)")  # fmt: skip
    elif model.graph_mode == "piecewise":
        backend += f"; compiled by vLLM, attention ({SPLITTING_OP}) between the graphs"
    else:
        backend += "; compiled by vLLM"
    if not pooling:
        attention = "KV cache (generation)"
    else:
        attention = "cache-free causal (no KV cache)" if cache_free else "KV cache"
    ours = next(cls for cls in type(model).__mro__ if cls.__module__ == __name__)
    logger.info(
        "vllm-npu-ext built %s (%s.%s); backend: %s; attention: %s",
        type(model).__name__, ours.__module__, ours.__name__, backend, attention,
    )  # fmt: skip
