"""The independent oracle: Hugging Face transformers' Qwen3Model, last token, L2-normalised.

Used by selfcheck and the test suite to check embeddings from a vLLM engine.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
import torch.nn.functional as F


@functools.lru_cache(maxsize=4)
def _model_and_tokenizer(model_dir: str, dtype: torch.dtype):
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep reports one line per check
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return AutoModel.from_pretrained(model_dir, dtype=dtype).eval(), tokenizer


def hf_embeddings(model_dir, texts: Sequence[str], dtype=torch.float32) -> torch.Tensor:
    """Float32 `[len(texts), H]`: each text alone (no padding), the last token's hidden state
    of the model loaded in `dtype` on the CPU, L2-normalised."""
    return embed_with(*_model_and_tokenizer(str(model_dir), dtype), texts)


def embed_with(model, tokenizer, texts: Sequence[str]) -> torch.Tensor:
    """`hf_embeddings` for a loaded transformers `Qwen3Model` and its tokenizer."""
    rows = []
    with torch.no_grad():
        for text in texts:
            batch = tokenizer(text, return_tensors="pt")
            rows.append(model(**batch).last_hidden_state[0, -1].float())
    return F.normalize(torch.stack(rows), dim=-1)
