"""Our cache-free metadata builder over vllm-ascend's real `AscendAttentionMetadataBuilder`,
fed the `AscendCommonAttentionMetadata` that vllm-ascend's `NPUModelRunner` builds.

The configuration is a real pooling `VllmConfig` of the tiny checkpoint under NPUPlatform; the
layer is our `CacheFreeCausalAttention`, whose backend subclasses the one NPUPlatform selects
(`AscendAttentionBackend`). The device is the host: the emulated NPU's tensors live on the CPU.

`NPUModelRunner.__init__` does not complete in this process
(`test_npu_model_runner_needs_a_workers_process_groups`): with the stand-in's npu device its
pinned host buffers are made (`InputBatch`, made in vLLM 0.23.0 `GPUModelRunner.__init__`, its
buffers in `InputBatch.__init__`; NPUPlatform answers `is_pin_memory_available()` with True,
vllm-ascend 0.23.0.post1 `NPUPlatform.is_pin_memory_available`), then its block table asks for
the worker's context-parallel groups (`vllm_ascend.worker.block_table.BlockTable.__init__`:
`get_pcp_group()`), which only a worker initialises. So the runner's own methods run on an
`NPUModelRunner` made without `__init__`, holding the state they read, set as `__init__` and
`_prepare_inputs` set it (`runner_for`, each group of attributes citing the method that sets it):

- the encoder-only KV cache group: vLLM 0.23.0's
  `GPUModelRunner.may_add_encoder_only_layers_to_kv_cache_config`, as vllm-ascend's
  `NPUModelRunner.initialize_kv_cache` calls it;
- the builder: the layer's backend's builder class, built and grouped as vllm-ascend's
  `create_attn_groups` does (the function of that name in `NPUModelRunner.initialize_attn_backend`);
- the step's attention state: `NPUModelRunner._build_attn_state`;
- the padded batch's dummy request: `NPUModelRunner._pad_query_start_loc_for_fia` writes it into
  the host buffer and copies a pinned snapshot to the device buffer
  (`vllm_ascend.worker.utils.copy_snapshot_to_gpu`);
- the per-step metadata: `NPUModelRunner._build_attention_metadata` builds the
  `AscendCommonAttentionMetadata` (its `cm_base = AscendCommonAttentionMetadata(...)`) and calls
  the builder (its inner `_build_attn_group_metadata`: `builder.build(...)`).

Counted by spies that call through (never replacing vllm-ascend's code): calls of
`AttentionMaskBuilder.get_attention_mask` and the bytes of the mask each returns (for a pooling run
the 2048x2048 bool mask, copied to the device on every call on an NPU,
`AttentionMaskBuilder.get_attention_mask` through `get_attn_mask`), and `Tensor.pin_memory` calls
(the pinned copy of `query_start_loc_cpu`, `AscendAttentionMetadataBuilder.build`). vllm-ascend's
own builder does both on every step; ours does neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from support.vllm_ascend_env import engine_config

LAYER = "model.layers.0.self_attn.attn"
MAX_NUM_REQS = 8
MAX_NUM_TOKENS = 512
POOLING_MASK_BYTES = 2048 * 2048  # AttentionMaskBuilder.get_attention_mask: 2048x2048 torch.bool
CPU = torch.device("cpu")

# (query lengths, tokens after graph padding or None, whether the runner inserts a dummy
# request for the padding: FULL graphs or sequence parallelism, vllm-ascend 0.23.0.post1
# `NPUModelRunner.execute_model`, its call of `_pad_query_start_loc_for_fia`)
BATCHES = {
    "unpadded": ([5, 3, 7], None, False),
    "padded_dummy_request": ([5, 3, 7], 16, True),
    "padded_tokens_only": ([5, 3, 7], 16, False),
}


def pooling_config(model_dir):
    return engine_config(
        model_dir, runner="pooling", max_model_len=256,
        max_num_seqs=MAX_NUM_REQS, max_num_batched_tokens=MAX_NUM_TOKENS, enforce_eager=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def vllm_config(vllm_ascend_started, tiny_model_dir):
    return pooling_config(tiny_model_dir)


@pytest.fixture(scope="module")
def layer(vllm_config):
    """Our layer, registered in the config's forward context as the model registers it."""
    from vllm.config import set_current_vllm_config

    from vllm_npu_ext.model_executor.layers.cache_free.backend import (
        CacheFreeCausalAttention,
    )

    hf_config = vllm_config.model_config.hf_config
    with set_current_vllm_config(vllm_config):
        return CacheFreeCausalAttention(
            hf_config.num_attention_heads, hf_config.head_dim, hf_config.head_dim**-0.5,
            num_kv_heads=hf_config.num_key_value_heads, cache_config=vllm_config.cache_config,
            prefix=LAYER,
        )  # fmt: skip


