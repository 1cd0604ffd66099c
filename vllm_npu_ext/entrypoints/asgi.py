"""Small ASGI helpers shared by our middleware: read a request body, replay it, send JSON."""

from __future__ import annotations

import json


async def read_body(receive) -> tuple[bytes, bool]:
    chunks = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b"", True
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), False


def replay(body: bytes, receive):
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


async def send_error(
    send,
    message: str,
    status: int = 400,
    kind: str = "BadRequestError",
    param: str | None = "input",
) -> None:
    error = {"message": message, "type": kind, "param": param, "code": status}
    await send_json(send, {"error": error}, status)


async def send_json(send, content: dict, status: int) -> None:
    body = json.dumps(content).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
