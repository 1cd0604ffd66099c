"""Patch: vLLM's table of known environment variables learns ours.

vLLM warns about every `VLLM_*` variable it does not know; it keeps the known ones in
`vllm.envs.environment_variables` (name -> getter; vLLM 0.23 and 0.32). `declare` adds a
getter for each of our variables that vLLM has none for. No function is replaced, so nothing
is pinned.
"""

from __future__ import annotations

import os

from vllm_npu_ext import envs


def declare() -> None:
    """Add our variables (`envs.VARIABLES`) to vLLM's known ones."""
    from vllm import envs as vllm_envs

    known = getattr(vllm_envs, "environment_variables", None)
    if isinstance(known, dict):
        for name in envs.VARIABLES:
            known.setdefault(name, lambda name=name: os.environ.get(name))
