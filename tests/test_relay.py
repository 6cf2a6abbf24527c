"""The relay between a replicated deployment's router and its engine replicas (no Ray needed):
streaming, disconnects, retries when a replica dies before answering, and merged metrics."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

pytest.importorskip("fastapi")

from fastapi import FastAPI, Request  # noqa: E402
from fastapi.responses import StreamingResponse  # noqa: E402

from quickdraft.server.metrics import Metrics, render_replicas  # noqa: E402
from quickdraft.server.relay import RelayedRequest, RelayRouter, ReplicaLost, run_asgi  # noqa: E402


def streaming_app(seen: dict) -> FastAPI:
    app = FastAPI()

    @app.post("/echo")
    async def echo(request: Request):
        body = await request.json()

        async def pieces():
            for word in body["words"]:
                yield f"data: {word}\n\n"
                await asyncio.sleep(0)
            yield "data: [DONE]\n\n"

        return StreamingResponse(pieces(), media_type="text/event-stream")

    @app.get("/wait")
    async def wait(request: Request):
        message = await request.receive()  # the body
        message = await request.receive()  # blocks until the client goes away
        seen["disconnect"] = message["type"]
        return {"never": "read"}

    return app


def relayed(method: str, path: str, body: bytes = b"") -> RelayedRequest:
    return RelayedRequest(method, path, b"", ((b"content-type", b"application/json"),), body)


def test_run_asgi_yields_each_streamed_piece_as_the_app_sends_it():
    async def main():
        app = streaming_app({})
        request = relayed("POST", "/echo", json.dumps({"words": ["a", "b", "c"]}).encode())
        return [m async for m in run_asgi(app, request)]

    messages = asyncio.run(main())
    assert messages[0]["type"] == "http.response.start" and messages[0]["status"] == 200
    bodies = [m["body"] for m in messages[1:] if m.get("body")]
    assert bodies == [b"data: a\n\n", b"data: b\n\n", b"data: c\n\n", b"data: [DONE]\n\n"]


def test_closing_the_relay_tells_the_app_its_client_disconnected():
    seen: dict = {}

    async def main():
        stream = run_asgi(streaming_app(seen), relayed("GET", "/wait"))
        task = asyncio.create_task(stream.__anext__())
        await asyncio.sleep(0.05)
        assert not task.done()  # the app is waiting for its client
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await stream.aclose()

    asyncio.run(main())
    assert seen == {"disconnect": "http.disconnect"}


class FakeReplicas:
    """``open_stream`` for a RelayRouter: replica ``i`` answers from the script ``plans[i]``: 'ok', 'die
    before' (lost before any body), or 'die mid-stream' (lost after the first event)."""

    def __init__(self, *plans: str) -> None:
        self.plans, self.calls = list(plans), 0

    async def open_stream(self, request: RelayedRequest):
        plan = self.plans[min(self.calls, len(self.plans) - 1)]
        self.calls += 1
        if plan == "die before":
            raise ReplicaLost("ActorDiedError: killed")
        yield {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
        yield {"type": "http.response.body", "body": b"data: first\n\n", "more_body": True}
        if plan == "die mid-stream":
            raise ReplicaLost("ActorDiedError: killed")
        yield {"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False}


def call(router: RelayRouter, method: str = "POST", path: str = "/v1/completions",
         body: bytes = b"{}") -> httpx.Response:
    async def main() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=router), base_url="http://relay") as client:
            return await client.request(method, path, content=body)

    return asyncio.run(main())


def test_a_request_whose_replica_dies_before_answering_goes_to_another():
    replicas, retries = FakeReplicas("die before", "ok"), []
    response = call(RelayRouter(replicas.open_stream, on_retry=lambda: retries.append(1)))
    assert response.status_code == 200
    assert response.text == "data: first\n\ndata: [DONE]\n\n"
    assert replicas.calls == 2 and retries == [1]


def test_no_replica_left_is_a_503_not_a_hang():
    replicas = FakeReplicas("die before")
    response = call(RelayRouter(replicas.open_stream, attempts=3))
    assert response.status_code == 503
    assert response.json()["error"]["code"] == "replica_unavailable"
    assert response.headers["retry-after"] == "1"
    assert replicas.calls == 3


def test_a_replica_lost_mid_stream_ends_the_stream_with_an_error_event():
    replicas, lost = FakeReplicas("die mid-stream", "ok"), []
    response = call(RelayRouter(replicas.open_stream, on_lost_mid_stream=lambda: lost.append(1)))
    assert response.status_code == 200
    events = [line.removeprefix("data: ") for line in response.text.split("\n\n") if line]
    assert events[0] == "first"
    assert json.loads(events[1])["error"]["code"] == "replica_lost"
    assert events[2] == "[DONE]"
    assert replicas.calls == 1 and lost == [1]  # text already sent is never replayed


def test_oversized_bodies_and_local_routes_are_answered_by_the_router():
    replicas = FakeReplicas("ok")

    async def health(request: RelayedRequest):
        return 200, "application/json", b'{"status": "ok"}'

    router = RelayRouter(replicas.open_stream, local_routes={"/health": health}, max_body_bytes=10)
    assert call(router, "GET", "/health", b"").json() == {"status": "ok"}
    too_big = call(router, body=b"x" * 11)
    assert too_big.status_code == 413 and too_big.json()["error"]["code"] == "request_too_large"
    assert replicas.calls == 0


def test_replicated_metrics_are_the_sum_and_each_replica_labelled():
    a, b, router = Metrics(), Metrics(), Metrics()
    a.inc("generation_tokens_total", 5)
    b.inc("generation_tokens_total", 7)
    b.inc("errors_total", type="server_error", code="500")
    router.inc("requests_retried_total")
    text = render_replicas(router.snapshot(), {"r1": a.snapshot(), "r2": b.snapshot()})
    lines = set(text.splitlines())
    assert "quickdraft_generation_tokens_total 12" in lines
    assert 'quickdraft_replica_generation_tokens_total{replica="r1"} 5' in lines
    assert 'quickdraft_replica_generation_tokens_total{replica="r2"} 7' in lines
    assert 'quickdraft_errors_total{code="500",type="server_error"} 1' in lines
    assert "quickdraft_requests_retried_total 1" in lines
    assert "# TYPE quickdraft_replica_errors_total counter" in lines


def test_single_process_serve_does_not_import_ray():
    code = ("import sys, quickdraft.cli, quickdraft.server.app, quickdraft.server.cli; "
            "print(any(m == 'ray' or m.startswith('ray.') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_body_chunks_already_waiting_travel_together_in_order():
    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for piece in (b"a", b"b", b"c"):  # sent without yielding: all three wait together
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        await send({"type": "http.response.body", "body": b"d", "more_body": False})

    async def main():
        return [m async for m in run_asgi(app, relayed("GET", "/"))]

    messages = asyncio.run(main())
    assert [m["type"] for m in messages] == ["http.response.start", "http.response.body"]
    assert messages[1] == {"type": "http.response.body", "body": b"abcd", "more_body": False}