def runner_for(vllm_config, backend):
    """An `NPUModelRunner` holding the state its metadata methods read (module docstring),
    with `backend` serving the encoder-only layers."""
    from vllm.utils.torch_utils import kv_cache_dtype_str_to_dtype
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.utils import CpuGpuBuffer
    from vllm.v1.worker.utils import AttentionGroup
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    model_config = vllm_config.model_config
    runner = object.__new__(NPUModelRunner)
    state = {
        # vLLM 0.23.0 GPUModelRunner.__init__: the configs, device and KV cache dtype
        "vllm_config": vllm_config, "model_config": model_config,
        "cache_config": vllm_config.cache_config, "scheduler_config": vllm_config.scheduler_config,
        "compilation_config": vllm_config.compilation_config, "speculative_config": None,
        "device": CPU, "kv_cache_dtype": kv_cache_dtype_str_to_dtype(
            vllm_config.cache_config.cache_dtype, model_config,
        ),
        # vLLM 0.23.0 GPUModelRunner.__init__: these attributes (no speculative tokens; the
        # positions, seq_lens and optimistic_seq_lens_cpu buffers)
        "is_mm_prefix_lm": model_config.is_mm_prefix_lm, "attn_groups": [],
        "use_async_spec_decode": False,
        "positions": torch.zeros(MAX_NUM_TOKENS, dtype=torch.int64, device=CPU),
        "seq_lens": torch.zeros(MAX_NUM_REQS, dtype=torch.int32, device=CPU),
        "optimistic_seq_lens_cpu": torch.zeros(MAX_NUM_REQS, dtype=torch.int32),
        "arange_np": np.arange(max(MAX_NUM_REQS + 1, MAX_NUM_TOKENS), dtype=np.int64),
        "uniform_decode_query_len": 1, "runner_only_attn_layers": set(),
        # vllm-ascend 0.23.0.post1 NPUModelRunner.__init__: these attributes (no compress_ratios;
        # query_start_loc, pinned there; no context-parallel groups)
        "use_compress": False,
        "query_start_loc": CpuGpuBuffer(MAX_NUM_REQS + 2, dtype=torch.int32, device=CPU,
                                        pin_memory=False),  # fmt: skip
        "_has_gdn": False, "attn_state": None, "pcp_size": 1, "dcp_size": 1,
        "long_seq_metadata": None, "enable_hamming_sparse": False,
        "actual_seq_lengths_q": [], "decode_token_per_req": 1,
        # The InputBatch tensors read here (vLLM 0.23.0 InputBatch.__init__).
        "input_batch": SimpleNamespace(
            num_prompt_tokens_cpu_tensor=torch.zeros(MAX_NUM_REQS, dtype=torch.int32),
            num_computed_tokens_cpu_tensor=torch.zeros(MAX_NUM_REQS, dtype=torch.int32),
        ),
        # What the engine plans for a model whose layers need no KV cache: no group.
        "kv_cache_config": KVCacheConfig(num_blocks=0, kv_cache_tensors=[], kv_cache_groups=[]),
    }  # fmt: skip
    batch = state["input_batch"]
    batch.num_computed_tokens_cpu = batch.num_computed_tokens_cpu_tensor.numpy()
    for name, value in state.items():
        setattr(runner, name, value)
    runner.may_add_encoder_only_layers_to_kv_cache_config()
    (group,) = runner.kv_cache_config.kv_cache_groups
    builder = backend.get_builder_cls()(group.kv_cache_spec, group.layer_names, vllm_config, CPU)
    runner.attn_groups.append(
        [AttentionGroup(backend, group.layer_names, group.kv_cache_spec, 0, [builder])]
    )
    return runner, builder


@dataclasses.dataclass
class Counts:
    mask_calls: int = 0
    mask_bytes: int = 0
    mask_shapes: list = dataclasses.field(default_factory=list)
    pinned: list = dataclasses.field(default_factory=list)  # the values of each pinned tensor
    pin_errors: list = dataclasses.field(default_factory=list)


@contextlib.contextmanager
def counting(builder, counts: Counts):
    """Count the per-step work our attention never reads, calling the real functions."""
    mask_builder_cls = type(builder.attn_mask_builder)  # the class behind vllm-ascend's singleton
    get_attention_mask = mask_builder_cls.get_attention_mask
    pin_memory = torch.Tensor.pin_memory

    def mask_spy(self, *args, **kwargs):
        mask = get_attention_mask(self, *args, **kwargs)
        counts.mask_calls += 1
        counts.mask_bytes += mask.numel() * mask.element_size()
        counts.mask_shapes.append((tuple(mask.shape), mask.dtype))
        return mask

    def pin_spy(self, *args, **kwargs):
        counts.pinned.append(self.tolist())
        try:
            return pin_memory(self, *args, **kwargs)
        except RuntimeError as error:
            counts.pin_errors.append(str(error))
            raise

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(mask_builder_cls, "get_attention_mask", mask_spy)
        patch.setattr(torch.Tensor, "pin_memory", pin_spy)
        yield


