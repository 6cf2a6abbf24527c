"""The engine in a process of its own, so that the HTTP layer and the engine never share one GIL.

    HTTP process                                                  engine process
    handlers ─▶ RequestQueue ─▶ forwarder thread ──submit/cancel──▶ receiver thread ─▶ RequestQueue
                                                                                            │
    job.events ◀── event-loop reader ◀──── one message per step ◀──── EngineWorker (main thread)

Why: in one process, every torch call of the engine thread releases the GIL and must win it back
from the event loop. Measured (16 sequences, plain, bf16, 1 thread): the scheduler alone decodes
6,300–6,600 tokens/s, beside a thread running Python 120 tokens/s; the batched server with the
engine in a thread delivered ~2,000 tokens/s to 16 clients while its two threads used 9.4 of the
machine's 20 CPU-seconds each 10 s. Apart, each process has its own GIL (vLLM splits its API
server from its engine core for the same reason).

The HTTP process keeps the request queue, so queueing, withdrawal of waiting jobs, deadlines
before admission and 429s behave as with the in-process worker. It hands the engine a job only
when a slot is free (``max_batch`` of them), so the engine's queue never holds more than its
batch. A job's later cancellation (disconnect) follows it as a message; its deadline is checked
by the engine itself (CLOCK_MONOTONIC is the same clock in both processes). Events come back in
one pickled message per step, read by the event loop itself (``add_reader``), so no thread hands
them over.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import multiprocessing
import pickle
import threading
import time
from dataclasses import dataclass
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

from quickdraft.errors import QuickdraftError
from quickdraft.model.tokenizer import Tokenizer, decode_ids, encode_prompt
from quickdraft.output import StreamEvent
from quickdraft.sampling_params import SamplingParams
from quickdraft.server.metrics import Metrics
from quickdraft.server.worker import EngineWorker, GenerationJob, NotRun, RequestQueue

if TYPE_CHECKING:  # the HTTP process of an engine process never imports the engine (nor torch)
    from quickdraft.engine import Engine

log = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 1800.0  # building the kernels and compiled graphs of a large target can take minutes
STOP_TIMEOUT_S = 10.0
DEFAULT_STREAM_INTERVAL_S = 0.02  # a job's text goes out at most every 20 ms (its first and last at once)


@dataclass(frozen=True)
class DrafterInfo:
    name: str


@dataclass
class EngineInfo:
    """What the HTTP layer needs of an engine that runs elsewhere: its tokenizer and limits."""

    tokenizer: Tokenizer | None
    vocab_limit: int
    context_length: int
    max_gamma: int
    drafter: DrafterInfo | None
    kernels: str | None = None  # the kernel build the engine's process loaded (kernels.loaded_isa)
    threads: int = 0  # CPU threads its steps ran with when it started

    @classmethod
    def of(cls, engine: Engine) -> EngineInfo:
        from quickdraft import kernels  # here in the engine's process: the HTTP one never imports torch

        drafter = DrafterInfo(engine.drafter.name) if engine.drafter is not None else None
        return cls(engine.tokenizer, engine.vocab_limit, engine.context_length, engine.max_gamma, drafter,
                   kernels.loaded_isa(), engine.threads)

    def encode(self, prompt: str | list[int]) -> list[int]:
        return encode_prompt(self.tokenizer, self.vocab_limit, prompt)

    def decode(self, ids: list[int]) -> str:
        return decode_ids(self.tokenizer, ids)


class EngineFailure(Exception):
    """An exception of the engine process that cannot cross as itself (a bug): its type's name."""

    def __init__(self, type_name: str, message: str = "") -> None:
        super().__init__(type_name, message)
        self.type_name, self.message = type_name, message


def _portable(item: Any) -> Any:
    """``item`` if it pickles, else an EngineFailure naming what it was."""
    if isinstance(item, BaseException) and not isinstance(item, QuickdraftError):
        try:
            pickle.dumps(item)
        except Exception:
            return EngineFailure(type(item).__name__, str(item))
    return item


