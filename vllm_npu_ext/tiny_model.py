"""Deterministic random-weight Qwen3 checkpoints with an offline-trained tokenizer.

No model hub is reachable from our machines, so tests and benchmarks build their own
checkpoints: real safetensors, a config laid out like Qwen3-Embedding's, and a byte-level BPE
tokenizer trained on a built-in corpus and set up like Qwen3-Embedding's (EOS
`<|endoftext|>` appended by the post-processor, left padding). The reranker presets set the
tokenizer up like Qwen3-Reranker's instead: nothing appended, `<think>`/`</think>` as single
tokens, and "yes"/"no" in the vocabulary (the tokens the reranker's score compares). The
same arguments always give byte-identical files.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors.torch import save_file

from vllm_npu_ext.envs import cache_dir

EOS_TOKEN = "<|endoftext|>"
DEFAULT_MODEL_NAME = "tiny-qwen3"  # what `vllm-npu-ext serve` calls the built-in model
DEFAULT_RERANKER_NAME = "tiny-qwen3-reranker"  # ... and the built-in reranker
CHAT_EOS_TOKEN = "<|im_end|>"  # Qwen3-Reranker's (a chat model's) EOS
SPECIAL_TOKENS = [EOS_TOKEN, "<|im_start|>", CHAT_EOS_TOKEN]
THINK_TOKENS = ["<think>", "</think>"]
ANSWER_TOKENS = ("no", "yes")  # Qwen3-Reranker's classifier_from_token

# Layer shapes. `0.6b` is Qwen3-Embedding-0.6B's; its vocabulary is our tokenizer's, not
# Qwen's 151k (per-token compute does not depend on it).
PRESETS: dict[str, dict] = {
    "tiny": {
        "hidden_size": 128,
        "intermediate_size": 256,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "max_position_embeddings": 2048,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
        "tokenizer_vocab_size": 2048,
    },
    "0.6b": {
        "hidden_size": 1024,
        "intermediate_size": 3072,
        "num_hidden_layers": 28,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "tokenizer_vocab_size": 8192,
    },
}
# Qwen3-Reranker-0.6B has Qwen3-Embedding-0.6B's shapes; its tokenizer appends nothing.
PRESETS["reranker"] = {**PRESETS["tiny"], "reranker": True}
PRESETS["reranker-0.6b"] = {**PRESETS["0.6b"], "reranker": True}
# Context-parallel decode checks: one KV head, so that DCP 2 fits TP 2 (vLLM: dcp <= tp //
# num_key_value_heads), head_dim 128 in bfloat16 (vllm-ascend's TND attention), weights drawn
# wide so that greedy decoding walks through many tokens.
PRESETS["cp"] = {**PRESETS["tiny"], "num_key_value_heads": 1, "head_dim": 128,
                 "torch_dtype": "bfloat16", "initializer_range": 0.3}  # fmt: skip
TOKENIZER_KEYS = ("tokenizer_vocab_size", "reranker")

_WORD_LIST = (
    "the of and to in is was for on that with as by at from his her an which be this are or "
    "had not but were have one all their there been has when who more will would no if out so "
    "said what up its about into than them can only other new some could time these two may "
    "then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very make world still own see men work long get "
    "here between both life being under never day same another know while last might us great "
    "old year off come since against go came right used take three embedding vector search "
    "query document retrieval ranking model token sequence attention layer norm kernel device "
    "memory latency throughput batch cache tensor matrix rotary residual fused operator graph "
    "Ascend NPU server request response cluster parallel context decode prefill pooling"
)


def corpus(num_sentences: int = 4000, seed: int = 0) -> list[str]:
    """A deterministic English-like corpus with digits and punctuation."""
    rng = random.Random(seed)
    words_available = _WORD_LIST.split()
    sentences = []
    for _ in range(num_sentences):
        words = [rng.choice(words_available) for _ in range(rng.randint(4, 24))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 99999)))
        sentence = " ".join(words)
        sentences.append(sentence[0].upper() + sentence[1:] + rng.choice(".?!,;:"))
    return sentences


def build_tokenizer(vocab_size: int, reranker: bool = False):
    """A byte-level BPE tokenizer (any text encodes, no unknown tokens).

    Embedding presets append EOS. Reranker presets append nothing, add `THINK_TOKENS` as
    special tokens and also train on lines that start with "yes"/"no", so that both are
    tokens of their own (without the word-start marker), as in Qwen's vocabulary, and on the
    reranker's prompt, so that it takes about as many tokens as with Qwen's tokenizer
    (benchmarks depend on its length: vLLM's prefix cache reuses whole 128-token blocks).
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + (THINK_TOKENS if reranker else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    extra = _reranker_lines() if reranker else []
    tokenizer.train_from_iterator(corpus() + extra, trainer=trainer)
    if reranker:
        missing = [word for word in ANSWER_TOKENS if tokenizer.token_to_id(word) is None]
        if missing:
            raise RuntimeError(f"the reranker tokenizer lacks the tokens {missing}")
        return tokenizer
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS_TOKEN}:0",
        pair=f"$A:0 {EOS_TOKEN}:0 $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, eos_id)],
    )
    return tokenizer


