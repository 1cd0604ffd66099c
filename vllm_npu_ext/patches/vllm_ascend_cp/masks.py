"""Which rows of a CP merge come from a rank without keys, and the device memory full decode
graphs read them from.

A rank holds no key of a request while the request is shorter than its first key on that rank
(vllm-ascend 0.23.0.post1 `PCPManager._get_cp_local_seq_lens`): FIA's result for such a row is
not documented, so the patch sends it as out 0 and lse -inf (`fill`), and a row no rank holds a
key of merges to 0. Masks are read from the per-rank key counts vllm-ascend's CP builder
computed for the step (`decode_meta.num_computed_tokens_of_pcp_dcp`, int `[bs, pcp, dcp]`, the
lengths its `_forward_decode_pcp_dcp` gives FIA) and, for a prefill chunk's context, from its
chunked-context metadata.
"""

from __future__ import annotations

import dataclasses

import numpy
import torch

NEG_INF = float("-inf")


@dataclasses.dataclass(frozen=True)
class Ranks:
    """This rank's place in its CP group: (pcp rank, dcp rank)."""

    pcp_rank: int
    dcp_rank: int


def rank_and_all_empty(lengths, ranks: Ranks) -> tuple[numpy.ndarray, numpy.ndarray]:
    """(this rank's rows without keys, rows without keys on every rank) of int `[bs, pcp, dcp]`
    key counts, as bool numpy `[bs]` arrays."""
    lengths = numpy.asarray(lengths)
    if lengths.ndim != 3:
        raise ValueError(f"lengths must be [bs, pcp, dcp] key counts, got shape {lengths.shape}")
    local = lengths[:, ranks.pcp_rank, ranks.dcp_rank] == 0
    everywhere = (lengths == 0).reshape(len(lengths), -1).all(axis=1)
    return local, everywhere


def fill_values(local, everywhere, reads_empty_out: bool) -> numpy.ndarray:
    """fp32 `[bs]`: the lse a row of this rank is sent with where it holds no key. -inf (the
    shard gets weight 0), except for rows no rank holds a key of when the merge kernel reads a
    shard's out at weight 0 (torch_npu's TensorList kernel: exp(-inf - -inf) is NaN there):
    then 0 from every rank, with out 0, merges to 0 as well. Rows with keys: 0 (unused)."""
    fill = numpy.where(local, NEG_INF, 0.0).astype(numpy.float32)
    if reads_empty_out:
        fill[everywhere] = 0.0
    return fill


def decode_shards_can_be_empty(config) -> bool:
    """Whether a decode step (at least 2 tokens per sequence) can leave a CP rank without keys
    under `config` (a VllmConfig; None: assume it can). Rank r holds none while a sequence has
    at most r x cp_kv_cache_interleave_size tokens."""
    if config is None:
        return True
    parallel = config.parallel_config
    ranks = parallel.decode_context_parallel_size * parallel.prefill_context_parallel_size
    return (ranks - 1) * parallel.cp_kv_cache_interleave_size >= 2


@dataclasses.dataclass
class StepMasks:
    """One eager step's masks on the device, computed once per step: every layer of a step
    reads the same metadata array (vllm-ascend's CP builder makes a new one every step, so its
    identity names the step)."""

    step: object = None
    key: tuple = ()
    masks: tuple = (None, None)

    def get(self, step, key: tuple, compute):
        if self.step is not step or self.key != key:
            self.step, self.key, self.masks = step, key, compute()
        return self.masks


def eager_masks(lengths, ranks: Ranks, reads_empty_out: bool, device) -> tuple:
    """(empty: bool `[bs]`, fill: fp32 `[bs]`) device tensors for a step's key counts, or
    (None, None) when this rank holds a key of every request."""
    local, everywhere = rank_and_all_empty(lengths, ranks)
    if not local.any():
        return None, None
    fill = fill_values(local, everywhere, reads_empty_out)
    return torch.from_numpy(local).to(device), torch.from_numpy(fill).to(device)


