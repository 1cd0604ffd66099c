"""`vllm-npu-ext serve` reads every flag it inspects or adds from vLLM's own parsed arguments:
each flag in each spelling vLLM accepts (`--flag-name`, `--flag_name`, `--flag=value`,
`--flag.key value`, `--config FILE`, an unambiguous prefix, short forms) means the same, and a
user's value wins or merges with ours.

All cases resolve in one child process per run (vLLM's parser loads vLLM's plugins, which this
process must not): `support/serve_args_child.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from support.serve_args_child import MARKER

from vllm_npu_ext import reranker, serve_args

SUPPORT = Path(__file__).resolve().parents[1] / "support"
USER_OVERRIDES = {"matryoshka_dimensions": [256]}
JSON = json.dumps(USER_OVERRIDES)


def _hf_spellings(flag: str, value: str) -> list[list[str]]:
    """A JSON-valued option in every spelling vLLM's FlexibleArgumentParser accepts."""
    under = "--" + flag[2:].replace("-", "_")
    return [[flag, value], [under, value], [f"{flag}={value}"], [f"{under}={value}"],
            [flag[: len(flag) - 3], value]]  # fmt: skip


def _value_spellings(flag: str, value: str) -> list[list[str]]:
    under = "--" + flag[2:].replace("-", "_")
    return [[flag, value], [under, value], [f"{flag}={value}"], [f"{under}={value}"]]


# name -> (argv after `serve`, predicate over the result); MODEL stands for the tiny
# checkpoint's directory, which comes first where the argv does not name it.
CASES: dict[str, tuple[list[str], object]] = {}


def _case(name: str, argv: list[str], check) -> None:
    CASES[name] = (argv, check)


for number, spelling in enumerate(_hf_spellings("--hf-overrides", JSON)):
    # The user's overrides say matryoshka: theirs, and nothing of ours on top.
    _case(f"hf-overrides spelling {number}: {spelling[0]}", spelling,
          lambda r: r["hf_overrides"] == USER_OVERRIDES)
_case("hf-overrides dotted", ["--hf-overrides.matryoshka_dimensions", "[256]"],
      lambda r: r["hf_overrides"] == USER_OVERRIDES)
_case("hf-overrides dotted, underscored", ["--hf_overrides.is_matryoshka", "false"],
      lambda r: r["hf_overrides"] == {"is_matryoshka": False})
_case("hf-overrides without matryoshka keys merge under ours",
      ["--hf_overrides", '{"max_position_embeddings": 64}'],
      lambda r: r["hf_overrides"] == {"is_matryoshka": True, "max_position_embeddings": 64})
for number, spelling in enumerate(_hf_spellings("--hf-overrides",
                                                '{"classifier_from_token": ["n", "y"]}')):
    _case(f"reranker hf-overrides spelling {number}", ["--reranker", *spelling],
          lambda r: r["hf_overrides"] == {**reranker.HF_OVERRIDES,
                                          "classifier_from_token": ["n", "y"]})  # fmt: skip
for number, spelling in enumerate(_value_spellings("--runner", "generate")):
    _case(f"runner spelling {number}", spelling,
          lambda r: r["runner"] == "generate" and r["hf_overrides"] == {})
for number, spelling in enumerate(_value_spellings("--served-model-name", "mine")):
    _case(f"served-model-name spelling {number}", spelling,
          lambda r: r["served_model_name"] == ["mine"])
for number, spelling in enumerate(_value_spellings("--middleware", "my.Middleware")):
    _case(f"middleware spelling {number}", spelling,
          lambda r: r["middleware"] == ["my.Middleware", *serve_args.MIDDLEWARES])
_case("our middleware given by the user is not added twice",
      ["--middleware", serve_args.MIDDLEWARES[1]],
      lambda r: r["middleware"] == list(serve_args.MIDDLEWARES[1:2])
      + [m for m in serve_args.MIDDLEWARES if m != serve_args.MIDDLEWARES[1]])
for number, spelling in enumerate(_value_spellings("--chat-template", "mine.jinja")):
    _case(f"reranker chat-template spelling {number}", ["--reranker", *spelling],
          lambda r: r["chat_template"] == "mine.jinja")
for number, spelling in enumerate(_value_spellings("--gpu-memory-utilization", "0.2")):
    _case(f"gpu-memory-utilization spelling {number}", spelling,
          lambda r: r["gpu_memory_utilization"] == 0.2)
for number, spelling in enumerate([["-dcp", "2", "-tp", "2"],
                                   ["--decode-context-parallel-size=2", "-tp", "2"],
                                   ["--decode_context_parallel_size", "2", "-tp", "2"],
                                   ["--prefill_context_parallel_size=2"], ["-pcp", "2"]]):
    _case(f"context parallel spelling {number}", spelling,
          lambda r: r["runner"] == "generate" and r["hf_overrides"] == {})
