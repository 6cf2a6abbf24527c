"""An HTTP request carried across a process boundary, streaming and disconnects included.

A Ray Serve deployment (``server/ray_serve.py``) puts a router in front of engine replicas: the
router receives the client's HTTP request, and a replica answers it with the same FastAPI app that
single-process ``quickdraft serve`` runs. Between the two, a request travels as a
``RelayedRequest`` and its answer as the app's own ASGI messages, one at a time, so a token
reaches the client as soon as the replica writes it.

``run_asgi`` (replica side) drives an ASGI app for one request and yields what it sends.
``RelayRouter`` (router side) is the ASGI app clients talk to: it replays a replica's messages and,
when the replica dies before anything reached the client, sends the request to another replica.
Neither knows about Ray: the transport is the ``open_stream`` callable, so both are tested without
a cluster.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

Message = dict[str, Any]


@dataclass(frozen=True)
class RelayedRequest:
    method: str
    path: str
    query_string: bytes
    headers: tuple[tuple[bytes, bytes], ...]
    body: bytes


class ReplicaLost(Exception):
    """The replica answering a request died or became unreachable."""


class BodyTooLarge(Exception):
    pass


async def run_asgi(app: Callable[..., Awaitable[None]], request: RelayedRequest) -> AsyncIterator[Message]:
    """Run ``app`` on ``request``; yield its ``http.response.start`` and ``http.response.body``
    messages as it sends them. Closing the iterator early (the client went away) tells the app that
    its client disconnected, so the generation it started is cancelled, as in a direct connection."""
    scope = {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
        "method": request.method, "scheme": "http", "path": request.path, "raw_path": request.path.encode(),
        "query_string": request.query_string, "root_path": "", "headers": [tuple(h) for h in request.headers],
        "client": ("relay", 0), "server": ("replica", 0),
    }
    outbox: deque[Message | None] = deque()  # None: the app returned
    sent = asyncio.Event()  # set while the outbox holds something
    disconnected = asyncio.Event()
    body_delivered = False

    async def receive() -> Message:
        nonlocal body_delivered
        if not body_delivered:
            body_delivered = True
            return {"type": "http.request", "body": request.body, "more_body": False}
        await disconnected.wait()
        return {"type": "http.disconnect"}

    def post(message: Message | None) -> None:
        outbox.append(message)
        sent.set()

    async def send(message: Message) -> None:
        if disconnected.is_set():
            raise OSError("the client disconnected")
        post(message)

    task = asyncio.create_task(app(scope, receive, send))
    task.add_done_callback(lambda _: post(None))
    try:
        while True:
            await sent.wait()
            message = outbox.popleft()
            if message is None:
                task.result()  # the app's own exception, if it raised one
                return
            if message["type"] == "http.response.body":
                message = _merge_waiting_bodies(message, outbox)
            if not outbox:
                sent.clear()
            yield message
            if message["type"] == "http.response.body" and not message.get("more_body", False):
                return
    finally:
        disconnected.set()
        if not task.done():
            # The app now sees the disconnect and abandons its generation; give it a moment to do so.
            await asyncio.wait([task], timeout=5.0)
            if not task.done():
                task.cancel()
        elif not task.cancelled():
            task.exception()  # retrieved: an app that failed to send to a departed client is no error


def _merge_waiting_bodies(message: Message, outbox: deque[Message | None]) -> Message:
    """``message`` with the body chunks already waiting behind it: under load, one transfer carries
    several tokens instead of one each. Waits for nothing."""
    body, more = [message.get("body", b"")], message.get("more_body", False)
    while more and outbox and outbox[0] is not None and outbox[0]["type"] == "http.response.body":
        following = outbox.popleft()
        body.append(following.get("body", b""))
        more = following.get("more_body", False)
    if len(body) == 1:
        return message
    return {"type": "http.response.body", "body": b"".join(body), "more_body": more}


OpenStream = Callable[[RelayedRequest], AsyncIterator[Message]]
LocalRoute = Callable[[RelayedRequest], Awaitable[tuple[int, str, bytes]]]


class RelayRouter:
    """The ASGI app in front of the replicas.

    Every request goes to one replica through ``open_stream``. The replica's response start is held
    until its first body bytes arrive, so a request whose replica dies before that point has sent
    the client nothing and is sent again (up to ``attempts`` times in all). A replica that dies
    after bytes reached the client cannot be replayed: a streaming client gets an error event and
    ``[DONE]``, the same shape as any error the engine reports mid-stream.

    ``local_routes`` (path -> handler) are answered here without a replica: /health and /metrics,
    which speak for all replicas at once.
    """

    def __init__(self, open_stream: OpenStream, *, local_routes: dict[str, LocalRoute] | None = None,
                 attempts: int = 3, max_body_bytes: int = 4 * 1024 * 1024,
                 on_retry: Callable[[], None] | None = None,
                 on_lost_mid_stream: Callable[[], None] | None = None) -> None:
        if attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {attempts}")
        self.open_stream, self.local_routes = open_stream, dict(local_routes or {})
        self.attempts, self.max_body_bytes = attempts, max_body_bytes
        self.on_retry = on_retry or (lambda: None)
        self.on_lost_mid_stream = on_lost_mid_stream or (lambda: None)

    async def __call__(self, scope: Message, receive: Callable, send: Callable) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            body = await _read_body(receive, self.max_body_bytes)
        except BodyTooLarge:
            await _send_json(send, 413, _error(f"the request body exceeds {self.max_body_bytes} bytes",
                                               "invalid_request_error", "request_too_large"))
            return
        request = RelayedRequest(scope["method"], scope["path"], scope.get("query_string", b""),
                                 tuple((bytes(k), bytes(v)) for k, v in scope.get("headers", [])), body)
        local = self.local_routes.get(request.path)
        if local is not None and request.method in ("GET", "HEAD"):
            status, content_type, payload = await local(request)
            await _send_bytes(send, status, content_type, payload)
            return
        await self._relay(request, send)

    async def _relay(self, request: RelayedRequest, send: Callable) -> None:
        for attempt in range(1, self.attempts + 1):
            held: Message | None = None  # the response start, until body bytes arrive
            started = False
            event_stream = False
            try:
                async for message in self.open_stream(request):
                    if message["type"] == "http.response.start":
                        held = message
                        event_stream = _is_event_stream(message)
                        continue
                    if message["type"] != "http.response.body":
                        continue
                    if not started:
                        if held is None:
                            raise RuntimeError("a replica sent a body before its response start")
                        await send(held)
                        started = True
                    await send(message)
                    if not message.get("more_body", False):
                        return
                if not started:
                    raise ReplicaLost("the replica's response ended before it began")
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
            except ReplicaLost as exc:
                if started:
                    log.warning("replica lost mid-response on %s: %s", request.path, exc)
                    self.on_lost_mid_stream()
                    await _end_interrupted(send, event_stream, str(exc))
                    return
                if attempt < self.attempts:
                    log.warning("replica lost before responding on %s (attempt %d of %d), retrying: %s",
                                request.path, attempt, self.attempts, exc)
                    self.on_retry()
                    continue
                await _send_json(send, 503, _error(f"no replica could answer after {self.attempts} attempts: {exc}",
                                                   "server_error", "replica_unavailable"), retry_after=1)
                return
            except Exception:
                log.exception("relaying %s failed", request.path)
                if started:
                    await _end_interrupted(send, event_stream, "internal server error")
                else:
                    await _send_json(send, 500, _error("internal server error", "server_error", None))
                return


def _is_event_stream(start: Message) -> bool:
    for key, value in start.get("headers", []):
        if bytes(key).lower() == b"content-type":
            return bytes(value).startswith(b"text/event-stream")
    return False


async def _end_interrupted(send: Callable, event_stream: bool, reason: str) -> None:
    tail = b""
    if event_stream:
        error = _error(f"the replica serving this request stopped mid-response ({reason}); the text so far is "
                       f"incomplete", "server_error", "replica_lost")
        tail = b"data: " + json.dumps(error).encode() + b"\n\ndata: [DONE]\n\n"
    await send({"type": "http.response.body", "body": tail, "more_body": False})


def _error(message: str, type_: str, code: str | None) -> dict[str, Any]:
    return {"error": {"message": message, "type": type_, "param": None, "code": code}}


async def _read_body(receive: Callable, limit: int) -> bytes:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            break
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge
        chunks.append(chunk)
        if not message.get("more_body", False):
            break
    return b"".join(chunks)


async def _send_json(send: Callable, status: int, payload: dict[str, Any], retry_after: int | None = None) -> None:
    extra = [(b"retry-after", str(retry_after).encode())] if retry_after is not None else []
    await _send_bytes(send, status, "application/json", json.dumps(payload).encode(), extra)


async def _send_bytes(send: Callable, status: int, content_type: str, payload: bytes,
                      extra_headers: list[tuple[bytes, bytes]] | None = None) -> None:
    headers = [(b"content-type", content_type.encode()), (b"content-length", str(len(payload)).encode()),
               *(extra_headers or [])]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


async def _lifespan(receive: Callable, send: Callable) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
