"""End to end: `vllm-npu-ext serve --reranker` answers /rerank and /score like the model-card
oracle, on the platform path and (VLLM_NPU_EXT_EMULATE=1) on the emulated NPU path.

Servers (tests/conftest.py): `reranker_server`, started with no model (the built-in tiny
reranker) and no flag but --reranker, and `emulated_reranker_server` (untied embeddings, a
server-wide instruction).
"""

from __future__ import annotations

import httpx
import pytest
from support.loadgen import word_texts
from support.rerank_oracle import MAX_SCORE_DIFF, hf_rerank_scores
from support.rerank_servers import DOCUMENTS, QUERY, post, rerank_scores

ENDPOINTS = ["/rerank", "/v1/rerank", "/v2/rerank", "/score", "/v1/score"]
SERVERS = {"platform": "reranker_server", "emulated": "emulated_reranker_server"}
CASES = [("platform", path) for path in ENDPOINTS] + [("emulated", "/rerank"),
                                                       ("emulated", "/score")]  # fmt: skip


# vLLM runs each pair of a rerank request as its own engine request, so equal pairs of one
# request may share a step with different neighbours. vLLM's CPU float32 linear (oneDNN,
# `dispatch_cpu_unquantized_gemm`) rounds a row by its place in the batch and the batch's size
# (measured on vLLM 0.23: a row of a [m, 128] x [128, 384] product differs in its last bits
# from the same row in a batch of 700; not on 0.32), so such pairs agree to float32 rounding,
# not to the bit; stock vLLM the same. Seen: 1 ulp (6e-8) at a score near 0.5.
SAME_PAIR_DIFF = 1e-6


def _server(request, name: str):
    return request.getfixturevalue(SERVERS[name])


def oracle(server, query: str, documents: list[str], instruction: str | None = None):
    return hf_rerank_scores(server.model_dir, query, documents, instruction or server.instruction)


def max_diff(got: list[float], expected: list[float]) -> float:
    return max(abs(a - b) for a, b in zip(got, expected, strict=True))


@pytest.mark.parametrize(("server_name", "path"), CASES)
def test_scores_match_the_model_card_oracle(request, server_name, path):
    server = _server(request, server_name)
    diff = max_diff(rerank_scores(server, QUERY, DOCUMENTS, path), oracle(server, QUERY, DOCUMENTS))
    print(f"{server_name} {path}: max |score - oracle| = {diff:.3g}")
    assert diff <= MAX_SCORE_DIFF


@pytest.mark.parametrize("server_name", SERVERS)
def test_rerank_top_n_returns_the_best_documents_sorted_with_their_text(request, server_name):
    server = _server(request, server_name)
    body = {"query": QUERY, "documents": DOCUMENTS, "top_n": 3, "return_documents": True}
    response = post(server, "/rerank", body)
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    expected = oracle(server, QUERY, DOCUMENTS)
    best = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])[:3]
    assert [r["index"] for r in results] == best
    for result in results:
        assert result["document"]["text"] == DOCUMENTS[result["index"]]
        assert abs(result["relevance_score"] - expected[result["index"]]) <= MAX_SCORE_DIFF


@pytest.mark.parametrize("count", [1, 2, 50])
def test_rerank_sorts_mixed_length_documents_by_score(reranker_server, count):
    documents = word_texts(count, seed=count, min_words=1, max_words=150)
    if count == 50:
        documents[40] = documents[3]  # the same pair twice in one request
    response = post(reranker_server, "/rerank", {"query": QUERY, "documents": documents})
    assert response.status_code == 200, response.text
    results = response.json()["results"]
    scores = [r["relevance_score"] for r in results]
    assert scores == sorted(scores, reverse=True)
    assert sorted(r["index"] for r in results) == list(range(count))
    by_index = [r["relevance_score"] for r in sorted(results, key=lambda r: r["index"])]
    assert max_diff(by_index, oracle(reranker_server, QUERY, documents)) <= MAX_SCORE_DIFF
    if count == 50:
        assert abs(by_index[40] - by_index[3]) <= SAME_PAIR_DIFF


