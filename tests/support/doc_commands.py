"""Running the commands of documented blocks: for real, against a recording stand-in, or checked.

- `run_shell` / `run_python`: a block for real, in a scratch directory, with this stack's console
  scripts on PATH and a new shell's environment (no VLLM_NPU_EXT_*, ASCEND_*, LD_LIBRARY_PATH).
- `record_commands`: a dry-run block under bash with a PATH of recording stand-ins only: every
  command it would run is recorded and nothing runs, except `vllm-npu-ext reranker-template`,
  whose output other commands take; a command with no stand-in is "command not found".
- `command_problem`: what is wrong with one recorded command, checked its own way. The checks
  that need a child process (vLLM's parser, a script's --help, pytest's collection) run first,
  for all blocks at once, in one child (`child_checks`, tests/support/doc_child.py).
- `console_problem`: run a `$ `-prompted transcript and compare its output.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

from support.doc_blocks import ROOT

BIN = Path(sys.executable).parent
TIMEOUT_S = 300
RECORD_SEPARATOR = "\x1e"
# Commands a dry-run block may run; each has a check in `command_problem`.
RECORDED = ("vllm-npu-ext", "vllm", "make", "pip", "python", "python3", "pytest", "tee")
RECORDED_PYTHONS = (".venv/bin/python", ".venv-ascend/bin/python")
PYTHONS = ("python", "python3")
PLACEHOLDER = "/path/to/"  # a reader's own checkpoint in a documented command
CANN_SET_ENV = "/usr/local/Ascend/ascend-toolkit/set_env.sh"
OUR_SET_ENV = re.compile(r"(^|/)vllm_npu_ext/cann_ops/_opp/vendors/vllm_npu_ext/bin/set_env\.bash$")
# `source` is a builtin: a shell function records it instead.
SOURCE_RECORDER = 'source() { printf "%s\\0" source "$@" $\'\\x1e\' >> "$DOC_CALLS"; }\n'
SHIM = """#!/bin/bash
printf '%s\\0' "${0##*/}" "$@" $'\\x1e' >> "$DOC_CALLS"
if [ "${0##*/}" = vllm-npu-ext ] && [ "$1" = reranker-template ]; then
  PATH="$DOC_REAL_PATH" exec "$DOC_REAL_BIN/vllm-npu-ext" "$@"
