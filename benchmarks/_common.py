"""Shared pieces of the embedding benchmarks: inputs, child processes, statistics, tables.

Inputs are generated, never read from disk: the same `(name, seed)` always gives the same
texts, and different seeds give texts that share no prefix, so a timed pass never meets a
text (or a prefix-cache block) an earlier pass has seen.
"""

from __future__ import annotations

import json
import math
import os
import random
import select
import statistics
import subprocess
import sys
import zlib
from collections.abc import Sequence
from pathlib import Path

from vllm_npu_ext.tiny_model import corpus

# Qwen3-Embedding's query format (documents get no instruction) and its model card's task.
QUERY_FORMAT = "Instruct: {task}\nQuery:{text}"
MODEL_CARD_TASK = "Given a web search query, retrieve relevant passages that answer the query"


def pass_seed(*parts: object) -> int:
    """A stable seed for one named pass (the same on every side and every run)."""
    return zlib.crc32("/".join(map(str, parts)).encode())


class TextMaker:
    """Deterministic texts of chosen token lengths, for one tokenizer."""

    def __init__(self, model_dir: str | os.PathLike):
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))

    def count_tokens(self, texts: Sequence[str]) -> int:
        """Tokens the model computes for `texts`, EOS included."""
        return sum(len(e.ids) for e in self.tokenizer.encode_batch(list(texts)))

    def text_of(self, num_tokens: int, rng: random.Random) -> str:
        """A text of about `num_tokens` tokens (EOS included) from random corpus sentences."""
        if num_tokens < 2:
            raise ValueError(f"num_tokens must be >= 2, got {num_tokens}")
        sentences = corpus(num_sentences=max(2, num_tokens // 6), seed=rng.randrange(2**31))
        ids = self.tokenizer.encode(" ".join(sentences), add_special_tokens=False).ids
        return self.tokenizer.decode(ids[: num_tokens - 1]).strip()

    def mixed(self, count: int, seed: int, min_tokens: int, max_tokens: int) -> list[str]:
        """`count` texts with log-uniform token lengths in [min_tokens, max_tokens]."""
        if not 2 <= min_tokens <= max_tokens:
            raise ValueError(f"need 2 <= min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
        rng = random.Random(seed)
        low, high = math.log(min_tokens), math.log(max_tokens)
        lengths = [round(math.exp(rng.uniform(low, high))) for _ in range(count)]
        return [self.text_of(n, rng) for n in lengths]

    def queries(self, count: int, seed: int, task: str, max_tokens: int) -> list[str]:
        """Short queries (8..max_tokens tokens) behind one shared instruction `task`."""
        texts = self.mixed(count, seed, min(8, max_tokens), max_tokens)
        return [QUERY_FORMAT.format(task=task, text=text) for text in texts]

    def model_card_queries(self, count: int, seed: int, min_words: int, max_words: int):
        """`count` queries of min_words..max_words words behind the model card's task."""
        rng = random.Random(seed)
        words = " ".join(corpus(num_sentences=4 * count, seed=seed)).split()
        queries = []
        for _ in range(count):
            length = rng.randint(min_words, max_words)
            start = rng.randrange(len(words) - length)
            text = " " + " ".join(words[start : start + length])
            queries.append(QUERY_FORMAT.format(task=MODEL_CARD_TASK, text=text))
        return queries

    def instruction(self, num_tokens: int) -> str:
        """A fixed task description of about `num_tokens` tokens (the shared prefix)."""
        body = self.text_of(num_tokens, random.Random(pass_seed("instruction")))
        return "Given a web search query, retrieve relevant passages that answer it. " + body


def chunks(items: Sequence, size: int) -> list[Sequence]:
    if size < 1:
        raise ValueError(f"batch size must be >= 1, got {size}")
    return [items[i : i + size] for i in range(0, len(items), size)]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def geometric_mean(values: Sequence[float]) -> float:
    values = [v for v in values if v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else float("nan")


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


class Worker:
    """A side's process (`python argv...`), driven one JSON line at a time.

    The process answers one line when ready, then one per command (see `_embed_worker`).
    Its other output goes to `log_path`, whose tail is in every error.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], log_path: Path, timeout: float):
        self.log_path, self.timeout = log_path, timeout
        self._log = open(log_path, "w")  # noqa: SIM115 - closed in close()
        self.process = subprocess.Popen(
            [sys.executable, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self._log, env={**os.environ, **env}, text=True,
        )  # fmt: skip
        self.ready = self._reply()

    def call(self, op: str, **arguments) -> dict:
        self.process.stdin.write(json.dumps({"op": op, **arguments}) + "\n")
        self.process.stdin.flush()
        return self._reply()

    def close(self) -> dict:
        """Ask the process to quit; returns its last answer (peak RSS)."""
        try:
            return self.call("quit")
        finally:
            self.process.wait(timeout=120)
            self._log.close()

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._log.close()

    def _reply(self) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], self.timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.kill()
            tail = "\n".join(self.log_path.read_text(errors="replace").splitlines()[-40:])
            raise RuntimeError(f"worker gave no answer (exit {self.process.returncode}):\n{tail}")
        return json.loads(line)


def peak_rss_gib() -> float:
    """This process's peak resident memory (children included), GiB."""
    import resource

    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 2**20  # ru_maxrss is in KiB on Linux


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    def cell(value: object) -> str:
        if not isinstance(value, float):
            return str(value)
        if not math.isfinite(value):
            return "n/a"
        return f"{value:.0f}" if value >= 100 else f"{value:.1f}" if value >= 10 else f"{value:.2f}"

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
