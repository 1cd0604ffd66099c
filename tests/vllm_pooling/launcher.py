"""pytest plugin for vLLM's own `tests/entrypoints/pooling` (loaded with `-p launcher` by
run.py): the server launcher replaced by ours, and the stated skips. Nothing else of vLLM's
tests changes.

- `RemoteOpenAIServer._start_server` (vLLM's `tests/utils.py`) starts `vllm-npu-ext serve
  MODEL ARGS` instead of `vllm serve MODEL ARGS`, with the same environment, output and process
  group.
- On the CPU, every engine (servers, and the offline tests' `LLM(...)`) gets a KV cache size
  (`kv_cache_memory_bytes`) unless the test sets one: vLLM's CPU worker otherwise refuses to
  start unless the fraction `gpu_memory_utilization` of the host's memory is free (the
  offline tests ask for 0.75), which would make the outcome depend on what else the machine
  runs. Cache-free pooling runs allocate no KV cache either way.
- Every skip in `skips.py` (per vLLM version) is applied with its reason: test functions
  (all their parameters), and modules that cannot even be imported here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import skips

KV_CACHE_BYTES = str(16 << 20)


def console_script() -> str:
    return str(Path(sys.executable).parent / "vllm-npu-ext")


def _start_server(self, model: str, vllm_serve_args: list[str], env_dict) -> None:
    env = os.environ.copy()
    env["VLLM_WORKER_MULTIPROC_METHOD"] = "spawn"
    if env_dict is not None:
        env.update(env_dict)
    args = list(vllm_serve_args)
    if not any(a.startswith(("--kv-cache-memory", "--kv_cache_memory")) for a in args):
        args += ["--kv-cache-memory-bytes", KV_CACHE_BYTES]
    command = [console_script(), "serve", model, *args]
    print(f"Launching vllm-npu-ext serve with: {' '.join(command)}", flush=True)
    self.proc = subprocess.Popen(command, env=env, stdout=sys.stdout, stderr=sys.stderr,
                                 start_new_session=True)  # fmt: skip


def _with_kv_cache_size(init):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kv_cache_memory_bytes", int(KV_CACHE_BYTES))
        init(self, *args, **kwargs)

    return __init__


def pytest_sessionstart(session) -> None:
    import vllm

    from tests import utils

    utils.RemoteOpenAIServer._start_server = _start_server
    vllm.LLM.__init__ = _with_kv_cache_size(vllm.LLM.__init__)


class SkippedModule(pytest.Module):
    """A module skipped as a whole, before its import (which fails here: network fetches at
    import time, packages that are not installed)."""

    reason = ""

    def collect(self):
        pytest.skip(self.reason, allow_module_level=True)


def pytest_pycollect_makemodule(module_path, parent):
    relative = _relative(module_path)
    reason = skips.for_version().modules.get(relative)
    if reason is None:
        return None
    module = SkippedModule.from_parent(parent, path=module_path)
    module.reason = reason
    return module


def pytest_collection_modifyitems(config, items) -> None:
    functions = skips.for_version().functions
    for item in items:
        name = f"{_relative(item.path)}::{getattr(item, 'originalname', item.name)}"
        reason = functions.get(name)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def _relative(path) -> str | None:
    """A path under tests/entrypoints/pooling, relative to it (None elsewhere)."""
    parts = Path(path).parts
    if "pooling" not in parts:
        return None
    index = len(parts) - 1 - parts[::-1].index("pooling")
    return "/".join(parts[index + 1 :])
