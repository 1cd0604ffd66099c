"""Start and always stop a real `vllm-npu-ext serve` process on loopback."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# The KV cache of every test server and engine (what a cache-free pooling one ignores): enough
# for the tiny checkpoints' few sequences (~1 KiB per token). An explicit size also skips
# vLLM's start-up check that a fraction of host memory is free, which fails on a busy machine.
KV_CACHE_BYTES = 16 << 20
# The test servers' flags: the tiny checkpoints in float32 and short inputs.
TEST_SERVER_FLAGS = ["--dtype", "float32", "--max-model-len", "128",
                     "--kv-cache-memory-bytes", str(KV_CACHE_BYTES)]  # fmt: skip


def _parent_death_signal():
    """A `preexec_fn` that has Linux SIGTERM the child when the test process dies.

    A test run killed from outside (a CI timeout, `timeout 600 pytest`) runs no fixture
    finalizer; without this its servers and engines would outlive it and hold memory and ports.
    The C function is looked up here, so the child only calls it (no import or lock after fork).
    """
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1  # <linux/prctl.h>

    def set_signal() -> None:
        prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)

    return set_signal


# Pass as `preexec_fn=` to every long-lived child a test starts.
DIE_WITH_PARENT = _parent_death_signal()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def console_script() -> str:
    """The installed `vllm-npu-ext` next to this interpreter."""
    script = Path(sys.executable).parent / "vllm-npu-ext"
    if not script.exists():
        raise RuntimeError(f"{script} is missing: install the package (pip install -e .)")
    return str(script)


@contextlib.contextmanager
def running_server(args: list[str], log_path: Path, env: dict[str, str | None] | None = None,
                   launcher: list[str] | None = None):  # fmt: skip
    """A healthy `Server` for the `with` block; stopped afterwards whatever happened."""
    server = Server(args, log_path, env, launcher)
    try:
        server.wait_healthy()
        yield server
    finally:
        server.stop()


def _child_env(env: dict[str, str | None] | None) -> dict[str, str]:
    """This process's environment with `env` over it; a None value unsets the variable."""
    merged = {**os.environ, **(env or {})}
    return {name: value for name, value in merged.items() if value is not None}


class Server:
    """A server process (own process group, so its engine children die with it)."""

    def __init__(self, args: list[str], log_path: Path, env: dict[str, str | None] | None = None,
                 launcher: list[str] | None = None):  # fmt: skip
        """`launcher`: the command before `args` (default: `vllm-npu-ext serve`)."""
        self.port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        launcher = launcher or [console_script(), "serve"]
        self.args = [*launcher, *args, "--host", "127.0.0.1", "--port", str(self.port)]
        from support import model_info_cache  # test process only (workers import this file)

        model_info_cache.warm()
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(
            self.args, stdout=self._log, stderr=subprocess.STDOUT,
            env=_child_env(env), start_new_session=True, preexec_fn=DIE_WITH_PARENT,
        )  # fmt: skip
        self.started_in: float | None = None

    def wait_healthy(self, timeout: float = 600.0) -> float:
        """Seconds until /health answered 200; raises with the log tail on death or timeout."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if self.process.poll() is not None:
                code = self.process.returncode
                raise RuntimeError(f"server exited with {code}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    self.started_in = time.monotonic() - start
                    return self.started_in
            time.sleep(1)
        raise RuntimeError(f"server not healthy after {timeout:.0f} s:\n{self.log_tail()}")

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def stop(self, timeout: float = 60.0) -> int:
        """SIGTERM the whole process group, then SIGKILL what is left; returns the exit code."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)  # engine children, if any remain
        code = self.process.wait()
        self._log.close()
        return code
