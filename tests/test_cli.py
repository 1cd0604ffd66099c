"""`vllm-npu-ext` command lines (without starting servers)."""

from __future__ import annotations

import json
import subprocess
import sys

from vllm_npu_ext import cli


def test_serve_defaults_to_pooling_embed_and_validation(tmp_path):
    command = cli.serve_command([str(tmp_path), "--port", "9"])
    assert command[1:4] == ["-m", cli.SERVER_MODULE, "--model"]
    assert command[4] == str(tmp_path)
    joined = " ".join(command)
    assert "--runner pooling" in joined and "--convert embed" in joined
    for middleware in cli.MIDDLEWARES:
        assert f"--middleware {middleware}" in joined
    assert json.loads(command[command.index("--hf-overrides") + 1]) == {"is_matryoshka": True}


def test_serve_adds_its_middleware_after_the_users(tmp_path):
    command = cli.serve_command([str(tmp_path), "--middleware", "my.Middleware"])
    values = [command[i + 1] for i, arg in enumerate(command) if arg == "--middleware"]
    assert values == ["my.Middleware", *cli.MIDDLEWARES]
    again = cli.serve_command([str(tmp_path), "--middleware", cli.MIDDLEWARES[1]])
    assert again.count(cli.MIDDLEWARES[1]) == 1


def test_serve_keeps_user_choices(tmp_path):
    command = cli.serve_command(
        ["--model", str(tmp_path), "--runner", "generate", "--gpu-memory-utilization=0.2"]
    )
    assert command.count("--runner") == 1 and "generate" in command
    assert "--hf-overrides" not in command
    assert "--gpu-memory-utilization=0.2" in command
    assert "--gpu-memory-utilization" not in command


def test_serve_without_model_uses_the_built_in_tiny_model(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    command = cli.serve_command([])
    model_dir = tmp_path / "vllm_npu_ext" / "tiny-qwen3"
    assert command[command.index("--model") + 1] == str(model_dir)
    assert command[command.index("--served-model-name") + 1] == "tiny-qwen3"
    assert (model_dir / "model.safetensors").exists()


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


def test_small_cpu_machine_binds_every_core_for_one_rank(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_OMP_THREADS_BIND", raising=False)
    monkeypatch.setattr(cli, "_on_cpu", lambda: True)
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: {0, 1})
    assert cli.cpu_thread_binding(["x", "--model", "m"]) == "0,1"
    assert cli.cpu_thread_binding(["x", "--tensor-parallel-size", "2"]) is None
    monkeypatch.setattr(cli.os, "sched_getaffinity", lambda pid: set(range(16)))
    assert cli.cpu_thread_binding(["x"]) is None
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0")
    assert cli.cpu_thread_binding(["x"]) is None
