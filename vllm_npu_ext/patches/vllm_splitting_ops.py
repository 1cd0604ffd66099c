"""Patch: vLLM's default splitting ops, with or without our cache-free attention op.

vLLM copies the class-level list `CompilationConfig._attention_ops` into `splitting_ops` when
the user gave none (`CompilationConfig.set_splitting_ops_for_v1`, vLLM 0.23 and 0.32);
vllm-ascend's PIECEWISE branch goes through the same copy. Our graph-mode hook
(`models/qwen3_config.py`) adds our op where piecewise graphs must split at it and removes it
where one graph per forward captures it. No function is replaced, so nothing is pinned.
"""

from __future__ import annotations


def add(op_name: str) -> None:
    """Add `op_name` ("namespace::op") to the ops vLLM splits piecewise graphs at by default."""
    from vllm.config.compilation import CompilationConfig

    if op_name not in CompilationConfig._attention_ops:
        CompilationConfig._attention_ops.append(op_name)


def remove(op_name: str) -> None:
    """Take `op_name` out of vLLM's default splitting ops again."""
    from vllm.config.compilation import CompilationConfig

    if op_name in CompilationConfig._attention_ops:
        CompilationConfig._attention_ops.remove(op_name)
