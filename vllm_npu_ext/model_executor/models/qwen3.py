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

One forward: embed, then per layer norm -> attention -> norm -> MLP, then the final norm.
What runs where is decided once at build (`layers.npu_plan`); per forward the model gathers
the rotary tables once and hands every layer an `NpuStep` (None on the platform path);
`positions` flow down only, as the layers' argument.
"""

from __future__ import annotations

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
from vllm.model_executor.models.interfaces import SupportsPP
from vllm.model_executor.models.utils import (
    AutoWeightsLoader,
    PPMissingLayer,
    make_empty_intermediate_tensors_factory,
    make_layers,
    maybe_prefix,
)
from vllm.sequence import IntermediateTensors

from vllm_npu_ext import compat, envs, patches
from vllm_npu_ext.logger import get_logger
from vllm_npu_ext.model_executor import shared_prefix
from vllm_npu_ext.model_executor.layers import fused, npu_plan
from vllm_npu_ext.model_executor.layers.attention import rotary_embedding
from vllm_npu_ext.model_executor.layers.cache_free.full_graph import FullGraphAttention
from vllm_npu_ext.model_executor.layers.decoder_layer import Qwen3DecoderLayer
from vllm_npu_ext.model_executor.layers.npu_plan import FusionConfig
from vllm_npu_ext.model_executor.layers.npu_step import NpuStep, RotaryTables
from vllm_npu_ext.model_executor.models import qwen3_config
from vllm_npu_ext.model_executor.models.weights import load_merged_weights
from vllm_npu_ext.ops import dispatch
from vllm_npu_ext.ops.packed import PackedSeqs
from vllm_npu_ext.patches import vllm_ascend_cos_sin, vllm_shared_prefix

logger = get_logger(__name__)


def _compiles(vllm_config: VllmConfig) -> bool:
    """Whether vLLM may compile the model (both paths; `--enforce-eager` still wins). The NPU
    path is traceable: host-side sequence lengths are read only inside the attention op
    (`layers/cache_free/op.py`), where vLLM splits the graph."""
    return envs.COMPILE()


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
        self.model_dtype = vllm_config.model_config.dtype
        self.npu_possible = compat.npu_path_expected()
        rotary_emb = rotary_embedding(config)  # one for every layer
        self.rotary_tables = RotaryTables(rotary_emb)  # and its NPU-path layouts
        pp_group = get_pp_group()
        if pp_group.is_first_rank or (config.tie_word_embeddings and pp_group.is_last_rank):
            self.embed_tokens = VocabParallelEmbedding(
                config.vocab_size, config.hidden_size, prefix=f"{prefix}.embed_tokens"
            )
        else:
            self.embed_tokens = PPMissingLayer()
        self.start_layer, self.end_layer, self.layers = make_layers(
            config.num_hidden_layers,
            lambda prefix: Qwen3DecoderLayer(config, vllm_config, prefix, cache_free, rotary_emb),
            prefix=f"{prefix}.layers",
        )
        dtype = self.model_dtype
        self.plan = npu_plan.plan_for(dtype, self.layers[self.start_layer].self_attn)
        self.float32_matmul = npu_plan.float32_matmul(self._layers(), dtype, self.npu_possible)
        for note in self.plan.notes if self.npu_possible else ():
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
        for layer in self._layers():
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
            step = self.npu_step(npu, positions, hidden_states.dtype)
        for layer in self._layers():
            hidden_states, residual = layer(positions, hidden_states, residual, step)
        if not get_pp_group().is_last_rank:
            return IntermediateTensors({"hidden_states": hidden_states, "residual": residual})
        return fused.add_rms_norm(self.norm, hidden_states, residual, step)[0]

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
        step = self.npu_step(npu, positions, hidden_states.dtype, seqs, fusions)
        residual = None
        for layer in self._layers():
            hidden_states, residual = layer(positions, hidden_states, residual, step)
        return fused.add_rms_norm(self.norm, hidden_states, residual, step)[0]

    def npu_step(self, npu, positions, dtype, seqs=None, fusions=None) -> NpuStep:
        """The NPU path's per-forward state under the model's plan (or `fusions`): the rotary
        cache, and the cos/sin tables gathered once for all layers where the q/k path reads
        them. `seqs`: explicit sequence boundaries (`forward_packed`), or None."""
        plan = self.plan if fusions is None else self.plan.under(fusions)
        cache = self.rotary_tables.cache(positions.device, dtype)
        cos = sin = None
        if plan.qk_path in npu_plan.QK_PATHS_WITH_TABLES:
            cos, sin = self.rotary_tables.gather(positions)
        return NpuStep(npu, plan.fusions, plan.qk_path, cache, cos, sin, seqs)

    def _layers(self) -> Iterable[Qwen3DecoderLayer]:
        return islice(self.layers, self.start_layer, self.end_layer)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_merged_weights(self, weights)

    def prepare_npu_weights(self) -> None:
        """NPU-path weight layouts and rotary tables, made once after loading (before platform
        post-processing), so that a compiled forward only reads them."""
        self.rotary_tables.prepare(self.model_dtype)
        if self.plan.fusions.grouped_qkv and self.plan.qk_path != npu_plan.QK_FUSED:
            for layer in self._layers():
                layer.self_attn.prepare_npu_weights()


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
        cache_free = cache_free and qwen3_config.cache_free_allowed(vllm_config)
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
        # Read by the runner's wrapped model call (patches/vllm_shared_prefix.py).
        self.shared_prefixes = shared_prefix.for_model(vllm_config, cache_free, self.graph_mode)
        if self.shared_prefixes is not None:
            done = patches.apply(vllm_shared_prefix.NAME)
            logger.info("vllm-npu-ext: shared prefixes of %d+ tokens computed once per step: %s",
                        self.shared_prefixes.min_len, "; ".join(done))  # fmt: skip
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


def _compiled(model: Qwen3Model) -> bool:
    """Whether vLLM's `support_torch_compile` will compile this model's forward."""
    return not getattr(model, "do_not_compile", True)


def _log_built(model: Qwen3ForCausalLM, cache_free: bool, pooling: bool) -> None:
    inner = model.model
    plan = inner.plan if inner.npu_possible else None
    backend = npu_plan.describe_backend(plan, inner.float32_matmul)
    backend += qwen3_config.describe_compilation(_compiled(inner), model.graph_mode)
    if not pooling:
        attention = "KV cache (generation)"
    else:
        attention = "cache-free causal (no KV cache)" if cache_free else "KV cache"
    ours = next(cls for cls in type(model).__mro__ if cls.__module__ == __name__)
    logger.info(
        "vllm-npu-ext built %s (%s.%s); backend: %s; attention: %s",
        type(model).__name__, ours.__module__, ours.__name__, backend, attention,
    )  # fmt: skip