def _engine_exited() -> EngineFailure:
    return EngineFailure("EngineProcessExited", "the engine process exited")


def _final(item: Any) -> bool:
    return not isinstance(item, StreamEvent) or item.result is not None


# ---- the engine process -----------------------------------------------------------------------
class _Outbox:
    """The engine process's events, sent in one message per flush with the last step's batch size
    and γ; and
    its jobs by id, until their last event.

    A flush sends at most once per ``interval_s`` (a job's events in between merge into one),
    except that a job's first and last events go at once: time to first token and request latency
    do not wait. Fewer, larger events are what lets the HTTP process and the clients keep up with
    a batch (each event costs them ~80-110 µs, a token's share of an engine step ~200 µs)."""

    def __init__(self, conn: Connection, interval_s: float) -> None:
        self.conn, self.interval_s = conn, interval_s
        self.items: dict[int, tuple[Any, str | None]] = {}  # job id -> (its pending item, cancel reason)
        self.urgent = False
        self.last_sent = 0.0
        self.worker: EngineWorker | None = None
        self.jobs: dict[int, _RemoteJob] = {}
        self.started: set[int] = set()  # jobs whose first event went

    def add(self, job_id: int, item: Any, cancel_reason: str | None) -> None:
        pending = self.items.get(job_id)
        if pending is not None and isinstance(pending[0], StreamEvent) and isinstance(item, StreamEvent):
            item = StreamEvent(pending[0].text + item.text, pending[0].token_ids + item.token_ids, item.result)
        elif pending is not None:  # an error after events: the events stay, then the error
            self._send()
        self.items[job_id] = (_portable(item), cancel_reason)
        if _final(item):
            self.started.discard(job_id)
            self.urgent = True
        elif job_id not in self.started:
            self.started.add(job_id)
            self.urgent = True

    def flush(self) -> None:
        if self.items and (self.urgent or time.monotonic() - self.last_sent >= self.interval_s):
            self._send()

    def _send(self) -> None:
        items = [(job_id, item, reason) for job_id, (item, reason) in self.items.items()]
        self.items, self.urgent, self.last_sent = {}, False, time.monotonic()
        worker = self.worker
        gauges = (worker.batch_size, worker.step_gamma, worker.threads) if worker is not None else (0, 0, 0)
        try:
            self.conn.send(("events", items, gauges))
        except (BrokenPipeError, OSError):  # the HTTP process is gone; the receiver stops the worker
            pass


@dataclass
class _RemoteJob:
    """The engine process's side of a GenerationJob: same fields, its events go to the outbox."""

    job_id: int
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    gamma: int | str
    stop: list[str]
    deadline: float
    outbox: _Outbox
    cancel_reason: str | None = None
    finished: bool = False

    cancel = GenerationJob.cancel
    cancelled = GenerationJob.cancelled
    on_cancel = None

    def emit(self, item: Any) -> None:
        final = _final(item)
        if final:
            self.outbox.jobs.pop(self.job_id, None)
        self.outbox.add(self.job_id, item, self.cancel_reason if final else None)


def _receive(conn: Connection, queue: RequestQueue, outbox: _Outbox) -> None:
    """Submit and cancel messages from the HTTP process, until it says stop or goes away."""
    jobs = outbox.jobs
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            break
        kind = message[0]
        if kind == "submit":
            _, job_id, fields = message
            job = _RemoteJob(job_id, *fields, outbox=outbox)
            jobs[job_id] = job
            queue.put(job)
        elif kind == "cancel":
            job = jobs.get(message[1])
            if job is not None:
                job.cancel(message[2])
        elif kind == "stop":
            break
    queue.close()


