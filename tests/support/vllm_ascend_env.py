"""Where vllm-ascend is imported from, and a child environment that can import it too."""

from __future__ import annotations

import os
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
# vLLM takes its distributed and ZMQ ports as free ephemeral ones (vLLM 0.23.0
# `network_utils._get_open_port`: bound to test, closed, bound again later), so processes that
# start together can take the same one (EADDRINUSE from TCPStore). With VLLM_PORT set, each scans
# upward from it instead: processes started together each get a block of their own, below
# Linux's ephemeral range (32768-60999), where no outgoing connection takes a port.
VLLM_PORT_BLOCKS = {"cp_decode": 21000, "serving": 24000, "shared_prefix": 26000}
VLLM_PORT_STRIDE = 100
# ACL graph capture sizes of the test engines in graph mode whose point is not vLLM's default
# list: powers of two up to the default list's largest (256 for pooling engines, vllm-ascend
# 0.23.0.post1 `NPUPlatform` capping it at max_num_seqs), 9 sizes where the default has 35.
# Every size a test replays is in it or below its largest: the parity texts in one step (67
# tokens) replay 128, each alone 2-32, a reranker pair (211) 256, a shared-prefix step's unique
# rows (114) 128. Capturing the default list took 65-113 s per engine on the stand-in.
TEST_CAPTURE_SIZES = [1, 2, 4, 8, 16, 32, 64, 128, 256]
TEST_COMPILATION = {"cudagraph_capture_sizes": TEST_CAPTURE_SIZES}


def vllm_ascend_site() -> Path:
    """The directory vllm-ascend is imported from (its package's parent)."""
    import importlib.util

    spec = importlib.util.find_spec("vllm_ascend")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("vllm_ascend is not importable; run `make setup-ascend`")
    return Path(next(iter(spec.submodule_search_locations))).resolve().parent


def vllm_port(block: str, index: int) -> str:
    """VLLM_PORT for the `index`-th process of `block` started together (`VLLM_PORT_BLOCKS`)."""
    return str(VLLM_PORT_BLOCKS[block] + VLLM_PORT_STRIDE * index)


def subprocess_env(site: Path | None = None, **extra: str) -> dict[str, str]:
    """This process's environment for a child Python that imports vllm-ascend from `site`
    (default: where this process imports it; first on PYTHONPATH) and the tests' support
    modules, under the stand-in (VLLM_NPU_EXT_EMULATE=1; what vllm-ascend's graph mode needs
    on this torch, the stand-in sets itself: `emulator/torch_fit.py`)."""
    from support import model_info_cache  # test process only

    model_info_cache.warm()
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site or vllm_ascend_site()), str(TESTS)])
    env["VLLM_NPU_EXT_EMULATE"] = "1"
    env.update(extra)
    return env


def server_env(**extra: str) -> dict[str, str | None]:
    """`subprocess_env` as a `support.server.Server` overlay."""
    return dict(subprocess_env(**extra))


def engine_config(model_dir, **engine_args):
    """The VllmConfig `vllm serve` would build for `model_dir` (on NPUPlatform here: vLLM's
    hooks, then vllm-ascend's `check_and_update_config`)."""
    from vllm.engine.arg_utils import EngineArgs

    return EngineArgs(model=str(model_dir), **engine_args).create_engine_config()


def start_like_a_vllm_ascend_process():
    """What a vLLM process on Ascend does before its model runner, as far as it runs here:
    the platform resolved (vllm-ascend's NPUPlatform; the stand-in is installed first by our
    platform plugin under VLLM_NPU_EXT_EMULATE=1), the general plugins of both packages
    loaded, and `vllm_ascend.ops` imported, as `NPUWorker`'s module imports do (through
    `ops.triton.triton_utils`) before `model_runner_v1`: imported first, `model_runner_v1` and
    `attention_cp` hit an import cycle (`device/device_op.py` <-> `ops/__init__.py`).
    Returns the platform."""
    from vllm_npu_ext import emulator

    emulator.install_stand_in()
    from vllm.platforms import current_platform
    from vllm.plugins import load_general_plugins

    load_general_plugins()
    import vllm_ascend.ops  # noqa: F401

    return current_platform
