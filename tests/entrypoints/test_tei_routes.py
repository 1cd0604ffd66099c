"""TEI's API on the servers the suite already runs (`vllm-npu-ext serve`, embedding and
reranker): the same numbers as vLLM's OpenAI and rerank routes, TEI's response and error
shapes checked against TEI v1.9.3's OpenAPI document (support/tei_openapi.py), TEI 1.9's
defaults (auto-truncate on), and the real TEI clients (huggingface_hub's InferenceClient,
LlamaIndex's TextEmbeddingsInference) unchanged against it. The server options (TEI limits,
`--auto-truncate false`, `--api-key`) are tests/entrypoints/test_plain_vllm_serve.py's.
"""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from support.loadgen import embed_batch, served_model
from support.stacks import EMULATED_SERVER
from support.tei_openapi import validate

from vllm_npu_ext.tiny_model import QWEN3_EMBEDDING_ST_CONFIG

TEXTS = ["What is the capital of France?", "a", "Paris is the capital of France. " * 3]
QUERY_PROMPT = QWEN3_EMBEDDING_ST_CONFIG["prompts"]["query"]
# One server, one batch composition, one engine: the two routes' vectors agree to float32
# rounding (vLLM 0.23's CPU float32 linear is not batch-invariant, FACTS.md).
SAME_ENGINE_ATOL = 1e-6
LONG_TEXT = "word " * 300  # more tokens than the test servers' 128
SERVER_FAILURE_MARKS = ("Exception in ASGI application", "Traceback (most recent call last)")


def _post(server, path: str, body, timeout: float = 120) -> httpx.Response:
    return httpx.post(server.base_url + path, json=body, timeout=timeout)


def _openai(server, texts, **extra):
    return torch.tensor(embed_batch(server.base_url, served_model(server.base_url), texts, **extra))


def _assert_tei_error(response: httpx.Response, status: int, kind: str, needle: str,
                      path: str = "/embed") -> None:  # fmt: skip
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}, body
    assert body["error_type"] == kind and needle in body["error"], body
    validate(path if path != "/" else "/embed", status, body)


@pytest.fixture(scope="module")
def embedding_model(embedding_server):
    return served_model(embedding_server.base_url)


@pytest.mark.parametrize("inputs", [TEXTS, TEXTS[0]], ids=["batch", "one string"])
def test_embed_equals_v1_embeddings(embedding_server, inputs):
    tei = torch.tensor(_post(embedding_server, "/embed", {"inputs": inputs}).json())
    texts = inputs if isinstance(inputs, list) else [inputs]
    assert tei.shape == (len(texts), tei.shape[1])
    torch.testing.assert_close(tei, _openai(embedding_server, texts), rtol=0,
                               atol=SAME_ENGINE_ATOL)  # fmt: skip


def test_embed_options_map_to_vllms(embedding_server):
    """normalize=false, dimensions, prompt_name and truncate: each as its vLLM counterpart."""
    raw = torch.tensor(_post(embedding_server, "/embed", {"inputs": TEXTS, "normalize": False,
                                                          "dimensions": 16}).json())  # fmt: skip
    expected = _openai(embedding_server, TEXTS, use_activation=False, dimensions=16)
    torch.testing.assert_close(raw, expected, rtol=0, atol=SAME_ENGINE_ATOL)
    assert raw.norm(dim=1).sub(1).abs().max() > 1e-3  # really unnormalised

    body = {"inputs": TEXTS[:1], "prompt_name": "query"}
    query = torch.tensor(_post(embedding_server, "/embed", body).json())
    prompted = _openai(embedding_server, [QUERY_PROMPT + TEXTS[0]])
    torch.testing.assert_close(query, prompted, rtol=0, atol=SAME_ENGINE_ATOL)
    assert (query - _openai(embedding_server, TEXTS[:1])).abs().max() > 1e-3

    for direction in ("right", "left"):
        cut = _post(embedding_server, "/embed", {"inputs": LONG_TEXT, "truncate": True,
                                                 "truncation_direction": direction})  # fmt: skip
        expected = _openai(embedding_server, [LONG_TEXT], truncate_prompt_tokens=-1,
                           truncation_side=direction)  # fmt: skip
        torch.testing.assert_close(torch.tensor(cut.json()), expected, rtol=0,
                                   atol=SAME_ENGINE_ATOL)  # fmt: skip


