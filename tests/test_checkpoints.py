"""Which checkpoints count as Qwen3-Embedding (`vllm_npu_ext.checkpoints`), by name where their
files say nothing: a hub id not cached yet, a directory holding the weights alone."""

from __future__ import annotations

import json

import pytest

from vllm_npu_ext import checkpoints


@pytest.fixture
def nothing_cached(monkeypatch):
    monkeypatch.setattr(checkpoints, "_cached_hub_file", lambda *args: None)


@pytest.mark.parametrize(("model", "expected"), [
    ("Qwen/Qwen3-Embedding-0.6B", True), ("Qwen/Qwen3-Embedding-8B", True),
    ("Qwen/Qwen3-Reranker-0.6B", False), ("BAAI/bge-m3", False), ("Qwen/Qwen3-8B", False),
])  # fmt: skip
def test_a_hub_id_not_cached_counts_by_its_name(nothing_cached, model, expected):
    assert checkpoints.is_qwen3_embedding(model) is expected


@pytest.mark.parametrize(("name", "model_type", "expected"), [
    ("Qwen3-Embedding-0.6B", "qwen3", True),  # the weights alone, named as the repository
    ("Qwen3-Embedding-0.6B", "llama", False),  # named so, but not a Qwen3
    ("my-model", "qwen3", False),  # a Qwen3 without Sentence Transformers' last-token pooling
])  # fmt: skip
def test_a_directory_counts_by_its_config_and_then_its_name(tmp_path, name, model_type,
                                                            expected):  # fmt: skip
    model = tmp_path / name
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": model_type}))
    assert checkpoints.is_qwen3_embedding(str(model)) is expected


def test_a_named_directory_without_a_config_is_not_one(tmp_path):
    (tmp_path / "Qwen3-Embedding-0.6B").mkdir()
    assert checkpoints.is_qwen3_embedding(str(tmp_path / "Qwen3-Embedding-0.6B")) is False
