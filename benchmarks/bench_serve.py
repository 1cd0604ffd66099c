#!/usr/bin/env python
"""Load against a running `/v1/embeddings` server: requests/s, tokens/s, latency, errors.

    vllm-npu-ext serve MODEL &                       # or any OpenAI-compatible server
    python benchmarks/bench_serve.py --url http://127.0.0.1:8000
    python benchmarks/bench_serve.py --requests 2000 --concurrency 64   # the big load test

First `--warmup` requests (untimed, texts of their own) warm the server and the clients.
Then for each concurrency level (default 1, 4, 16, 64), `--requests` requests are sent by
that many closed-loop clients (each sends its next request when the previous one answers).
Every text is new to the server: each level and the warm-up draw their own texts, with
log-uniform lengths of `--min-words`..`--max-words` words, so a prefix cache answers none
of them from an earlier level. Within a level, every `--probe-every`-th request repeats one
of that level's probe texts: embeddings of the same text must agree whatever they were
batched with (`min probe cos`, 1.0 = identical); only those repeats can be prefix-cache
hits. Tokens are the server's own `usage.prompt_tokens`. `--instruction` puts every text behind
one instruction (Qwen3-Embedding's query format; without a value its model card's task): the
shared-instruction workload, where requests batched into one step share their first tokens.
Failed requests are counted (`errors`) and left out of requests/s, tokens/s and the latency
percentiles.

Output: a markdown table, then one JSON line. Exit status 1 when a request failed or the
probe embeddings disagree (below `--min-cosine`). `tests/test_load.py` and
`tests/test_faults.py` drive `run_load` from this module.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import sys
import time
import zlib
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import MODEL_CARD_TASK, QUERY_FORMAT, cosine, markdown_table, median  # noqa: E402

from vllm_npu_ext.tiny_model import corpus  # noqa: E402

PROBE_TEXTS = 8


EMBEDDINGS_PATH = "/v1/embeddings"


@dataclasses.dataclass(frozen=True)
class Request:
    """One POST: a JSON body, or raw bytes (for malformed requests), to `path`.

    Embeddings answers give one vector per input; rerank answers (`/rerank`) give each
    document's `[relevance_score]`, in document order.
    """

    body: Any
    probe: str | None = None  # requests with the same probe key carry the same text ...
    probe_index: int = 0  # ... at this position of their input
    keep_embedding: bool = False
    path: str = EMBEDDINGS_PATH
    base_url: str | None = None  # another server's, for one load over several servers

    def probe_embedding(self, embeddings: list[list[float]]) -> list[float]:
        return embeddings[self.probe_index]

    def send_kwargs(self) -> dict:
        if isinstance(self.body, bytes):
            return {"content": self.body, "headers": {"content-type": "application/json"}}
        return {"json": self.body}


@dataclasses.dataclass
class Outcome:
    """What came back for one request (status 0: no HTTP answer, see `error`)."""

    request: Request
    status: int
    seconds: float
    prompt_tokens: int = 0
    error: str | None = None
    embeddings: list[list[float]] | None = None

    @property
    def ok(self) -> bool:
        return self.status == 200 and self.error is None


async def _send(client: httpx.AsyncClient, base_url: str, request: Request) -> Outcome:
    start = time.perf_counter()
    try:
        url = (request.base_url or base_url).rstrip("/") + request.path
        response = await client.post(url, **request.send_kwargs())
    except httpx.HTTPError as error:
        return Outcome(request, 0, time.perf_counter() - start, error=repr(error))
    seconds = time.perf_counter() - start
    try:
        payload = response.json()
    except ValueError:
        return Outcome(request, response.status_code, seconds, error=response.text[:200])
    if response.status_code != 200:
        message = (payload.get("error") or {}).get("message") if isinstance(payload, dict) else None
        return Outcome(request, response.status_code, seconds, error=message or str(payload))
    outcome = Outcome(request, 200, seconds, payload.get("usage", {}).get("prompt_tokens", 0))
    if request.probe is not None or request.keep_embedding:
        outcome.embeddings = _vectors(payload)
    return outcome


def _vectors(payload: dict) -> list[list[float]]:
    """Embeddings, or each document's [relevance_score] of a rerank answer, in input order."""
    if "results" in payload:
        return [[r["relevance_score"]] for r in sorted(payload["results"], key=_index)]
    return [d["embedding"] for d in sorted(payload["data"], key=_index)]


