"""One side of `bench_rerank.py` in its own process: a vLLM reranker engine or transformers.

    python benchmarks/_rerank_worker.py SPEC_JSON

The same protocol as `_embed_worker.py` (one JSON line per command; SPEC_JSON and the
`warmup`/`pass`/`check`/`quit` commands), on (query, document) pairs:

- vLLM: `LLM.score(query, documents, chat_template=...)` with `reranker.HF_OVERRIDES` and our
  template, one call per query (what a /rerank request does);
- hf: the model card's computation (its prompt, P(yes) from the "no"/"yes" logits at the last
  position), length-sorted left-padded batches, only the last position's logits computed.

A scenario S is {"name", "pairs_per_pass", "min_tokens", "max_tokens", "query_tokens"};
batch size b = documents per query: a pass scores `pairs_per_pass` pairs as
pairs_per_pass / b queries with b documents each, all generated from the pass's seed (new
for every pass, the same on every side). `texts` in a pass record counts pairs.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import TextMaker, chunks, pass_seed  # noqa: E402
from _embed_worker import HfSide, VllmSide, pass_record, serve  # noqa: E402

from vllm_npu_ext import reranker  # noqa: E402

CHECK_PAIRS = 8
Groups = list[tuple[str, list[str]]]


class VllmRerankSide(VllmSide):
    """vLLM's score API as `vllm-npu-ext serve --reranker` configures it."""

    def __init__(self, spec: dict):
        super().__init__(spec, hf_overrides=reranker.HF_OVERRIDES)
        self.template = reranker.template_text()

    def score(self, groups: Groups, batch_size: int) -> list[float]:
        scores = []
        for query, documents in groups:
            outputs = self.llm.score(query, documents, chat_template=self.template,
                                     use_tqdm=False)  # fmt: skip
            scores += [output.outputs.score for output in self.counted(outputs)]
        return scores


class HfRerankSide(HfSide):
    """The model card's scoring, batched like `HfSide` (length-sorted, left padding)."""

    auto_class = "AutoModelForCausalLM"

    def __init__(self, spec: dict):
        super().__init__(spec)
        self.answer_ids = self.tokenizer.convert_tokens_to_ids(["no", "yes"])

    def score(self, groups: Groups, batch_size: int) -> list[float]:
        prompts = [reranker.prompt(query, doc) for query, docs in groups for doc in docs]
        return [vector[0] for vector in self.embed(prompts, batch_size)]

    def _forward(self, prompts: list[str]) -> list[list[float]]:
        torch = self.torch
        batch = self.tokenizer(prompts, padding=True, return_tensors="pt").to(self.device)
        with torch.inference_mode():
            # logits_to_keep=1: the LM head runs on the last position only.
            logits = self.model(**batch, use_cache=False, logits_to_keep=1).logits[:, -1]
            pair = logits[:, self.answer_ids].float()
            scores = torch.softmax(pair, dim=-1)[:, 1]
        return [[score] for score in scores.cpu().tolist()]


def pass_groups(maker: TextMaker, scenario: dict, count: int, batch_size: int, seed: int):
    """`count` pairs: ceil(count / batch_size) queries with up to batch_size documents."""
    documents = maker.mixed(count, seed, scenario["min_tokens"], scenario["max_tokens"])
    groups = chunks(documents, batch_size)
    queries = maker.mixed(len(groups), seed + 1, 4, scenario["query_tokens"])
    return [(query, list(group)) for query, group in zip(queries, groups, strict=True)]


def prompt_tokens(maker: TextMaker, groups: Groups) -> int:
    return maker.count_tokens([reranker.prompt(q, d) for q, docs in groups for d in docs])


def warmup(side, maker: TextMaker, command: dict) -> dict:
    """`count` pairs of one query, then one query with one document (the first batch of a
    single sequence costs vLLM's torch.compile a one-off extra compile)."""
    scenario, count = command["scenario"], command["count"]
    seed = pass_seed(scenario["name"], "warmup")
    side.score(pass_groups(maker, scenario, count, count, seed), count)
    side.score(pass_groups(maker, scenario, 1, 1, seed + 2), 1)
    return {"texts": count + 1}


def timed_pass(side, maker: TextMaker, command: dict) -> dict:
    scenario, batch_size = command["scenario"], command["batch_size"]
    count = scenario["pairs_per_pass"]
    seed = pass_seed(scenario["name"], batch_size, command["repeat"])
    groups = pass_groups(maker, scenario, count, batch_size, seed)
    tokens = prompt_tokens(maker, groups)
    return pass_record(command, lambda: side.score(groups, batch_size), count, tokens, side)


def check(side, maker: TextMaker, command: dict) -> dict:
    scenario = {"min_tokens": 8, "max_tokens": 64, "query_tokens": 16}
    groups = pass_groups(maker, scenario, CHECK_PAIRS, CHECK_PAIRS, pass_seed("check"))
    return {"check_scores": side.score(groups, CHECK_PAIRS)}


COMMANDS = {"warmup": warmup, "pass": timed_pass, "check": check}


if __name__ == "__main__":
    serve({"vllm": VllmRerankSide, "hf": HfRerankSide}, COMMANDS)
