"""TEI request translation (`entrypoints/tei_protocol.py`) and the `TeiRoutes` middleware over
a stand-in ASGI app: which requests are TEI's, what reaches vLLM's handlers, the key check.
The servers' own answers are tests/entrypoints/test_tei_routes.py's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_npu_ext.entrypoints import tei_protocol as protocol
from vllm_npu_ext.entrypoints.tei import TeiRoutes
from vllm_npu_ext.entrypoints.tei_protocol import TeiError, TeiLimits

LIMITS = TeiLimits(max_client_batch_size=4, max_input_length=128, prompts={"query": "Q: "})


@pytest.mark.parametrize(
    ("inputs", "expected"),
    [
        ("a", ["a"]),
        (["a", "b"], ["a", "b"]),
        ([1, 2], [[1, 2]]),  # token ids: one input
        ([[1, 2], "b"], [[1, 2], "b"]),
    ],
)
def test_embed_inputs_follow_teis_untagged_input(inputs, expected):
    assert protocol.embed_request({"inputs": inputs}, LIMITS)["input"] == expected


def test_embed_options_become_vllm_fields():
    body = protocol.embed_request({"inputs": "a", "normalize": False, "dimensions": 8,
                                   "truncate": True, "truncation_direction": "Left",
                                   "prompt_name": "query"}, LIMITS)  # fmt: skip
    assert body == {"input": ["Q: a"], "use_activation": False, "dimensions": 8,
                    "truncate_prompt_tokens": -1, "truncation_side": "left"}  # fmt: skip
    assert protocol.embed_request({"inputs": "a", "truncate": False}, LIMITS) == {"input": ["a"]}


@pytest.mark.parametrize(
    ("payload", "status", "kind"),
    [
        ({"inputs": ["a"] * 5}, 413, "Validation"),
        ({"inputs": ""}, 400, "Empty"),
        ({"inputs": ["a", ""]}, 400, "Empty"),
        ({"inputs": []}, 400, "Empty"),
        ({"inputs": {"a": 1}}, 422, "Validation"),
        ({"inputs": [[1, -1]]}, 422, "Validation"),
        ({"inputs": [1.5]}, 422, "Validation"),
        ({"inputs": [[1, 2]], "prompt_name": "query"}, 422, "Validation"),
        ({"inputs": "a", "prompt_name": "doc"}, 422, "Validation"),
        ({"inputs": "a", "dimensions": True}, 422, "Validation"),
        ({}, 422, "Validation"),
        ("a", 422, "Validation"),
    ],
)
def test_bad_embed_requests_raise_teis_errors(payload, status, kind):
    with pytest.raises(TeiError) as caught:
        protocol.embed_request(payload, LIMITS)
    assert (caught.value.status, caught.value.kind) == (status, kind)
    assert set(caught.value.body()) == {"error", "error_type"}


def test_prompt_name_without_prompts_names_the_configuration():
    with pytest.raises(TeiError, match="no prompts were found"):
        protocol.embed_request({"inputs": "a", "prompt_name": "query"}, TeiLimits())


def test_rerank_ranks_highest_first_with_teis_tie_order():
    answer = {"results": [{"index": 0, "relevance_score": 0.5},
                          {"index": 1, "relevance_score": 0.9},
                          {"index": 2, "relevance_score": 0.5}]}  # fmt: skip
    ranks = protocol.rerank_response(answer, ["x", "y", "z"], return_text=True)
    assert [r["index"] for r in ranks] == [1, 2, 0]  # TEI: ascending sort, reversed
    assert ranks[0] == {"index": 1, "score": 0.9, "text": "y"}
    with pytest.raises(TeiError, match="NaN") as caught:
        protocol.rerank_response({"results": [{"index": 0, "relevance_score": float("nan")}]},
                                 ["x"], return_text=False)  # fmt: skip
    assert caught.value.status == 424


def test_rerank_request_asks_for_every_document_and_raw_scores():
    body, return_text, truncate = protocol.rerank_request(
        {"query": "q", "texts": ["a", "b"], "raw_scores": True}, LIMITS)  # fmt: skip
    assert body == {"query": "q", "documents": ["a", "b"], "top_n": 2, "use_activation": False}
    assert (return_text, truncate) == (False, False)
    with pytest.raises(TeiError, match="left is not supported"):
        protocol.rerank_request({"query": "q", "texts": ["a"], "truncate": True,
                                 "truncation_direction": "left"}, LIMITS)  # fmt: skip


def test_similarity_is_cosine_and_counts_the_source_in_the_batch():
    body = protocol.similarity_request(
        {"inputs": {"source_sentence": "s", "sentences": ["a", "b"]}}, LIMITS)  # fmt: skip
    assert body["input"] == ["s", "a", "b"] and body["use_activation"] is False
    answer = {"data": [{"index": 1, "embedding": [3.0, 4.0]},
                       {"index": 0, "embedding": [1.0, 0.0]},
                       {"index": 2, "embedding": [0.0, -2.0]}]}  # fmt: skip
    assert protocol.similarity_response(answer) == pytest.approx([0.6, 0.0])
    with pytest.raises(TeiError) as caught:
        protocol.similarity_request(
            {"inputs": {"source_sentence": "s", "sentences": ["a"] * 4}}, LIMITS)  # fmt: skip
    assert caught.value.status == 413


def test_tokens_carry_utf8_byte_offsets_and_special_tokens_none():
    text = "hé x"
    tokens = protocol.tokens_of(text, [5, 6, 7, 0], [(0, 1), (1, 2), (2, 4), (0, 0)],
                                [0, 0, 0, 1], ["h", "Ã©", "Ġx", "<eos>"])  # fmt: skip
    assert tokens[1] == {"id": 6, "text": "é", "special": False, "start": 1, "stop": 3}
    assert tokens[2] == {"id": 7, "text": " x", "special": False, "start": 3, "stop": 5}
    assert tokens[3] == {"id": 0, "text": "<eos>", "special": True, "start": None, "stop": None}


def test_decode_checks_ids_against_the_vocabulary():
    assert protocol.decode_request({"ids": [1, 2]}, LIMITS, 10) == ([[1, 2]], True)
    assert protocol.decode_request({"ids": [[1], [2]], "skip_special_tokens": False},
                                   LIMITS, 10) == ([[1], [2]], False)  # fmt: skip
    for ids, status in (([1, 10], 422), ([[1], []], 400), ([], 400), ([[1]] * 5, 413)):
        with pytest.raises(TeiError) as caught:
            protocol.decode_request({"ids": ids}, LIMITS, 10)
        assert caught.value.status == status, ids


@pytest.mark.parametrize(("status", "kind"), [(400, "Validation"), (404, "Validation"),
                                              (503, "Unhealthy"), (500, "Backend")])  # fmt: skip
def test_vllm_errors_map_to_tei_errors(status, kind):
    error = protocol.vllm_error(status, {"error": {"message": "boom", "code": status}})
    assert (error.kind, error.message) == (kind, "boom")


# The middleware over a stand-in app: what vLLM's handlers receive and what the client gets.


class _App:
    """Stands in for vLLM's app: records requests, answers /v1/embeddings and /rerank."""

    def __init__(self, runner="pooling", architectures=("Qwen3ForCausalLM",), api_key=None):
        model_config = SimpleNamespace(
            runner_type=runner, architectures=list(architectures), max_model_len=128,
            model=str(Path(__file__).parent), revision=None, hf_config=SimpleNamespace(),
            dtype="torch.float32",
        )
        vllm_config = SimpleNamespace(model_config=model_config, scheduler_config=SimpleNamespace(
            max_num_batched_tokens=2048, max_num_seqs=8))  # fmt: skip
        self.state = SimpleNamespace(vllm_config=vllm_config,
                                     args=SimpleNamespace(api_key=api_key))  # fmt: skip
        self.seen: list[tuple[str, dict]] = []

    async def __call__(self, scope, receive, send):
        message = await receive()
        body = json.loads(message["body"] or b"null")
        self.seen.append((scope["path"], body))
        if scope["path"] == "/v1/embeddings":
            data = [{"index": i, "embedding": [float(i), 1.0]} for i in range(len(body["input"]))]
            answer = {"data": data[::-1]}
        elif scope["path"] == "/rerank" and "top_n" in body:
            count = len(body["documents"])
            answer = {"results": [{"index": i, "relevance_score": i / 10} for i in range(count)]}
        else:
            answer = {"echo": body}
        raw = json.dumps(answer).encode()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": raw})


