"""One side of `bench_embed.py` in its own process: a vLLM engine or Hugging Face transformers.

    python benchmarks/_embed_worker.py SPEC_JSON

SPEC_JSON (from bench_embed.py): {"kind": "vllm"|"hf", "model", "dtype", "max_model_len",
"gpu_memory_utilization", "device", "emulate"}. The worker builds its side, answers one JSON
line (start-up time, KV-cache bytes, ...), then serves commands, one JSON line each on stdin,
each answered by one JSON line on stdout; everything else it prints goes to stderr:

- {"op": "warmup", "scenario": S, "count": n}: embed n texts of S no timed pass uses;
- {"op": "pass", "scenario": S, "batch_size": b, "repeat": r}: one timed pass;
- {"op": "check"}: eight fixed embeddings, to compare the sides;
- {"op": "quit"}: answers the peak RSS and exits.

A scenario S is {"name", "texts_per_pass", "min_tokens", "max_tokens", "prefix_tokens"}.
Pass texts are seeded by (scenario name, batch size, repeat): the same on every side, and
new for every pass. With `prefix_tokens > 0`, one shared instruction precedes short queries.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import TextMaker, chunks, pass_seed, peak_rss_gib  # noqa: E402

from vllm_npu_ext.selfcheck.engine_probe import class_names, kv_cache_figures  # noqa: E402

CHECK_TEXTS = 8


class VllmSide:
    """`LLM.embed` on an in-process engine (`VLLM_ENABLE_V1_MULTIPROCESSING=0`).

    `engine_args` go to `vllm.LLM` besides the spec's (default: `convert="embed"`)."""

    def __init__(self, spec: dict, **engine_args):
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if spec.get("emulate"):
            from vllm_npu_ext import emulator as torch_npu_emulator

            torch_npu_emulator.install()
        from vllm import LLM

        self.llm = LLM(
            model=spec["model"], runner="pooling", dtype=spec["dtype"],
            max_model_len=spec["max_model_len"], seed=0,
            gpu_memory_utilization=spec["gpu_memory_utilization"],
            **(engine_args or {"convert": "embed"}), **spec.get("engine_args", {}),
        )  # fmt: skip
        self.prompt_tokens = self.cached_tokens = 0

    def embed(self, texts: list[str], batch_size: int) -> list[list[float]]:
        """One `LLM.embed` call per `batch_size` texts, in order."""
        out = []
        for chunk in chunks(texts, batch_size):
            out += [o.outputs.embedding
                    for o in self.counted(self.llm.embed(list(chunk), use_tqdm=False))]
        return out

    def counted(self, outputs: list) -> list:
        """`outputs` of vLLM, their prompt and prefix-cache tokens counted."""
        self.prompt_tokens += sum(len(o.prompt_token_ids) for o in outputs)
        self.cached_tokens += sum(o.num_cached_tokens or 0 for o in outputs)
        return outputs

    def computed_tokens(self) -> int:
        """Prompt tokens the engine computed so far: neither prefix-cache hits nor rows of
        prefixes the plugin shared (`model_executor/shared_prefix.py`)."""
        return self.prompt_tokens - self.cached_tokens - self.llm.apply_model(_shared_away)[0]

    def info(self) -> dict:
        config = self.llm.llm_engine.vllm_config
        return {
            "kv_cache_bytes": sum(
                figures["allocated_bytes"] for figures in self.llm.collective_rpc(kv_cache_figures)
            ),
            "prefix_caching": bool(config.cache_config.enable_prefix_caching),
            "chunked_prefill": bool(config.scheduler_config.enable_chunked_prefill),
            "max_num_batched_tokens": config.scheduler_config.max_num_batched_tokens,
            "model_classes": self.llm.apply_model(class_names)[0],
            "torch_threads": self.llm.collective_rpc(_torch_threads)[0],
        }


def _shared_away(model) -> int:
    """Tokens the plugin's model did not compute thanks to shared prefixes (0 elsewhere)."""
    sharing = getattr(model, "shared_prefixes", None)
    return 0 if sharing is None else sharing.stats.tokens - sharing.stats.computed_tokens


def _torch_threads(worker) -> int:
    import torch

    return torch.get_num_threads()