def test_the_same_pair_always_gets_the_same_score(reranker_server):
    """No prefix cache: a repeated pair scores identically alone, and within float32 rounding
    of vLLM's CPU linear in another batch (`SAME_PAIR_DIFF`)."""
    alone = rerank_scores(reranker_server, QUERY, DOCUMENTS[:1])
    again = rerank_scores(reranker_server, QUERY, DOCUMENTS[:1])
    batched = rerank_scores(reranker_server, QUERY, [*DOCUMENTS, DOCUMENTS[0]])
    assert alone == again
    assert abs(batched[0] - alone[0]) <= SAME_PAIR_DIFF
    assert abs(batched[0] - batched[-1]) <= SAME_PAIR_DIFF


@pytest.mark.parametrize("field", ["instruction", "chat_template_kwargs"])
@pytest.mark.parametrize("server_name", SERVERS)
def test_per_request_instruction_overrides_the_servers(request, server_name, field):
    server = _server(request, server_name)
    instruction = "Given a city, find passages about its rivers"
    extra = ({"instruction": instruction} if field == "instruction"
             else {"chat_template_kwargs": {"instruction": instruction}})  # fmt: skip
    got = rerank_scores(server, QUERY, DOCUMENTS[:3], **extra)
    assert max_diff(got, oracle(server, QUERY, DOCUMENTS[:3], instruction)) <= MAX_SCORE_DIFF
    assert max_diff(got, oracle(server, QUERY, DOCUMENTS[:3])) > 1e-4


@pytest.mark.parametrize("server_name", SERVERS)
def test_served_by_our_model_cache_free(request, server_name):
    log = _server(request, server_name).log_text()
    assert ("vllm-npu-ext built Qwen3ForSequenceClassification "
            "(vllm_npu_ext.model_executor.models.qwen3.Qwen3ForCausalLM)") in log  # fmt: skip
    assert "attention: cache-free causal (no KV cache)" in log
    npu = "backend: NPU path (torch_npu emulator" in log
    assert npu == (server_name == "emulated")


TOO_LONG = "word " * 2000
BAD_REQUESTS = {
    "empty query": ("/rerank", {"query": "", "documents": ["a"]}),
    "empty document list": ("/rerank", {"query": "q", "documents": []}),
    "non-string documents": ("/rerank", {"query": "q", "documents": [1, 2]}),
    "document object": ("/rerank", {"query": "q", "documents": [{"text": "a"}]}),
    "query list": ("/rerank", {"query": ["q"], "documents": ["a"]}),
    "negative top_n": ("/rerank", {"query": "q", "documents": ["a"], "top_n": -1}),
    "pair longer than max-model-len": ("/rerank", {"query": "q", "documents": ["a", TOO_LONG]}),
    "truncation above max-model-len": (
        "/rerank", {"query": "q", "documents": ["a"], "truncate_prompt_tokens": 10_000}
    ),
    "truncation leaving no room for the document": (
        "/rerank", {"query": QUERY * 3, "documents": ["a"], "truncate_prompt_tokens": 20}
    ),
    "score: empty query": ("/score", {"queries": "", "documents": ["a"]}),
    "score: empty documents": ("/v1/score", {"queries": "q", "documents": []}),
    "score: too long": ("/score", {"text_1": TOO_LONG, "text_2": "a"}),
    "score: mismatched lists": ("/score", {"queries": ["a", "b"], "documents": ["c", "d", "e"]}),
}


@pytest.mark.parametrize("case", BAD_REQUESTS)
def test_bad_input_gets_400_and_server_keeps_serving(reranker_server, case):
    path, body = BAD_REQUESTS[case]
    response = post(reranker_server, path, body)
    assert response.status_code == 400, response.text
    assert response.json()["error"]["message"]
    got = rerank_scores(reranker_server, QUERY, DOCUMENTS[:2])
    assert max_diff(got, oracle(reranker_server, QUERY, DOCUMENTS[:2])) <= MAX_SCORE_DIFF


