"""`count_ops.py --shared-prefix`: the NPU options for shared-prefix attention, counted.

Issue 44 names three ways to attend with a group's prefix keys on the NPU; each is run under
the torch_npu stand-in on one decoder layer's attention at the Qwen3-Embedding-0.6B shapes
(bf16, 16 q / 8 kv heads, head_dim 128) and counted by `op_counter.OpCounter` (launches,
bytes read and written) for the workloads of `bench_*.py --shared-prefix`:

- `gathered keys` (what `ops.shared_prefix.shared_prefix_attention` runs): each text's keys
  gathered from the unique rows (two index_selects) and one FIA in TND whose per-text key
  lengths are the whole texts' (sparse_mode 3, right-down causal);
- `two FIA + AttentionUpdate`: the unique rows laid out prefixes first, then the texts' own
  rows; one causal FIA over every segment with its LSE, one FIA of the own rows against
  their group's prefix rows (no mask) with its LSE, both written into one [2, ...] buffer,
  merged by our tensor-input AttentionUpdate and copied back over the own rows;
- `key_shared_prefix`: not run: torch-npu 2.10.0.post4 documents FIA's prefix arguments for
  one prefix per call (its batch "必须为1") and lists "prefix" among what TND does not
  support on Atlas A2/A3 (`_op_plugin_docs.py`, npu_fused_infer_attention_score: the
  input_layout and "prefix相关参数约束" passages; the same exclusion for _v2's TND).
Every run is checked against attention over every text whole (the reference), which is also
counted (`whole texts`, one FIA over all rows: what the step costs without sharing).
"""

from __future__ import annotations

import numpy as np
import torch
from op_counter import OpCounter

HEADS = (16, 8, 128)  # Qwen3-Embedding-0.6B: q heads, kv heads, head_dim
# name -> (texts, shared prefix tokens, own tokens low..high): the bench_* workloads' shapes
WORKLOADS = {
    "(a) 64 queries, 20-token instruction": (64, 20, (5, 17)),
    "(b) 32 documents, 80-token prompt + query": (32, 80, (47, 271)),
    "(c) 16 queries, 262-token instruction": (16, 262, (9, 65)),
}
OPTIONS = ("whole texts", "gathered keys", "two FIA + AttentionUpdate")


def _step(texts: int, prefix: int, own: tuple[int, int], seed: int = 0):
    rng = np.random.default_rng(seed)
    head = rng.integers(10, 100_000, prefix).tolist()
    return [head + rng.integers(10, 100_000, rng.integers(*own)).tolist() for _ in range(texts)]


def _qkv(num_rows: int):
    generator = torch.Generator().manual_seed(1)
    q_heads, kv_heads, dim = HEADS
    return [torch.randn(num_rows, n, dim, generator=generator).to(torch.bfloat16)
            for n in (q_heads, kv_heads, kv_heads)]  # fmt: skip


def _two_calls(npu, q, k, v, lengths, scale):
    """Option 2 (module docstring) on the unique rows laid out by `_prefix_first` (q, k, v
    reordered by the caller, as the planner would lay them out); returns the output rows in
    that order."""
    from vllm_npu_ext.ops import attention
    from vllm_npu_ext.ops.attention_update import attention_update
    from vllm_npu_ext.ops.packed import PackedSeqs

    prefix_lens, own_lens, segments = lengths
    rows, heads, dim = q.shape
    out = torch.empty(2, rows, heads, dim, dtype=q.dtype)
    lse = torch.empty(2, rows, heads, 1, dtype=torch.float32)
    seqs = PackedSeqs.from_seq_lens(segments)
    npu.npu_fused_infer_attention_score.out(
        q, k, v, **attention.fia_tnd_kwargs(q, k, seqs, scale), softmax_lse_flag=True,
        out=[out[0], lse[0]])  # fmt: skip
    start, end = sum(prefix_lens), sum(prefix_lens) + sum(own_lens)
    own_q, prefix_k, prefix_v = q[start:end], k[:start], v[:start]
    npu.npu_fused_infer_attention_score.out(
        own_q, prefix_k, prefix_v, **attention.fia_tnd_kwargs(
            own_q, prefix_k, PackedSeqs.from_seq_lens(own_lens), scale, causal=False,
            kv_seqs=PackedSeqs.from_seq_lens(prefix_lens)),
        softmax_lse_flag=True, out=[out[1, start:end], lse[1, start:end]])  # fmt: skip
    merged, _ = attention_update(lse[:, start:end].reshape(2, -1),
                                 out[:, start:end].reshape(2, -1, dim))  # fmt: skip
    out[0, start:end].copy_(merged.view(end - start, heads, dim))
    return out[0]


