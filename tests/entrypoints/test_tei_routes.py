"""TEI's API on the servers the suite already runs (`vllm-npu-ext serve`, embedding and
reranker): the same numbers as vLLM's OpenAI and rerank routes, TEI's response and error
shapes, and the real TEI clients (huggingface_hub's InferenceClient, LlamaIndex's
TextEmbeddingsInference) unchanged against it.
"""

from __future__ import annotations

import math

import httpx
import pytest
import torch
from support.loadgen import embed_batch, served_model

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


def _assert_tei_error(response: httpx.Response, status: int, kind: str, needle: str) -> None:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error", "error_type"}, body
    assert body["error_type"] == kind and needle in body["error"], body


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
    info = httpx.get(embedding_server.base_url + "/info", timeout=10).json()
    assert info["model_type"] == {"embedding": {"pooling": "last_token"}}
    assert info["served_model_name"] == embedding_model
    assert info["model_dtype"] == "float32" and info["max_input_length"] == 128
    assert info["max_client_batch_size"] == 32 and info["max_batch_requests"] > 0
    assert info["max_concurrent_requests"] is None  # vLLM has no such limit
    rerank_info = httpx.get(reranker_server.base_url + "/info", timeout=10).json()
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


def test_rerank_truncate_cuts_documents_to_fit(reranker_server):
    texts = [LONG_TEXT, "short"]
    too_long = _post(reranker_server, "/rerank", {"query": "q", "texts": texts})
    _assert_tei_error(too_long, 422, "Validation", "maximum context length")
    fitted = _post(reranker_server, "/rerank", {"query": "q", "texts": texts, "truncate": True})
    assert fitted.status_code == 200 and {r["index"] for r in fitted.json()} == {0, 1}


BAD_TEI_REQUESTS = [
    ("/embed", {"inputs": ""}, 400, "Empty", "cannot be empty"),
    ("/embed", {"inputs": []}, 400, "Empty", "cannot be empty"),
    ("/embed", {"inputs": ["a"] * 33}, 413, "Validation", "batch size 33"),
    ("/embed", {"inputs": LONG_TEXT}, 422, "Validation", "maximum context length"),
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
    ("/rerank", {"query": "a", "texts": ["b"]}, 424, "Backend", "not a re-ranker"),
]


@pytest.mark.parametrize(("path", "body", "status", "kind", "needle"), BAD_TEI_REQUESTS,
                         ids=[f"{r[0]}-{r[2]}-{r[4]}" for r in BAD_TEI_REQUESTS])  # fmt: skip
def test_bad_tei_requests_get_teis_errors(embedding_server, path, body, status, kind, needle):
    _assert_tei_error(_post(embedding_server, path, body), status, kind, needle)


def test_bad_tei_requests_leave_the_servers_serving(embedding_server, reranker_server):
    malformed = httpx.post(embedding_server.base_url + "/embed", content=b"{bad", timeout=30,
                           headers={"content-type": "application/json"})  # fmt: skip
    _assert_tei_error(malformed, 422, "Validation", "not valid JSON")
    _assert_tei_error(_post(reranker_server, "/embed", {"inputs": "a"}), 424, "Backend",
                      "not an embedding model")  # fmt: skip
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


def test_embed_on_the_emulated_npu_path_equals_v1_embeddings(emulated_embedding_server):
    tei = torch.tensor(_post(emulated_embedding_server, "/embed", {"inputs": TEXTS}).json())
    torch.testing.assert_close(tei, _openai(emulated_embedding_server, TEXTS), rtol=0,
                               atol=SAME_ENGINE_ATOL)  # fmt: skip
