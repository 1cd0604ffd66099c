"""The embeddings request validator (a pure function and ASGI middleware) and the shutdown
guard, driven by fake apps and engines."""

from __future__ import annotations

import asyncio
import json
import re
import time
import types

import pytest
from vllm.exceptions import VLLMNotFoundError

from vllm_npu_ext import compat
from vllm_npu_ext.entrypoints.middleware import (
    MAX_INPUTS,
    SHUTDOWN_MESSAGE,
    EmbeddingRequestValidator,
    GenerationRequestValidator,
    Refusal,
    ScoringRequestValidator,
    ServedModel,
    ShutdownGuard,
    validate_embedding_request,
    validate_scoring_request,
)

MATRYOSHKA_128 = ServedModel(name="m", embedding_size=128, matryoshka=True)


@pytest.mark.parametrize(
    ("payload", "message", "param"),
    [
        ({"input": ""}, "input must not be an empty string", "input"),
        ({"input": ["a", ""]}, r"input\[1\] must not be an empty string", "input"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, "at most 2048", "input"),
    ],
)
@pytest.mark.parametrize("vllm_checks", [False, True], ids=["vLLM 0.23", "vLLM 0.32"])
def test_our_own_refusals_name_the_field(payload, message, param, vllm_checks):
    """What no vLLM version refuses: empty strings, more inputs than OpenAI allows."""
    refusal = validate_embedding_request(payload, MATRYOSHKA_128, vllm_checks)
    assert refusal is not None and re.search(message, refusal.message)
    assert refusal.param == param


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"input": [[3, -1, -4]]}, "Token id -4 is out of vocabulary"),
        ({"input": [5, -2]}, "Token id -2 is out of vocabulary"),
        ({"input": [[1], [0, -7]]}, "Token id -7 is out of vocabulary"),
        ({"input": "x", "dimensions": 129},
         "Model 'm' only supports dimensions in range [1, 128], got 129."),
    ],
)
def test_vllm_0_23_gets_vllm_0_32s_answer_where_it_has_none(payload, message):
    """vLLM 0.23 embeds negative token ids and returns the whole vector for `dimensions`
    above the embedding size; 0.32 answers these with exactly this message, and there the
    validator leaves them to vLLM."""
    refusal = validate_embedding_request(payload, MATRYOSHKA_128, vllm_checks=False)
    assert refusal == Refusal(message, None)
    assert validate_embedding_request(payload, MATRYOSHKA_128, vllm_checks=True) is None


@pytest.mark.parametrize(
    "model",
    [ServedModel(name="m", embedding_size=128),  # not Matryoshka: vLLM's own 400
     ServedModel(name="m", embedding_size=128, matryoshka=True, matryoshka_dimensions=(64,)),
     None],
)  # fmt: skip
def test_other_dimensions_errors_are_vllms_own(model):
    assert validate_embedding_request({"input": "x", "dimensions": 129}, model, False) is None


@pytest.mark.parametrize(
    "payload",
    [{"input": "x"}, {"input": ["a", "b"]}, {"input": [[1, 2]]}, {"input": 3}, [], "text",
     {"input": ["a"] * MAX_INPUTS}, {"input": "x", "dimensions": 128},
     {"input": "x", "dimensions": 0}, {"input": [[0, 5]]}, {"input": [[1, "a"]]}],
)  # fmt: skip
@pytest.mark.parametrize("vllm_checks", [False, True], ids=["vLLM 0.23", "vLLM 0.32"])
def test_payloads_left_to_vllm(payload, vllm_checks):
    assert validate_embedding_request(payload, MATRYOSHKA_128, vllm_checks) is None


@pytest.mark.parametrize(
    ("path", "payload", "message"),
    [
        ("/rerank", {"query": "", "documents": ["a"]}, "query must not be an empty string"),
        ("/v2/rerank", {"query": "", "documents": []}, "query must not"),
        ("/score", {"queries": "", "documents": ["a"]}, "queries must not"),
        ("/v1/score", {"text_1": ["a", ""], "text_2": ["b", "c"]}, r"text_1\[1\] must not"),
        ("/score", {"data_1": "", "data_2": "x"}, "data_1 must not"),
    ],
)
def test_rejected_scoring_payloads(path, payload, message):
    refusal = validate_scoring_request(path, payload)
    assert refusal is not None and re.search(message, refusal.message)


