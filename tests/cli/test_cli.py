"""`vllm-npu-ext` command lines (without starting servers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from vllm_npu_ext import cli


def test_serve_runs_our_server_module_on_the_arguments_as_given():
    """`serve` execs `python -m vllm_npu_ext.server ARGS`; what ARGS mean is
    tests/cli/test_serve_args.py's."""
    args = ["m", "--hf_overrides={}", "--reranker"]
    assert cli.serve_command(args) == [sys.executable, "-m", "vllm_npu_ext.server", *args]


def test_make_tiny_model_command(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "vllm_npu_ext.cli", "make-tiny-model", str(tmp_path / "m")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "m" / "config.json").read_text())["architectures"] == [
        "Qwen3ForCausalLM"
    ]


def test_unknown_command_exits_2(capsys):
    assert cli.main(["nonsense"]) == 2
    assert "usage: vllm-npu-ext" in capsys.readouterr().err
    assert cli.main(["--help"]) == 0


def test_reranker_template_command_prints_the_path(tmp_path, capsys, monkeypatch):
    from vllm_npu_ext import reranker

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.main(["reranker-template"]) == 0
    assert capsys.readouterr().out.strip() == str(reranker.TEMPLATE_PATH)
    assert cli.main(["reranker-template", "--instruction", "Find code"]) == 0
    path = capsys.readouterr().out.strip()
    assert path.startswith(str(tmp_path)) and "Find code" in Path(path).read_text(encoding="utf-8")
