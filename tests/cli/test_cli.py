"""`vllm-npu-ext` command lines (without starting servers)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_a_headless_node_runs_vllms_serve_subcommand_with_the_same_defaults(tmp_path):
    """vLLM's api_server module would ignore --headless and start an API server."""
    args = [str(tmp_path), "--headless", "--data-parallel-start-rank", "1"]
    command = cli.serve_command(args)
    assert command[1:4] == ["-m", cli.HEADLESS_MODULE, "--model"]
    with_api_server = cli.serve_command([args[0], *args[2:]])
    assert with_api_server[2] == cli.SERVER_MODULE
    assert [arg for arg in command[3:] if arg != "--headless"] == with_api_server[3:]


def test_the_headless_module_refuses_a_node_with_an_api_server():
    from vllm_npu_ext import headless

    with pytest.raises(SystemExit, match="--headless is missing"):
        headless.main(["--model", "m"])


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
    assert "--hf-overrides" not in command and "--convert" not in command
    assert "--gpu-memory-utilization=0.2" in command
    assert "--gpu-memory-utilization" not in command


@pytest.mark.parametrize("cp", [["-tp", "2", "-dcp", "2"], ["--decode-context-parallel-size=2"],
                                ["-pcp", "2"], ["--prefill-context-parallel-size", "2"]])
def test_serve_with_context_parallelism_generates(tmp_path, cp):
    """CP is for decoding: `serve CKPT -tp 2 -dcp 2` serves generation, with nothing else."""
    command = cli.serve_command([str(tmp_path), *cp])
    assert _value(command, "--runner") == "generate" and command.count("--runner") == 1
    assert "--convert" not in command and "--hf-overrides" not in command
    for size_one in (["-dcp", "1"], ["--prefill-context-parallel-size=1"]):
        assert _value(cli.serve_command([str(tmp_path), *size_one]), "--runner") == "pooling"
    chosen = cli.serve_command([str(tmp_path), *cp, "--runner", "pooling"])
    assert _value(chosen, "--runner") == "pooling"  # the user's choice wins


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


def _value(command: list[str], flag: str) -> str:
    return command[command.index(flag) + 1]


def test_serve_reranker_adds_overrides_template_and_no_embed_convert(tmp_path):
    from vllm_npu_ext import reranker

    command = cli.serve_command([str(tmp_path), "--reranker", "--dtype", "float32"])
    assert "--reranker" not in command and "--convert" not in command
    assert _value(command, "--runner") == "pooling"
    assert json.loads(_value(command, "--hf-overrides")) == reranker.HF_OVERRIDES
    assert _value(command, "--chat-template") == str(reranker.TEMPLATE_PATH)
    for middleware in cli.MIDDLEWARES:
        assert f"--middleware {middleware}" in " ".join(command)


def test_serve_merges_the_users_hf_overrides(tmp_path):
    from vllm_npu_ext import reranker

    command = cli.serve_command(
        [str(tmp_path), "--reranker", '--hf-overrides={"classifier_from_token": ["n", "y"]}']
    )
    assert command.count("--hf-overrides") == 1
    assert json.loads(_value(command, "--hf-overrides")) == {
        **reranker.HF_OVERRIDES, "classifier_from_token": ["n", "y"]
    }
    command = cli.serve_command([str(tmp_path), "--hf-overrides", '{"max_model_len": 64}'])
    assert json.loads(_value(command, "--hf-overrides")) == {
        "is_matryoshka": True, "max_model_len": 64
    }


def test_serve_reranker_instruction_writes_a_template_copy(tmp_path, monkeypatch):
    from vllm_npu_ext import reranker

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    command = cli.serve_command(["m", "--reranker", "--reranker-instruction", "Find code"])
    path = _value(command, "--chat-template")
    assert path.startswith(str(tmp_path))
    assert Path(path).read_text(encoding="utf-8") == reranker.template_text("Find code")
    again = cli.serve_command(["m", "--reranker", "--reranker-instruction=Find code"])
    assert _value(again, "--chat-template") == path


def test_serve_keeps_a_users_chat_template(tmp_path):
    command = cli.serve_command([str(tmp_path), "--reranker", "--chat-template", "mine.jinja"])
    assert command.count("--chat-template") == 1 and "mine.jinja" in command


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["m", "--reranker-instruction", "x"], "needs --reranker"),
        (["m", "--reranker", "--reranker-instruction"], "needs a value"),
        (["m", "--reranker", "--reranker-instruction", "x", "--chat-template", "t"], "cannot"),
        (["m", "--reranker", "--hf-overrides", "{bad"], "not JSON"),
        (["m", "--hf-overrides", "[1]"], "JSON object"),
    ],
)
def test_serve_refuses_contradictory_options(args, message):
    with pytest.raises(SystemExit, match=message):
        cli.serve_command(args)


def test_serve_reranker_without_model_uses_the_built_in_tiny_reranker(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    command = cli.serve_command(["--reranker"])
    model_dir = tmp_path / "vllm_npu_ext" / "tiny-qwen3-reranker"
    assert _value(command, "--model") == str(model_dir)
    assert _value(command, "--served-model-name") == "tiny-qwen3-reranker"
    assert (model_dir / "model.safetensors").exists()


def test_reranker_template_command_prints_the_path(tmp_path, capsys, monkeypatch):
    from vllm_npu_ext import reranker

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cli.main(["reranker-template"]) == 0
    assert capsys.readouterr().out.strip() == str(reranker.TEMPLATE_PATH)
    assert cli.main(["reranker-template", "--instruction", "Find code"]) == 0
    path = capsys.readouterr().out.strip()
    assert path.startswith(str(tmp_path)) and "Find code" in Path(path).read_text(encoding="utf-8")
