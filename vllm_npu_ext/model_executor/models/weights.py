"""Checkpoint loading for models whose q/k/v and gate/up projections are merged: each
parameter carries its own `weight_loader` (vLLM's), so this loop stays generic."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from vllm.model_executor.model_loader.weight_utils import (
    default_weight_loader,
    maybe_remap_kv_scale_name,
)
from vllm.model_executor.models.utils import is_pp_missing_parameter

from vllm_npu_ext import compat


def load_merged_weights(model: nn.Module, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
    """Load checkpoint `weights` into `model`'s parameters (merged ones by shard); returns the
    names loaded. Rotary inverse frequencies and weights of other pipeline ranks are skipped."""
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded: set[str] = set()
    for name, tensor in weights:
        if "rotary_emb.inv_freq" in name:
            continue
        name, shard_id = stacked_name(name)
        if name.endswith("scale"):
            name = maybe_remap_kv_scale_name(name, params)
        if name is None or name not in params or is_pp_missing_parameter(name, model):
            continue
        param = params[name]
        loader = getattr(param, "weight_loader", default_weight_loader)
        loader(param, tensor) if shard_id is None else loader(param, tensor, shard_id)
        loaded.add(name)
    return loaded


def stacked_name(name: str) -> tuple[str, str | int | None]:
    """Checkpoint name -> (merged parameter name, shard id) for q/k/v and gate/up."""
    for merged, part, shard_id in compat.STACKED_PARAMS:
        if f".{part}." in name:
            return name.replace(f".{part}.", f".{merged}."), shard_id
    return name, None
