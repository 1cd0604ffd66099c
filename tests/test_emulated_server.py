"""The NPU code path behind the real HTTP server: `VLLM_NPU_EXT_EMULATE=1 vllm-npu-ext serve`.

Every vLLM process of the server (API server, engine core, worker) installs the torch_npu
emulator from the plugin's `register()`, so the model takes its NPU path on the CPU, behind
the same middleware and HTTP stack users run (tests/conftest.py `emulated_embedding_server`).
"""

from __future__ import annotations

import re

import httpx
import pytest
import torch
from support.bad_requests import BAD_INPUTS, MALFORMED_JSON
from support.engines import PARITY_TEXTS
from support.hf_oracle import MIN_COSINE, cosines, hf_embeddings
from support.loadgen import embed_alone, embed_batch, served_model
from support.shutdown import engine_core_processes
from support.stacks import EMULATED_SERVER

EMULATING = re.compile(r"vllm-npu-ext in pid (\d+): VLLM_NPU_EXT_EMULATE=1")
NPU_BACKEND = "backend: NPU path (torch_npu emulator on the CPU)"
pytestmark = EMULATED_SERVER


@pytest.fixture(scope="module")
def model(emulated_embedding_server):
    return served_model(emulated_embedding_server.base_url)


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):
    return hf_embeddings(tiny_model_dir, PARITY_TEXTS)


@pytest.mark.parametrize("send", [embed_batch, embed_alone], ids=["one batch", "one per request"])
def test_embeddings_match_hf(emulated_embedding_server, model, oracle, send):
    got = torch.tensor(send(emulated_embedding_server.base_url, model, PARITY_TEXTS))
    worst = cosines(got, oracle).min().item()
    print(f"emulated server vs Hugging Face: worst cosine {worst:.7f}")
    assert worst >= MIN_COSINE


def test_every_process_says_once_that_it_emulates_and_the_model_runs_the_npu_path(
    emulated_embedding_server,
):
    log = emulated_embedding_server.log_text()
    pids = EMULATING.findall(log)
    assert len(pids) == len(set(pids)), pids  # one line per process
    api_server = emulated_embedding_server.process.pid  # `serve` execs vLLM's server
    (engine_core,) = engine_core_processes(emulated_embedding_server)
    built = [line for line in log.splitlines() if "vllm-npu-ext built Qwen3ForEmbedding" in line]
    assert len(built) == 1 and NPU_BACKEND in built[0], built
    worker = re.search(r"pid=(\d+)\)", built[0])  # vLLM's log prefix names the process
    assert worker, built[0]
    assert {str(api_server), str(engine_core.pid), worker.group(1)} <= set(pids), pids


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_400(emulated_embedding_server, model, case):
    response = httpx.post(
        f"{emulated_embedding_server.base_url}/v1/embeddings",
        json={"model": model, **BAD_INPUTS[case]}, timeout=60,
    )  # fmt: skip
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]


def test_malformed_json_gets_400_and_the_server_keeps_serving(
    emulated_embedding_server, model, oracle
):
    response = httpx.post(
        f"{emulated_embedding_server.base_url}/v1/embeddings", content=MALFORMED_JSON,
        headers={"content-type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 400
    got = torch.tensor(embed_alone(emulated_embedding_server.base_url, model, PARITY_TEXTS[:1]))
    assert cosines(got, oracle[:1]).item() >= MIN_COSINE
