"""End to end: the real `vllm-npu-ext serve` on loopback, called with the openai client.

The server (tests/conftest.py `embedding_server`) is started once per session on the tiny
checkpoint in float32 and stopped even when tests fail.
"""

from __future__ import annotations

import base64

import httpx
import numpy as np
import openai
import pytest
import torch
from support.bad_requests import BAD_INPUTS, MALFORMED_JSON
from support.hf_oracle import MIN_COSINE, cosines, hf_embeddings

TEXTS = ["What is the capital of France?", "a", "Paris is the capital of France. " * 3]


@pytest.fixture(scope="module")
def client(embedding_server):
    return openai.OpenAI(base_url=f"{embedding_server.base_url}/v1", api_key="unused")


@pytest.fixture(scope="module")
def model_name(client):
    return client.models.list().data[0].id


@pytest.fixture(scope="module")
def oracle(tiny_model_dir):
    return hf_embeddings(tiny_model_dir, TEXTS)


def _post(server, body, **kwargs) -> httpx.Response:
    return httpx.post(f"{server.base_url}/v1/embeddings", json=body, timeout=60, **kwargs)


def test_health(embedding_server):
    assert httpx.get(f"{embedding_server.base_url}/health", timeout=10).status_code == 200


def test_float_embeddings_match_hf(client, model_name, oracle):
    response = client.embeddings.create(model=model_name, input=TEXTS, encoding_format="float")
    got = torch.tensor([d.embedding for d in sorted(response.data, key=lambda d: d.index)])
    assert cosines(got, oracle).min().item() >= MIN_COSINE
    assert response.usage.prompt_tokens > len(TEXTS)


def test_base64_embeddings_match_float(embedding_server, model_name, oracle):
    body = {"model": model_name, "input": TEXTS, "encoding_format": "base64"}
    data = _post(embedding_server, body).json()["data"]
    decoded = [np.frombuffer(base64.b64decode(d["embedding"]), dtype=np.float32) for d in data]
    assert cosines(torch.tensor(np.stack(decoded)), oracle).min().item() >= MIN_COSINE


def test_served_by_our_model(embedding_server):
    log = embedding_server.log_text()
    assert "vllm-npu-ext built Qwen3ForEmbedding" in log
    assert "vllm_npu_ext.model_executor.models.qwen3.Qwen3ForCausalLM" in log


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_bad_input_gets_400_and_server_keeps_serving(embedding_server, model_name, oracle, case):
    response = _post(embedding_server, {"model": model_name, **BAD_INPUTS[case]})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]
    _assert_still_serves(embedding_server, model_name, oracle)


def test_malformed_json_gets_400(embedding_server, model_name, oracle):
    response = httpx.post(
        f"{embedding_server.base_url}/v1/embeddings", content=MALFORMED_JSON,
        headers={"content-type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 400
    _assert_still_serves(embedding_server, model_name, oracle)


def _assert_still_serves(server, model_name, oracle) -> None:
    data = _post(server, {"model": model_name, "input": TEXTS[:1]}).json()["data"]
    assert cosines(torch.tensor([data[0]["embedding"]]), oracle[:1]).item() >= MIN_COSINE


def test_dimensions_returns_renormalised_prefix(embedding_server, model_name, client):
    full = client.embeddings.create(model=model_name, input=TEXTS[0]).data[0].embedding
    short = client.embeddings.create(model=model_name, input=TEXTS[0], dimensions=32)
    got = torch.tensor(short.data[0].embedding)
    expected = torch.nn.functional.normalize(torch.tensor(full[:32]), dim=0)
    assert got.shape == (32,)
    torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
