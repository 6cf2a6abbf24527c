"""The engine's side of serving: the bounded queue of jobs and the worker that runs them.

A GenerationJob carries one request to the engine and its events back (an asyncio.Queue fed
thread-safely). The EngineWorker is the one thread that runs the engine: one job at a time, or the
continuous-batching scheduler's steps. It runs in the HTTP process (``create_app(engine)``) or in an
engine process of its own (``server/engine_process.py``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from quickdraft.output import StreamEvent
from quickdraft.errors import QuickdraftError
from quickdraft.sampling_params import SamplingParams
from quickdraft.server.metrics import Metrics

if TYPE_CHECKING:  # the HTTP process of an engine process never imports the engine (nor torch)
    from quickdraft.engine import Engine

log = logging.getLogger(__name__)


class QueueFull(Exception):
    pass


@dataclass
class NotRun:
    """The job left the queue without running (its deadline passed, or its client left)."""

    reason: str


@dataclass
class GenerationJob:
    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams
    gamma: int | str
    stop: list[str]
    deadline: float  # time.monotonic()
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)  # StreamEvent | NotRun | BaseException
    cancel_reason: str | None = None  # "disconnect" | "timeout"
    finished: bool = False
    on_cancel: Callable[[str], None] | None = None  # tells an engine in another process

    def cancel(self, reason: str) -> None:
        if not self.finished and self.cancel_reason is None:
            self.cancel_reason = reason
            if self.on_cancel is not None:
                self.on_cancel(reason)

    def cancelled(self) -> bool:
        """Checked by the engine after every step (from the worker thread)."""
        if self.cancel_reason is None and time.monotonic() > self.deadline:
            self.cancel_reason = "timeout"
        return self.cancel_reason is not None

    def emit(self, item: StreamEvent | NotRun | BaseException) -> None:
        """Hand an item to the waiting handler (thread-safe)."""
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, item)
        except RuntimeError:  # the event loop is closed: the server is shutting down
            pass


class RequestQueue:
    """Bounded FIFO of jobs waiting for the engine."""

    def __init__(self, max_queue: int) -> None:
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self._jobs: deque[GenerationJob] = deque()
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return len(self._jobs)

    def put(self, job: GenerationJob) -> None:
        with self._cond:
            if len(self._jobs) >= self.max_queue:
                raise QueueFull
            self._jobs.append(job)
            self._cond.notify()

    def withdraw(self, job: GenerationJob) -> bool:
        """Remove a job that has not started; False if the worker already took it."""
        with self._cond:
            try:
                self._jobs.remove(job)
            except ValueError:
                return False
            return True

    def take(self, limit: int = 1, *, block: bool = True) -> list[GenerationJob] | None:
        """Up to ``limit`` jobs, waiting for one when ``block`` and none is queued; None when closed."""
        with self._cond:
            while block and not self._jobs and not self._closed:
                self._cond.wait()
            if self._closed:
                return None
            return [self._jobs.popleft() for _ in range(min(limit, len(self._jobs)))]

    def close(self) -> list[GenerationJob]:
        with self._cond:
            self._closed = True
            left = list(self._jobs)
            self._jobs.clear()
            self._cond.notify_all()
            return left


class EngineWorker:
    """The one thread that runs the engine: with ``max_batch`` > 1 it drives the engine's
    continuous-batching scheduler (jobs join and leave between steps); with 1 it runs one request
    at a time through the single-sequence loop."""

    def __init__(self, engine: Engine, queue: RequestQueue, metrics: Metrics, max_batch: int = 1,
                 flush: Callable[[], None] = lambda: None) -> None:
        """``flush`` runs after each step's events are emitted (an engine process sends them then)."""
        self.engine, self.queue, self.metrics = engine, queue, metrics
        self.max_batch = max_batch
        self.flush = flush
        self.scheduler = engine.batch_scheduler(max_batch) if max_batch > 1 else None
        self._single_running = 0
        self.current: GenerationJob | None = None
        self._jobs: dict[int, GenerationJob] = {}  # id(BatchRequest) -> job
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def running(self) -> int:
        return self.scheduler.running if self.scheduler is not None else self._single_running

    @property
    def batch_size(self) -> int:
        """Sequences in the last batched step."""
        return self.scheduler.last_batch if self.scheduler is not None else self._single_running

    @property
    def step_gamma(self) -> int:
        """The γ the last batched step chose for its auto-γ sequences."""
        return self.scheduler.last_gamma if self.scheduler is not None else 0

    @property
    def threads(self) -> int:
        """CPU threads the engine's steps run with."""
        return self.engine.threads

    @property
    def alive(self) -> bool:
        """Whether the engine thread is running (it starts with the app, or with the first request)."""
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="quickdraft-engine", daemon=True)
                self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        for job in self.queue.close():
            job.emit(NotRun("shutdown"))
        current = self.current
        if current is not None:
            current.cancel("shutdown")
        for job in list(self._jobs.values()):
            job.cancel("shutdown")
        if self._thread is not None:
            self._thread.join(timeout)

    def _run(self) -> None:
        """Serve jobs from the queue until it is closed."""
        if self.scheduler is not None:
            self._run_batched(self.scheduler)
            return
        while (jobs := self.queue.take()) is not None:
            for job in jobs:
                self._generate(job)
                self.flush()

    def _run_batched(self, scheduler) -> None:  # noqa: ANN001 - quickdraft.batch.scheduler.BatchScheduler
        while True:
            self.flush()  # the last pass's events, before waiting for jobs
            free = self.max_batch - scheduler.running - len(scheduler.waiting)
            jobs = self.queue.take(max(free, 0), block=scheduler.idle)
            if jobs is None:
                break
            for job in jobs:
                self._admit(scheduler, job)
            if scheduler.idle:
                continue
            try:
                events = scheduler.step()
            except Exception as exc:  # a bug: fail the batch's requests with 500, keep serving
                log.exception("batched step failed")
                for request in [*scheduler.active, *scheduler.waiting]:
                    scheduler.cancel(request)
                for job in self._jobs.values():
                    job.finished = True
                    job.emit(exc)
                self._jobs.clear()
                scheduler.active.clear()
                scheduler.waiting.clear()
                continue
            for request, event in events:
                job = self._jobs[id(request)]
                if event.result is not None:
                    self._record(job, event)
                    job.finished = True
                    del self._jobs[id(request)]
                job.emit(event)
        for job in self._jobs.values():
            job.emit(NotRun("shutdown"))
        self.flush()

    def _skipped(self, job: GenerationJob) -> bool:
        """A job cancelled while it waited (deadline, disconnect) never runs: answer it now."""
        if not job.cancelled():
            return False
        self.metrics.inc("generations_cancelled_total", reason=job.cancel_reason or "unknown")
        job.finished = True
        job.emit(NotRun(job.cancel_reason or "cancelled"))
        return True

    def _record(self, job: GenerationJob, last: StreamEvent) -> None:
        result = last.result
        assert result is not None
        self.metrics.record_generation(result.stats, result.finish_reason)
        if result.finish_reason == "cancelled":
            self.metrics.inc("generations_cancelled_total", reason=job.cancel_reason or "unknown")

    def _admit(self, scheduler, job: GenerationJob) -> None:  # noqa: ANN001
        if self._skipped(job):
            return
        try:
            request = scheduler.submit(job.prompt_ids, job.max_tokens, job.sampling, job.gamma, job.stop,
                                       cancelled=job.cancelled)
        except QuickdraftError as exc:
            job.finished = True
            job.emit(exc)
            return
        self._jobs[id(request)] = job

    def _generate(self, job: GenerationJob) -> None:
        if self._skipped(job):
            return
        self._single_running += 1
        self.current = job
        try:
            for event in self.engine.stream(job.prompt_ids, job.max_tokens, job.sampling, job.gamma, job.stop,
                                            cancelled=job.cancelled):
                if event.result is not None:
                    self._record(job, event)
                job.emit(event)
                self.flush()
        except QuickdraftError as exc:
            job.emit(exc)
        except Exception as exc:  # a bug: answer 500, keep serving
            log.exception("generation failed")
            job.emit(exc)
        finally:
            job.finished = True
            self.current = None
            self._single_running -= 1
