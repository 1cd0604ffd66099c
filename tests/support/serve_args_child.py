"""`serve_args.resolve` for a batch of command lines, in a process of its own (vLLM's parser
loads vLLM's plugins, which the test process must not): JSON cases on stdin, JSON results on
stdout after a marker line.

Each case is {"argv": [...], "default_model": str | null, "env": {...}}; each result holds the
namespace fields `serve` reads or sets, or {"error": message} where resolving exits.
"""

from __future__ import annotations

import json
import os
import sys
from unittest import mock

MARKER = "SERVE-ARGS-RESULTS"
FIELDS = ("model", "runner", "convert", "hf_overrides", "middleware", "served_model_name",
          "chat_template", "gpu_memory_utilization", "headless", "tensor_parallel_size",
          "decode_context_parallel_size", "prefill_context_parallel_size")  # fmt: skip


def resolve_one(case: dict) -> dict:
    from vllm_npu_ext import serve_args

    env = case.get("env") or {}
    with mock.patch.dict(os.environ, {k: v for k, v in env.items() if v is not None}):
        for name in [k for k, v in env.items() if v is None]:
            os.environ.pop(name, None)
        try:
            resolved = serve_args.resolve(case["argv"], case.get("default_model"))
        except SystemExit as error:
            return {"error": str(error.code)}
    args = vars(resolved.args)
    result = {field: args.get(field) for field in FIELDS}
    return {**result, "environment": resolved.environment, "notes": resolved.notes}


def main() -> None:
    cases = json.loads(sys.stdin.read())
    results = [resolve_one(case) for case in cases]
    print(MARKER)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
