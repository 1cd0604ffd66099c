"""What kind of checkpoint a model is, read from its files (a directory, or a hub id's files
already in the local Hugging Face cache; nothing is downloaded here).

Qwen3-Embedding is recognised by what its repositories ship: a Qwen3 config (`model_type`
"qwen3", `Qwen3ForCausalLM`) with a Sentence Transformers pooling module that pools the last
token (`1_Pooling/config.json`: `"pooling_mode_lasttoken": true`, listed in `modules.json`),
which is how Qwen3-Embedding-0.6B/4B/8B are packaged. A Qwen3 checkpoint without those files
counts when it is named like them (`Qwen3-Embedding-*`, e.g. a copy of the weights alone in
`/models/Qwen3-Embedding-0.6B`), and so does a hub id of that name whose files are not cached
yet. Other Qwen3 checkpoints (a generative Qwen3, a Qwen3-Reranker, a fine-tune pooled
otherwise) are not: Matryoshka `dimensions` are for models trained with them.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

QWEN3_EMBEDDING_NAME = re.compile(r"(^|[/\\])Qwen3-Embedding-[^/\\]*$", re.IGNORECASE)
POOLING_CONFIG = "1_Pooling/config.json"


def is_qwen3_embedding(model: str, revision: str | None = None) -> bool:
    """Whether `model` (a directory or a hub id) is a Qwen3-Embedding checkpoint (module
    docstring)."""
    named = bool(QWEN3_EMBEDDING_NAME.search(str(model).rstrip("/\\")))
    config = read_json(model, "config.json", revision)
    if config is None:
        return named and not Path(model).is_dir()
    if config.get("model_type") != "qwen3":
        return False
    return named or last_token_pooled(model, revision)


def last_token_pooled(model: str, revision: str | None = None) -> bool:
    """Whether the checkpoint's Sentence Transformers pooling module pools the last token."""
    modules = read_json(model, "modules.json", revision)
    if not isinstance(modules, list):
        return False
    pooling_dirs = [module.get("path") for module in modules if isinstance(module, dict)
                    and str(module.get("type", "")).endswith("models.Pooling")]  # fmt: skip
    for directory in pooling_dirs:
        pooling = read_json(model, f"{directory}/config.json" if directory else "config.json",
                            revision)  # fmt: skip
        if isinstance(pooling, dict) and pooling.get("pooling_mode_lasttoken") is True:
            return True
    return False


def read_json(model: str, filename: str, revision: str | None = None) -> Any:
    """A JSON file of the checkpoint, or None when it is absent, unreadable or not cached."""
    path = Path(model) / filename
    if not Path(model).is_dir():
        path = _cached_hub_file(model, filename, revision)
    if path is None or not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None


def _cached_hub_file(repo_id: str, filename: str, revision: str | None) -> Path | None:
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, filename, revision=revision)
    except (ImportError, ValueError):  # not a repo id (a missing local path, say)
        return None
    return Path(found) if isinstance(found, str) else None
