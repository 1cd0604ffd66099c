"""Engine and server tests that run once, on the vLLM 0.23 stack (`one_stack`, tests/conftest.py).

The suite runs on two stacks: vLLM 0.23 (what vllm-ascend 0.23 runs on) and vLLM 0.32. A test
that starts an engine or a server costs a minute or more of CPU; where the code of this package
it reaches is the same on both versions, and other tests run that code on vLLM 0.32, it runs
on the 0.23 stack only. Each marker says which tests cover the code on 0.32.
"""

from __future__ import annotations

import pytest

# `emulated_embedding_server`: the NPU path behind vLLM's multiprocess server. On vLLM 0.32
# the NPU path's version-dependent code (attention metadata, weight loading, the compiled
# forward and its graph-mode hooks) runs in the in-process engine runs (test_model_parity,
# test_graph_mode's compiled runs, test_shared_prefix), and the server's own (middleware, TEI
# routes, the emulator installed in every process) on the platform-path and reranker servers
# (test_server, test_tei_routes, tests/reranker's emulated reranker server, tests/bootstrap).
EMULATED_SERVER = pytest.mark.one_stack(reason=(
    "the NPU path behind the HTTP server; on vLLM 0.32 the engine runs (test_model_parity, "
    "test_graph_mode, test_shared_prefix), the platform-path servers and the emulated reranker "
    "server cover the code it reaches"))  # fmt: skip