def test_similarity_is_the_cosine_of_the_embeddings(embedding_server):
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS}}
    scores = _post(embedding_server, "/similarity", body).json()
    vectors = _openai(embedding_server, [TEXTS[0], *TEXTS]).double()
    expected = torch.nn.functional.cosine_similarity(vectors[:1], vectors[1:])
    assert scores[0] == pytest.approx(1.0, abs=1e-6)
    torch.testing.assert_close(torch.tensor(scores, dtype=torch.float64), expected, rtol=0,
                               atol=1e-6)  # fmt: skip


def test_root_routes_by_model_type_and_body(embedding_server, reranker_server):
    embed = torch.tensor(_post(embedding_server, "/", {"inputs": TEXTS}).json())
    torch.testing.assert_close(
        embed, torch.tensor(_post(embedding_server, "/embed", {"inputs": TEXTS}).json()),
        rtol=0, atol=SAME_ENGINE_ATOL,
    )  # vLLM 0.23 rounds a row's last bits by the step's batch (docs/benchmarks.md)
    similarity = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    assert len(_post(embedding_server, "/", similarity).json()) == 2
    rerank = {"query": TEXTS[0], "texts": TEXTS}
    root, direct = (_post(reranker_server, path, rerank).json() for path in ("/", "/rerank"))
    assert [r["index"] for r in root] == [r["index"] for r in direct]
    assert [r["score"] for r in root] == pytest.approx([r["score"] for r in direct], abs=1e-6)
    assert httpx.get(embedding_server.base_url + "/", timeout=10).status_code == 200  # health


def test_tokenize_and_decode_use_the_servers_tokenizer(embedding_server, embedding_model):
    text = "héllo wörld"
    tokens = _post(embedding_server, "/tokenize", {"inputs": [text, TEXTS[0]]}).json()
    vllm = _post(embedding_server, "/tokenize", {"model": embedding_model, "prompt": text}).json()
    assert [t["id"] for t in tokens[0]] == vllm["tokens"]  # vLLM's own /tokenize still answers
    encoded = text.encode()
    for token in tokens[0]:
        if token["special"]:
            assert token["start"] is None and token["stop"] is None
        else:  # TEI's offsets are UTF-8 byte offsets
            assert token["text"] == encoded[token["start"] : token["stop"]].decode()
    assert any(t["special"] for t in tokens[0]) and not all(t["special"] for t in tokens[0])
    ids = [t["id"] for t in tokens[1] if not t["special"]]
    decoded = _post(embedding_server, "/decode", {"ids": [ids, ids[:2]]}).json()
    assert decoded[0] == TEXTS[0] and TEXTS[0].startswith(decoded[1])
    assert _post(embedding_server, "/decode", {"ids": ids}).json() == [TEXTS[0]]


def test_info_describes_the_served_model(embedding_server, reranker_server, embedding_model):
    """Valid against TEI's OpenAPI document (every field it requires, integers where it says
    so) and the server's real values: TEI's defaults for its router options."""
    info = httpx.get(embedding_server.base_url + "/info", timeout=10).json()
    validate("/info", 200, info, method="get")
    assert info["model_type"] == {"embedding": {"pooling": "last_token"}}
    assert info["served_model_name"] == embedding_model
    assert info["model_dtype"] == "float32" and info["max_input_length"] == 128
    assert info["max_client_batch_size"] == 32 and info["max_batch_requests"] > 0
    assert info["max_concurrent_requests"] == 512 and info["auto_truncate"] is True
    assert info["tokenization_workers"] == 1  # vLLM's one API server process tokenizes
    rerank_info = httpx.get(reranker_server.base_url + "/info", timeout=10).json()
    validate("/info", 200, rerank_info, method="get")
    assert set(rerank_info["model_type"]) == {"reranker"}


