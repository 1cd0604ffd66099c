"""`--task` on vLLM's own command lines (patches/vllm_task_flag.py): read as the --runner and
--convert flags vLLM 0.10 read it as, only on server command lines, and off with its switch.
The server started this way is tests/entrypoints/test_plain_vllm_serve.py's."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from vllm_npu_ext import serve_args
from vllm_npu_ext.patches.vllm_task_flag import translated

SERVER_PARSER = SimpleNamespace(_option_string_actions={"--runner": None, "--model": None})


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["m", "--task", "embed"], ["m", "--runner", "pooling", "--convert", "embed"]),
        (["m", "--task=classify", "-tp", "2"],
         ["m", "-tp", "2", "--runner", "pooling", "--convert", "classify"]),
        (["m", "--task", "score"], ["m", "--runner", "pooling"]),
        (["m", "--task", "generate"], ["m", "--runner", "generate"]),
        (["m", "--task", "auto"], ["m"]),
        (["m", "--task", "nonsense"], ["m", "--task", "nonsense"]),  # vLLM's own error
        (["m", "--runner", "pooling"], ["m", "--runner", "pooling"]),
        # the user's own --runner / --convert win over what the task would mean
        (["m", "--runner", "generate", "--task", "embed"],
         ["m", "--runner", "generate", "--convert", "embed"]),
        (["m", "--task", "embed", "--convert=classify"],
         ["m", "--convert=classify", "--runner", "pooling"]),
    ],
)  # fmt: skip
def test_task_is_replaced_on_server_command_lines(argv, expected, capsys):
    assert translated(SERVER_PARSER, argv) == expected
    notices = capsys.readouterr().err.splitlines()
    tasks = [a.split("=")[-1] for a in argv if a.startswith("--task=")]
    tasks += [argv[i + 1] for i, a in enumerate(argv) if a == "--task"]
    if tasks and tasks[0] in serve_args.TASKS:
        user_argv = [a for i, a in enumerate(argv) if not a.startswith("--task")
                     and (i == 0 or argv[i - 1] != "--task")]  # fmt: skip
        assert notices == [serve_args.task_notice(tasks[0], user_argv)]
        assert ("kept" in notices[0]) == any(a.startswith(("--runner", "--convert")) for a in argv)
    else:
        assert notices == []


def test_vllm_serve_subcommand_lines_are_translated_and_others_left_alone():
    top = SimpleNamespace(_option_string_actions={"--help": None})
    assert translated(top, ["serve", "m", "--task", "embed"])[-4:] == [
        "--runner", "pooling", "--convert", "embed"]
    assert translated(top, ["bench", "--task", "embed"]) == ["bench", "--task", "embed"]
    own = SimpleNamespace(_option_string_actions={"--runner": None, "--task": None})
    assert translated(own, ["--task", "embed"]) == ["--task", "embed"]


PARSE = """
import sys
from vllm_npu_ext import compat
args = compat.server_parser().parse_args(["m", "--task", "embed"])
print("PARSED", args.runner, args.convert)
"""


@pytest.mark.parametrize("switch", ["1", "0"])
def test_vllms_own_parser_reads_task_with_the_plugin_installed(switch, monkeypatch):
    """vLLM loads plugins before it builds its server parser: the patch is in place when
    vLLM parses (`VLLM_NPU_EXT_TASK_FLAG_PATCH=0`: vLLM's own refusal)."""
    monkeypatch.setenv("VLLM_NPU_EXT_TASK_FLAG_PATCH", switch)
    done = subprocess.run([sys.executable, "-c", PARSE], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    if switch == "1":
        assert done.returncode == 0, done.stderr[-2000:]
        assert "PARSED pooling embed" in done.stdout
        assert serve_args.task_notice("embed") in done.stderr
    else:
        assert done.returncode == 2 and "unrecognized arguments: --task embed" in done.stderr