class HfSide:
    """transformers the sentence-transformers way: length-sorted, left-padded batches.

    Last-token pooling and L2 normalisation, as Qwen3-Embedding's model card does it;
    `use_cache=False` so no decoder cache is built for a single forward. Subclasses load
    another `auto_class` and override `_forward`.
    """

    auto_class = "AutoModel"

    def __init__(self, spec: dict):
        import torch
        import transformers

        if spec["device"] == "npu":
            import torch_npu  # noqa: F401 - registers the "npu" device with torch

        self.torch = torch
        self.device = spec["device"]
        self.max_length = spec["max_model_len"]
        self.tokenizer = transformers.AutoTokenizer.from_pretrained(
            spec["model"], padding_side="left"
        )
        model_class = getattr(transformers, self.auto_class)
        dtype = getattr(torch, spec["dtype"])
        self.model = model_class.from_pretrained(spec["model"], dtype=dtype)
        self.model = self.model.to(self.device).eval()

    def embed(self, texts: list[str], batch_size: int) -> list[list[float]]:
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out: list = [None] * len(texts)
        for chunk in chunks(order, batch_size):
            vectors = self._forward([texts[i] for i in chunk])
            for i, vector in zip(chunk, vectors, strict=True):
                out[i] = vector
        return out

    def _forward(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        batch = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length,
            return_tensors="pt",
        ).to(self.device)  # fmt: skip
        with torch.inference_mode():
            hidden = self.model(**batch, use_cache=False).last_hidden_state[:, -1]
            vectors = torch.nn.functional.normalize(hidden.float(), dim=-1)
        return vectors.cpu().tolist()

    def computed_tokens(self) -> None:
        return None  # every padded token: not counted

    def info(self) -> dict:
        return {
            "kv_cache_bytes": 0,
            "prefix_caching": False,
            "chunked_prefill": False,
            "max_num_batched_tokens": None,
            "model_classes": [type(self.model).__module__ + "." + type(self.model).__name__],
            "torch_threads": self.torch.get_num_threads(),
        }


def scenario_texts(maker: TextMaker, scenario: dict, count: int, seed: int) -> list[str]:
    if scenario.get("kind") == "model_card":
        return maker.model_card_queries(count, seed, scenario["min_words"],
                                        scenario["max_words"])  # fmt: skip
    if scenario["prefix_tokens"] > 0:
        task = maker.instruction(scenario["prefix_tokens"])
        return maker.queries(count, seed, task, scenario["max_tokens"])
    return maker.mixed(count, seed, scenario["min_tokens"], scenario["max_tokens"])


def warmup(side, maker: TextMaker, command: dict) -> dict:
    scenario = command["scenario"]
    texts = scenario_texts(maker, scenario, command["count"], pass_seed(scenario["name"], "warmup"))
    side.embed(texts, len(texts))
    return {"texts": len(texts)}


def timed_pass(side, maker: TextMaker, command: dict) -> dict:
    scenario, batch_size = command["scenario"], command["batch_size"]
    seed = pass_seed(scenario["name"], batch_size, command["repeat"])
    texts = scenario_texts(maker, scenario, scenario["texts_per_pass"], seed)
    tokens = maker.count_tokens(texts)
    return pass_record(command, lambda: side.embed(texts, batch_size), len(texts), tokens, side)


def pass_record(command: dict, run, count: int, tokens: int, side=None) -> dict:
    """Time `run()`, which must return `count` results, as the pass `command` asks for; with
    `side`, also the tokens it computed, and with the scenario's `keep_outputs` the results."""
    scenario, batch_size, repeat = command["scenario"], command["batch_size"], command["repeat"]
    before = side.computed_tokens() if side is not None else None
    start = time.perf_counter()
    results = run()
    seconds = time.perf_counter() - start
    if len(results) != count:
        raise RuntimeError(f"{count} inputs gave {len(results)} results")
    print(f"{scenario['name']} bs={batch_size} #{repeat}: {seconds:.2f} s", flush=True)
    record = {
        "scenario": scenario["name"], "batch_size": batch_size, "repeat": repeat,
        "texts": count, "tokens": tokens, "seconds": seconds, "load": os.getloadavg()[0],
    }  # fmt: skip
    if before is not None:
        record["computed_tokens"] = side.computed_tokens() - before
    if scenario.get("keep_outputs"):
        record["outputs"] = results
    return record


def check(side, maker: TextMaker, command: dict) -> dict:
    texts = maker.mixed(CHECK_TEXTS, pass_seed("check"), 8, 64)
    return {"check_embeddings": side.embed(texts, CHECK_TEXTS)}


COMMANDS = {"warmup": warmup, "pass": timed_pass, "check": check}


def serve(sides: dict, commands: dict) -> None:
    """Build the side of the spec in argv[1] (`sides[spec["kind"]](spec)`), answer one line,
    then serve `commands`."""
    spec = json.loads(sys.argv[1])
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # vLLM logs to stdout; keep that for replies only
    start = time.perf_counter()
    side = sides[spec["kind"]](spec)
    startup_seconds = time.perf_counter() - start
    maker = TextMaker(spec["model"])
    print(json.dumps({"startup_seconds": startup_seconds, **side.info()}), file=replies)
    for line in sys.stdin:
        command = json.loads(line)
        if command["op"] == "quit":
            break
        print(json.dumps(commands[command["op"]](side, maker, command)), file=replies)
    print(json.dumps({"peak_rss_gib": peak_rss_gib()}), file=replies)


if __name__ == "__main__":
    serve({"vllm": VllmSide, "hf": HfSide}, COMMANDS)