def _engine_main(build: Callable[[], Engine], max_batch: int, stream_interval_s: float, conn: Connection) -> None:
    """The engine process: build and warm the engine, say ready, then serve jobs until told to stop."""
    from quickdraft.server.cli import warm_up

    try:
        engine = build()
        warm_up(engine, max_batch)
    except BaseException as exc:
        conn.send(("failed", _portable(exc)))
        return
    conn.send(("ready", EngineInfo.of(engine)))
    queue = RequestQueue(max_queue=2 * max_batch)  # the HTTP side has at most max_batch jobs here
    outbox = _Outbox(conn, stream_interval_s)
    worker = EngineWorker(engine, queue, Metrics(), max_batch, flush=outbox.flush)
    outbox.worker = worker
    threading.Thread(target=_receive, args=(conn, queue, outbox), name="quickdraft-receiver", daemon=True).start()
    worker._run()


# ---- the HTTP process -------------------------------------------------------------------------
class EngineProcess:
    """An engine built by ``build`` (a picklable callable, e.g. ``functools.partial(build_engine,
    args)``) in a spawned process: ``quickdraft serve``'s default.

    ``info`` stands in for the engine where the HTTP layer reads it (tokenizer, context, limits).
    """

    def __init__(self, build: Callable[[], Engine], max_batch: int,
                 stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S,
                 startup_timeout_s: float = STARTUP_TIMEOUT_S) -> None:
        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited threads or locks
        self.conn, child = context.Pipe()
        self.max_batch = max_batch
        self.process = context.Process(target=_engine_main, args=(build, max_batch, stream_interval_s, child), name="quickdraft-engine")
        self.process.start()
        child.close()
        self._send_lock = threading.Lock()
        if not self.conn.poll(startup_timeout_s):
            self.close()
            raise QuickdraftError(f"the engine process did not start within {startup_timeout_s:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            self.process.join(STOP_TIMEOUT_S)
            raise QuickdraftError(f"the engine process exited while starting (exit code {self.process.exitcode})") \
                from None
        if kind == "failed":
            self.close()
            raise payload
        self.info: EngineInfo = payload

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def send(self, message: tuple) -> None:
        with self._send_lock:
            self.conn.send(message)

    def close(self) -> None:
        """Ask the engine to stop (it answers what it still runs with 'shutdown'), then end it."""
        if self.process.is_alive():
            try:
                self.send(("stop",))
            except (BrokenPipeError, OSError):
                pass
            self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_TIMEOUT_S)


def engine_info(engine: Engine | EngineProcess) -> Engine | EngineInfo:
    """The object that answers the HTTP layer's questions about ``engine``."""
    return engine.info if isinstance(engine, EngineProcess) else engine