def _reranker_lines() -> list[str]:
    from vllm_npu_ext import reranker

    prompt = reranker.prompt("", "").replace("<|im_start|>", "").replace("<|im_end|>", "")
    return [f"{word}\n" for word in ANSWER_TOKENS] * 200 + [prompt] * 50


def _tokenizer_config(reranker: bool) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        # Qwen3-Reranker ends turns with <|im_end|> and pads with <|endoftext|>.
        "eos_token": CHAT_EOS_TOKEN if reranker else EOS_TOKEN,
        "pad_token": EOS_TOKEN,
        "padding_side": "left",
        "model_max_length": 131072,
        "clean_up_tokenization_spaces": False,
        "additional_special_tokens": SPECIAL_TOKENS[1:] + (THINK_TOKENS if reranker else []),
    }


def model_config(preset: str, vocab_size: int, eos_id: int, **overrides) -> dict:
    """A config.json dict laid out like Qwen3-Embedding's (and Qwen3-Reranker's)."""
    shapes = {k: v for k, v in PRESETS[preset].items() if k not in TOKENIZER_KEYS}
    config = {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "attention_bias": False,
        "attention_dropout": 0.0,
        "bos_token_id": eos_id,
        "eos_token_id": eos_id,
        "hidden_act": "silu",
        "initializer_range": 0.02,
        "max_window_layers": shapes["num_hidden_layers"],
        "rms_norm_eps": 1e-6,
        "rope_scaling": None,
        "rope_theta": 1000000,
        "sliding_window": None,
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab_size,
        **shapes,
    }
    unknown = set(overrides) - set(config)
    if unknown:
        raise ValueError(f"unknown config overrides: {sorted(unknown)}")
    config.update(overrides)
    return config


def random_weights(config: dict, seed: int) -> dict[str, torch.Tensor]:
    """Qwen3 weights under Hugging Face names; norm scales vary around 1.

    With `attention_bias` the q/k/v/o projections get biases too (as Hugging Face's Qwen3
    builds them), drawn like the weights."""
    generator = torch.Generator().manual_seed(seed)
    dtype = getattr(torch, config["torch_dtype"])
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    head_dim = config["head_dim"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim
    std = config["initializer_range"]

    def normal(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, generator=generator) * std).to(dtype)

    def norm_scale(size: int) -> torch.Tensor:
        return (1.0 + 0.1 * torch.randn(size, generator=generator)).to(dtype)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        weights.update(
            {
                p + "input_layernorm.weight": norm_scale(hidden),
                p + "post_attention_layernorm.weight": norm_scale(hidden),
                p + "self_attn.q_proj.weight": normal(q_size, hidden),
                p + "self_attn.k_proj.weight": normal(kv_size, hidden),
                p + "self_attn.v_proj.weight": normal(kv_size, hidden),
                p + "self_attn.o_proj.weight": normal(hidden, q_size),
                p + "self_attn.q_norm.weight": norm_scale(head_dim),
                p + "self_attn.k_norm.weight": norm_scale(head_dim),
                p + "mlp.gate_proj.weight": normal(inter, hidden),
                p + "mlp.up_proj.weight": normal(inter, hidden),
                p + "mlp.down_proj.weight": normal(hidden, inter),
            }
        )
        if config["attention_bias"]:  # Hugging Face's Qwen3 then biases q, k, v and o
            for name, size in (("q", q_size), ("k", kv_size), ("v", kv_size), ("o", hidden)):
                weights[f"{p}self_attn.{name}_proj.bias"] = normal(size)
    weights["model.norm.weight"] = norm_scale(hidden)
    if not config["tie_word_embeddings"]:
        weights["lm_head.weight"] = normal(config["vocab_size"], hidden)
    return weights


