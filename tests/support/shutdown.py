"""Stopping a real server in tests: background load, its engine process, what outlived it."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

import psutil

from support.loadgen import Request, run_load, served_model, word_texts
from support.server import Server

ENGINE_CORE = "EngineCore"  # vLLM names its engine process VLLM::EngineCore


def load_in_background(server: Server, results: list, concurrency: int, count: int = 3000):
    """A thread sending `count` short embedding requests; outcomes are appended to `results`."""
    model = served_model(server.base_url)
    requests = [Request({"model": model, "input": t}) for t in word_texts(count, 23, 5, 60)]
    def send() -> None:
        results.extend(run_load(server.base_url, requests, concurrency, timeout=60)[0])

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    return thread


def engine_core_processes(server: Server) -> list[psutil.Process]:
    """The server's engine core process(es), found by vLLM's process title."""
    children = psutil.Process(server.process.pid).children(recursive=True)
    return [p for p in children if ENGINE_CORE in p.name() or ENGINE_CORE in " ".join(p.cmdline())]


def freeze(processes: list[psutil.Process]) -> None:
    """SIGSTOP: the processes keep their sockets and memory but never answer again."""
    for process in processes:
        os.kill(process.pid, signal.SIGSTOP)


def wait_exit(server: Server, timeout_s: float) -> tuple[int | None, float]:
    """SIGTERM the server's main process -> (exit code or None if still running, seconds)."""
    start = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    try:
        code = server.process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        code = None
    return code, time.monotonic() - start


def group_alive_after(pgid: int, grace_s: float) -> bool:
    """Whether a process of the group is still alive `grace_s` after the leader exited."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        time.sleep(0.5)
    return True
