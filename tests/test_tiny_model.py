"""The built-in checkpoints: deterministic, Qwen3-Embedding-like config and tokenizer."""

from __future__ import annotations

import hashlib
import json

import pytest

from vllm_npu_ext.tiny_model import EOS_TOKEN, PRESETS, make_tiny_model


def _digests(path):
    """sha256 of every file under `path` (Sentence Transformers' module folders included)."""
    return {str(f.relative_to(path)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file()}


def test_same_arguments_give_identical_files(tmp_path, tiny_model_dir):
    again = make_tiny_model(tmp_path / "again")
    assert _digests(again) == _digests(tiny_model_dir)
    other_seed = make_tiny_model(tmp_path / "seed1", seed=1)
    assert _digests(other_seed)["model.safetensors"] != _digests(again)["model.safetensors"]


def test_tokenizer_appends_eos_and_pads_left(tiny_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tokenizer("Hello world")["input_ids"]
    assert tokenizer.convert_ids_to_tokens(ids[-1]) == EOS_TOKEN
    assert tokenizer.padding_side == "left"
    batch = tokenizer(["a", "a longer text here"], padding=True)
    assert batch["attention_mask"][0][0] == 0  # padding comes first
    assert tokenizer.decode(tokenizer("unseen wörds ✓")["input_ids"][:-1]) == "unseen wörds ✓"


def test_config_has_qwen3_embedding_layout(tiny_model_dir):
    config = json.loads((tiny_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"] and config["model_type"] == "qwen3"
    assert config["vocab_size"] % 64 == 0
    shapes = {k: PRESETS["0.6b"][k] for k in ("hidden_size", "num_hidden_layers", "head_dim")}
    assert shapes == {"hidden_size": 1024, "num_hidden_layers": 28, "head_dim": 128}


def test_bad_arguments_raise(tmp_path):
    with pytest.raises(ValueError, match="preset"):
        make_tiny_model(tmp_path / "x", preset="7b")
    with pytest.raises(ValueError, match="unknown config overrides"):
        make_tiny_model(tmp_path / "x", hidden=3)
    with pytest.raises(ValueError, match="multiple of num_key_value_heads"):
        make_tiny_model(tmp_path / "x", num_key_value_heads=3)


@pytest.mark.parametrize("preset", ["reranker", "reranker-0.6b"])
def test_reranker_presets_have_qwen3_reranker_tokens(preset):
    from vllm_npu_ext.tiny_model import PRESETS, build_tokenizer

    tokenizer = build_tokenizer(PRESETS[preset]["tokenizer_vocab_size"], reranker=True)
    for token in ("no", "yes", "<think>", "</think>", "<|im_start|>", "<|im_end|>"):
        assert tokenizer.token_to_id(token) is not None, token
    # Nothing appended (Qwen3-Reranker's tokenizer adds no special tokens).
    assert tokenizer.encode("yes").tokens == ["yes"]
    # The prompt's shared part is about as long as with Qwen's tokenizer (~60 tokens).
    from vllm_npu_ext import reranker

    assert len(tokenizer.encode(reranker.prompt("", "")).ids) < 80


def test_reranker_checkpoint_layout(reranker_model_dir):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reranker_model_dir)
    config = json.loads((reranker_model_dir / "config.json").read_text())
    assert config["architectures"] == ["Qwen3ForCausalLM"]
    assert config["eos_token_id"] == tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert tokenizer.eos_token == "<|im_end|>" and tokenizer.padding_side == "left"
    tokens = tokenizer.convert_ids_to_tokens(tokenizer("<think>\n\n</think>")["input_ids"])
    assert (tokens[0], tokens[-1]) == ("<think>", "</think>")


def test_attention_bias_gives_every_attention_projection_the_bias_hf_loads(tmp_path):
    from safetensors.torch import load_file
    from transformers import AutoModel

    model_dir = make_tiny_model(tmp_path / "bias", attention_bias=True)
    weights = load_file(str(model_dir / "model.safetensors"))
    names = {name for name in weights if name.endswith(".bias")}
    assert names == {
        f"model.layers.{i}.self_attn.{p}_proj.bias" for i in range(2) for p in ("q", "k", "v", "o")
    }
    model = AutoModel.from_pretrained(str(model_dir))  # no randomly initialised leftovers
    o_bias = model.layers[0].self_attn.o_proj.bias
    assert o_bias is not None and o_bias.equal(weights["model.layers.0.self_attn.o_proj.bias"])
