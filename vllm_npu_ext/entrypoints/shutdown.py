"""`ShutdownGuard`: no request waits for an engine that has stopped (`vllm-npu-ext serve` adds
it with `--middleware vllm_npu_ext.entrypoints.middleware.ShutdownGuard`, its documented
path; middleware.py docstring says why)."""

from __future__ import annotations

import asyncio
import contextlib

from vllm_npu_ext.entrypoints.asgi import send_error

SHUTDOWN_MESSAGE = "the server is shutting down; the request was not completed"


class ShutdownGuard:
    """ASGI middleware: once the engine has stopped, no request waits for it any longer.

    A request still running `grace_s` after the engine client reports `errored` (engine dead
    or its output task stopped) is cancelled and, when nothing was sent yet, answered with
    503 Service Unavailable; requests arriving after that get the 503 at once. Answers that
    were already on their way get the grace period to finish. Apps without an engine client
    (`scope["app"].state.engine_client`) are passed through untouched.
    """

    poll_s = 0.5
    grace_s = 2.0
    cancel_wait_s = 1.0

    def __init__(self, app) -> None:
        self.app = app
        self._stopped: asyncio.Future | None = None  # done once the engine stopped
        self._watcher: asyncio.Task | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope.get("type") != "http":
            return await self.app(scope, receive, send)
        engine = _engine_client(scope)
        if engine is None:
            return await self.app(scope, receive, send)
        stopped = self._stopped_future(engine)
        if stopped.done() or _engine_stopped(engine):
            _set_done(stopped)
            return await _send_unavailable(send)

        started = False

        async def tracked_send(message) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        request = asyncio.ensure_future(self.app(scope, receive, tracked_send))
        try:
            # One future shared by all requests: no extra task per request.
            await asyncio.wait({request, stopped}, return_when=asyncio.FIRST_COMPLETED)
            if not request.done():
                await asyncio.wait({request}, timeout=self.grace_s)
        except asyncio.CancelledError:
            request.cancel()
            raise
        if request.done():
            return request.result()
        request.cancel()
        # Cancelling makes vLLM abort the request on an engine that is gone; do not wait long
        # (and do not let a late exception of the abandoned task be logged as unretrieved).
        request.add_done_callback(_retrieve)
        await asyncio.wait({request}, timeout=self.cancel_wait_s)
        if not started:
            await _send_unavailable(send)
        return None

    def _stopped_future(self, engine) -> asyncio.Future:
        if self._stopped is None:
            self._stopped = asyncio.get_running_loop().create_future()
            self._watcher = asyncio.ensure_future(self._watch(engine, self._stopped))
        return self._stopped

    async def _watch(self, engine, stopped: asyncio.Future) -> None:
        while not _engine_stopped(engine) and not stopped.done():
            await asyncio.sleep(self.poll_s)
        _set_done(stopped)


def _engine_client(scope):
    return getattr(getattr(scope.get("app"), "state", None), "engine_client", None)


def _engine_stopped(engine) -> bool:
    with contextlib.suppress(Exception):
        return bool(engine.errored)
    return False


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def _set_done(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _send_unavailable(send) -> None:
    await send_error(send, SHUTDOWN_MESSAGE, 503, "ServiceUnavailableError", None)
