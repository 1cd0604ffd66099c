"""The independent oracle (`vllm_npu_ext.selfcheck.hf_oracle`, and Hugging Face `generate`)
and how tests compare with it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from vllm_npu_ext.selfcheck.hf_oracle import embed_with, hf_embeddings
from vllm_npu_ext.selfcheck.tolerances import min_embedding_cosine

__all__ = [
    "MIN_COSINE", "cosines", "embeddings_of_edited_model", "hf_embeddings", "hf_greedy_tokens"
]

# float32 embeddings from vLLM (any path) against the float32 oracle.
MIN_COSINE = min_embedding_cosine(torch.float32)


def cosines(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.cosine_similarity(a.float(), b.float(), dim=-1)


def hf_greedy_tokens(model_dir, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Hugging Face `generate` in float32 on the CPU: greedy, `max_new_tokens` new token ids per
    prompt (token-id list), never stopping at EOS (vLLM's `ignore_eos`)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    tokens = []
    with torch.no_grad():
        for ids in prompts:
            input_ids = torch.tensor([ids])
            out = model.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), do_sample=False,
                max_new_tokens=max_new_tokens, min_new_tokens=0, eos_token_id=[],
                pad_token_id=ids[-1],
            )  # fmt: skip
            tokens.append(out[0, len(ids) :].tolist())
    return tokens


def embeddings_of_edited_model(model_dir, texts: list[str], edit) -> torch.Tensor:
    """`hf_embeddings` of a fresh float32 copy of the model after `edit(model)` changed it."""
    from transformers import AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        edit(model)
    return embed_with(model, AutoTokenizer.from_pretrained(str(model_dir)), texts)