def test_rerank_equals_vllms_rerank(reranker_server):
    texts = ["Paris is the capital of France.", "Berlin is in Germany.", "cats and dogs"]
    query = "What is the capital of France?"
    tei = _post(reranker_server, "/rerank", {"query": query, "texts": texts,
                                             "return_text": True}).json()  # fmt: skip
    vllm = _post(reranker_server, "/rerank", {"model": reranker_server.model, "query": query,
                                              "documents": texts}).json()["results"]  # fmt: skip
    assert [r["score"] for r in tei] == sorted((r["score"] for r in tei), reverse=True)
    by_index = {r["index"]: r["relevance_score"] for r in vllm}
    # The same pairs, scored in two requests: fp32 CPU matmuls are not batch-invariant, and a
    # run gave 0.5024519562721252 against 0.5024518966674805 (1 ulp). Within 2^-20 relative.
    assert {r["index"]: r["score"] for r in tei} == pytest.approx(by_index, rel=2**-20, abs=0)
    assert all(r["text"] == texts[r["index"]] for r in tei)
    raw = _post(reranker_server, "/rerank", {"query": query, "texts": texts,
                                             "raw_scores": True}).json()  # fmt: skip
    for rank in raw:  # the logit whose sigmoid is the score
        p = by_index[rank["index"]]
        assert rank["score"] == pytest.approx(math.log(p / (1 - p)), abs=1e-5)
        assert "text" not in rank


@pytest.mark.parametrize("direction", ["right", "left"])
def test_rerank_truncates_documents_by_default_from_the_side_asked(reranker_server, direction):
    """TEI 1.9 truncates unless told not to; the document is cut (its start kept, or its end
    for `truncation_direction` left), the query and template stay whole, and the score is
    vLLM's for the cut the scoring validator makes (tests/reranker/test_server.py proves
    that cut against the model card)."""
    texts = [LONG_TEXT * 2, "short"]
    refused = _post(reranker_server, "/rerank", {"query": "q", "texts": texts, "truncate": False})
    _assert_tei_error(refused, 422, "Validation", "maximum context length", "/rerank")
    fitted = _post(reranker_server, "/rerank", {"query": "q", "texts": texts,
                                                "truncation_direction": direction})  # fmt: skip
    assert fitted.status_code == 200, fitted.text
    validate("/rerank", 200, fitted.json())
    vllm = _post(reranker_server, "/rerank", {
        "model": reranker_server.model, "query": "q", "documents": texts,
        "truncate_prompt_tokens": -1, "truncation_side": direction}).json()["results"]  # fmt: skip
    by_index = {r["index"]: r["relevance_score"] for r in vllm}
    assert {r["index"]: r["score"] for r in fitted.json()} == pytest.approx(by_index, rel=2**-20)


