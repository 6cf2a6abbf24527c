"""``quickdraft serve --replicas N``: the OpenAI routes on Ray Serve, one engine per replica.

Two deployments make the application:

- ``EngineReplica`` (N replicas, or autoscaled): each loads its own engine and runs the same
  FastAPI app as single-process ``quickdraft serve`` (continuous batching included). It answers
  relayed HTTP requests (``server/relay.py``) as a stream of ASGI messages, and reports its
  health and counters.
- ``Router`` (the ingress, one light replica, no CPU reserved): clients talk to it through Ray
  Serve's HTTP proxy. It sends each request to an engine replica chosen by Ray Serve (fewest
  requests in flight of two picked at random), re-sends it elsewhere when that replica dies
  before answering, and answers /health and /metrics for all replicas at once.

Ray is an optional extra (``pip install 'quickdraft[ray]'``); nothing imports this module unless
``--replicas`` or ``--ray-address`` is given.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import AsyncIterator
from typing import Any

import ray
from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from quickdraft.errors import QuickdraftError
from quickdraft.server.metrics import ROUTER_COUNTERS, Metrics, render_replicas
from quickdraft.server.relay import RelayedRequest, RelayRouter, ReplicaLost, run_asgi

log = logging.getLogger(__name__)

APP_NAME = "quickdraft"
ENGINE_DEPLOYMENT = "EngineReplica"
FANOUT_TIMEOUT_S = 10.0  # /health and /metrics wait this long for every replica's answer
LOCAL_RAY_ENVIRONMENT = {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60", "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
                         "RAY_USAGE_STATS_ENABLED": "0"}


class EngineReplica:
    """One engine and its OpenAI app, in a Ray Serve replica."""

    def __init__(self, engine_args: dict[str, Any], app_options: dict[str, Any]) -> None:
        from quickdraft.cli import build_engine
        from quickdraft.server.app import create_app
        from quickdraft.server.cli import warm_up
        from quickdraft.server.engine_process import DEFAULT_STREAM_INTERVAL_S, EngineProcess

        args = argparse.Namespace(**engine_args)
        if getattr(args, "in_process", False):
            engine = build_engine(args)
            warm_up(engine, app_options["max_batch"])
        else:  # as single-process serving: the replica's event loop and its engine do not share a GIL
            interval = getattr(args, "stream_interval", None)
            engine = EngineProcess(functools.partial(build_engine, args), app_options["max_batch"],
                                   stream_interval_s=DEFAULT_STREAM_INTERVAL_S if interval is None else interval / 1000)
        self.app = create_app(engine, **app_options)
        self.state = self.app.state.quickdraft
        self.state.worker.start()
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except Exception:  # constructed outside Ray Serve
            self.replica_id = f"pid-{os.getpid()}"

    async def http(self, request: RelayedRequest) -> AsyncIterator[dict[str, Any]]:
        async for message in run_asgi(self.app, request):
            yield message

    def health(self) -> dict[str, Any]:
        return {"replica": self.replica_id, "pid": os.getpid(), "queued": len(self.state.queue),
                "running": self.state.worker.running, "max_queue": self.state.queue.max_queue,
                "worker_alive": self.state.worker.alive}

    def metrics_snapshot(self) -> tuple[str, dict]:
        return self.replica_id, self.state.metrics.snapshot()

    def check_health(self) -> None:
        """Called by Ray Serve every few seconds; a replica whose engine (process or thread) died is replaced."""
        if not self.state.worker.alive:
            raise RuntimeError("the engine is not running")

    def __del__(self) -> None:
        state = getattr(self, "state", None)
        if state is not None:
            state.worker.stop()


class Router:
    """The ingress: relays requests to engine replicas; /health and /metrics speak for all."""

    def __init__(self, engine: Any, model_name: str, expected_replicas: str, max_body_bytes: int) -> None:
        self.engine, self.model_name, self.expected_replicas = engine, model_name, expected_replicas
        self.max_body_bytes = max_body_bytes
        self.metrics = Metrics(counters=ROUTER_COUNTERS)

    def __serve_build_asgi_app__(self) -> RelayRouter:
        return RelayRouter(
            self._open_stream, local_routes={"/health": self._health, "/metrics": self._metrics},
            max_body_bytes=self.max_body_bytes,
            on_retry=lambda: self.metrics.inc("requests_retried_total"),
            on_lost_mid_stream=lambda: self.metrics.inc("replicas_lost_mid_response_total"),
        )

    async def _open_stream(self, request: RelayedRequest) -> AsyncIterator[dict[str, Any]]:
        responses = self.engine.options(stream=True).http.remote(request)
        try:
            async for message in responses:
                yield message
        except (RayActorError, DeploymentUnavailableError) as exc:
            raise ReplicaLost(f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
        except BackPressureError:
            yield {"type": "http.response.start", "status": 429,
                   "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1")]}
            body = {"error": {"message": "every replica's queue is full; retry after 1 s", "type": "rate_limit_error",
                              "param": None, "code": "queue_full"}}
            yield {"type": "http.response.body", "body": json.dumps(body).encode(), "more_body": False}
        finally:
            responses.cancel()  # no-op once finished; stops the replica's work when the client left

    async def _fan_out(self, method: str) -> list[Any]:
        try:
            results = await self.engine.broadcast(method).results_async(timeout_s=FANOUT_TIMEOUT_S,
                                                                        return_exceptions=True)
        except Exception as exc:  # no replica to ask (all dead or starting)
            log.warning("broadcast %s failed: %s", method, exc)
            return []
        return [r for r in results if not isinstance(r, BaseException)]

    async def _replica_states(self) -> dict[str, int]:
        def read() -> dict[str, int]:
            status = serve.status().applications[APP_NAME].deployments[ENGINE_DEPLOYMENT]
            return {str(state.value if hasattr(state, "value") else state): count
                    for state, count in status.replica_states.items()}

        try:
            return await asyncio.to_thread(read)
        except Exception as exc:
            log.warning("could not read the replicas' state from Ray Serve: %s", exc)
            return {}

    async def _health(self, request: RelayedRequest) -> tuple[int, str, bytes]:
        replicas, states = await asyncio.gather(self._fan_out("health"), self._replica_states())
        healthy = [r for r in replicas if r["worker_alive"]]
        body = {
            "status": "ok" if healthy else "unavailable",
            "model": self.model_name,
            "queued": sum(r["queued"] for r in replicas),
            "running": sum(r["running"] for r in replicas),
            "max_queue": sum(r["max_queue"] for r in replicas),
            "replicas": {"expected": self.expected_replicas, "healthy": len(healthy), "ray_states": states,
                         "each": sorted(replicas, key=lambda r: r["replica"])},
        }
        return (200 if healthy else 503), "application/json", json.dumps(body).encode()

    async def _metrics(self, request: RelayedRequest) -> tuple[int, str, bytes]:
        replicas = dict(await self._fan_out("metrics_snapshot"))
        router = self.metrics.snapshot()
        router["replicas"] = {(("state", state),): count for state, count in (await self._replica_states()).items()}
        text = render_replicas(router, replicas)
        return 200, "text/plain; version=0.0.4; charset=utf-8", text.encode()


def replica_threads(args: argparse.Namespace) -> int:
    """Torch threads per replica: --threads, else the machine's cores shared evenly (at least 1)."""
    if args.threads:
        return args.threads
    return max(1, (os.cpu_count() or 1) // max(1, replica_bounds(args)[1]))


def autoscaled(args: argparse.Namespace) -> bool:
    return args.min_replicas is not None or args.max_replicas is not None


def replica_bounds(args: argparse.Namespace) -> tuple[int, int]:
    low = args.min_replicas if args.min_replicas is not None else 1
    high = args.max_replicas if args.max_replicas is not None else max(low, args.replicas or 1)
    return low, high


def replica_count(args: argparse.Namespace) -> str:
    """'2', or '1..4' when autoscaling."""
    if autoscaled(args):
        low, high = replica_bounds(args)
        return f"{low}..{high}"
    return str(args.replicas or 1)


def build_application(args: argparse.Namespace, model_name: str) -> serve.Application:
    threads = replica_threads(args)
    engine_args = {k: v for k, v in vars(args).items() if k != "func"} | {"threads": threads}
    app_options = {"model_name": model_name, "max_queue": args.max_queue, "request_timeout_s": args.request_timeout,
                   "max_body_bytes": args.max_body_bytes, "max_batch": args.max_batch}
    scaling: dict[str, Any]
    if autoscaled(args):
        low, high = replica_bounds(args)
        scaling = {"autoscaling_config": {"min_replicas": low, "max_replicas": high,
                                          "initial_replicas": min(max(args.replicas or low, low), high),
                                          "target_ongoing_requests": max(1, args.max_batch // 2)}}
    else:
        scaling = {"num_replicas": args.replicas or 1}
    expected = replica_count(args)
    engine = serve.deployment(
        EngineReplica, name=ENGINE_DEPLOYMENT, ray_actor_options={"num_cpus": threads},
        # Up to max_batch requests run on a replica; the rest wait in Ray Serve's router, where they
        # can still go to whichever replica frees up first (or survives).
        max_ongoing_requests=args.max_batch, max_queued_requests=args.max_queue,
        health_check_period_s=args.health_check_period, health_check_timeout_s=30,
        **scaling,
    ).bind(engine_args, app_options)
    router = serve.deployment(serve.ingress()(Router), name="Router", num_replicas=1,
                              ray_actor_options={"num_cpus": 0}, max_ongoing_requests=10_000)
    return router.bind(engine, model_name, expected, args.max_body_bytes)


def app_builder(flags: dict[str, str]) -> serve.Application:
    """The application for ``serve run`` and KubeRay's RayService, from ``quickdraft serve``'s flags
    written without dashes: ``serve run quickdraft.server.ray_serve:app_builder replicas=2 threads=1``
    (a flag without a value, like ``no_compile_drafter``, takes ``true``)."""
    from quickdraft.cli import build_parser
    from quickdraft.server.cli import served_model_name

    argv = ["serve"]
    for key, value in flags.items():
        flag = "--" + key.replace("_", "-")
        argv += [flag] if str(value).lower() == "true" else [flag, str(value)]
    args = build_parser().parse_args(argv)
    return build_application(args, served_model_name(args))


def cmd_serve_ray(args: argparse.Namespace, model_name: str) -> int:
    """Deploy on Ray Serve, print the endpoint, and keep it up until interrupted."""
    started_ray = False
    if args.ray_address:
        try:
            ray.init(address=args.ray_address, namespace="quickdraft", log_to_driver=False)
        except (ConnectionError, RuntimeError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise QuickdraftError(
                f"could not connect to the Ray cluster at {args.ray_address}: {reason}. A cluster started with token "
                f"authentication (the default of `ray start` in recent Ray) also needs RAY_AUTH_MODE=token here, "
                f"with its token in ~/.ray/auth_token or $RAY_AUTH_TOKEN") from None
    else:
        # A local instance's processes inherit these. Ray Serve's 5 s proxy ready check fails on a
        # loaded 2-core machine, and there is nowhere to send usage statistics.
        for name, value in LOCAL_RAY_ENVIRONMENT.items():
            os.environ.setdefault(name, value)
        threads = replica_threads(args)
        replicas = replica_bounds(args)[1]
        # Logical CPUs: enough for every replica even where that oversubscribes the machine
        # (said so below); Ray's own processes need none.
        cpus = max(os.cpu_count() or 1, replicas * threads)
        ray.init(num_cpus=cpus, namespace="quickdraft", include_dashboard=False, log_to_driver=False,
                 configure_logging=False)
        started_ray = True
        if replicas * threads > (os.cpu_count() or 1):
            print(f"quickdraft serve: {replicas} replicas x {threads} threads on {os.cpu_count()} cores "
                  f"oversubscribes this machine", file=sys.stderr)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options={"host": args.host, "port": args.port})
        print(f"quickdraft serve: deploying {replica_count(args)} replica(s) of {model_name!r} on Ray "
              f"({'cluster ' + args.ray_address if args.ray_address else 'a local instance'})...", file=sys.stderr)
        serve.run(build_application(args, model_name), name=APP_NAME, route_prefix="/")
        print(f"quickdraft serve: model {model_name!r} on http://{args.host}:{args.port}/v1 "
              f"(Ray Serve, {replica_count(args)} replica(s))", file=sys.stderr, flush=True)
        stop.wait()
    finally:
        try:
            serve.delete(APP_NAME)
            if started_ray:
                serve.shutdown()
        finally:
            if started_ray:
                ray.shutdown()
    return 0
