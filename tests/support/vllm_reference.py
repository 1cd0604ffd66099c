"""The installed vLLM's version, and vLLM's own reference functions that tests compare with,
wherever that version keeps them."""

from __future__ import annotations

import torch
import vllm
from packaging.version import Version

try:  # vLLM 0.32
    from vllm.v1.attention.ops.dcp import _lse_weighted_combine
except ImportError:  # vLLM 0.23 keeps it in dcp_alltoall.py
    from vllm.v1.attention.ops.dcp_alltoall import _lse_weighted_combine

__all__ = ["VLLM_0_23", "lse_weighted_combine"]

# The suite runs on vLLM 0.23 (.venv-ascend) and 0.32 (.venv); a test whose subject differs
# between them by nature (vLLM's own behaviour, not the plugin's) says why where it uses this.
VLLM_0_23 = Version(vllm.__version__).release[:2] == (0, 23)


def lse_weighted_combine(outputs: torch.Tensor, lses: torch.Tensor, **kwargs):
    """vLLM's CPU reference of the log-sum-exp-weighted merge of DCP partial outputs:
    outputs `[N, B, H, D]`, lses `[N, B, H]` -> `[B, H, D]` (and `[B, H]` with
    `return_lse=True`).

    A shard without keys (lse -inf or NaN) has no output: its partial may hold anything. 0.32's
    reference zeroes such partials itself; 0.23's multiplies them by their zero weight, which
    keeps a NaN or inf, so they are zeroed here first (the same result on both versions).
    """
    empty = (torch.isnan(lses) | torch.isinf(lses)).unsqueeze(-1)
    outputs = torch.where(empty, torch.zeros_like(outputs), outputs)
    return _lse_weighted_combine(outputs, lses, **kwargs)