BAD_TEI_REQUESTS = [
    ("/embed", {"inputs": ""}, 400, "Empty", "cannot be empty"),
    ("/embed", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/embed", {"inputs": ["a"] * 33}, 422, "Validation", "batch size 33"),  # TEI 1.9's router
    ("/embed", {"inputs": LONG_TEXT, "truncate": False}, 422, "Validation",
     "maximum context length"),
    ("/embed", {"inputs": "a", "prompt_name": "nope"}, 422, "Validation", "Available prompts"),
    ("/embed", {"inputs": "a", "dimensions": 0}, 422, "Validation", "dimensions"),
    ("/embed", {"inputs": "a", "dimensions": 100000}, 422, "Validation", "dimensions"),
    ("/embed", {"inputs": [[1, 2, 10**9]]}, 422, "Validation", "vocabulary"),
    ("/embed", {"inputs": [[1, -2]]}, 422, "Validation", "negative"),
    ("/embed", {"inputs": "a", "normalize": "yes"}, 422, "Validation", "normalize"),
    ("/embed", {"texts": ["a"]}, 422, "Validation", "missing field `inputs`"),
    ("/embed", ["a"], 422, "Validation", "JSON object"),
    ("/embed", {"inputs": "a", "truncation_direction": "up"}, 422, "Validation", "left or right"),
    ("/similarity", {"inputs": {"source_sentence": "a", "sentences": []}}, 400, "Empty",
     "sentences"),
    ("/similarity", {"inputs": {"sentences": ["a"]}}, 422, "Validation", "source_sentence"),
    ("/tokenize", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/decode", {"ids": []}, 400, "Empty", "cannot be empty"),
    ("/decode", {"ids": [1, 10**9]}, 422, "Tokenizer", "token id"),
    ("/rerank", {"query": "a", "texts": ["b"]}, 424, "Backend",
     "Backend error: model is not a re-ranker model"),
    ("/predict", {"inputs": "a"}, 424, "Backend", "Backend error: Model is not a classifier model"),
    ("/embed_sparse", {"inputs": "a"}, 424, "Backend",
     "Backend error: Model is not an embedding model with SPLADE pooling"),
    ("/embed_all", {"inputs": []}, 400, "Empty", "cannot be empty"),
]


@pytest.mark.parametrize(("path", "body", "status", "kind", "needle"), BAD_TEI_REQUESTS,
                         ids=[f"{r[0]}-{r[2]}-{r[4]}" for r in BAD_TEI_REQUESTS])  # fmt: skip
def test_bad_tei_requests_get_teis_errors(embedding_server, path, body, status, kind, needle):
    _assert_tei_error(_post(embedding_server, path, body), status, kind, needle, path)


def test_bad_tei_requests_leave_the_servers_serving(embedding_server, reranker_server):
    malformed = httpx.post(embedding_server.base_url + "/embed", content=b"{bad", timeout=30,
                           headers={"content-type": "application/json"})  # fmt: skip
    _assert_tei_error(malformed, 422, "Validation", "not valid JSON")
    _assert_tei_error(_post(reranker_server, "/embed", {"inputs": "a"}), 424, "Backend",
                      "Backend error: Model is not an embedding model")  # fmt: skip
    _assert_tei_error(_post(reranker_server, "/rerank", {"query": "a", "texts": []}), 400,
                      "Empty", "`texts` cannot be empty")  # fmt: skip
    assert _post(embedding_server, "/embed", {"inputs": TEXTS}).status_code == 200
    assert _post(reranker_server, "/rerank", {"query": "a", "texts": ["b"]}).status_code == 200
    for server in (embedding_server, reranker_server):
        assert not any(mark in server.log_text() for mark in SERVER_FAILURE_MARKS)


def test_huggingface_hub_inference_client(embedding_server):
    """`InferenceClient(model=URL)` posts `{"inputs": ...}` to the URL itself (its
    hf-inference provider), i.e. TEI's `POST /`."""
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=embedding_server.base_url)
    vectors = torch.tensor(client.feature_extraction(TEXTS))
    torch.testing.assert_close(vectors, _openai(embedding_server, TEXTS), rtol=0,
                               atol=SAME_ENGINE_ATOL)  # fmt: skip
    scores = client.sentence_similarity(TEXTS[0], other_sentences=TEXTS[1:])
    body = {"inputs": {"source_sentence": TEXTS[0], "sentences": TEXTS[1:]}}
    expected = _post(embedding_server, "/similarity", body).json()
    assert scores == pytest.approx(expected, abs=1e-6)


def test_llama_index_text_embeddings_inference(embedding_server, embedding_model):
    """LlamaIndex's TEI embedding class posts `{"inputs": [...], "truncate": true}` to
    `/embed`, each text stripped (its `format_text`: no instruction for this model name)."""
    from llama_index.embeddings.text_embeddings_inference import TextEmbeddingsInference

    model = TextEmbeddingsInference(model_name=embedding_model, base_url=embedding_server.base_url,
                                    timeout=120)  # fmt: skip
    vectors = torch.tensor(model.get_text_embedding_batch(TEXTS))
    expected = _openai(embedding_server, [t.strip() for t in TEXTS], truncate_prompt_tokens=-1)
    torch.testing.assert_close(vectors, expected, rtol=0, atol=SAME_ENGINE_ATOL)
    query = torch.tensor(model.get_query_embedding(TEXTS[0]))
    torch.testing.assert_close(query, _openai(embedding_server, TEXTS[:1])[0], rtol=0,
                               atol=SAME_ENGINE_ATOL)  # fmt: skip


@EMULATED_SERVER
def test_embed_on_the_emulated_npu_path_equals_v1_embeddings(emulated_embedding_server):
    tei = torch.tensor(_post(emulated_embedding_server, "/embed", {"inputs": TEXTS}).json())
    torch.testing.assert_close(tei, _openai(emulated_embedding_server, TEXTS), rtol=0,
                               atol=SAME_ENGINE_ATOL)  # fmt: skip


def test_embed_truncates_long_inputs_by_default(embedding_server):
    """TEI 1.9's `--auto-truncate` default: no `truncate` field, the input is cut to the
    model's length from its end (`truncation_direction` left: from its start)."""
    for direction in ("right", "left"):
        cut = _post(embedding_server, "/embed", {"inputs": LONG_TEXT,
                                                 "truncation_direction": direction})  # fmt: skip
        assert cut.status_code == 200, cut.text
        expected = _openai(embedding_server, [LONG_TEXT], truncate_prompt_tokens=-1,
                           truncation_side=direction)  # fmt: skip
        torch.testing.assert_close(torch.tensor(cut.json()), expected, rtol=0,
                                   atol=SAME_ENGINE_ATOL)  # fmt: skip


def test_embed_all_returns_every_tokens_hidden_state(embedding_server, tiny_model_dir):
    """vLLM's token-embedding pooling: one unnormalised vector per prompt token (EOS
    included), whose last row is what /embed normalises (last-token pooling)."""
    response = _post(embedding_server, "/embed_all", {"inputs": TEXTS[:2]})
    assert response.status_code == 200, response.text
    validate("/embed_all", 200, response.json())
    tokens = _post(embedding_server, "/tokenize", {"inputs": TEXTS[:2]}).json()
    pooled = _openai(embedding_server, TEXTS[:2])
    for per_token, ids, vector in zip(response.json(), tokens, pooled, strict=True):
        per_token = torch.tensor(per_token)
        assert per_token.shape == (len(ids), pooled.shape[1])
        last = torch.nn.functional.normalize(per_token[-1], dim=0)
        torch.testing.assert_close(last, vector, rtol=0, atol=1e-5)
    assert int(response.headers["x-compute-tokens"]) == sum(len(ids) for ids in tokens)
    cut = torch.tensor(_post(embedding_server, "/embed_all", {"inputs": LONG_TEXT}).json()[0])
    assert cut.shape[0] == 128  # TEI's default auto-truncate, to --max-model-len
    torch.testing.assert_close(torch.nn.functional.normalize(cut[-1], dim=0),
                               _openai(embedding_server, [LONG_TEXT], truncate_prompt_tokens=-1)[0],
                               rtol=0, atol=1e-5)  # fmt: skip


def test_tei_answers_carry_timing_headers_and_match_the_document(embedding_server):
    response = _post(embedding_server, "/embed", {"inputs": TEXTS})
    validate("/embed", 200, response.json())
    headers = response.headers
    assert int(headers["x-compute-characters"]) == sum(len(t) for t in TEXTS)
    tokens = _post(embedding_server, "/tokenize", {"inputs": TEXTS}).json()
    assert int(headers["x-compute-tokens"]) == sum(len(row) for row in tokens)
    assert int(headers["x-total-time"]) >= 0 and headers["x-compute-type"] == "cpu"
    for path, body in (("/similarity", {"inputs": {"source_sentence": "a", "sentences": ["b"]}}),
                       ("/tokenize", {"inputs": "a"}), ("/decode", {"ids": [1, 2]})):
        validate(path, 200, _post(embedding_server, path, body).json())


def test_openai_route_alias_and_invocations(embedding_server, embedding_model):
    """TEI's `/embeddings` is its OpenAI route (vLLM's /v1/embeddings here); `/invocations`
    embeds on an embedding model, as TEI routes it."""
    alias = _post(embedding_server, "/embeddings", {"model": embedding_model, "input": TEXTS})
    assert alias.status_code == 200, alias.text
    vectors = torch.tensor([d["embedding"] for d in alias.json()["data"]])
    torch.testing.assert_close(vectors, _openai(embedding_server, TEXTS), rtol=0,
                               atol=SAME_ENGINE_ATOL)  # fmt: skip
    invoked = torch.tensor(_post(embedding_server, "/invocations", {"inputs": TEXTS}).json())
    torch.testing.assert_close(invoked, vectors, rtol=0, atol=SAME_ENGINE_ATOL)
    assert httpx.get(embedding_server.base_url + "/ping", timeout=10).status_code == 200


def test_predict_scores_pairs_on_the_reranker(reranker_server):
    texts = ["Paris is the capital of France.", "cats and dogs"]
    query = "What is the capital of France?"
    pairs = [[query, text] for text in texts]
    predicted = _post(reranker_server, "/predict", {"inputs": pairs})
    assert predicted.status_code == 200, predicted.text
    validate("/predict", 200, predicted.json())
    ranks = _post(reranker_server, "/rerank", {"query": query, "texts": texts}).json()
    by_index = {r["index"]: r["score"] for r in ranks}
    scores = [rows[0]["score"] for rows in predicted.json()]
    assert scores == pytest.approx([by_index[0], by_index[1]], rel=2**-20, abs=0)
    single = _post(reranker_server, "/predict", {"inputs": pairs[0]}).json()
    assert single[0]["score"] == pytest.approx(by_index[0], rel=2**-20, abs=0)
    invoked = _post(reranker_server, "/invocations", {"query": query, "texts": texts}).json()
    assert {r["index"]: r["score"] for r in invoked} == pytest.approx(by_index, rel=2**-20)
