"""`--task` on vLLM's server command lines (`vllm serve MODEL --task embed`).

vLLM removed `--task` (0.11; "unrecognized arguments: --task" on 0.23 and 0.32) in favour of
`--runner pooling --convert embed|classify|reward`, while vllm-ascend's older tutorials and
scripts still pass it. vLLM parses the command line after it has loaded the general plugins
(both `vllm serve`, `vllm/entrypoints/cli/main.py`, and `python -m
vllm.entrypoints.openai.api_server`: importing the server's argument module loads them), so
this patch, applied at `register()`, sees every server command line: it wraps
`FlexibleArgumentParser.parse_args` to replace `--task X` (any spelling vLLM accepts for an
option: `--task=X`, `--task X`) by the flags vLLM 0.10 read it as
(`task_arguments`) and says so on one line, for `serve` command lines and for
parsers that have `--runner` and no `--task` of their own. Other command lines are untouched.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence

_WRAPPED = "_vllm_npu_ext_task_flag"
# `--task` as vLLM read it before 0.11 (ModelConfig's `_task_to_convert`): the runner and
# convert it meant. "score" left the convert to the architecture (classify for a
# *ForSequenceClassification, else embed), which vLLM's `--convert auto` still does.
TASKS: dict[str, list[str]] = {
    "embed": ["--runner", "pooling", "--convert", "embed"],
    "embedding": ["--runner", "pooling", "--convert", "embed"],
    "classify": ["--runner", "pooling", "--convert", "classify"],
    "score": ["--runner", "pooling"],
    "reward": ["--runner", "pooling", "--convert", "reward"],
    "generate": ["--runner", "generate"],
    "auto": [],
}


def option_name(token: str) -> str | None:
    """The long option a token names as vLLM reads it (`--flag_name=v` -> `--flag-name`,
    `--flag.key` -> `--flag`), or None for anything else."""
    if not token.startswith("--") or token == "--":
        return None
    key = token[2:].split("=", 1)[0].split(".", 1)[0]
    return "--" + key.replace("_", "-")


def task_arguments(task: str, argv: Sequence[str] = ()) -> list[str]:
    """vLLM's flags for a `--task` value (`TASKS`), less those `argv` sets itself: a user's
    own `--runner` or `--convert` wins over what the task would mean."""
    flags = TASKS[task]
    user_options = {option_name(token) for token in argv}
    return [token for flag, value in zip(flags[::2], flags[1::2], strict=True)
            if flag not in user_options for token in (flag, value)]  # fmt: skip


def task_notice(task: str, argv: Sequence[str] = ()) -> str:
    """The one line that says how `--task` was read (given the rest of the command line)."""
    replacement = " ".join(task_arguments(task, argv)) or "nothing (vLLM's defaults)"
    kept = [flag for flag in TASKS[task][::2] if flag in {option_name(t) for t in argv}]
    note = f" (your own {' and '.join(kept)} kept)" if kept else ""
    return f"vllm-npu-ext: --task {task} is no longer a vLLM option; read as {replacement}{note}"


def install() -> str:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    original = FlexibleArgumentParser.parse_args
    if getattr(original, _WRAPPED, False):
        return "vllm serve --task: read as --runner/--convert"

    @functools.wraps(original)
    def parse_args(self, args=None, namespace=None):
        argv = sys.argv[1:] if args is None else list(args)
        return original(self, translated(self, argv), namespace)

    setattr(parse_args, _WRAPPED, True)
    FlexibleArgumentParser.parse_args = parse_args
    return "vllm serve --task: read as --runner/--convert"


def uninstall() -> None:
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    current = FlexibleArgumentParser.parse_args
    if getattr(current, _WRAPPED, False):
        FlexibleArgumentParser.parse_args = current.__wrapped__


def translated(parser, argv: list[str]) -> list[str]:
    """`argv` with `--task X` replaced, where the command line is a server's."""
    is_serve = argv[:1] == ["serve"]
    options = getattr(parser, "_option_string_actions", {})
    if not is_serve and ("--runner" not in options or "--task" in options):
        return argv
    out, i, tasks = [], 0, []
    while i < len(argv):
        token = argv[i]
        if option_name(token) == "--task" and "." not in token:
            if "=" in token:
                tasks.append(token.split("=", 1)[1])
            elif i + 1 < len(argv):
                tasks.append(argv[i + 1])
                i += 1
            else:
                out.append(token)  # no value: vLLM's own error
        else:
            out.append(token)
        i += 1
    if any(task not in TASKS for task in tasks):
        return argv  # vLLM's "unrecognized arguments" then names it
    user_argv = list(out)
    for task in tasks:
        out += task_arguments(task, user_argv)
        print(task_notice(task, user_argv), file=sys.stderr, flush=True)
    return out
