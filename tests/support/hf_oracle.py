"""The independent oracle: Hugging Face transformers' Qwen3Model, last token, L2 normalise."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def hf_embeddings(model_dir, texts: list[str], dtype=torch.float32) -> torch.Tensor:
    """Embeddings the sentence-transformers way: left-padded batch, last token, normalised."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    if tokenizer.padding_side != "left":
        raise ValueError("the checkpoint's tokenizer must pad on the left, like Qwen3-Embedding's")
    model = AutoModel.from_pretrained(model_dir, dtype=dtype).eval()
    batch = tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**batch).last_hidden_state
    return F.normalize(hidden[:, -1].float(), dim=-1)


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.float(), b.float(), dim=-1)
