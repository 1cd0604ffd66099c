"""vLLM's model-info cache for the Qwen3 classes, written once per test session.

Before it builds an engine, vLLM inspects the checkpoint's model class (whether it pools,
supports pipeline parallelism, ...): `_LazyRegisteredModel.inspect_model_cls` (vLLM 0.23.0 and
0.32.0, `vllm/model_executor/models/registry.py`) reads `VLLM_CACHE_ROOT/modelinfos/`, keyed
by a hash of the class's source file, and on a miss imports vLLM and the model in a subprocess
of its own (`_run_in_subprocess`) and writes the cache. Tests start engines and servers
together in a session whose `VLLM_CACHE_ROOT` is new (tests/conftest.py), so each of them
missed: seen here, 40-80 s per engine for ten engines started at once under vllm-ascend.

`warm()` writes the cache of the classes tests serve (ours, with and without a KV cache, and
vLLM's own Qwen3, the stock side) in the test process before the first child starts, with
vLLM's own inspection (only the subprocess replaced by a call in this process: the subprocess
exists so that CUDA is not initialised, and there is none here). Engines then read it as they
read a cache a user's earlier run left. Another vLLM without these names keeps its misses.
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from unittest import mock

QWEN3_CLASSES = (
    ("vllm_npu_ext.model_executor.models.qwen3", "Qwen3ForCausalLM"),
    ("vllm_npu_ext.model_executor.models.qwen3", "Qwen3KVCacheForCausalLM"),
    ("vllm.model_executor.models.qwen3", "Qwen3ForCausalLM"),
)


def warm() -> tuple[str, ...]:
    """The classes whose model info is cached under this process's `VLLM_CACHE_ROOT`."""
    return _warm(os.environ.get("VLLM_CACHE_ROOT", ""))


@functools.cache
def _warm(cache_root: str) -> tuple[str, ...]:
    if not cache_root:
        return ()  # vLLM's default cache, shared with the user's own runs: left alone
    registry = importlib.import_module("vllm.model_executor.models.registry")
    lazy_model = getattr(registry, "_LazyRegisteredModel", None)
    if lazy_model is None or not hasattr(registry, "_run_in_subprocess"):
        return ()
    cached = []
    with mock.patch.object(registry, "_run_in_subprocess", lambda fn: fn()):
        for module_name, class_name in QWEN3_CLASSES:
            try:
                lazy_model(module_name=module_name, class_name=class_name).inspect_model_cls()
            except Exception as exc:  # noqa: BLE001 - an engine then inspects it itself
                print(f"model info of {module_name}.{class_name} not cached: {exc!r}",
                      file=sys.stderr)  # fmt: skip
            else:
                cached.append(f"{module_name}.{class_name}")
    return tuple(cached)