_case("context parallel 1 keeps pooling", ["-dcp", "1"], lambda r: r["runner"] == "pooling")
_case("context parallel with a runner of the user's", ["-pcp", "2", "--runner=pooling"],
      lambda r: r["runner"] == "pooling")
for number, spelling in enumerate(_value_spellings("--tensor-parallel-size", "2") + [["-tp", "2"]]):
    _case(f"tensor parallel spelling {number}: no single-rank core binding", spelling,
          lambda r: "VLLM_CPU_OMP_THREADS_BIND" not in r["environment"])
for number, spelling in enumerate(_value_spellings("--task", "embed")):
    _case(f"task spelling {number}", spelling,
          lambda r: (r["runner"], r["convert"]) == ("pooling", "embed")
          and any("--task embed" in note for note in r["notes"]))
_case("task classify", ["--task", "classify"],
      lambda r: (r["runner"], r["convert"]) == ("pooling", "classify"))
_case("task score", ["--task=score"], lambda r: (r["runner"], r["convert"]) == ("pooling", "auto"))
_case("task generate", ["--task", "generate"], lambda r: r["runner"] == "generate")
_case("task with the user's own runner: the user's wins", ["--runner=generate", "--task", "embed"],
      lambda r: (r["runner"], r["convert"]) == ("generate", "embed")
      and any("your own --runner kept" in note for note in r["notes"]))
_case("task with the user's own convert: the user's wins",
      ["--task", "embed", "--convert", "classify"],
      lambda r: (r["runner"], r["convert"]) == ("pooling", "classify"))
_case("task unknown", ["--task", "nonsense"], lambda r: "--task must be one of" in r["error"])
for number, spelling in enumerate(_value_spellings("--reranker-instruction", "Find code")):
    _case(f"reranker-instruction spelling {number}", ["--reranker", *spelling],
          lambda r: Path(r["chat_template"]).read_text(encoding="utf-8")
          == reranker.template_text("Find code"))
_case("model given as --model=", ["--model=MODEL", "--runner", "pooling"],
      lambda r: r["model"].endswith("tiny") and r["hf_overrides"] == {"is_matryoshka": True})
_case("model given as --model", ["--served_model_name", "x", "--model", "MODEL"],
      lambda r: r["model"].endswith("tiny") and r["served_model_name"] == ["x"])
_case("headless", ["--headless", "--data-parallel-start-rank", "1"],
      lambda r: r["headless"] is True and r["runner"] == "pooling")
TEI_CASES = {
    "--auto-truncate false": ("VLLM_NPU_EXT_TEI_AUTO_TRUNCATE", "0"),
    "--auto_truncate=false": ("VLLM_NPU_EXT_TEI_AUTO_TRUNCATE", "0"),
    "--auto-truncate": ("VLLM_NPU_EXT_TEI_AUTO_TRUNCATE", "1"),
    "--payload-limit 1000": ("VLLM_NPU_EXT_TEI_PAYLOAD_LIMIT", "1000"),
    "--payload_limit=1000": ("VLLM_NPU_EXT_TEI_PAYLOAD_LIMIT", "1000"),
    "--max-concurrent-requests 4": ("VLLM_NPU_EXT_TEI_MAX_CONCURRENT_REQUESTS", "4"),
    "--max_client_batch_size=8": ("VLLM_NPU_EXT_TEI_MAX_CLIENT_BATCH_SIZE", "8"),
}
for text, (variable, value) in TEI_CASES.items():
    _case(f"TEI {text}", text.split(), lambda r, v=variable, x=value: r["environment"][v] == x)
BAD = {
    "reranker-instruction without reranker": (["--reranker-instruction", "x"], "needs --reranker"),
    "reranker-instruction without value": (["--reranker", "--reranker-instruction"],
                                           "needs a value"),
    "instruction with a chat template": (["--reranker", "--reranker_instruction=x",
                                          "--chat_template", "t"], "cannot apply"),
    "hf-overrides not an object": (["--hf-overrides", "[1]"], "must be a JSON object"),
    "payload limit not a number": (["--payload-limit", "lots"], "positive integer"),
    "auto-truncate not a boolean": (["--auto-truncate=maybe"], "true or false"),
}
for name, (argv, needle) in BAD.items():
    _case(f"refused: {name}", argv, lambda r, n=needle: n in (r.get("error") or ""))


