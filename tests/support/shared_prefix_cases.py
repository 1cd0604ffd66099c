"""One step with shared prefixes, as issue 44 lists its cases, and the mutations that must fail.

`case_prompts` builds token-id prompts (token ids, so that a text can be exactly another's
prefix: our tokenizer appends EOS to every text) for one step: two groups with different
prefixes (an instruction; a reranker-like prompt and query), texts of unequal length, a text
equal to its group's prefix (so it has no own tokens) that is also a whole text the others
start with, a duplicate text, and unrelated texts. `EXPECTED_GROUPS` is the grouping the plan
must find.

`MUTATIONS` break the shared-prefix path in the three ways issue 44 names, each a context
manager that patches this process (a worker's), so a run under it shows that the parity checks
catch the fault: own tokens not attending to the prefix, own positions restarting at 0, a
group's prefix keys taken from another group.
"""

from __future__ import annotations

import contextlib

import numpy as np

INSTRUCTION = ("Instruct: Given a web search query, retrieve relevant passages that answer "
               "the query\nQuery:")  # fmt: skip
RERANK_PROMPT = ("Judge whether the Document meets the requirements based on the Query "
                 "and the Instruct provided. Query: which river flows through Paris? "
                 "Document:")  # fmt: skip


def case_prompts(tokenizer) -> list[list[int]]:
    """Eight prompts for one step (module docstring), in this order:
    0 instruction alone (the whole prefix of 3 and 5), 1 and 6 rerank prompt + two documents
    of unequal length, 2 unrelated, 3 and 5 instruction + queries of unequal length, 4
    unrelated, 7 a duplicate of 1."""
    def ids(text: str) -> list[int]:
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    eos = [tokenizer.eos_token_id]
    instruction, rerank = ids(INSTRUCTION), ids(RERANK_PROMPT)
    return [
        instruction,
        rerank + ids(" The Seine.") + eos,
        ids("unrelated text about cats and the weather") + eos,
        instruction + ids(" what is the capital of france") + eos,
        ids("Paris") + eos,
        instruction + ids(" how tall is mount everest in meters, measured today") + eos,
        rerank + ids(" The Seine flows through Paris and on to the sea at Le Havre.") + eos,
        rerank + ids(" The Seine.") + eos,
    ]


# (members, prefix tokens) as `find_shared_prefixes` must group `case_prompts`: the prefix
# lengths are those of INSTRUCTION and of RERANK_PROMPT + " The Seine" tokens (see the test).
EXPECTED_MEMBERS = ((0, 3, 5), (1, 6, 7))


def _plan_methods():
    from vllm_npu_ext.ops.shared_prefix import AttentionLayout, SharedPrefixPlan

    return SharedPrefixPlan, AttentionLayout


@contextlib.contextmanager
def _patched(owner, name, replacement):
    original = getattr(owner, name)
    setattr(owner, name, replacement(original))
    try:
        yield
    finally:
        setattr(owner, name, original)


def _own_keys_only(original):
    """Each text attends to its own rows only: the prefix keys are left out."""
    _, layout_cls = _plan_methods()

    def layout(self, num_rows):
        real = original(self, num_rows)
        q_lens = real.q_seqs.seq_lens
        rows = np.arange(num_rows)
        from vllm_npu_ext.ops.packed import PackedSeqs

        return layout_cls(real.q_seqs, PackedSeqs.from_seq_lens(q_lens), rows)

    return layout


def _other_groups_prefix(original):
    """A later member's prefix keys are taken from the next group's first member."""
    def layout(self, num_rows):
        real = original(self, num_rows)
        kv_rows = real.kv_rows.copy()
        groups = self.groups
        attending = [i for i, n in enumerate(self.q_lens) if n > 0]
        kv_starts = dict(zip(attending, real.kv_seqs.cu_seqlens, strict=False))
        for index, group in enumerate(groups):
            donor = groups[(index + 1) % len(groups)]
            if donor is group:
                continue
            donor_rows = self.original_to_unique[self.seqs.cu_seqlens[donor.members[0]]:]
            for member in group.members[1:]:
                if member in kv_starts:
                    width = min(group.prefix_len, donor.prefix_len)
                    start = kv_starts[member]
                    kv_rows[start : start + width] = donor_rows[:width]
        return type(real)(real.q_seqs, real.kv_seqs, kv_rows)

    return layout


def _positions_from_zero(original):
    """Own tokens of a group's later members get positions 0, 1, ... (not after the prefix)."""
    def forward(self, run_model, plan, input_ids, positions, capture_sizes):
        restarted = positions.clone()
        for group in plan.groups:
            for member in group.members[1:]:
                start, end = plan.seqs.cu_seqlens[member], plan.seqs.cu_seqlens[member + 1]
                restarted[..., start + group.prefix_len : end] -= group.prefix_len
        return original(self, run_model, plan, input_ids, restarted, capture_sizes)

    return forward


@contextlib.contextmanager
def mutation(name: str):
    """Patch this process with mutation `name` (`MUTATIONS`) while the block runs."""
    plan_cls, _ = _plan_methods()
    from vllm_npu_ext.model_executor.shared_prefix import SharedPrefixes

    patches = {
        "own_keys_only": (plan_cls, "_layout", _own_keys_only),
        "positions_from_zero": (SharedPrefixes, "forward", _positions_from_zero),
        "other_groups_prefix": (plan_cls, "_layout", _other_groups_prefix),
    }
    with _patched(*patches[name]):
        yield


MUTATIONS = ("own_keys_only", "positions_from_zero", "other_groups_prefix")