def test_a_negative_top_n_is_ours_where_vllm_returns_every_document_and_vllm_s_elsewhere():
    payload = {"query": "q", "documents": ["a"], "top_n": -1}
    refusal = validate_scoring_request("/v1/rerank", payload, vllm_checks=False)  # vLLM 0.23
    assert refusal is not None and re.search("top_n must be >= 0", refusal.message)
    assert validate_scoring_request("/v1/rerank", payload, vllm_checks=True) is None  # 0.32


@pytest.mark.parametrize(
    ("path", "payload"),
    [("/rerank", {"query": "q", "documents": ["", "a"], "top_n": 0}),
     ("/rerank", {"query": "q", "documents": [], "top_n": "x"}),  # vLLM answers these
     ("/rerank", {"query": ["q"], "documents": [1]}), ("/rerank", [1]),
     ("/score", {"queries": "q", "documents": [""]}),
     ("/score", {"queries": "q", "documents": "d", "truncate_prompt_tokens": 8})],
)  # fmt: skip
def test_scoring_payloads_left_to_vllm(path, payload):
    assert validate_scoring_request(path, payload) is None


class _Tokenizer:
    """One token per character; the prompt is the template with the pair substituted."""

    def apply_chat_template(self, messages, chat_template, tokenize, **kwargs):
        query, document = (m["content"] for m in messages)
        return chat_template.replace("Q", query).replace("D", document)

    def __call__(self, text, add_special_tokens=False, return_offsets_mapping=False):
        encoded = {"input_ids": list(range(len(text)))}
        if return_offsets_mapping:
            encoded["offset_mapping"] = [(i, i + 1) for i in range(len(text))]
        return encoded


def _scoring_app(qwen3_reranker: bool, template: str = "<Q|D>"):
    hf_config = types.SimpleNamespace(is_original_qwen3_reranker=qwen3_reranker)
    model_config = types.SimpleNamespace(hf_config=hf_config, max_model_len=64)
    renderer = types.SimpleNamespace(get_tokenizer=_Tokenizer)
    state = types.SimpleNamespace(vllm_config=types.SimpleNamespace(model_config=model_config),
                                  args=types.SimpleNamespace(chat_template=template),
                                  engine_client=types.SimpleNamespace(renderer=renderer))
    return types.SimpleNamespace(state=state)


@pytest.mark.parametrize("qwen3_reranker", [False, True])
def test_scoring_middleware_cuts_qwen3_reranker_documents(qwen3_reranker):
    """For Qwen3-Reranker the document is cut so that the prompt fits; other models get
    vLLM's own truncation (the body passes unchanged)."""
    payload = {"query": "qq", "documents": ["abcdefgh"], "truncate_prompt_tokens": 8}
    body = json.dumps(payload).encode()
    seen, sent = _call("/rerank", body, validator=ScoringRequestValidator,
                       app=_scoring_app(qwen3_reranker))  # fmt: skip
    assert sent[0]["status"] == 200
    if qwen3_reranker:  # "<qq|" + 3 characters + ">" = 8 tokens
        assert json.loads(seen["body"]) == {"query": "qq", "documents": ["abc"]}
    else:
        assert seen["body"] == body


def test_scoring_middleware_answers_a_limit_that_leaves_no_room():
    body = json.dumps({"query": "q" * 10, "documents": ["d"], "truncate_prompt_tokens": 8})
    seen, sent = _call("/rerank", body.encode(), validator=ScoringRequestValidator,
                       app=_scoring_app(True))  # fmt: skip
    error = json.loads(sent[1]["body"])["error"]
    assert sent[0]["status"] == 400 and "body" not in seen
    assert error["param"] == "truncate_prompt_tokens" and "no room" in error["message"]