def _index(item: dict) -> int:
    return item["index"]


async def run_load_async(
    base_url: str,
    requests: list[Request],
    concurrency: int,
    timeout: float = 120.0,
    progress: bool = False,
) -> tuple[list[Outcome], float]:
    """Send `requests` with `concurrency` closed-loop clients -> (outcomes in order, wall s)."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    base_url = base_url.rstrip("/")
    outcomes: list[Outcome | None] = [None] * len(requests)
    queue = iter(range(len(requests)))
    bar = _progress_bar(len(requests), concurrency) if progress else None

    async def client_loop():
        # One connection per client: httpx's shared pool costs O(connections) per request.
        async with httpx.AsyncClient(timeout=timeout, limits=httpx.Limits(max_connections=1)) as c:
            for i in queue:  # shared iterator: each index is taken by exactly one client
                outcomes[i] = await _send(c, base_url, requests[i])
                if bar is not None:
                    bar.update(1)

    start = time.perf_counter()
    await asyncio.gather(*(client_loop() for _ in range(concurrency)))
    wall = time.perf_counter() - start
    if bar is not None:
        bar.close()
    return outcomes, wall  # type: ignore[return-value]


def run_load(base_url: str, requests: list[Request], concurrency: int, **kwargs):
    """Blocking `run_load_async`."""
    return asyncio.run(run_load_async(base_url, requests, concurrency, **kwargs))


def _progress_bar(total: int, concurrency: int):
    from tqdm import tqdm

    return tqdm(total=total, desc=f"concurrency {concurrency}", unit="req", file=sys.stderr)


def word_texts(count: int, seed: int, min_words: int, max_words: int) -> list[str]:
    """`count` texts with log-uniform word counts in [min_words, max_words]."""
    if not 1 <= min_words <= max_words:
        raise ValueError(f"need 1 <= min_words <= max_words, got {min_words}, {max_words}")
    rng = random.Random(seed)
    words = " ".join(corpus(num_sentences=count * max_words // 8 + 8, seed=seed)).split()
    texts = []
    for _ in range(count):
        n = round(math.exp(rng.uniform(math.log(min_words), math.log(max_words))))
        start = rng.randrange(max(1, len(words) - n))
        texts.append(" ".join(words[start : start + n]))
    return texts


def load_requests(
    model: str, count: int, seed: int, min_words: int, max_words: int, probe_every: int,
    instruction: str | None = None,
) -> list[Request]:
    """Mixed-length single-text requests, all texts drawn from `seed`; every
    `probe_every`-th request repeats one of `PROBE_TEXTS` probe texts (also from `seed`).
    `instruction`: every text is a query behind it, in Qwen3-Embedding's query format."""
    texts = word_texts(count, seed, min_words, max_words)
    probes = word_texts(PROBE_TEXTS, seed + 1, min_words, max_words)
    if instruction is not None:
        texts, probes = ([QUERY_FORMAT.format(task=instruction, text=" " + text)
                          for text in group] for group in (texts, probes))  # fmt: skip
    requests = []
    for i, text in enumerate(texts):
        if probe_every and i % probe_every == 0:
            key = i // probe_every % len(probes)
            requests.append(Request({"model": model, "input": probes[key]}, probe=str(key)))
        else:
            requests.append(Request({"model": model, "input": text}))
    return requests


def level_seed(level: int | str) -> int:
    """Texts of one concurrency level (or "warmup"): seeds 2 apart, texts and probes."""
    return zlib.crc32(f"bench_serve/{level}".encode()) * 2


def min_probe_cosine(outcomes: list[Outcome]) -> float:
    """Smallest cosine between an embedding of a probe text and its first embedding."""
    first: dict[str, list[float]] = {}
    worst = 1.0
    for outcome in outcomes:
        if outcome.ok and outcome.request.probe is not None:
            vector = outcome.request.probe_embedding(outcome.embeddings)
            reference = first.setdefault(outcome.request.probe, vector)
            worst = min(worst, cosine(vector, reference))
    return worst


