"""What the CP decode engine tests share: the checkpoint and prompts, the engine runs and
servers, and the comparison of a CP generation with its baseline.

Forced tokens. Every run decodes the same tokens: each generated token is `forced_token`
(vLLM's `allowed_token_ids`; vLLM 0.23's sampler takes the raw logprobs it returns before it
applies the mask, `Sampler.forward`, so they are the model's). A free-running greedy
comparison can only follow a request while the two runs pick the same tokens, and where a
step's top two are within rounding of each other the choice depends on the CPU's kernels
(seen: 66 steps comparable on an AVX512 EPYC, 58 on an AMX Xeon, from the same run). Forced,
every step of every request is compared on every machine, and the greedy choice is checked
where it is determined: the run's top-1 must be the baseline's wherever the baseline's margin
is clear (below).

The comparison's bound. Logits are bf16 (vLLM computes them in the model dtype; logprobs are
the float32 log-softmax of those), so a logit z moves in whole bf16 steps of 2^(e-7) for
|z| in [2^e, 2^(e+1)); the largest logit L of a run fixes the coarsest step, ulp(L). A CP
decode step differs from the non-CP one by bf16 roundings of the attention output (each
rank's partial rounded to bf16 before the fp32 merge, within 2^-8 of the output: the layer
test's bound; with PCP the prefill's attention is merged from chunks as well), and graph
mode by its fused kernels' roundings. The tests require that this moves every logit by at
most `LOGIT_STEPS` (2) steps of ulp(L). Then a token's logprob `z_t - logsumexp(z)` moves by
|dz_t - sum_j p_j dz_j| <= 2 x 2 ulp(L), and two tokens whose logits differ by more than that
in the baseline cannot swap: a step is "clear" when the baseline's top-1 minus top-2 logprob
exceeds the bound. At every step the forced token's logprob must be within the bound of the
baseline's (a NaN is outside it), and at every clear step the two runs' top-1 must agree.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
import subprocess
import sys
from pathlib import Path

from support.server import DIE_WITH_PARENT
from support.vllm_ascend_env import TESTS, subprocess_env

MAX_TOKENS = 12
# Unequal, in the thousands: per-request key counts differ. The second shares the first's
# first `SHARED_PREFIX` tokens (a prefix-cache hit: a multiple of the block size times
# dcp x pcp, vLLM's hash block under CP); the first is longer than three chunks of
# `CHUNK_BUDGET`, the token budget of the engines at vLLM's defaults.
PROMPT_TOKENS = (3100, 2400, 2000)
SHARED_PREFIX = 2048
CHUNK_BUDGET = 512
MAX_MODEL_LEN = 4096
WORKER = TESTS / "support" / "cp_generation_worker.py"
WORKER_EXTENSION = "support.cp_worker_extension.CPProbe"
# What the servers get besides the checkpoint and their parallel sizes: only what the tests
# need. Our worker extension's probes, read through vLLM's dev-mode /collective_rpc (dev mode
# also logs every 4xx with a traceback, which the bad-request test looks for) and a chat
# template (the tiny tokenizer has none).
SERVER_TEST_FLAGS = ["--worker-extension-cls", WORKER_EXTENSION, "--no-log-error-stack"]
# The stand-in's NPUs share this host's RAM: each rank gets 1 GiB of device memory, of which
# vLLM's default --gpu-memory-utilization sizes the KV cache.
SERVER_DEVICE_MIB = "1024"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['role'] }}: {{ message['content'] }}\n"
    "{% endfor %}assistant:"
)
_WORDS = (
    "context", "parallel", "decode", "prefill", "attention", "kernel", "device", "memory",
    "cache", "tensor", "rank", "shard", "merge", "block", "table", "slot", "query", "key",
    "value", "layer", "norm", "token",
)  # fmt: skip


def prompt_text(words: int, seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(_WORDS) for _ in range(words))


def prompts(model_dir: Path) -> list[list[int]]:
    """Token ids of `PROMPT_TOKENS` lengths, from the checkpoint's own tokenizer; the second
    starts with the first's `SHARED_PREFIX` tokens."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    token_ids = [tokenizer.encode(prompt_text(2 * length, seed), add_special_tokens=False)
                 .ids[:length] for seed, length in enumerate(PROMPT_TOKENS)]  # fmt: skip
    token_ids[1][:SHARED_PREFIX] = token_ids[0][:SHARED_PREFIX]
    assert [len(ids) for ids in token_ids] == list(PROMPT_TOKENS)
    return token_ids


def forced_token(token_ids: list[list[int]]) -> int:
    """The token every CP test run generates at every step: the first prompt's first."""
    return token_ids[0][0]