def _call(path: str, body: bytes, method: str = "POST", validator=EmbeddingRequestValidator,
          app=None):  # fmt: skip
    seen, sent = {}, []

    async def downstream(scope, receive, send):
        message = await receive()
        seen["body"] = message["body"]
        await send({"type": "http.response.start", "status": 200, "headers": []})

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": method, "path": path, "app": app}
    asyncio.run(validator(downstream)(scope, receive, send))
    return seen, sent


@pytest.mark.parametrize(
    ("model_config", "status"),
    [({"embedding_size": 64, "is_matryoshka": True}, 400),  # vLLM 0.32's ModelConfig
     ({"hf_config": types.SimpleNamespace(hidden_size=64), "is_matryoshka": True}, 400),  # 0.23
     ({"hf_config": types.SimpleNamespace(hidden_size=256), "is_matryoshka": True}, 200),
     ({"embedding_size": 64, "is_matryoshka": False}, 200), ({}, 200)],
)  # fmt: skip
def test_dimensions_bounded_by_the_served_model_on_vllm_0_23(model_config, status, monkeypatch):
    monkeypatch.setattr(compat, "rejects_negative_token_ids", lambda: False)
    config = types.SimpleNamespace(model_config=types.SimpleNamespace(**model_config))
    app = types.SimpleNamespace(state=types.SimpleNamespace(vllm_config=config))
    body = json.dumps({"input": "x", "dimensions": 100}).encode()
    seen, sent = _call("/v1/embeddings", body, app=app)
    assert sent[0]["status"] == status
    if status == 400:
        assert json.loads(sent[1]["body"])["error"] == {
            "message": "Model 'model' only supports dimensions in range [1, 64], got 100.",
            "type": "BadRequestError", "param": None, "code": 400}


def _raising_app(exc: Exception, after_start: bool = False):
    async def app(scope, receive, send):
        await receive()
        if after_start:
            await send({"type": "http.response.start", "status": 200, "headers": []})
        raise exc

    return app


@pytest.mark.parametrize(
    "validator", [EmbeddingRequestValidator, ScoringRequestValidator, GenerationRequestValidator]
)
@pytest.mark.parametrize(
    ("exc", "status"),
    [(ValueError("Token id 7 is out of vocabulary"), 400), (TypeError("bad type"), 400),
     (VLLMNotFoundError("The model `x` does not exist."), 404)],
)  # fmt: skip
def test_client_errors_vllm_raises_are_answered_not_reraised(validator, exc, status):
    """vLLM 0.23 raises these out of its handlers; its catch-all answer re-raises them (a
    traceback in the log per bad request, the connection closed). The validators answer them
    as vLLM does."""
    path = {EmbeddingRequestValidator: "/v1/embeddings", ScoringRequestValidator: "/rerank",
            GenerationRequestValidator: "/v1/completions"}[validator]  # fmt: skip
    sent = []

    async def receive():
        return {"type": "http.request", "body": b'{"input": "x", "query": "q"}'}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": path, "app": None}
    asyncio.run(validator(_raising_app(exc))(scope, receive, send))
    error = json.loads(sent[1]["body"])["error"]
    assert sent[0]["status"] == status == error["code"] and error["message"] == str(exc)


@pytest.mark.parametrize(
    ("exc", "after_start"), [(RuntimeError("engine bug"), False), (ValueError("late"), True)]
)
def test_server_errors_and_late_errors_still_propagate(exc, after_start):
    async def receive():
        return {"type": "http.request", "body": b'{"input": "x"}'}

    async def send(message):
        pass

    scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "app": None}
    app = EmbeddingRequestValidator(_raising_app(exc, after_start))
    with pytest.raises(type(exc)):
        asyncio.run(app(scope, receive, send))


def test_middleware_answers_400_without_calling_vllm():
    seen, sent = _call("/v1/embeddings", json.dumps({"input": ""}).encode())
    assert "body" not in seen
    assert sent[0]["status"] == 400
    assert json.loads(sent[1]["body"])["error"]["message"] == "input must not be an empty string"


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/embeddings", b'{"input": "ok"}'), ("/v1/embeddings", b"{broken"),
     ("/v1/completions", b'{"input": ""}')],
)  # fmt: skip
def test_middleware_passes_the_same_body_on(path, body):
    seen, sent = _call(path, body)
    assert seen["body"] == body
    assert sent[0]["status"] == 200


