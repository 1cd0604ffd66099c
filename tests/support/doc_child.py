"""The dry-run checks that need a process of their own, all in one (tests/test_docs.py).

Jobs arrive as JSON on stdin (`doc_commands.child_job`); results go to the file named by the
caller as {job key: {"problem": str | None, "output": str}}:

- `serve`: a documented `vllm-npu-ext serve ...` (read by `vllm_npu_ext.serve_args.resolve`
  with vLLM's parser, our defaults set) or `vllm serve ...`, parsed by vLLM's own server
  argument parser and `validate_parsed_serve_args`, without starting anything. Its own
  process because importing vLLM's server arguments loads vLLM's plugins and settles global
  state the suite depends on.
- `help`: a repository script's `--help`, run in this process (`runpy`), for its flags.
- `collect`: `pytest --collect-only` with the documented arguments.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import sys
from pathlib import Path
from unittest import mock

from support.doc_blocks import ROOT
from support.doc_commands import job_key, last_line

PLACEHOLDER_MODEL = "/nonexistent/tiny-model"  # what `serve` without a model would build


def vllm_server_parser():
    """vLLM's `vllm serve` parser and argument check (0.32: entrypoints.launchers, 0.23: openai)."""
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:
        from vllm.entrypoints.launchers import cli_args
    except ImportError:
        from vllm.entrypoints.openai import cli_args
    from vllm_npu_ext.patches import vllm_task_flag

    # The child loads no plugin (VLLM_PLUGINS=""); documented `vllm serve` lines assume ours
    # is installed, which reads `--task` in vLLM's parser (patches/vllm_task_flag.py).
    vllm_task_flag.install()
    parser = cli_args.make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
    return parser, cli_args.validate_parsed_serve_args


def serve_problem(parser, validate, argv: list[str]) -> str | None:
    """Why vLLM's parser and argument check refuse a documented command line, or None:
    `vllm serve ...` as given, `vllm-npu-ext serve ...` as `serve_args.resolve` reads it (with
    vLLM's parser) and sets our defaults in the namespace."""
    from vllm_npu_ext import serve_args

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            if argv[0] == "vllm":
                args = parser.parse_args(argv[2:])
            else:
                args = serve_args.resolve(argv[2:], default_model=PLACEHOLDER_MODEL).args
            validate(args)
    except SystemExit as error:
        return f"{' '.join(argv)}: exit {error.code}: {last_line(stderr.getvalue()) or error}"
    except (ValueError, TypeError) as error:
        return f"{' '.join(argv)}: {type(error).__name__}: {error}"
    return None


def in_process(function, argv: list[str]) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of function() run with sys.argv = argv."""
    stdout, stderr = io.StringIO(), io.StringIO()
    code = 0
    with mock.patch.object(sys, "argv", argv):
        try:
            with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
                code = function() or 0
        except SystemExit as error:
            code = error.code if isinstance(error.code, int) else 1
    return code, stdout.getvalue(), stderr.getvalue()


def script_help(script: str) -> dict:
    path = str(ROOT / script)

    def run_as_main() -> int:
        runpy.run_path(path, run_name="__main__")
        return 0

    code, out, err = in_process(run_as_main, [path, "--help"])
    problem = None if code == 0 else f"{script} --help exited {code}: {last_line(err)}"
    return {"problem": problem, "output": out}


def collection(args: list[str]) -> dict:
    import pytest

    argv = ["--collect-only", "-q", "-p", "no:cacheprovider", *args]
    code, out, err = in_process(lambda: int(pytest.main(argv)), ["pytest", *argv])
    problem = f"pytest {' '.join(args)}: collection exited {code}\n{out}{err}"
    return {"problem": None if code == 0 else problem, "output": ""}


def main(result_path: str) -> None:
    jobs = json.loads(sys.stdin.read())
    results = {}
    serve_jobs = [job for job in jobs if job["kind"] == "serve"]
    if serve_jobs:
        parser, validate = vllm_server_parser()
        for job in serve_jobs:
            results[job_key(job)] = {"problem": serve_problem(parser, validate, job["argv"]),
                                     "output": ""}  # fmt: skip
    for job in jobs:
        if job["kind"] == "help":
            results[job_key(job)] = script_help(job["script"])
        elif job["kind"] == "collect":
            results[job_key(job)] = collection(job["args"])
    Path(result_path).write_text(json.dumps(results))