def make_tiny_model(
    output_dir: str | os.PathLike, preset: str = "tiny", seed: int = 0, **overrides
) -> Path:
    """Write a random-weight Qwen3 checkpoint and tokenizer to `output_dir`.

    `overrides` replace config.json fields (e.g. `num_key_value_heads=4`,
    `tie_word_embeddings=False`) for tests that need other shapes.
    """
    if preset not in PRESETS:
        raise ValueError(f"preset must be one of {sorted(PRESETS)}, got {preset!r}")
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    reranker = PRESETS[preset].get("reranker", False)
    tokenizer = build_tokenizer(PRESETS[preset]["tokenizer_vocab_size"], reranker)
    # Round the embedding table up to a multiple of 64, as Qwen's checkpoints do.
    vocab_size = -(-tokenizer.get_vocab_size() // 64) * 64
    eos_id = tokenizer.token_to_id(CHAT_EOS_TOKEN if reranker else EOS_TOKEN)
    config = model_config(preset, vocab_size, eos_id, **overrides)
    _check_shapes(config)

    tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", _tokenizer_config(reranker))
    _write_json(out / "config.json", config)
    _write_json(
        out / "generation_config.json",
        {"bos_token_id": config["bos_token_id"], "eos_token_id": config["eos_token_id"]},
    )
    if not reranker:
        _write_sentence_transformers_files(out, config["hidden_size"])
    weights = random_weights(config, seed)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    return out


def _write_sentence_transformers_files(out: Path, hidden_size: int) -> None:
    """Qwen3-Embedding's Sentence Transformers files: its prompts, and the module list that
    pools the last token and normalises (what `checkpoints.is_qwen3_embedding` reads)."""
    _write_json(out / ST_CONFIG, QWEN3_EMBEDDING_ST_CONFIG)
    layout = (("", "Transformer"), ("1_Pooling", "Pooling"), ("2_Normalize", "Normalize"))
    modules = [{"idx": i, "name": str(i), "path": path,
                "type": f"sentence_transformers.models.{kind}"}
               for i, (path, kind) in enumerate(layout)]  # fmt: skip
    (out / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    (out / "1_Pooling").mkdir(exist_ok=True)
    pooling = {f"pooling_mode_{mode}": mode == "lasttoken"
               for mode in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                            "weightedmean_tokens", "lasttoken")}  # fmt: skip
    _write_json(out / "1_Pooling" / "config.json",
                {"word_embedding_dimension": hidden_size, **pooling, "include_prompt": True})


def _check_shapes(config: dict) -> None:
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    if heads % kv_heads:
        raise ValueError(
            f"num_attention_heads ({heads}) must be a multiple of num_key_value_heads ({kv_heads})"
        )


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


# Qwen3-Embedding's Sentence Transformers config: the query prompt TEI's `prompt_name` names.
ST_CONFIG = "config_sentence_transformers.json"
QWEN3_EMBEDDING_ST_CONFIG = {
    "prompts": {
        "query": "Instruct: Given a web search query, retrieve relevant passages that answer "
        "the query\nQuery:",
        "document": "",
    },
    "default_prompt_name": None,
    "similarity_fn_name": "cosine",
}

# preset -> the built-in model's directory name (and served name)
DEFAULT_MODELS = {"tiny": DEFAULT_MODEL_NAME, "reranker": DEFAULT_RERANKER_NAME}


def default_model_dir(preset: str = "tiny") -> Path:
    """Where `vllm-npu-ext serve` keeps the built-in tiny model (`--reranker`: the reranker)."""
    if preset not in DEFAULT_MODELS:
        raise ValueError(f"preset must be one of {sorted(DEFAULT_MODELS)}, got {preset!r}")
    return cache_dir() / DEFAULT_MODELS[preset]


def ensure_default_model(preset: str = "tiny") -> Path:
    """The built-in tiny model of `preset`, created on first use."""
    path = default_model_dir(preset)
    if (path / "model.safetensors").exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=path.name + ".", dir=path.parent))
    make_tiny_model(tmp, preset=preset)
    shutil.rmtree(path, ignore_errors=True)  # a partial earlier attempt
    try:
        os.replace(tmp, path)
    except OSError:  # another process finished first; its files are identical
        shutil.rmtree(tmp, ignore_errors=True)
    return path