class GraphMasks:
    """The masks full decode graphs read: device memory written between replays.

    empty: bool `[capacity]`, this rank's rows without keys; fill: fp32 `[capacity]`, the lse
    those rows are sent with (`fill_values`). Rows past a step's requests read as empty (a
    graph's padding: FIA is given 0 keys there, vllm-ascend 0.23.0.post1
    `AscendAttentionCPImpl.update_graph_params`). Each step's masks are written from one
    persistent pinned host buffer with a non-blocking copy, as vLLM's `CpuGpuBuffer` does:
    vllm-ascend's runner builds a step's metadata (and so calls `refresh`) inside vLLM's
    `synchronize_input_prep` (vLLM 0.23.0 `GPUModelRunner.synchronize_input_prep`; vllm-ascend
    0.23.0.post1 `NPUModelRunner.execute_model`), which waits for the previous step's copies
    first, so the host buffer is never rewritten under a copy still queued. Allocated outside
    capture and never reallocated once a graph has read it."""

    def __init__(self, capacity: int, device, reads_empty_out: bool):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.reads_empty_out = reads_empty_out
        # One byte buffer on each side, fill's 4 x capacity bytes then empty's capacity: one
        # copy a step.
        self.host = torch.empty(5 * capacity, dtype=torch.uint8, pin_memory=True)
        self.device_buffer = torch.empty(5 * capacity, dtype=torch.uint8, device=device)
        self.captured = False
        self.refresh(numpy.zeros((0, 1, 1), dtype=numpy.int64), Ranks(0, 0))

    @staticmethod
    def _views(buffer: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        capacity = buffer.numel() // 5
        return buffer[4 * capacity :].view(torch.bool), buffer[: 4 * capacity].view(torch.float32)

    @property
    def capacity(self) -> int:
        return self.host.numel() // 5

    @property
    def empty(self) -> torch.Tensor:
        return self._views(self.device_buffer)[0]

    @property
    def fill(self) -> torch.Tensor:
        return self._views(self.device_buffer)[1]

    def on(self, device) -> bool:
        """Whether the masks are on `device` (`npu` names the current one)."""
        mine = self.device_buffer.device
        return mine.type == device.type and device.index in (None, mine.index)

    def rows(self, num_tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Views for a graph of `num_tokens` rows: (empty bool `[n]`, fill fp32 `[n]`)."""
        if num_tokens > self.capacity:
            raise ValueError(f"a {num_tokens}-row graph exceeds the {self.capacity} rows reserved")
        self.captured = True
        empty, fill = self._views(self.device_buffer)
        return empty[:num_tokens], fill[:num_tokens]

    def refresh(self, lengths, ranks: Ranks) -> None:
        """Write the masks of a step's key counts (int `[bs, pcp, dcp]`) into the host buffer,
        then one non-blocking copy to the device."""
        rows = min(len(lengths), self.capacity)
        empty, fill = (view.numpy() for view in self._views(self.host))
        empty.fill(True)  # padding rows: empty on every rank
        fill.fill(0.0 if self.reads_empty_out else NEG_INF)
        if rows:
            local, everywhere = rank_and_all_empty(numpy.asarray(lengths)[:rows], ranks)
            empty[:rows] = local
            fill[:rows] = fill_values(local, everywhere, self.reads_empty_out)
        self.device_buffer.copy_(self.host, non_blocking=True)

    def host_empty(self) -> numpy.ndarray:
        """The empty rows last written (host side, for logs and probes)."""
        return self._views(self.host)[0].numpy().copy()


def empty_context_rows(chunked, ranks: Ranks):
    """Bool host `[query tokens]`: the tokens of requests with context on another rank but
    none on this one, from vllm-ascend's chunked-context metadata (`local_context_lens_allranks`
    `[reqs, pcp, dcp]`, `actual_chunk_seq_lengths` the cumulative query lengths FIA took);
    None when there is no such request."""
    lengths = chunked.local_context_lens_allranks.cpu()
    somewhere = lengths.flatten(1).sum(dim=1) > 0
    empty = (lengths[:, ranks.pcp_rank, ranks.dcp_rank] == 0) & somewhere
    if not bool(empty.any()):
        return None
    ends = torch.as_tensor(chunked.actual_chunk_seq_lengths).cpu().long()
    tokens = torch.diff(ends, prepend=ends.new_zeros(1))
    return torch.repeat_interleave(empty, tokens)