fi
"""


def fresh_environment(scratch: Path) -> dict[str, str]:
    """What a user's new shell has: our console scripts first, none of our or CANN's variables,
    caches in the scratch directory."""
    drop = ("VLLM_NPU_EXT_", "ASCEND_", "LD_LIBRARY_PATH", "MAKEFLAGS", "MFLAGS", "MAKELEVEL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    env["XDG_CACHE_HOME"] = str(scratch / "cache")
    return env


def _run(argv: list[str], scratch: Path, **kwargs) -> subprocess.CompletedProcess:
    kwargs.setdefault("env", fresh_environment(scratch))
    return subprocess.run(argv, cwd=kwargs.pop("cwd", scratch), capture_output=True, text=True,
                          timeout=TIMEOUT_S, **kwargs)  # fmt: skip


def run_shell(text: str, scratch: Path) -> subprocess.CompletedProcess:
    return _run(["/bin/bash", "-eo", "pipefail", "-c", text], scratch)


def run_python(text: str, scratch: Path) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-c", text], scratch)


def failure(result: subprocess.CompletedProcess, what: str) -> str:
    return (f"{what} exited with {result.returncode}\n"
            f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")  # fmt: skip


def syntax_problem(text: str) -> str | None:
    result = subprocess.run(["/bin/bash", "-n", "-c", text], capture_output=True, text=True)
    if result.returncode == 0:
        return None
    return result.stderr.strip() or f"bash -n exited {result.returncode}"


def _write_shims(scratch: Path) -> Path:
    shims = scratch / "shims"
    shims.mkdir()
    for name in RECORDED:
        (shims / name).write_text(SHIM)
        (shims / name).chmod(0o755)
    for python in RECORDED_PYTHONS:  # `.venv/bin/python X`, as from the repository root
        (scratch / python).parent.mkdir(parents=True)
        (scratch / python).symlink_to(shims / "python")
    return shims


def record_commands(text: str, scratch: Path) -> tuple[list[list[str]], str]:
    """(every command the block would run, as argv, in order; what bash wrote to stderr)."""
    shims = _write_shims(scratch)
    calls = scratch / "calls"
    calls.touch()
    env = fresh_environment(scratch)
    env.update(PATH=str(shims), DOC_CALLS=str(calls), DOC_REAL_BIN=str(BIN),
               DOC_REAL_PATH=fresh_environment(scratch)["PATH"])  # fmt: skip
    result = _run(["/bin/bash", "-c", SOURCE_RECORDER + text], scratch, env=env)
    commands, current = [], []
    for field in calls.read_text().split("\0")[:-1]:
        if field == RECORD_SEPARATOR:
            commands.append(current)
            current = []
        else:
            current.append(field)
    return commands, result.stderr


# --- the checks done in one child process ----------------------------------------------------


def job_key(job: dict) -> str:
    return json.dumps(job, sort_keys=True)


def child_job(argv: list[str]) -> dict | None:
    """The child-process check one command needs, if any."""
    name, args = argv[0], argv[1:]
    if argv[:2] in (["vllm-npu-ext", "serve"], ["vllm", "serve"]):
        return {"kind": "serve", "argv": argv}
    if name in PYTHONS and args[:2] == ["-m", "pytest"]:
        return {"kind": "collect", "args": args[2:]}
    if name == "pytest":
        return {"kind": "collect", "args": args}
    if name in PYTHONS and args and args[0].endswith(".py") and (ROOT / args[0]).is_file():
        return {"kind": "help", "script": args[0]}
    return None


def child_checks(jobs: list[dict], scratch: Path) -> dict[str, dict]:
    """{job_key: {"problem": str | None, "output": str}}, from one child process."""
    unique = list({job_key(job): job for job in jobs}.values())
    out = scratch / "child_checks.json"
    code = ("import sys; sys.path.insert(0, sys.argv[1]); "
            "from support.doc_child import main; main(sys.argv[2])")  # fmt: skip
    env = fresh_environment(scratch)
    env["VLLM_PLUGINS"] = ""  # parse and collect only: no plugin needs to load in the child
    result = _run([sys.executable, "-c", code, str(ROOT / "tests"), str(out)], scratch,
                  env=env, cwd=ROOT, input=json.dumps(unique))  # fmt: skip
    if result.returncode or not out.exists():
        raise AssertionError(failure(result, "the child process of the dry-run checks"))
    return json.loads(out.read_text())


# --- checks of single commands ---------------------------------------------------------------


def command_problem(argv: list[str], scratch: Path, checked: dict) -> str | None:
    """What is wrong with one recorded command (None: nothing). `checked`: `child_checks`."""
    argv = with_placeholders(argv, scratch)
    job = child_job(argv)
    if job is not None:
        return _child_problem(job, argv, checked[job_key(job)])
    name, args = argv[0], argv[1:]
    checks = {"vllm-npu-ext": _cli_problem, "make": _make_problem, "pip": _pip_problem,
              "source": _source_problem, "tee": lambda args, scratch: None}  # fmt: skip
    if name not in checks:
        return f"no dry-run check for `{' '.join(argv[:2])}`"
    return checks[name](args, scratch)


def _child_problem(job: dict, argv: list[str], result: dict) -> str | None:
    if result["problem"] or job["kind"] != "help":
        return result["problem"]
    flags = [a.split("=")[0] for a in argv[2:] if a.startswith("--")]
    text = result["output"]
    unknown = [f for f in flags if not re.search(rf"(?<![\w-]){re.escape(f)}(?![\w-])", text)]
    return f"{job['script']} takes no {unknown} (see its --help)" if unknown else None


def with_placeholders(argv: list[str], scratch: Path) -> list[str]:
    """`argv` with each `/path/to/NAME` argument an existing directory with a config.json
    (commands check paths); what `command_problem` checks, and so the child jobs to run."""
    result = argv[:1]
    for arg in argv[1:]:
        if arg.startswith(PLACEHOLDER):
            directory = scratch / "placeholders" / arg.removeprefix(PLACEHOLDER)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "config.json").write_text("{}")
            arg = str(directory)
        result.append(arg)
    return result


def _cli_problem(args: list[str], scratch: Path) -> str | None:
    command = args[0] if args else ""
    if command == "build-ops":
        return _in_process("vllm_npu_ext.cann_ops.build_ops", "main", [*args[1:], "--dry-run"])
    if command == "selfcheck":
        return _in_process("vllm_npu_ext.selfcheck", "_parse", args[1:])
    if command in ("doctor", "reranker-template", "make-tiny-model"):
        result = _run([str(BIN / "vllm-npu-ext"), *args], scratch)
        allowed = (0, 1) if command == "doctor" else (0,)  # doctor: 1 = problems found
        return None if result.returncode in allowed else failure(result, "vllm-npu-ext " + command)
    return f"no dry-run check for `vllm-npu-ext {command}`"


def _in_process(module: str, function: str, args: list[str]) -> str | None:
    """Call module.function(args) with output captured; a SystemExit or non-zero result fails."""
    import importlib

    target = getattr(importlib.import_module(module), function)
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            result = target(args)
    except SystemExit as error:
        return f"{module}.{function}({args}) exited {error.code}: {last_line(stderr.getvalue())}"
    if isinstance(result, int) and result != 0:
        return f"{module}.{function}({args}) returned {result}:\n{stderr.getvalue()}"
    return None


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@functools.cache
def make_database() -> str:
    """make's database of the Makefile as written: no variable of this process's environment
    but PATH (so `?=` defaults show, not a caller's override), printed for a target that does
    not exist, so nothing is run, not even a recipe that calls $(MAKE)."""
    result = subprocess.run(["make", "-pRrq", "-f", "Makefile", "__no_such_target__"], cwd=ROOT,
                            env={"PATH": os.environ.get("PATH", "")}, capture_output=True,
                            text=True, timeout=60)  # fmt: skip
    return result.stdout


def make_targets() -> frozenset[str]:
    """The Makefile's targets, from make's database."""
    return frozenset(re.findall(r"^([A-Za-z0-9][\w.-]*):(?!=)", make_database(), flags=re.M))


def _make_problem(args: list[str], scratch: Path) -> str | None:
    targets = [a for a in args if not a.startswith("-") and "=" not in a]
    missing = [t for t in targets or [""] if t not in make_targets()]
    return f"make: no target {missing} in the Makefile" if missing else None


def _pip_problem(args: list[str], scratch: Path) -> str | None:
    if args[:1] != ["install"]:
        return f"no dry-run check for `pip {' '.join(args[:1])}`"
    from pip._internal.commands import create_command

    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            _, positional = create_command("install").parse_args(args[1:])
    except SystemExit:
        return f"pip install {' '.join(args[1:])}: {last_line(stderr.getvalue())}"
    if "." in positional and not (ROOT / "setup.py").is_file():
        return "pip install .: the repository root has no setup.py"
    return None


def _source_problem(args: list[str], scratch: Path) -> str | None:
    path = args[0] if args else ""
    if path == CANN_SET_ENV or OUR_SET_ENV.search(path):
        return None
    return f"source {path}: only CANN's {CANN_SET_ENV} or our operator's set_env.bash"


# --- console transcripts ---------------------------------------------------------------------


def console_problem(text: str, scratch: Path, tmp_stands_for: str | None) -> str | None:
    """Run the `$ ` lines of a console block in one shell; each command's stdout must match the
    lines below it (`...` matches anything). `tmp_stands_for` is replaced by a new directory."""
    if tmp_stands_for:
        text = text.replace(tmp_stands_for, str(scratch / "tmp"))
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            return f"a console block starts with a `$ ` command, not {line!r}"
    separator = "\x1f"
    script = "".join(f"{command}\n__status=$?; printf '{separator}\\n'; (exit $__status)\n"
                     for command, _ in steps)  # fmt: skip
    result = _run(["/bin/bash", "-c", script], scratch)
    outputs = result.stdout.split(separator + "\n")
    for (command, expected), actual in zip(steps, outputs, strict=False):
        problem = _output_mismatch(expected, actual.splitlines())
        if problem:
            return f"$ {command}\n{problem}\nstderr:\n{result.stderr}"
    return None


def _output_mismatch(expected: list[str], actual: list[str]) -> str | None:
    if len(expected) != len(actual):
        return f"expected {len(expected)} lines, got {len(actual)}:\n" + "\n".join(actual)
    for want, got in zip(expected, actual, strict=True):
        pattern = ".*".join(re.escape(part) for part in want.split("..."))
        if not re.fullmatch(pattern, got):
            return f"expected: {want}\n     got: {got}"
    return None