def _prefix_first(plan):
    """Unique rows reordered: every group's prefix rows, then every group member's own rows
    (group by group), then the texts without a group; with the segment lengths."""
    starts = np.concatenate([[0], np.cumsum(plan.q_lens)])
    first_rows, own_rows, rest, prefix_lens, own_lens, own_segments = [], [], [], [], [], []
    grouped = set()
    for group in plan.groups:
        first = group.members[0]
        first_rows += range(starts[first], starts[first] + group.prefix_len)
        prefix_lens.append(group.prefix_len)
        count = 0
        for member in group.members:
            grouped.add(member)
            skip = group.prefix_len if member == first else 0
            own = range(starts[member] + skip, starts[member + 1])
            own_rows += own
            count += len(own)
            if len(own):
                own_segments.append(len(own))
        own_lens.append(count)
    rest_segments = []
    for index in range(len(plan.q_lens)):
        if index not in grouped:
            rest += range(starts[index], starts[index + 1])
            rest_segments.append(int(plan.q_lens[index]))
    order = first_rows + own_rows + rest
    return order, (prefix_lens, own_lens, prefix_lens + own_segments + rest_segments)


def count_options(npu) -> dict:
    """Launches and bytes of each option on each workload (module docstring)."""
    return {name: _count_workload(npu, shape) for name, shape in WORKLOADS.items()}


def _count_workload(npu, shape) -> dict:
    from vllm_npu_ext.ops import attention
    from vllm_npu_ext.ops.packed import PackedSeqs
    from vllm_npu_ext.ops.shared_prefix import find_shared_prefixes, shared_prefix_attention

    scale = HEADS[2] ** -0.5
    texts = _step(*shape)
    seqs = PackedSeqs.from_seq_lens([len(text) for text in texts])
    plan = find_shared_prefixes(np.array([token for text in texts for token in text]), seqs, 4)
    q, k, v = _qkv(plan.num_tokens)
    # A causal model's rows are equal wherever texts share their first tokens.
    holder = torch.as_tensor(plan.unique_rows[plan.original_to_unique])
    q, k, v = (t[holder] for t in (q, k, v))
    unique = torch.as_tensor(plan.unique_rows)
    uq, uk, uv = q[unique], k[unique], v[unique]
    kv_rows = plan.tensor("kv_rows", "cpu", plan.num_unique)
    order, lengths = _prefix_first(plan)
    oq, ok, ov = (t[torch.as_tensor(order)] for t in (uq, uk, uv))
    attention.compressed_causal_mask(q.device)  # made once per device, not per call
    runs = {
        "whole texts": lambda: attention.varlen_attention(q, k, v, seqs, scale, npu=npu),
        "gathered keys": lambda: shared_prefix_attention(
            uq, uk, uv, plan.attention_layout(plan.num_unique), kv_rows, scale, npu=npu),
        "two FIA + AttentionUpdate": lambda: _two_calls(npu, oq, ok, ov, lengths, scale),
    }  # fmt: skip
    truth = attention.varlen_attention_native(q, k, v, seqs, scale)
    back = plan.tensor("original_to_unique", "cpu")
    entry = {"tokens": plan.num_tokens, "unique_rows": plan.num_unique}
    for option, run in runs.items():
        with OpCounter(measure_bytes=True) as counter:
            out = run()
        if option == "two FIA + AttentionUpdate":  # back in the unique rows' order
            out = torch.empty_like(out).index_copy_(0, torch.as_tensor(order), out)
        full = out if option == "whole texts" else out[back]
        entry[option] = {
            "launches": dict(sorted(counter.launches.items())),
            "launch_count": sum(counter.launches.values()),
            "mib_read": sum(r for r, _ in counter.bytes.values()) / 2**20,
            "mib_written": sum(w for _, w in counter.bytes.values()) / 2**20,
            "max_error_vs_whole": (full.float() - truth.float()).abs().max().item(),
        }  # fmt: skip
    return entry


def print_table(results: dict) -> None:
    print("| workload (attention of one layer, 0.6B shapes, bf16) | option | launches | "
          "MiB read | MiB written | max error vs whole |\n|---|---|---:|---:|---:|---:|")
    for name, entry in results.items():
        for option in OPTIONS:
            row = entry[option]
            label = f"{name}: {entry['tokens']} rows, {entry['unique_rows']} unique"
            print(f"| {label} | {option} | {row['launch_count']} | {row['mib_read']:.1f} | "
                  f"{row['mib_written']:.1f} | {row['max_error_vs_whole']:.1e} |")
