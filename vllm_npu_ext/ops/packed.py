"""Boundaries of variable-length sequences packed along the token axis (TND layout)."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import torch


@dataclasses.dataclass(frozen=True)
class PackedSeqs:
    """Sequence boundaries of a packed batch, kept on the host.

    `cu_seqlens` is `[0, len_0, len_0 + len_1, ..., T]` (batch + 1 entries, strictly
    increasing), the flash-attention convention, but as Python ints: NPU operators take their
    sequence lengths as host lists, and building them from a device tensor would cost a
    device-to-host sync in every layer.
    """

    cu_seqlens: tuple[int, ...]

    def __post_init__(self) -> None:
        cu = self.cu_seqlens
        if len(cu) < 2 or cu[0] != 0:
            raise ValueError(f"cu_seqlens must start at 0 and hold at least 2 entries, got {cu}")
        if any(not isinstance(c, int) for c in cu):
            raise ValueError(f"cu_seqlens must hold Python ints, got {cu}")
        if any(b <= a for a, b in itertools.pairwise(cu)):
            raise ValueError(f"cu_seqlens must be strictly increasing, got {cu}")

    @classmethod
    def from_seq_lens(cls, seq_lens: Sequence[int]) -> PackedSeqs:
        cu = [0]
        for length in seq_lens:
            cu.append(cu[-1] + int(length))
        return cls(tuple(cu))

    @classmethod
    def from_query_start_loc(cls, query_start_loc_cpu: torch.Tensor) -> PackedSeqs:
        """From vLLM's host-side `query_start_loc_cpu`; empty requests are dropped."""
        if query_start_loc_cpu.device.type != "cpu":
            raise ValueError("query_start_loc_cpu must be a host (CPU) tensor")
        cu = query_start_loc_cpu.tolist()
        return cls(tuple(dict.fromkeys(cu)))  # drops repeats, keeps order

    @property
    def num_tokens(self) -> int:
        return self.cu_seqlens[-1]

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def seq_lens(self) -> list[int]:
        return [b - a for a, b in itertools.pairwise(self.cu_seqlens)]

    @property
    def max_seqlen(self) -> int:
        return max(self.seq_lens)

    @property
    def actual_seq_lengths(self) -> list[int]:
        """Cumulative lengths without the leading 0: the form torch_npu's TND operators take."""
        return list(self.cu_seqlens[1:])

    def chunks(self, max_seqs: int, max_tokens: int) -> list[tuple[int, PackedSeqs]]:
        """Consecutive groups of whole sequences within an operator's batch limits.

        Returns `[(first_token, seqs)]`, each `seqs` holding at most `max_seqs` sequences and
        `max_tokens` tokens, its boundaries relative to `first_token`; `[(0, self)]` when the
        whole batch fits. ValueError when one sequence alone exceeds `max_tokens`.
        """
        if max_seqs < 1 or max_tokens < 1:
            raise ValueError(f"max_seqs and max_tokens must be >= 1, got {max_seqs}, {max_tokens}")
        if self.num_seqs <= max_seqs and self.num_tokens <= max_tokens:
            return [(0, self)]
        if self.max_seqlen > max_tokens:
            raise ValueError(
                f"a sequence of {self.max_seqlen} tokens exceeds the limit of {max_tokens}"
            )
        chunks: list[tuple[int, PackedSeqs]] = []
        first = 0  # index into cu_seqlens of the current chunk's first sequence
        cu_seqlens = self.cu_seqlens
        for last in range(1, self.num_seqs + 1):
            done = last == self.num_seqs
            full = last - first == max_seqs
            next_overflows = not done and cu_seqlens[last + 1] - cu_seqlens[first] > max_tokens
            if done or full or next_overflows:
                start = cu_seqlens[first]
                cu = tuple(c - start for c in cu_seqlens[first : last + 1])
                chunks.append((start, PackedSeqs(cu)))
                first = last
        return chunks

    def padded_to(self, num_tokens: int) -> PackedSeqs:
        """Cover `num_tokens` rows; padding rows beyond the last sequence form one more sequence.

        Rows never attend across sequences, so padding rows cannot change real outputs.
        """
        if num_tokens < self.num_tokens:
            raise ValueError(f"num_tokens ({num_tokens}) < packed tokens ({self.num_tokens})")
        if num_tokens == self.num_tokens:
            return self
        return PackedSeqs((*self.cu_seqlens, num_tokens))

    def cu_seqlens_tensor(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """`cu_seqlens` as an int32 tensor `(batch + 1,)`."""
        return torch.tensor(self.cu_seqlens, dtype=torch.int32, device=device)
