"""``quickdraft serve``: the OpenAI-compatible server on uvicorn."""

from __future__ import annotations

import argparse
import functools
import logging
import sys

from quickdraft.batch import DEFAULT_MAX_BATCH
from quickdraft.errors import QuickdraftError

log = logging.getLogger(__name__)


def add_serve_parser(subparsers: argparse._SubParsersAction) -> None:
    from quickdraft.cli import add_model_args, add_threads_arg

    parser = subparsers.add_parser("serve", help="OpenAI-compatible HTTP server (streaming, speculative statistics)")
    add_model_args(parser)
    add_threads_arg(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: loopback only)")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", help="the model id clients send (default: --target as given, "
                        "or 'quickdraft' for the embedded model)")
    parser.add_argument("--max-batch", type=_positive_int, default=DEFAULT_MAX_BATCH,
                        help=f"requests decoded together (continuous batching, default {DEFAULT_MAX_BATCH}); "
                        "1 = one at a time")
    parser.add_argument("--max-queue", type=_positive_int, default=64,
                        help="requests that may wait for the engine; more get 429 (default 64)")
    parser.add_argument("--request-timeout", type=_positive_float, default=300.0,
                        help="seconds a request may take, queueing included (default 300)")
    parser.add_argument("--max-body-bytes", type=_positive_int, default=4 * 1024 * 1024,
                        help="largest request body accepted (default 4 MiB)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the engine in a thread of the HTTP process instead of a process of its own "
                             "(the two then share one GIL: slower under load)")
    parser.add_argument("--stream-interval", type=_non_negative_float, default=20.0, metavar="MS",
                        help="a streamed response's text goes out at most every MS milliseconds, its first and last "
                             "tokens at once (default 20; 0 = every engine step). Larger events let the HTTP layer "
                             "keep up with a batch. The engine's own process does this; --in-process sends every step")
    parser.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    ray_group = parser.add_argument_group(
        "Ray Serve (scale out; needs pip install 'quickdraft[ray]')",
        "Any of these serves the same routes from engine replicas on Ray Serve; --threads is then per replica "
        "(default: the cores shared evenly).")
    ray_group.add_argument("--replicas", type=_positive_int,
                           help="engine replicas, each with its own engine (the initial count when autoscaling)")
    ray_group.add_argument("--min-replicas", type=_non_negative_int,
                           help="autoscale between --min-replicas and --max-replicas on requests in flight")
    ray_group.add_argument("--max-replicas", type=_positive_int, help="see --min-replicas")
    ray_group.add_argument("--ray-address", help="an existing Ray cluster (e.g. 'auto' or ray://head:10001) "
                           "instead of a local instance started for this server")
    ray_group.add_argument("--health-check-period", type=_positive_float, default=5.0,
                           help="seconds between Ray Serve's health checks of each replica (default 5)")
    parser.set_defaults(func=cmd_serve, default_draft=True, compile_drafter=True)


def _int_at_least(low: int):
    """An argparse type: an integer >= ``low``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {value}")
    return value


def served_model_name(args: argparse.Namespace) -> str:
    if args.served_model_name:
        return args.served_model_name
    return args.target or "quickdraft"


def warm_up(engine, max_batch: int = 1) -> None:
    """One short generation before the first client's: lazy initialisation (compiled graphs, the
    batch scheduler's cache, invariance probe and step costs) is not its latency."""
    gamma = "auto" if engine.drafter is not None else 0
    try:
        engine.generate([1], 2, gamma=gamma)
        if max_batch > 1:
            engine.generate_batch([[1], [1, 2]], 2, gamma=gamma, max_batch=max_batch)
            seconds = engine.batch_scheduler(max_batch).measure_step_costs()
            log.info("batched step costs measured in %.1f s", seconds)
    except QuickdraftError as exc:
        log.warning("warm-up generation failed: %s", exc)


def uses_ray(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) is not None
               for name in ("replicas", "min_replicas", "max_replicas", "ray_address"))


def cmd_serve(args: argparse.Namespace) -> int:
    if uses_ray(args):
        return _serve_on_ray(args)
    try:
        import uvicorn

        from quickdraft.server.app import create_app
    except ModuleNotFoundError as exc:
        raise QuickdraftError(f"`quickdraft serve` needs {exc.name}: pip install 'quickdraft[serve]'") from None
    from quickdraft.cli import build_engine
    from quickdraft.server.engine_process import EngineProcess, engine_info

    if args.in_process:
        engine = build_engine(args)
        warm_up(engine, args.max_batch)
    else:  # built, warmed up and run in a process of its own (server/engine_process.py says why)
        engine = EngineProcess(functools.partial(build_engine, args), args.max_batch,
                               stream_interval_s=args.stream_interval / 1000)
    name = served_model_name(args)
    app = create_app(engine, model_name=name, max_queue=args.max_queue, request_timeout_s=args.request_timeout,
                     max_body_bytes=args.max_body_bytes, max_batch=args.max_batch)
    info = engine_info(engine)
    drafter = info.drafter.name if info.drafter is not None else "none"
    print(f"quickdraft serve: model {name!r} (drafter {drafter}, context {info.context_length}) on "
          f"http://{args.host}:{args.port}/v1", file=sys.stderr)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)
    finally:
        if isinstance(engine, EngineProcess):
            engine.close()
    return 0


def _serve_on_ray(args: argparse.Namespace) -> int:
    try:
        from quickdraft.server.ray_serve import cmd_serve_ray
    except ModuleNotFoundError as exc:
        raise QuickdraftError(f"serving on Ray needs {exc.name}: pip install 'quickdraft[ray]'") from None
    if args.min_replicas is not None and args.max_replicas is not None and args.max_replicas < args.min_replicas:
        raise QuickdraftError(f"--max-replicas ({args.max_replicas}) is below --min-replicas ({args.min_replicas})")
    if not args.ray_address:
        _check_models_exist(args)
    return cmd_serve_ray(args, served_model_name(args))


def _check_models_exist(args: argparse.Namespace) -> None:
    """Fail in seconds on a model that is not there, rather than after Ray Serve has retried each
    replica's constructor. (Skipped for a remote cluster, whose nodes may hold paths this one lacks.)"""
    from quickdraft.cli import resolve_target_and_drafter
    from quickdraft.drafters.factory import draft_model_path
    from quickdraft.model.weights import resolve_model_dir

    target, drafter = resolve_target_and_drafter(args)
    resolve_model_dir(target)
    draft_model = draft_model_path(drafter) if drafter else None
    if draft_model:
        resolve_model_dir(draft_model)


class BackgroundServer:
    """uvicorn serving ``app`` from a thread on ``host`` (a free port unless given): for tests and
    for tools that need a loopback server in-process.

    >>> with BackgroundServer(app) as server:          # doctest: +SKIP
    ...     httpx.get(server.url + "/health")
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, log_level: str = "warning",
                 startup_timeout_s: float = 30.0) -> None:
        self.app, self.host, self.port, self.log_level = app, host, port, log_level
        self.startup_timeout_s = startup_timeout_s
        self._server = None
        self._thread = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> BackgroundServer:
        import socket
        import threading
        import time

        import uvicorn

        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level=self.log_level, lifespan="on", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="uvicorn",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + self.startup_timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server did not start on {self.url}")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc_info) -> None:
        self._server.should_exit = True
        self._thread.join(10)
