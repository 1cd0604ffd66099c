"""The models vLLM's pooling tests name, as local tiny checkpoints in an offline Hugging Face
hub cache (nothing can be downloaded here).

Each model the tests name maps to a random-weight Qwen3 checkpoint built by
`vllm_npu_ext.tiny_model`, shaped like the named model where the tests read its shape (hidden
size, number of labels) and pooled as its Sentence Transformers configuration pools (mean,
CLS or last token, normalised or not). Embedding models become `Qwen3ForCausalLM` checkpoints
(vLLM adapts them with `--runner pooling`, through this package's Qwen3); classifiers and
cross-encoders `Qwen3ForSequenceClassification` (vLLM's adapter over ours) with a random
`score` head. Only the Qwen3-Embedding-like checkpoint pools the last token, so only it is
recognised as Qwen3-Embedding by `vllm-npu-ext serve` (Matryoshka `dimensions`).

The cache layout is huggingface_hub's (`models--ORG--NAME/refs/main` and
`snapshots/COMMIT/...`): with HF_HUB_OFFLINE=1 vLLM, transformers and sentence-transformers
all resolve the name to the tiny checkpoint, and vLLM serves it under the name the test uses.
Models outside the mapping (multimodal, ColBERT) are not built: the tests that need them are
skipped with the reason (`skips.py`).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from vllm_npu_ext.tiny_model import EOS_TOKEN, make_tiny_model

ST_POOLING_MODES = ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens",
                    "weightedmean_tokens", "lasttoken")  # fmt: skip


@dataclass(frozen=True)
class Tiny:
    """How to build one tiny stand-in: an embedding model pooled by `pooling` (a Sentence
    Transformers mode), or a sequence classifier with `labels` (its id2label names)."""

    hidden_size: int = 128
    pooling: str | None = "mean_tokens"
    normalize: bool = True
    labels: tuple[str, ...] | None = None
    chat_template: str | None = None
    config: dict = field(default_factory=dict)


# Qwen's chat format (ChatML), as Qwen2.5's tokenizer config carries it.
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
          "message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


# Shapes: heads of 64 (32 for 128), two key/value heads, two layers, 2x intermediate. CLS
# pooling (bge, arctic) is degenerate on a causal decoder (the first token's state sees only
# the first token): their stand-ins pool the mean.
MODELS: dict[str, Tiny] = {
    "intfloat/multilingual-e5-small": Tiny(384, "mean_tokens"),
    "intfloat/e5-small": Tiny(384, "mean_tokens"),
    "sentence-transformers/all-MiniLM-L12-v2": Tiny(384, "mean_tokens"),
    "BAAI/bge-base-en-v1.5": Tiny(768, "mean_tokens"),
    "Snowflake/snowflake-arctic-embed-m-v1.5": Tiny(768, "mean_tokens"),
    "Snowflake/snowflake-arctic-embed-xs": Tiny(384, "mean_tokens"),
    "Qwen/Qwen3-Embedding-0.6B": Tiny(128, "lasttoken"),
    "jason9693/Qwen2.5-1.5B-apeach": Tiny(128, None, labels=("Default", "Spoiled"),
                                          chat_template=CHATML),
    "BAAI/bge-reranker-base": Tiny(128, None, labels=("LABEL_0",)),
    "cross-encoder/ms-marco-MiniLM-L-6-v2": Tiny(128, None, labels=("LABEL_0",)),
    "tomaarsen/Qwen3-Reranker-0.6B-seq-cls": Tiny(128, None, labels=("LABEL_0",)),
}


def build_hub_cache(hub: Path, models: dict[str, Tiny] = MODELS) -> dict[str, Path]:
    """Every model of `models` in huggingface_hub's cache layout under `hub`; returns the
    snapshot directory of each (built once: a snapshot that exists is kept)."""
    snapshots = {}
    for name, tiny in models.items():
        commit = hashlib.sha1(f"{name}:{tiny}".encode()).hexdigest()
        repo = hub / ("models--" + name.replace("/", "--"))
        snapshot = repo / "snapshots" / commit
        if not (snapshot / "model.safetensors").exists():
            build(snapshot, tiny)
        (repo / "refs").mkdir(parents=True, exist_ok=True)
        (repo / "refs" / "main").write_text(commit, encoding="utf-8")
        snapshots[name] = snapshot
    return snapshots


def build(directory: Path, tiny: Tiny) -> Path:
    heads = max(2, tiny.hidden_size // 64)
    shape = {"hidden_size": tiny.hidden_size, "num_attention_heads": heads,
             "head_dim": tiny.hidden_size // heads, "num_key_value_heads": 2,
             "intermediate_size": 2 * tiny.hidden_size, **tiny.config}  # fmt: skip
    if tiny.labels is None:
        make_tiny_model(directory, **shape)
        _sentence_transformers_pooling(directory, tiny)
    else:  # Qwen's tokenizer: nothing appended, so the pad token never ends an input
        make_tiny_model(directory, preset="reranker", **shape)
        _sequence_classifier(directory, tiny.labels, tiny.chat_template)
    return directory


def _sentence_transformers_pooling(directory: Path, tiny: Tiny) -> None:
    modules = json.loads((directory / "modules.json").read_text(encoding="utf-8"))
    if not tiny.normalize:
        modules = [module for module in modules if not module["type"].endswith("Normalize")]
    (directory / "modules.json").write_text(json.dumps(modules, indent=2), encoding="utf-8")
    pooling = {f"pooling_mode_{mode}": mode == tiny.pooling for mode in ST_POOLING_MODES}
    config = {"word_embedding_dimension": tiny.hidden_size, **pooling, "include_prompt": True}
    (directory / "1_Pooling" / "config.json").write_text(json.dumps(config, indent=2),
                                                         encoding="utf-8")  # fmt: skip


def _sequence_classifier(directory: Path, names: tuple[str, ...],
                         chat_template: str | None) -> None:
    """A Qwen3ForSequenceClassification: the config's architecture, labels and pad token (the
    one Hugging Face's class pools before), a random `score` head (no bias) as it loads it,
    and the chat template of a chat model (a cross-encoder has none: sentence-transformers
    formats pairs with one where there is one, vLLM does not)."""
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    labels = dict(enumerate(names))
    tokenizer = json.loads((directory / "tokenizer.json").read_text(encoding="utf-8"))
    pad_id = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == EOS_TOKEN)
    config.update(architectures=["Qwen3ForSequenceClassification"], num_labels=len(names),
                  id2label={str(i): n for i, n in labels.items()},
                  label2id={n: i for i, n in labels.items()}, pad_token_id=pad_id)  # fmt: skip
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True), encoding="utf-8")
    if chat_template is not None:
        path = directory / "tokenizer_config.json"
        tokenizer_config = json.loads(path.read_text(encoding="utf-8"))
        path.write_text(json.dumps({**tokenizer_config, "chat_template": chat_template},
                                   indent=2), encoding="utf-8")  # fmt: skip
    weights = load_file(str(directory / "model.safetensors"))
    generator = torch.Generator().manual_seed(len(names))
    dtype = weights["model.norm.weight"].dtype
    weights["score.weight"] = (torch.randn(len(names), config["hidden_size"],
                                           generator=generator) * 0.5).to(dtype)  # fmt: skip
    weights.pop("lm_head.weight", None)
    save_file(weights, str(directory / "model.safetensors"), metadata={"format": "pt"})
