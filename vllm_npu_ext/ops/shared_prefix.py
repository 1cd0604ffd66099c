"""Shared token prefixes of one step, computed once: the plan and its attention.

In a causal decoder a prefix's hidden states and keys do not depend on what follows it, so
sequences of one step that begin with the same tokens can share those rows exactly. The
plan is made on the host from token ids the runner holds (no device sync):

- groups: sequences are bucketed by their first `min_len` tokens, each bucket sorted, and
  split into runs of consecutive sequences whose longest common prefix is at least `min_len`
  tokens, choosing at each level the split that saves the most tokens (two rerank queries in
  one step: two groups, each with its own query in the prefix; unrelated texts: none);
- rows: the "unique" rows are the step's rows without the prefix rows of each group's later
  members (the first member, lowest index, computes the prefix): each prefix once, each text's
  own tokens with their positions (which continue after the prefix); `unique_rows` maps
  unique rows to the step's rows, `original_to_unique` maps every step row to the unique row
  holding its hidden state (the pooler reads the same rows it reads without sharing);
- attention: each sequence with own tokens attends with its own rows as queries and its
  whole text as keys (the group's prefix rows, then its own), causally right-down aligned:
  `kv_rows` gathers those keys from the unique rows. A text equal to its prefix has no
  query row and no attention of its own.

`shared_prefix_attention` runs that attention on unique-row q/k/v (NPU path or reference);
the model's layers never see the plan otherwise.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import defaultdict
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import torch

from vllm_npu_ext.ops import attention
from vllm_npu_ext.ops.packed import PackedSeqs


@dataclasses.dataclass(frozen=True)
class PrefixGroup:
    """Sequences (step indices, ascending) sharing their first `prefix_len` tokens;
    `members[0]` computes the prefix."""

    members: tuple[int, ...]
    prefix_len: int


@dataclasses.dataclass(frozen=True)
class AttentionLayout:
    """Attention of the unique rows (padded to `q_seqs.num_tokens`): sequence i's queries are
    rows `q_seqs[i]`, its keys the unique rows `kv_rows[kv_seqs[i]]`. `kv_rows` int64 `[T_kv]`
    on the host; padding rows form one more sequence attending to themselves."""

    q_seqs: PackedSeqs
    kv_seqs: PackedSeqs
    kv_rows: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class SharedPrefixPlan:
    """One step's shared prefixes (module docstring). Host arrays are int64.

    seqs: the step's sequences (T rows); groups: the prefix groups; unique_rows `[U]`: the step
    row of each unique row (ascending); original_to_unique `[T]`; q_lens / kv_lens: per
    sequence, its query rows among the unique rows and its keys (its whole length)."""

    seqs: PackedSeqs
    groups: tuple[PrefixGroup, ...]
    unique_rows: np.ndarray
    original_to_unique: np.ndarray
    q_lens: np.ndarray
    _cache: dict = dataclasses.field(default_factory=dict, repr=False)

    @property
    def num_tokens(self) -> int:
        return self.seqs.num_tokens

    @property
    def num_unique(self) -> int:
        return int(self.unique_rows.shape[0])

    @property
    def saved_tokens(self) -> int:
        return self.num_tokens - self.num_unique

    def cached(self, key: Any, make: Callable[[], Any]) -> Any:
        """`make()`, made once per plan (the step) under `key`: what every layer reads."""
        if key not in self._cache:
            self._cache[key] = make()
        return self._cache[key]

    def attention_layout(self, num_rows: int) -> AttentionLayout:
        """The attention of `num_rows` >= U unique rows (the last ones padding)."""
        return self.cached(("layout", num_rows), lambda: self._layout(num_rows))

    def tensor(self, name: str, device: torch.device | str, num_rows: int | None = None):
        """A host index as an int64 tensor on `device`, made once per step: "unique_rows"
        (padded to `num_rows` with row 0), "original_to_unique" (padded to `num_rows` step rows
        with unique row 0) or "kv_rows" (of `attention_layout(num_rows)`)."""
        return self.cached((name, str(device), num_rows),
                           lambda: _to_device(self._index(name, num_rows), device))

    def _index(self, name: str, num_rows: int | None) -> np.ndarray:
        if name == "kv_rows":
            return self.attention_layout(num_rows).kv_rows
        base = {"unique_rows": self.unique_rows, "original_to_unique": self.original_to_unique}
        rows = base[name]
        if num_rows is None or num_rows == rows.shape[0]:
            return rows
        if num_rows < rows.shape[0]:
            raise ValueError(f"num_rows ({num_rows}) < the {rows.shape[0]} rows of {name}")
        return np.concatenate([rows, np.zeros(num_rows - rows.shape[0], dtype=np.int64)])

    def _layout(self, num_rows: int) -> AttentionLayout:
        if num_rows < self.num_unique:
            raise ValueError(f"num_rows ({num_rows}) < unique rows ({self.num_unique})")
        lens = np.asarray(self.seqs.seq_lens, dtype=np.int64)
        attending = self.q_lens > 0
        seq_of_row = np.repeat(np.arange(lens.shape[0]), lens)
        kv_rows = self.original_to_unique[attending[seq_of_row]]
        q_lens, kv_lens = self.q_lens[attending].tolist(), lens[attending].tolist()
        padding = num_rows - self.num_unique
        if padding:
            kv_rows = np.concatenate([kv_rows, np.arange(self.num_unique, num_rows)])
            q_lens, kv_lens = [*q_lens, padding], [*kv_lens, padding]
        return AttentionLayout(
            PackedSeqs.from_seq_lens(q_lens), PackedSeqs.from_seq_lens(kv_lens), kv_rows
        )


def _to_device(index: np.ndarray, device: torch.device | str) -> torch.Tensor:
    """`index` on `device`: on an accelerator through pinned memory, queued without waiting
    for the stream (a blocking copy from pageable memory would synchronise it each step)."""
    host = torch.from_numpy(index)
    if torch.device(device).type == "cpu":
        return host
    return host.pin_memory().to(device, non_blocking=True)


def find_shared_prefixes(
    token_ids: np.ndarray | torch.Tensor | Sequence[int], seqs: PackedSeqs, min_len: int
) -> SharedPrefixPlan | None:
    """The step's shared prefixes of at least `min_len` tokens, or None when none is shared.

    token_ids: the step's `[T]` host token ids, sequences packed as `seqs` says (whole
    prompts: a prefix is only shared between sequences that start at their first token).
    """
    if min_len < 1:
        raise ValueError(f"min_len must be >= 1, got {min_len}")
    ids = _host_ids(token_ids)
    if ids.shape[0] != seqs.num_tokens:
        raise ValueError(f"token_ids has {ids.shape[0]} ids but seqs cover {seqs.num_tokens}")
    starts, lens = seqs.cu_seqlens[:-1], seqs.seq_lens
    buckets: dict[bytes, list[int]] = defaultdict(list)
    for index, (start, length) in enumerate(zip(starts, lens, strict=True)):
        if length >= min_len:
            buckets[ids[start : start + min_len].tobytes()].append(index)
    rows = [ids[start : start + length] for start, length in zip(starts, lens, strict=True)]
    groups: list[PrefixGroup] = []
    for members in buckets.values():
        if len(members) > 1:
            groups.extend(_groups_of_bucket(members, rows, min_len))
    if not groups:
        return None
    return _plan(seqs, tuple(sorted(groups, key=lambda g: g.members[0])))


def _host_ids(token_ids) -> np.ndarray:
    if isinstance(token_ids, torch.Tensor):
        if token_ids.device.type != "cpu":
            raise ValueError("token_ids must be host (CPU) ids: reading device ids would sync")
        token_ids = token_ids.numpy()
    ids = np.asarray(token_ids)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ValueError(f"token_ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    return ids.astype(np.int64, copy=False)


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(a.shape[0], b.shape[0])
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


# Neighbours' common prefixes are computed in one array operation up to this many elements
# (members x longest member), pair by pair beyond it.
_VECTOR_LIMIT = 1 << 22


def _neighbour_prefixes(ordered: list[int], rows: list[np.ndarray]) -> list[int]:
    """Common prefix lengths of consecutive members of `ordered`."""
    width = max(rows[index].shape[0] for index in ordered)
    if len(ordered) * width > _VECTOR_LIMIT:
        return [_common_prefix(rows[a], rows[b]) for a, b in itertools.pairwise(ordered)]
    padded = np.full((len(ordered), width + 1), -1, dtype=np.int64)
    lengths = np.array([rows[index].shape[0] for index in ordered])
    for place, index in enumerate(ordered):
        padded[place, : lengths[place]] = rows[index]
    padded[np.arange(len(ordered)), lengths] = -2 - np.arange(len(ordered))  # ends differ
    first_difference = np.argmax(padded[1:] != padded[:-1], axis=1)
    return np.minimum(first_difference, np.minimum(lengths[1:], lengths[:-1])).tolist()


def _groups_of_bucket(members: list[int], rows: list[np.ndarray], min_len: int):
    """The groups of one bucket: members sorted by their tokens (byte order of fixed-width
    ids is a token order: sequences with a common prefix sort next to each other, and the
    common prefix of a run is the smallest of its neighbours'), then split (`_best_runs`)."""
    ordered = sorted(members, key=lambda index: rows[index].tobytes())
    common = _neighbour_prefixes(ordered, rows)
    return [PrefixGroup(tuple(sorted(run)), prefix)
            for run, prefix in _best_runs(ordered, common, min_len)]  # fmt: skip


def _best_runs(ordered: list[int], common: list[int], min_len: int) -> list[tuple[list, int]]:
    """Runs of `ordered` (neighbours' common prefixes `common`) that save the most tokens.

    Neighbours with less than `min_len` in common never share a group; otherwise the run is
    one group with its smallest common prefix, or the runs split where that smallest value is
    reached (each with a longer prefix), whichever saves more ((members - 1) x prefix each)."""
    if len(ordered) < 2:
        return []
    prefix = min(common)
    must_split = prefix < min_len
    pieces, start = [], 0
    for index, value in enumerate(common):
        if value < min_len if must_split else value == prefix:
            pieces.append((ordered[start : index + 1], common[start:index]))
            start = index + 1
    pieces.append((ordered[start:], common[start:]))
    split = [run for part, between in pieces if len(part) > 1
             for run in _best_runs(part, between, min_len)]  # fmt: skip
    if must_split:
        return split
    saved_by_split = sum((len(run) - 1) * run_prefix for run, run_prefix in split)
    return split if saved_by_split > (len(ordered) - 1) * prefix else [(ordered, prefix)]


def _plan(seqs: PackedSeqs, groups: tuple[PrefixGroup, ...]) -> SharedPrefixPlan:
    """Rows of the plan (module docstring), vectorised over the step's rows."""
    num_seqs = seqs.num_seqs
    starts = np.asarray(seqs.cu_seqlens[:-1], dtype=np.int64)
    lens = np.asarray(seqs.seq_lens, dtype=np.int64)
    dropped = np.zeros(num_seqs, dtype=np.int64)  # prefix rows a later member leaves out
    first = np.arange(num_seqs)  # the member whose rows hold this sequence's prefix
    for group in groups:
        later = list(group.members[1:])
        dropped[later] = group.prefix_len
        first[later] = group.members[0]
    q_lens = lens - dropped
    unique_starts = np.concatenate([[0], np.cumsum(q_lens)[:-1]])
    num_unique = int(q_lens.sum())
    seq_of_row = np.repeat(np.arange(num_seqs), lens)
    offset = np.arange(seqs.num_tokens) - starts[seq_of_row]
    in_prefix = offset < dropped[seq_of_row]
    original_to_unique = np.where(
        in_prefix,
        unique_starts[first[seq_of_row]] + offset,
        unique_starts[seq_of_row] + offset - dropped[seq_of_row],
    )
    kept = np.repeat(starts + dropped - unique_starts, q_lens) + np.arange(num_unique)
    return SharedPrefixPlan(seqs, groups, kept.astype(np.int64),
                            original_to_unique.astype(np.int64), q_lens)  # fmt: skip


def shared_prefix_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: AttentionLayout,
    kv_rows: torch.Tensor,
    scale: float,
    npu: ModuleType | None = None,
    operator: str = attention.FUSED_INFER,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of the unique rows with shared prefixes: query `[U_pad, Nq, D]`, key
    and value `[U_pad, Nkv, D]`, `layout` from `SharedPrefixPlan.attention_layout(U_pad)` and
    `kv_rows` its keys' rows on the query's device -> `[U_pad, Nq, D]`.

    One fused attention call over gathered keys (two index_selects and FIA or FA in TND with
    `actual_seq_lengths_kv` of each text's whole length, sparse_mode 3), the option the
    launch and byte counts chose (docs/benchmarks.md, "Shared prefixes"); `npu` None: the
    PyTorch reference on the same gathered keys.
    """
    if kv_rows.shape[0] != layout.kv_seqs.num_tokens:
        raise ValueError(f"kv_rows has {kv_rows.shape[0]} rows, the layout's keys "
                         f"{layout.kv_seqs.num_tokens}")  # fmt: skip
    keys, values = key.index_select(0, kv_rows), value.index_select(0, kv_rows)
    return attention.varlen_attention(
        query, keys, values, layout.q_seqs, scale, npu=npu, operator=operator, out=out,
        kv_seqs=layout.kv_seqs,
    )  # fmt: skip