def test_max_tokens_per_doc_keeps_the_prompt_whole(reranker_server):
    """The way to fit long documents: vLLM cuts the document before templating (at a token
    boundary of the text), so the pair scores like the model card on the kept text."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reranker_server.model_dir)
    body = {"query": QUERY, "documents": [TOO_LONG], "max_tokens_per_doc": 100}
    response = post(reranker_server, "/rerank", body)
    assert response.status_code == 200, response.text
    offsets = tokenizer(TOO_LONG, add_special_tokens=False,
                        return_offsets_mapping=True)["offset_mapping"]  # fmt: skip
    kept = TOO_LONG[: min(offsets[99][1], offsets[100][0])]
    expected = oracle(reranker_server, QUERY, [kept])[0]
    assert abs(response.json()["results"][0]["relevance_score"] - expected) <= MAX_SCORE_DIFF


def _kept_by_prompt_limit(model_dir, query: str, document: str, limit: int, side: str) -> str:
    """The longest start (side "right") or end ("left") of `document`, cut at a token
    boundary of its text, whose model-card prompt has at most `limit` tokens: found by
    scanning every cut, independently of the package's fitting loop."""
    from support.rerank_oracle import model_card_prompt
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    offsets = tokenizer(document, add_special_tokens=False,
                        return_offsets_mapping=True)["offset_mapping"]  # fmt: skip
    for keep in range(len(offsets), 0, -1):
        cut = document[: offsets[keep - 1][1]] if side == "right" else \
            document[offsets[len(offsets) - keep][0]:]  # fmt: skip
        if len(tokenizer(model_card_prompt(query, cut))["input_ids"]) <= limit:
            return cut
    raise AssertionError("no cut fits")


LONG_DOCUMENT = " ".join(word_texts(1, 7, 700, 700)[0].split()[:700])


@pytest.mark.parametrize(("path", "side", "limit"),
                         [("/rerank", "right", 120), ("/rerank", "left", 120),
                          ("/score", "right", 97), ("/v1/rerank", "right", -1)])  # fmt: skip
def test_truncate_prompt_tokens_cuts_the_document_and_keeps_the_prompt(reranker_server, path,
                                                                       side, limit):  # fmt: skip
    """Qwen3-Reranker with `truncate_prompt_tokens`: the document is cut (its start kept, or
    its end with truncation_side "left") so that the whole prompt, template and query
    included, fits the limit (-1: --max-model-len); the score is the model card's on the
    kept text."""
    from support.rerank_servers import MAX_MODEL_LEN

    tokens = MAX_MODEL_LEN if limit == -1 else limit
    extra = {"truncate_prompt_tokens": limit, "truncation_side": side}
    body = ({"queries": QUERY, "documents": [LONG_DOCUMENT, "short"], **extra}
            if path.endswith("score") else
            {"query": QUERY, "documents": [LONG_DOCUMENT, "short"], **extra})  # fmt: skip
    response = post(reranker_server, path, body)
    assert response.status_code == 200, response.text
    kept = _kept_by_prompt_limit(reranker_server.model_dir, QUERY, LONG_DOCUMENT, tokens, side)
    assert 0 < len(kept) < len(LONG_DOCUMENT)
    expected = oracle(reranker_server, QUERY, [kept, "short"])
    got = rerank_scores(reranker_server, QUERY, [kept, "short"], path)
    answer = response.json()
    scores = ([d["score"] for d in sorted(answer["data"], key=lambda d: d["index"])]
              if path.endswith("score") else
              [r["relevance_score"] for r in sorted(answer["results"],
                                                    key=lambda r: r["index"])])  # fmt: skip
    assert max_diff(scores, expected) <= MAX_SCORE_DIFF
    assert max_diff(scores, got) <= SAME_PAIR_DIFF
    assert answer["usage"]["prompt_tokens"] <= 2 * tokens


def test_malformed_json_gets_400(reranker_server):
    response = httpx.post(
        f"{reranker_server.base_url}/rerank", content=b'{"query": "q", "documents": [',
        headers={"content-type": "application/json"}, timeout=30,
    )  # fmt: skip
    assert response.status_code == 400
