"""`vllm-npu-ext selfcheck` run under the torch_npu emulator, where it must pass, say
"emulated" on every line, and fail loudly when an operator is corrupted; and without an NPU,
where it must refuse in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from support.host_kernel import without_compiler

from vllm_npu_ext import bootstrap, emulator, envs, selfcheck
from vllm_npu_ext.ops import dispatch
from vllm_npu_ext.selfcheck.parity import compare
from vllm_npu_ext.selfcheck.target import Target
from vllm_npu_ext.selfcheck.tolerances import Tolerance

# One operator family per fused op selfcheck checks (our custom op included).
OPERATORS = [
    "npu_rms_norm", "npu_add_rms_norm", "npu_rotary_mul", "npu_mrope", "npu_swiglu", "npu_linear",
    "npu_grouped_matmul", "npu_fused_infer_attention_score", "npu_fusion_attention",
    "npu_attention_update", "npu_ext_attention_update",
]  # fmt: skip


def _selfcheck_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "vllm_npu_ext.cli", "selfcheck", *args]


def _env_without_emulation() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != envs.SELFCHECK_EMULATE.name}


@pytest.fixture
def run_in_process(monkeypatch, capsys, tmp_path):
    """selfcheck.main(args) in this process -> (exit status, stdout). The doctor applies the
    bootstrap to the environment; monkeypatch restores the two variables it may change."""
    for name in (bootstrap.OPP_PATH_VARIABLE, bootstrap.LIBRARY_PATH_VARIABLE):
        if name in os.environ:
            monkeypatch.setenv(name, os.environ[name])
        else:
            monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv(envs.SELFCHECK_EMULATE.name, raising=False)

    def run(*args: str) -> tuple[int, str]:
        code = selfcheck.main(["--workdir", str(tmp_path), *args])
        return code, capsys.readouterr().out

    return run


@pytest.mark.slow
def test_every_part_passes_under_the_emulator_and_every_line_says_so(tmp_path):
    """The whole command, as CI runs it: ops, the tiny model in a vLLM engine, bench, doctor."""
    env = {**_env_without_emulation(), envs.SELFCHECK_EMULATE.name: "1"}
    done = subprocess.run(
        _selfcheck_command("--quick", "--workdir", str(tmp_path)),
        capture_output=True, text=True, env=env, timeout=600,
    )  # fmt: skip
    lines = done.stdout.splitlines()
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert lines and all("emulated" in line for line in lines), done.stdout
    assert not any(line.startswith(("FAIL", "FAILED")) for line in lines)
    passed = [line for line in lines if line.startswith("PASS")]
    for operator in OPERATORS:
        assert any(f"op={operator} " in line for line in passed), operator
    for check in ("our-model", "fused-ops-ran", "engine-vs-hf", "fused-vs-unfused"):
        assert any(f"check={check} " in line for line in passed), check
    graph = [line for line in lines if "check=graph-mode " in line]
    assert graph and all(" mode=" in line and " updates=" in line for line in graph), graph
    bench = [line for line in lines if line.startswith("BENCH")]
    assert bench and all(line.endswith("[emulated: not a measurement]") for line in bench)
    assert any(line.startswith("PASS") and "check=doctor" in line for line in lines)
    assert lines[0].startswith("SELFCHECK") and "coverage=" in lines[0]
    assert lines[-1].startswith("SUMMARY PASS: ") and "Qwen3-Embedding 0.6b" in lines[-1]


def test_json_report_lists_every_op_check_with_its_errors(run_in_process):
    code, out = run_in_process("--emulate", "--quick", "--parts", "ops,doctor", "--json")
    report = json.loads(out)
    assert code == 0 and report["summary"]["exit_code"] == 0
    assert report["emulated"] is True
    assert report["summary"]["fail"] == 0 and report["summary"]["pass"] > 40
    ops = [check for check in report["checks"] if check["part"] == "ops"]
    assert {check["op"] for check in ops} == set(OPERATORS)
    for check in ops:
        assert check["status"] == "PASS"
        assert {"dtype", "shape", "max_abs", "max_rel", "err_over_tol", "tol"} <= set(check)
        assert 0 <= check["err_over_tol"] <= 1
    assert {check["dtype"] for check in ops} == {"fp32", "fp16", "bf16"}
    assert report["doctor"]["problems"] == []
    assert dispatch.emulator() is None  # the emulator is gone again after the run


def test_without_our_custom_operator_its_cases_are_reported_as_not_run(run_in_process, monkeypatch):
    monkeypatch.setattr(Target, "custom_kernel_installed", lambda self: False)
    code, out = run_in_process("--emulate", "--quick", "--parts", "ops")
    lines = out.splitlines()
    passed = [line for line in lines if line.startswith("PASS")]
    assert code == 0
    assert any(line.startswith("INFO") and "installed=false" in line for line in lines)
    assert not any("op=npu_ext_attention_update" in line for line in passed)
    assert any("op=npu_attention_update " in line for line in passed)


def test_without_a_compiler_our_custom_operator_fails_naming_it(run_in_process, monkeypatch):
    with without_compiler(monkeypatch) as missing:
        code, out = run_in_process("--emulate", "--quick", "--parts", "ops")
    failed = [line for line in out.splitlines() if line.startswith("FAIL ")]
    assert code == 1 and failed
    assert all("op=npu_ext_attention_update " in line and missing in line for line in failed)


def _nudge(result):
    """A fused operator's result with its first output off by 5% + 0.05."""
    if isinstance(result, torch.Tensor):
        return result * 1.05 + 0.05
    return type(result)([_nudge(result[0]), *result[1:]])