@dataclasses.dataclass
class Step:
    common: object  # the AscendCommonAttentionMetadata the runner passed to the builder
    attn_metadata: dict
    num_tokens: int
    num_input_tokens: int


def run_step(runner, query_lens, num_tokens_padded, dummy_request, counts: Counts) -> Step:
    """One step of new prompts through the runner's metadata code (module docstring), each
    statement before `_build_attn_state` as vllm-ascend 0.23.0.post1's
    `NPUModelRunner._prepare_inputs` has it; the work of `_build_attention_metadata` is added to
    `counts`."""
    buffer = runner.query_start_loc
    num_reqs, num_tokens = len(query_lens), sum(query_lens)
    scheduled = np.array(query_lens, dtype=np.int32)
    batch = runner.input_batch
    batch.num_prompt_tokens_cpu_tensor[:num_reqs] = torch.from_numpy(scheduled)
    batch.num_computed_tokens_cpu_tensor.zero_()
    buffer.np[0] = 0
    buffer.np[1 : num_reqs + 1] = np.cumsum(scheduled)
    buffer.gpu.copy_(buffer.cpu)  # copy_snapshot_to_gpu's copy
    torch.add(batch.num_computed_tokens_cpu_tensor[:num_reqs], torch.from_numpy(scheduled),
              out=runner.optimistic_seq_lens_cpu[:num_reqs])  # fmt: skip
    runner.optimistic_seq_lens_cpu[num_reqs:].fill_(0)
    buffer.gpu[num_reqs + 1 :].fill_(-1)
    runner.seq_lens[:num_reqs] = torch.from_numpy(scheduled)  # nothing computed
    runner.seq_lens[num_reqs:].fill_(0)
    runner._build_attn_state(num_reqs, scheduled, scheduled)
    num_reqs_padded = num_reqs
    if dummy_request:
        num_reqs_padded = runner._pad_query_start_loc_for_fia(
            buffer, num_tokens_padded, num_reqs, num_reqs, None, num_reqs
        )
        assert num_reqs_padded == num_reqs + 1  # its mixed-batch case's dummy request
        assert buffer.np[num_reqs + 1] == num_tokens_padded
        assert buffer.gpu[num_reqs + 1].item() == num_tokens_padded  # its pinned copy

    builder = runner.attn_groups[0][0].get_metadata_builder()
    passed = []
    build = builder.build

    def spy(*args, **kwargs):
        passed.append(kwargs["common_attn_metadata"])
        return build(*args, **kwargs)

    builder.build = spy
    try:
        with counting(builder, counts):
            attn_metadata, _ = runner._build_attention_metadata(
                num_tokens=num_tokens, num_reqs=num_reqs, max_query_len=max(query_lens),
                num_tokens_padded=num_tokens_padded, num_reqs_padded=num_reqs_padded,
                num_scheduled_tokens_np=scheduled,
            )  # fmt: skip
    finally:
        del builder.build
    (common,) = passed
    return Step(common, attn_metadata, num_tokens, num_tokens_padded or num_tokens)


def test_npu_model_runner_needs_a_workers_process_groups(vllm_ascend_started, tiny_model_dir):
    """Its pinned host buffers are made on the stand-in's npu device; then it needs the
    context-parallel groups a worker initialises (vllm-ascend 0.23.0.post1
    `BlockTable.__init__`: `get_pcp_group()`)."""
    from vllm.config import set_current_vllm_config
    from vllm_ascend.worker.model_runner_v1 import NPUModelRunner

    vllm_config = pooling_config(tiny_model_dir)  # its own: a failed __init__ leaves it changed
    assert torch.zeros(1, pin_memory=True).is_pinned()
    with set_current_vllm_config(vllm_config), pytest.raises(AssertionError) as raised:
        NPUModelRunner(vllm_config, torch.device("npu", 0))
    assert "prefill context parallel group is not initialized" in str(raised.value)
    assert any(Path(entry.path).name == "npu_input_batch.py" for entry in raised.traceback)
    assert Path(raised.traceback[-2].path).name == "block_table.py"