class ProcessWorker:
    """EngineWorker's stand-in in the HTTP process: forwards jobs to an EngineProcess as slots free
    up, and hands its events to each job's queue from the event loop."""

    def __init__(self, process: EngineProcess, queue: RequestQueue, metrics: Metrics) -> None:
        self.process, self.queue, self.metrics = process, queue, metrics
        self._slots = threading.Semaphore(process.max_batch)
        self._jobs: dict[int, GenerationJob] = {}
        self._ids = itertools.count()
        # the engine's batch size, step γ and threads, when it last sent events
        self._gauges = (0, 0, process.info.threads)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._lost = False

    # The jobs the engine holds (generating, or admitted for its next step), counted here: a count
    # of the engine's would travel with its events, and none follows its last one.
    running = property(lambda self: len(self._jobs))
    batch_size = property(lambda self: self._gauges[0])
    step_gamma = property(lambda self: self._gauges[1])
    threads = property(lambda self: self._gauges[2])

    @property
    def alive(self) -> bool:
        """The engine process runs, and so does the forwarder once started."""
        return self.process.process.is_alive() and (self._thread is None or self._thread.is_alive())

    def start(self) -> None:
        """Start forwarding on the running event loop (the app's lifespan, or its first request);
        outside one (a Ray Serve replica's constructor) it waits for the first request."""
        if self._loop is not None:
            return
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._loop.add_reader(self.process.conn.fileno(), self._on_readable)
        self._thread = threading.Thread(target=self._forward, name="quickdraft-forwarder", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        for job in self.queue.close():
            job.emit(NotRun("shutdown"))
        for job_id in list(self._jobs):
            self._cancel(job_id, "shutdown")
        if self._loop is not None and not self._lost:
            self._loop.remove_reader(self.process.conn.fileno())
        self._slots.release()  # a forwarder waiting for a slot sees the closed queue
        self.process.close()
        for job in list(self._jobs.values()):
            job.finished = True
            job.emit(NotRun("shutdown"))
        self._jobs.clear()
        if self._thread is not None:
            self._thread.join(timeout)

    def _forward(self) -> None:
        while True:
            self._slots.acquire()
            jobs = self.queue.take(1)
            if jobs is None:
                return
            job = jobs[0]
            if job.cancelled():  # its client left or its deadline passed while it waited
                self.metrics.inc("generations_cancelled_total", reason=job.cancel_reason or "unknown")
                job.finished = True
                job.emit(NotRun(job.cancel_reason or "cancelled"))
                self._slots.release()
                continue
            if self._lost:
                self._fail_lost(job)
                continue
            job_id = next(self._ids)
            self._jobs[job_id] = job
            try:
                self.process.send(("submit", job_id, (job.prompt_ids, job.max_tokens, job.sampling, job.gamma,
                                                      job.stop, job.deadline)))
            except (BrokenPipeError, OSError):
                self._jobs.pop(job_id, None)
                self._fail_lost(job)
                continue
            job.on_cancel = lambda reason, job_id=job_id: self._cancel(job_id, reason)
            if job.cancel_reason is not None:  # cancelled between take() and on_cancel
                self._cancel(job_id, job.cancel_reason)
            if self._lost and self._jobs.pop(job_id, None) is not None:  # the engine died meanwhile
                self._fail_lost(job)

    def _fail_lost(self, job: GenerationJob) -> None:
        """Answer a job the engine process will never run (it exited), and free its slot."""
        job.finished = True
        job.emit(_engine_exited())
        self._slots.release()

    def _cancel(self, job_id: int, reason: str) -> None:
        try:
            self.process.send(("cancel", job_id, reason))
        except (BrokenPipeError, OSError):
            pass

    def _on_readable(self) -> None:
        conn = self.process.conn
        try:
            while conn.poll():
                kind, items, gauges = conn.recv()
                self._gauges = gauges
                for job_id, item, cancel_reason in items:
                    self._deliver(job_id, item, cancel_reason)
        except (EOFError, OSError):
            self._engine_lost()

    def _deliver(self, job_id: int, item: Any, cancel_reason: str | None) -> None:
        job = self._jobs.get(job_id)
        if job is None:
            return
        if _final(item):
            del self._jobs[job_id]
            job.finished = True
            self._slots.release()
            self._record(item, cancel_reason or job.cancel_reason)
        job.events.put_nowait(item)

    def _record(self, item: Any, cancel_reason: str | None) -> None:
        if isinstance(item, NotRun):
            self.metrics.inc("generations_cancelled_total", reason=cancel_reason or item.reason)
        elif isinstance(item, StreamEvent):
            self.metrics.record_generation(item.result.stats, item.result.finish_reason)
            if item.result.finish_reason == "cancelled":
                self.metrics.inc("generations_cancelled_total", reason=cancel_reason or "unknown")

    def _engine_lost(self) -> None:
        """The engine process died: fail what it ran, and what comes next."""
        if self._lost:
            return
        self._lost = True
        log.error("the engine process exited (code %s)", self.process.process.exitcode)
        self._loop.remove_reader(self.process.conn.fileno())
        for job in list(self._jobs.values()):
            job.finished = True
            job.events.put_nowait(_engine_exited())
            self._slots.release()
        self._jobs.clear()