def _explode(result):
    raise RuntimeError("kernel launch failed (deliberate, test-only)")


@pytest.mark.parametrize(
    ("operator", "perturb", "message"),
    [
        ("npu_rms_norm", _nudge, "err_over_tol="),
        ("npu_fused_infer_attention_score", _nudge, "err_over_tol="),
        ("npu_swiglu", _explode, 'error="RuntimeError: kernel launch failed'),
    ],
    ids=["rms_norm-off", "attention-off", "swiglu-raises"],
)
def test_a_corrupted_operator_fails_the_run_and_is_named(
    run_in_process, operator, perturb, message
):
    with emulator.corrupted(operator, perturb):
        code, out = run_in_process("--emulate", "--quick", "--parts", "ops")
    lines = out.splitlines()
    failed = [line for line in lines if line.startswith("FAIL ")]
    assert code == 1
    assert failed and all(f"op={operator} " in line and message in line for line in failed)
    assert any(line.startswith("PASS") for line in lines)  # the other operators still pass
    assert sum(line.startswith("FAILED ") for line in lines) == len(failed)
    assert lines[-1].startswith("SUMMARY FAIL: ") and f", {len(failed)} failed" in lines[-1]


def test_without_npu_or_emulator_it_exits_2_with_one_line():
    done = subprocess.run(
        _selfcheck_command(), capture_output=True, text=True, env=_env_without_emulation(),
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stdout == ""
    assert len(done.stderr.splitlines()) == 1
    assert "no usable Ascend NPU" in done.stderr and "--emulate" in done.stderr


@pytest.mark.parametrize("parts", ["ops,gpu", ""])
def test_unknown_parts_are_rejected(run_in_process, parts):
    with pytest.raises(SystemExit) as raised:
        run_in_process("--emulate", "--parts", parts)
    assert raised.value.code == 2


@pytest.mark.parametrize(
    ("actual", "problem"),
    [
        (torch.tensor([1.0, float("nan")]), "NaN/inf"),
        (torch.tensor([1.0, 2.0], dtype=torch.bfloat16), "dtype"),
        (torch.tensor([1.0, 2.0, 3.0]), "shape"),
    ],
)
def test_compare_fails_nan_wrong_dtype_and_wrong_shape(actual, problem):
    stats = compare(actual, torch.tensor([1.0, 2.0]), Tolerance(atol=1e-5, rtol=1e-5))
    assert not stats.passed and problem in stats.problem


def test_compare_uses_isclose_rule():
    tol = Tolerance(atol=0.1, rtol=0.1)
    inside = compare(torch.tensor([1.19]), torch.tensor([1.0]), tol)  # 0.19 <= 0.1 + 0.1
    outside = compare(torch.tensor([1.21]), torch.tensor([1.0]), tol)
    assert inside.passed and inside.worst == pytest.approx(0.95, rel=1e-5)
    assert not outside.passed and outside.worst == pytest.approx(1.05, rel=1e-5)


FULL_GRAPH_RUN = {"mode": "full", "captured_sizes": [8, 16, 128], "batch_updates": 1,
                  "updates": 7, "widest_update": [2, 9, 31, 5, 20, 17, 4]}  # fmt: skip


@pytest.mark.parametrize(("graph", "status"), [
    (FULL_GRAPH_RUN, "PASS"),
    ({**FULL_GRAPH_RUN, "batch_updates": 0}, "FAIL"),  # a replay not updated
    ({**FULL_GRAPH_RUN, "batch_updates": 2}, "FAIL"),  # the batch split over steps
    ({**FULL_GRAPH_RUN, "widest_update": [80]}, "FAIL"),  # the texts' boundaries lost
    ({**FULL_GRAPH_RUN, "captured_sizes": []}, "INFO"),  # nothing captured (the CPU platform)
    ({**FULL_GRAPH_RUN, "mode": "piecewise"}, "INFO"),
])  # fmt: skip
def test_the_graph_mode_check_passes_only_a_batch_replayed_and_updated_once(graph, status):
    from vllm_npu_ext.selfcheck.model_check import graph_mode_result

    result = graph_mode_result({"model": "tiny"}, {"graph": graph}, "compiled")
    assert result.status == status
    assert result.fields["mode"] == graph["mode"] and result.fields["updates"] == graph["updates"]