@pytest.fixture(scope="module")
def resolved(tiny_model_dir, tmp_path_factory) -> dict[str, dict]:
    """Every case resolved with the tiny Qwen3-Embedding checkpoint as the model."""
    cache = tmp_path_factory.mktemp("serve_args_cache")
    cases = []
    for argv, _ in CASES.values():
        named = any(a.endswith("MODEL") for a in argv)
        argv = [a.replace("MODEL", str(tiny_model_dir)) for a in argv]
        cases.append({"argv": argv if named else [str(tiny_model_dir), *argv],
                      "env": {"XDG_CACHE_HOME": str(cache)}})  # fmt: skip
    env = {"XDG_CACHE_HOME": str(cache), "VLLM_CPU_OMP_THREADS_BIND": None}
    cases += [_plain_qwen3_case(tmp_path_factory),
              _config_file_case(tiny_model_dir, tmp_path_factory),
              {"argv": [], "env": env}, {"argv": ["--reranker"], "env": env},
              {"argv": [str(tiny_model_dir)], "env": env}]  # fmt: skip
    results = _run_child(cases)
    names = [*CASES, "plain Qwen3", "config file", "no model", "no model, reranker", "defaults"]
    return dict(zip(names, results, strict=True))


def test_without_a_model_the_built_in_tiny_models_serve(resolved):
    from vllm_npu_ext.tiny_model import DEFAULT_MODEL_NAME, DEFAULT_RERANKER_NAME

    embedding, rerank = resolved["no model"], resolved["no model, reranker"]
    assert embedding["model"].endswith(f"vllm_npu_ext/{DEFAULT_MODEL_NAME}")
    assert embedding["served_model_name"] == [DEFAULT_MODEL_NAME]
    assert embedding["hf_overrides"] == {"is_matryoshka": True}
    assert rerank["model"].endswith(f"vllm_npu_ext/{DEFAULT_RERANKER_NAME}")
    assert rerank["served_model_name"] == [DEFAULT_RERANKER_NAME]


def test_the_reranker_gets_its_overrides_template_and_vllms_convert(resolved):
    rerank = resolved["no model, reranker"]
    assert rerank["hf_overrides"] == reranker.HF_OVERRIDES
    assert rerank["chat_template"] == str(reranker.TEMPLATE_PATH)
    assert (rerank["runner"], rerank["convert"]) == ("pooling", "auto")


def test_defaults_of_a_single_rank_cpu_server(resolved):
    """Pooling (vLLM's `--convert auto` reads *ForCausalLM as embed), our middleware, half the
    memory, and on a machine of 4 cores or fewer every core for the one rank."""
    import os

    result = resolved["defaults"]
    assert (result["runner"], result["convert"]) == ("pooling", "auto")
    assert result["middleware"] == list(serve_args.MIDDLEWARES)
    assert result["gpu_memory_utilization"] == serve_args.CPU_MEMORY_UTILIZATION
    cores = sorted(os.sched_getaffinity(0))
    binding = result["environment"].get("VLLM_CPU_OMP_THREADS_BIND")
    if len(cores) <= serve_args.SMALL_CPU_MACHINE:
        assert binding == ",".join(map(str, cores))
    else:
        assert binding is None


def _plain_qwen3_case(tmp_path_factory) -> dict:
    """A Qwen3 checkpoint without Qwen3-Embedding's pooling files."""
    from vllm_npu_ext.tiny_model import make_tiny_model

    model = make_tiny_model(tmp_path_factory.mktemp("plain") / "qwen3")
    for name in ("modules.json", "1_Pooling/config.json"):
        (model / name).unlink()
    return {"argv": [str(model)]}


def _config_file_case(model, tmp_path_factory) -> dict:
    config = tmp_path_factory.mktemp("config") / "serve.yaml"
    config.write_text(f"hf_overrides: '{JSON}'\nrunner: pooling\n", encoding="utf-8")
    return {"argv": [str(model), "--config", str(config)]}


def _run_child(cases: list[dict]) -> list[dict]:
    done = subprocess.run([sys.executable, str(SUPPORT / "serve_args_child.py")],
                          input=json.dumps(cases), capture_output=True, text=True, timeout=600,
                          cwd=SUPPORT.parent)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.split(MARKER, 1)[1])


@pytest.mark.parametrize("name", list(CASES))
def test_each_flag_in_each_spelling_means_the_same(resolved, name):
    result = resolved[name]
    assert CASES[name][1](result), result


def test_dimensions_are_on_for_qwen3_embedding_only(resolved):
    """The tiny checkpoint ships Qwen3-Embedding's last-token pooling files; a plain Qwen3
    checkpoint gets no matryoshka override (vLLM's 400 for `dimensions`)."""
    default = resolved["served-model-name spelling 0"]
    assert default["hf_overrides"] == {"is_matryoshka": True}
    assert resolved["plain Qwen3"]["hf_overrides"] == {}
    assert resolved["plain Qwen3"]["runner"] == "pooling"


def test_a_config_file_is_read_as_vllm_reads_it(resolved):
    assert resolved["config file"]["hf_overrides"] == USER_OVERRIDES