class _Engine:
    def __init__(self) -> None:
        self.errored = False


class _Downstream:
    """The wrapped app: answers after `answer_after` s (never when None), optionally streaming."""

    def __init__(self, engine: _Engine | None, answer_after: float | None, start_first=False):
        self.state = types.SimpleNamespace(engine_client=engine) if engine else object()
        self.answer_after = answer_after
        self.start_first = start_first
        self.called = False
        self.cancelled = False

    async def __call__(self, scope, receive, send):
        self.called = True
        try:
            if self.start_first:
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await asyncio.sleep(3600 if self.answer_after is None else self.answer_after)
            if not self.start_first:
                await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"answer"})
        except asyncio.CancelledError:
            self.cancelled = True
            raise


def _guarded(downstream: _Downstream, stop_after: float | None, calls: int = 1):
    """Runs `calls` requests through a fast ShutdownGuard; the engine stops after `stop_after`."""
    guard = ShutdownGuard(downstream)
    guard.poll_s, guard.grace_s, guard.cancel_wait_s = 0.01, 0.2, 0.1
    sent: list[list[dict]] = [[] for _ in range(calls)]

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def request(i: int):
        async def send(message):
            sent[i].append(message)

        scope = {"type": "http", "method": "POST", "path": "/v1/embeddings", "app": downstream}
        await guard(scope, receive, send)

    async def main():
        async def stop():
            if stop_after is not None:
                await asyncio.sleep(stop_after)
                downstream.state.engine_client.errored = True

        stopper = asyncio.ensure_future(stop())
        start = time.monotonic()
        await asyncio.wait_for(asyncio.gather(*(request(i) for i in range(calls))), timeout=10)
        elapsed = time.monotonic() - start
        await stopper
        return elapsed

    return asyncio.run(main()), sent


def _status(messages: list[dict]) -> int | None:
    starts = [m for m in messages if m["type"] == "http.response.start"]
    return starts[0]["status"] if starts else None


def test_guard_answers_503_when_the_engine_stops_under_a_waiting_request():
    downstream = _Downstream(_Engine(), answer_after=None)
    elapsed, sent = _guarded(downstream, stop_after=0.05, calls=3)
    assert elapsed < 2
    assert downstream.cancelled
    for messages in sent:
        assert _status(messages) == 503
        error = json.loads(messages[-1]["body"])["error"]
        assert error["message"] == SHUTDOWN_MESSAGE and error["code"] == 503


def test_guard_keeps_answers_that_finish_within_the_grace_period():
    downstream = _Downstream(_Engine(), answer_after=0.15)
    _, sent = _guarded(downstream, stop_after=0.05)
    assert _status(sent[0]) == 200 and sent[0][-1]["body"] == b"answer"
    assert not downstream.cancelled


def test_guard_passes_answers_through_while_the_engine_runs():
    downstream = _Downstream(_Engine(), answer_after=0.01)
    _, sent = _guarded(downstream, stop_after=None, calls=2)
    assert [_status(m) for m in sent] == [200, 200]


def test_guard_answers_503_at_once_after_the_engine_stopped():
    engine = _Engine()
    engine.errored = True
    downstream = _Downstream(engine, answer_after=0.01)
    elapsed, sent = _guarded(downstream, stop_after=None)
    assert _status(sent[0]) == 503 and not downstream.called
    assert elapsed < 0.5


def test_guard_sends_nothing_more_once_a_response_started():
    downstream = _Downstream(_Engine(), answer_after=None, start_first=True)
    _, sent = _guarded(downstream, stop_after=0.05)
    assert [m["type"] for m in sent[0]] == ["http.response.start"]
    assert downstream.cancelled


def test_guard_leaves_apps_without_an_engine_alone():
    downstream = _Downstream(None, answer_after=0.01)
    _, sent = _guarded(downstream, stop_after=None)
    assert _status(sent[0]) == 200 and downstream.called