def summarise(outcomes: list[Outcome], wall: float) -> dict:
    """requests/s, tokens/s and latency percentiles of the successful requests; errors
    counted apart (a fast failure must not improve the latency figures)."""
    ok = [o for o in outcomes if o.ok]
    latencies = sorted(o.seconds for o in ok)
    return {
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "requests_per_s": len(ok) / wall,
        "tokens_per_s": sum(o.prompt_tokens for o in ok) / wall,
        "p50_ms": 1000 * median(latencies) if latencies else math.nan,
        "p99_ms": 1000 * percentile(latencies, 0.99) if latencies else math.nan,
        "min_probe_cosine": min_probe_cosine(outcomes),
        "first_errors": sorted({f"{o.status}: {o.error}" for o in outcomes if not o.ok})[:5],
    }


def percentile(sorted_values: list[float], fraction: float) -> float:
    """The nearest-rank percentile of a non-empty sorted list."""
    rank = min(len(sorted_values), max(1, math.ceil(fraction * len(sorted_values))))
    return sorted_values[rank - 1]


def served_model(base_url: str) -> str:
    response = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=30)
    response.raise_for_status()
    return response.json()["data"][0]["id"]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="model name (default: the server's first)")
    parser.add_argument("--concurrency", default="1,4,16,64",
                        type=lambda s: [int(v) for v in s.split(",")])  # fmt: skip
    parser.add_argument("--requests", type=int, default=200, help="per concurrency level")
    parser.add_argument("--min-words", type=int, default=6)
    parser.add_argument("--max-words", type=int, default=380)
    parser.add_argument("--probe-every", type=int, default=10)
    parser.add_argument("--instruction", nargs="?", const=MODEL_CARD_TASK,
                        help="every text a query behind this instruction (no value: "
                        "Qwen3-Embedding's model-card task), in its query format: the "
                        "shared-instruction workload")  # fmt: skip
    parser.add_argument("--warmup", type=int, default=32, help="untimed requests first")
    parser.add_argument("--min-cosine", type=float, default=0.99999)
    parser.add_argument("--timeout", type=float, default=300, help="seconds per request")
    parser.add_argument("--no-progress", action="store_true")
    parser.add_argument("--json-out", type=Path)
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    model = args.model or served_model(args.url)
    warmup = summarise(*_run_level(args, model, "warmup", args.warmup, max(args.concurrency)))
    rows, levels = [], {}
    for level in args.concurrency:
        outcomes, wall = _run_level(args, model, level, args.requests, level)
        levels[level] = summary = summarise(outcomes, wall)
        rows.append([level, summary["requests"], summary["requests_per_s"],
                     summary["tokens_per_s"], summary["p50_ms"], summary["p99_ms"],
                     summary["errors"], f"{summary['min_probe_cosine']:.6f}"])  # fmt: skip
    header = ["concurrency", "requests", "requests/s", "tokens/s", "p50 ms", "p99 ms",
              "errors", "min probe cos"]  # fmt: skip
    print(markdown_table(header, rows))
    failed = warmup["errors"] > 0 or any(
        s["errors"] or s["min_probe_cosine"] < args.min_cosine for s in levels.values()
    )
    line = json.dumps({"url": args.url, "model": model, "warmup_errors": warmup["errors"],
                       "levels": levels, "ok": not failed})  # fmt: skip
    if args.json_out:
        args.json_out.write_text(line + "\n")
    print(line)
    return 1 if failed else 0


def _run_level(args, model: str, level, count: int, concurrency: int):
    requests = load_requests(
        model, count, level_seed(level), args.min_words, args.max_words, args.probe_every,
        args.instruction,
    )  # fmt: skip
    if not requests:
        return [], 1.0
    return run_load(
        args.url, requests, concurrency, timeout=args.timeout, progress=not args.no_progress
    )


if __name__ == "__main__":
    sys.exit(main())
