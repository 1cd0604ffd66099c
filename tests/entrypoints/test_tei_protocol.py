"""TEI request translation (`entrypoints/tei_protocol.py`) and the `TeiRoutes` middleware over
a stand-in ASGI app: which requests are TEI's, what reaches vLLM's handlers, the key check.
The servers' own answers are tests/entrypoints/test_tei_routes.py's."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from vllm_npu_ext.entrypoints import tei
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


@pytest.mark.parametrize(("auto_truncate", "truncate", "truncated"),
                         [(True, None, True), (True, False, False), (False, None, False),
                          (False, True, True)])  # fmt: skip
def test_truncation_defaults_to_the_servers_auto_truncate(auto_truncate, truncate, truncated):
    """TEI 1.9: `truncate` unset means `--auto-truncate`, on by default."""
    limits = TeiLimits(auto_truncate=auto_truncate)
    payload = {"inputs": "a"} if truncate is None else {"inputs": "a", "truncate": truncate}
    for body in (protocol.embed_request(payload, limits),
                 protocol.rerank_request({"query": "q", "texts": ["a"], **payload}, limits)[0]):
        assert ("truncate_prompt_tokens" in body) == truncated, body
    assert TeiLimits().auto_truncate is True


@pytest.mark.parametrize(
    ("payload", "status", "kind"),
    [
        ({"inputs": ["a"] * 5}, 422, "Validation"),  # TEI 1.9's router: 422
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
    body, return_text = protocol.rerank_request(
        {"query": "q", "texts": ["a", "b"], "raw_scores": True, "truncate": False},
        LIMITS)  # fmt: skip
    assert body == {"query": "q", "documents": ["a", "b"], "top_n": 2, "use_activation": False}
    assert return_text is False
    body, _ = protocol.rerank_request({"query": "q", "texts": ["a"],
                                       "truncation_direction": "Left"}, LIMITS)  # fmt: skip
    assert (body["truncate_prompt_tokens"], body["truncation_side"]) == (-1, "left")


@pytest.mark.parametrize(
    ("inputs", "sequences", "single"),
    [("a", ["a"], True), (["q", "d"], [["q", "d"]], True),
     ([["q", "d"], ["q", "e"]], [["q", "d"], ["q", "e"]], False),
     (["a", "b", "c"], ["a", "b", "c"], False)],
)  # fmt: skip
def test_predict_inputs_follow_teis_untagged_predict_input(inputs, sequences, single):
    assert protocol.predict_request({"inputs": inputs}, LIMITS) == (sequences, single)


def test_predict_scores_pairs_only():
    body = protocol.predict_score_body([["q", "d"], ["q", "e"]], {"raw_scores": True,
                                                                  "truncate": False}, LIMITS)
    assert body == {"queries": ["q", "q"], "documents": ["d", "e"], "use_activation": False}
    with pytest.raises(TeiError, match="pairs") as caught:
        protocol.predict_score_body(["a"], {}, LIMITS)
    assert caught.value.status == 422
    answer = {"data": [{"index": 1, "score": 0.25}, {"index": 0, "score": 0.5}]}
    assert protocol.predict_response(answer, "LABEL_0", single=False) == [
        [{"score": 0.5, "label": "LABEL_0"}], [{"score": 0.25, "label": "LABEL_0"}]]


def test_embed_all_takes_embeds_inputs_without_pooling_options():
    body = protocol.embed_all_request({"inputs": ["a", "b"], "truncate": False,
                                       "normalize": False, "dimensions": 2}, LIMITS)  # fmt: skip
    assert body == {"input": ["a", "b"]}


@pytest.mark.parametrize(("side", "expected"), [("right", [0, 1, 2, 9]), ("left", [0, 4, 5, 9])])
def test_embed_all_truncation_keeps_the_special_tokens(side, expected):
    """[BOS] 1..5 [EOS] cut to 4 tokens: the content is cut, the special tokens stay."""
    from vllm_npu_ext.entrypoints.tei_backend import truncated_ids

    assert truncated_ids([0, 1, 2, 3, 4, 5, 9], [1, 2, 3, 4, 5], 4, side) == expected


@pytest.mark.parametrize(
    ("route", "payload", "count", "characters"),
    [("/embed", {"inputs": "abc"}, 1, 3), ("/embed", {"inputs": ["ab", "c"]}, 2, 3),
     ("/embed", {"inputs": [1, 2, 3]}, 1, 0),
     ("/rerank", {"query": "q", "texts": ["ab", "c"]}, 2, 4),
     ("/similarity", {"inputs": {"source_sentence": "s", "sentences": ["a", "bc"]}}, 3, 4),
     ("/predict", {"inputs": [["q", "dd"]]}, 1, 3), ("/embed", "junk", 0, 0)],
)  # fmt: skip
def test_inputs_and_characters_counted_as_tei_counts_them(route, payload, count, characters):
    assert protocol.input_count(route, payload) == count
    assert protocol.input_characters(route, payload) == characters


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
    assert caught.value.status == 422


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
    for ids, status in (([1, 10], 422), ([[1], []], 400), ([], 400), ([[1]] * 5, 422)):
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
    status, answer = _request(app, "/embed", {"inputs": ["a", "b"], "truncate": False})
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
    assert app.seen == [("/rerank", {"query": "q", "documents": ["a", "b"], "top_n": 2,
                                     "truncate_prompt_tokens": -1, "truncation_side": "right"})]
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


def test_open_routes_stay_open_under_an_api_key_and_the_alias_needs_it():
    """TEI keeps `GET /` (health), /health, /ping and /metrics open; /embeddings is its
    OpenAI route (vLLM's /v1/embeddings), behind the key."""
    app = _App(api_key=["secret"])
    assert _request(app, "/", None, method="GET")[0] == 200
    assert app.seen == [("/health", None)]
    assert _request(app, "/embeddings", {"input": "a"}) == (401, None)
    key = [(b"authorization", b"Bearer secret")]
    assert _request(app, "/embeddings", {"input": "a"}, headers=key)[0] == 200
    assert app.seen[-1] == ("/v1/embeddings", {"input": "a"})


@pytest.mark.parametrize(("architectures", "body", "reaches"),
                         [(["Qwen3ForCausalLM"], {"inputs": "a"}, "/v1/embeddings"),
                          (["Qwen3ForSequenceClassification"], {"query": "q", "texts": ["a"]},
                           "/rerank"),
                          (["Qwen3ForCausalLM"], {"input": "a"}, "/invocations")])  # fmt: skip
def test_invocations_route_by_model_type_for_tei_bodies(architectures, body, reaches):
    app = _App(architectures=architectures)
    assert _request(app, "/invocations", body)[0] == 200
    assert app.seen[0][0] == reaches


def test_a_body_above_the_payload_limit_gets_413(monkeypatch):
    monkeypatch.setenv("VLLM_NPU_EXT_TEI_PAYLOAD_LIMIT", "100")
    app = _App()
    status, answer = _request(app, "/embed", {"inputs": "x" * 100})
    assert status == 413 and answer == {"error": tei.PAYLOAD_TOO_LARGE, "error_type": "Validation"}
    assert app.seen == [] and _request(app, "/embed", {"inputs": "x" * 10})[0] == 200


def test_inputs_past_the_concurrency_limit_get_429(monkeypatch):
    """Each input holds one of TEI's permits while it computes; a request whose inputs do not
    all find one is refused, and the permits come back when a request ends."""
    monkeypatch.setenv("VLLM_NPU_EXT_TEI_MAX_CONCURRENT_REQUESTS", "3")

    async def scenario():
        release = asyncio.Event()
        app = _App()
        inner = app.__call__

        async def slow(scope, receive, send):
            await release.wait()
            await inner(scope, receive, send)

        middleware = TeiRoutes(slow)
        middleware._backend_for({"app": app})
        results = []

        async def post(body):
            sent = []

            async def receive():
                return {"type": "http.request", "body": json.dumps(body).encode()}

            async def send(message):
                sent.append(message)

            scope = {"type": "http", "method": "POST", "path": "/embed", "app": app,
                     "headers": []}  # fmt: skip
            await middleware(scope, receive, send)
            results.append((body["inputs"], sent[0]["status"],
                            json.loads(sent[1]["body"]) if sent[0]["status"] != 200 else None))

        first = asyncio.ensure_future(post({"inputs": ["a", "b"]}))
        await asyncio.sleep(0.05)
        await post({"inputs": ["c", "d"]})  # 2 + 2 > 3
        second = asyncio.ensure_future(post({"inputs": "e"}))  # 2 + 1 <= 3: computes
        await asyncio.sleep(0.05)
        release.set()
        await asyncio.gather(first, second)
        await post({"inputs": ["f", "g", "h"]})  # all permits back
        return results

    results = asyncio.run(scenario())
    refused = [r for r in results if r[1] != 200]
    assert refused == [(["c", "d"], 429, {"error": "Model is overloaded",
                                          "error_type": "Overloaded"})]
    assert sorted(str(r[0]) for r in results if r[1] == 200) == sorted(
        str(i) for i in (["a", "b"], "e", ["f", "g", "h"]))


def test_successful_answers_carry_teis_timing_headers():
    app = _App()
    middleware = TeiRoutes(app)
    scope = {"type": "http", "method": "POST", "path": "/embed", "app": app, "headers": []}
    sent = []

    async def receive():
        return {"type": "http.request", "body": b'{"inputs": ["ab", "cde"]}'}

    async def send(message):
        sent.append(message)

    asyncio.run(middleware(scope, receive, send))
    headers = dict(sent[0]["headers"])
    assert headers[b"x-compute-characters"] == b"5"
    assert {b"x-compute-type", b"x-compute-time", b"x-total-time"} <= set(headers)
    assert int(headers[b"x-total-time"]) >= 0