def test_vllm_ascends_builder_works_for_nothing_every_step(vllm_config, layer):
    """vllm-ascend's own builder (the one NPUPlatform selects, which ours subclasses): per
    step, the pooling mask and a pinned copy of query_start_loc."""
    from vllm_ascend.attention.attention_v1 import AscendAttentionBackend

    assert issubclass(layer.get_attn_backend(), AscendAttentionBackend)
    runner, builder = runner_for(vllm_config, AscendAttentionBackend)
    steps, counts = [BATCHES["unpadded"], ([4, 9], None, False)], Counts()
    for batch in steps:
        run_step(runner, *batch, counts)
    assert counts.mask_calls == len(steps)
    assert counts.mask_shapes == [((2048, 2048), torch.bool)] * len(steps)
    assert counts.mask_bytes == len(steps) * POOLING_MASK_BYTES  # 4 MiB per step
    # One pin per step, of query_start_loc_cpu (AscendAttentionMetadataBuilder.build).
    assert counts.pinned == [[0, 5, 8, 15], [0, 4, 13]]
    assert counts.pin_errors == []


@pytest.mark.parametrize("batch", list(BATCHES))
def test_our_builder_does_none_of_it_and_packs_the_batch(vllm_config, layer, batch):
    """Fails on a builder that runs vllm-ascend's `build`: counts > 0."""
    from vllm.forward_context import set_forward_context
    from vllm_ascend.attention.attention_v1 import AscendAttentionState, AscendMetadata

    from vllm_npu_ext.model_executor import forward_context

    query_lens, num_tokens_padded, dummy_request = BATCHES[batch]
    runner, _ = runner_for(vllm_config, layer.get_attn_backend())
    counts = Counts()
    step = run_step(runner, query_lens, num_tokens_padded, dummy_request, counts)
    assert counts == Counts()  # no mask, no pin

    metadata = step.attn_metadata[LAYER]
    seqs = getattr(metadata, forward_context.PACKED_SEQS_ATTR)
    cu = [0, 5, 8, 15]
    assert list(seqs.cu_seqlens) == (cu + [16] if dummy_request else cu)
    with set_forward_context(step.attn_metadata, vllm_config, num_tokens=step.num_input_tokens):
        layer_seqs = forward_context.packed_seqs_for_layer(LAYER, step.num_input_tokens)
    # The padding rows form one sequence of their own, whoever added it.
    expected = cu + [16] if num_tokens_padded else cu
    assert list(layer_seqs.cu_seqlens) == expected
    assert layer_seqs.seq_lens[: len(query_lens)] == query_lens

    # What vllm-ascend's code may read of it, filled from host values only.
    assert type(metadata) is AscendMetadata
    assert metadata.num_actual_tokens == step.num_tokens == 15
    assert metadata.attn_state is AscendAttentionState.PrefillNoCache
    assert metadata.causal is True
    assert metadata.model_runner_type == "pooling"
    assert metadata.attn_mask is None
    assert metadata.max_query_len == max(query_lens)
    assert metadata.actual_seq_lengths_q == seqs.actual_seq_lengths  # [5, 8, 15(, 16)]
    assert metadata.seq_lens_list == query_lens + [0] * dummy_request  # the dummy's: 0
    assert metadata.seq_lens.device.type == "cpu" and metadata.seq_lens is metadata.seq_lens_cpu
    # The runner's own device tensors, not copies.
    assert metadata.query_start_loc is step.common.query_start_loc
    assert metadata.query_start_loc.data_ptr() == runner.query_start_loc.gpu.data_ptr()
    assert metadata.block_tables is step.common.block_table_tensor
    assert metadata.slot_mapping.shape == (15,)


def test_the_choice_follows_the_models_npu_path_test(vllm_ascend_started):
    from vllm_npu_ext.model_executor.layers.cache_free.backend import npu_path_reads_metadata
    from vllm_npu_ext.ops import dispatch

    assert dispatch.cpu_takes_npu_path()  # the stand-in is installed
    assert npu_path_reads_metadata(CPU)
    assert not npu_path_reads_metadata(torch.device("meta"))


def test_boundaries_are_read_only_from_metadata_our_builder_filled(vllm_config):
    """One sequence only for vLLM's dummy batches (no attention metadata at all); a forward
    whose metadata lacks this layer's boundaries, or no forward context, is an error: one
    sequence there would attend across requests (forward_context.packed_seqs_for_layer)."""
    from vllm.forward_context import set_forward_context

    from vllm_npu_ext.model_executor import forward_context

    with set_forward_context(None, vllm_config, num_tokens=8):
        assert forward_context.packed_seqs_for_layer(LAYER, 8).cu_seqlens == (0, 8)
    other_only = {"model.layers.1.self_attn.attn": SimpleNamespace()}
    with set_forward_context(other_only, vllm_config, num_tokens=8), pytest.raises(
        RuntimeError, match="none with sequence boundaries for " + LAYER
    ):
        forward_context.packed_seqs_for_layer(LAYER, 8)
    with pytest.raises(RuntimeError, match="outside a vLLM forward context"):
        forward_context.packed_seqs_for_layer(LAYER, 8)