def start_engine(name: str, model_dir: Path, root: Path, token_ids, engine_args: dict,
                 *flags: str, **env: str) -> tuple[subprocess.Popen, Path, Path]:  # fmt: skip
    """`cp_generation_worker.py` in its own process, generating `forced_token`; (process,
    results file, log). Give
    processes that start together different `VLLM_PORT`s: vLLM picks its distributed ports
    as free ephemeral ones, and two engines starting at once took the same one (EADDRINUSE)."""
    out, log = root / f"{name}.json", root / f"{name}.log"
    with open(log, "wb") as output:  # the child keeps its own descriptor
        process = subprocess.Popen(
            [sys.executable, str(WORKER), "--model", str(model_dir), "--out", str(out),
             "--prompts", json.dumps(token_ids), "--max-tokens", str(MAX_TOKENS),
             "--engine-args", json.dumps(engine_args),
             "--force-token", str(forced_token(token_ids)), *flags],
            env=subprocess_env(**env), stdout=output, stderr=subprocess.STDOUT,
            preexec_fn=DIE_WITH_PARENT,
        )  # fmt: skip
    return process, out, log


LOGIT_STEPS = 2  # bf16 steps of the largest logit each logit may move (module docstring)


def logit_step(largest_logit: float) -> float:
    """The bf16 spacing of logits as large as `largest_logit` (module docstring)."""
    return 2.0 ** (math.floor(math.log2(largest_logit)) - 7)


@dataclasses.dataclass
class Comparison:
    """A CP run against its baseline, both forced to the same tokens (module docstring)."""

    bound: float  # 2 x LOGIT_STEPS x ulp(L)
    compared: int = 0  # steps compared: every step of every request
    clear: int = 0  # of which the baseline's margin was clear
    unequal_tokens: list = dataclasses.field(default_factory=list)  # requests not forced alike
    unequal_clear: list = dataclasses.field(default_factory=list)  # (request, step): top-1s
    worst_logprob: float = 0.0
    over_bound: list = dataclasses.field(default_factory=list)  # (request, step, difference)

    @property
    def agrees(self) -> bool:
        return not (self.unequal_tokens or self.unequal_clear or self.over_bound)


def compare(run: dict, baseline: dict, largest_logit: float) -> Comparison:
    """`run` and `baseline`: {"tokens": [[id]], "logprobs": [[{"logprob", "top"}]]}, generated
    with the same forced tokens."""
    result = Comparison(bound=2 * LOGIT_STEPS * logit_step(largest_logit))
    for request, (tokens, base_tokens) in enumerate(zip(run["tokens"], baseline["tokens"],
                                                        strict=True)):  # fmt: skip
        if tokens != base_tokens:
            result.unequal_tokens.append(request)
            continue
        steps = zip(run["logprobs"][request], baseline["logprobs"][request], strict=True)
        for step, (mine, base) in enumerate(steps):
            clear = base["top"][0][1] - base["top"][1][1] > result.bound
            result.compared += 1
            result.clear += clear
            if clear and mine["top"][0][0] != base["top"][0][0]:
                result.unequal_clear.append((request, step))
            difference = abs(mine["logprob"] - base["logprob"])
            if not difference <= result.bound:  # NaN included
                result.over_bound.append((request, step, difference))
            elif difference > result.worst_logprob:
                result.worst_logprob = difference
    return result


def largest_logit(*workers_lists) -> float:
    """The largest |logit| any worker of the given runs computed (`cp_worker_extension`)."""
    return max(worker.get("largest |logit|", 0.0) for workers in workers_lists
               for worker in workers)  # fmt: skip


def _token_id(text: str) -> int:
    return int(text.split(":", 1)[1])  # "token_id:123" (`return_tokens_as_token_ids`)


def from_chat(choice: dict) -> dict:
    """A chat completion's choice (`logprobs`, `top_logprobs: 2`,
    `return_tokens_as_token_ids`) as a one-request run of the engine worker's."""
    steps = choice["logprobs"]["content"]
    return {"tokens": [[_token_id(step["token"]) for step in steps]],
            "logprobs": [[{"logprob": step["logprob"],
                           "top": [[_token_id(top["token"]), top["logprob"]]
                                   for top in step["top_logprobs"][:2]]}
                          for step in steps]]}  # fmt: skip


def from_completion(choices: list[dict]) -> dict:
    """An OpenAI completions response's choices (`logprobs: 2`,
    `return_tokens_as_token_ids`) as the engine worker's run."""
    tokens, logprobs = [], []
    for choice in sorted(choices, key=lambda c: c["index"]):
        data = choice["logprobs"]
        tokens.append([_token_id(t) for t in data["tokens"]])
        logprobs.append([
            {"logprob": chosen, "top": sorted(([_token_id(t), lp] for t, lp in top.items()),
                                              key=lambda item: -item[1])[:2]}
            for chosen, top in zip(data["token_logprobs"], data["top_logprobs"], strict=True)
        ])  # fmt: skip
    return {"tokens": tokens, "logprobs": logprobs}