def _request(app, path, body, method="POST", headers=()):
    middleware = TeiRoutes(app)
    scope = {"type": "http", "method": method, "path": path, "app": app, "query_string": b"",
             "headers": [(b"content-type", b"application/json"), *headers]}  # fmt: skip
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = []

    async def receive():
        return {"type": "http.request", "body": raw, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    status = sent[0]["status"]
    payload = b"".join(m.get("body", b"") for m in sent[1:])
    return status, json.loads(payload) if payload else None


def test_embed_goes_through_vllms_embeddings_route_in_order():
    app = _App()
    status, answer = _request(app, "/embed", {"inputs": ["a", "b"]})
    assert status == 200 and answer == [[0.0, 1.0], [1.0, 1.0]]
    assert app.seen == [("/v1/embeddings", {"input": ["a", "b"]})]


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/rerank", {"query": "q", "documents": ["a"]}),  # vLLM's (Jina/Cohere) rerank
        ("/tokenize", {"prompt": "a"}),  # vLLM's tokenize
        ("/v1/embeddings", {"input": "a"}),
        ("/score", {"queries": "a", "documents": ["b"]}),
    ],
)
def test_vllms_own_bodies_pass_through_untouched(path, body):
    app = _App(architectures=["Qwen3ForSequenceClassification"])
    status, answer = _request(app, path, body)
    assert status == 200 and app.seen == [(path, body)]


def test_a_server_that_does_not_pool_gets_no_tei_routes():
    app = _App(runner="generate")
    _request(app, "/embed", {"inputs": "a"})
    assert app.seen == [("/embed", {"inputs": "a"})]  # vLLM answers (404)


def test_tei_rerank_on_a_classifier_calls_vllms_rerank():
    app = _App(architectures=["Qwen3ForSequenceClassification"])
    status, answer = _request(app, "/rerank", {"query": "q", "texts": ["a", "b"]})
    assert app.seen == [("/rerank", {"query": "q", "documents": ["a", "b"], "top_n": 2})]
    assert status == 200 and answer == [{"index": 1, "score": 0.1}, {"index": 0, "score": 0.0}]
    status, answer = _request(app, "/embed", {"inputs": "a"})
    assert (status, answer["error_type"]) == (424, "Backend")


def test_api_key_guards_the_tei_routes_as_vllm_guards_v1():
    app = _App(api_key=["secret"])
    assert _request(app, "/embed", {"inputs": "a"}) == (401, None)
    assert _request(app, "/info", None, method="GET") == (401, None)
    assert app.seen == []
    status, _ = _request(app, "/embed", {"inputs": "a"},
                         headers=[(b"authorization", b"Bearer secret")])  # fmt: skip
    assert status == 200 and app.seen[0][0] == "/v1/embeddings"


def test_malformed_json_gets_a_tei_error_and_reaches_no_handler():
    app = _App()
    status, answer = _request(app, "/embed", b"{bad")
    assert status == 422 and answer["error_type"] == "Validation" and app.seen == []
