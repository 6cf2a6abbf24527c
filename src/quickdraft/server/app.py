"""The OpenAI-compatible HTTP API: one engine, one worker, a bounded queue between them.

    HTTP handler (event loop) ──validate, tokenize──▶ RequestQueue ──▶ EngineWorker (thread)
          ▲                                                              │ engine.stream(...)
          └────────── StreamEvents through an asyncio.Queue ◀───────────┘

Given an ``Engine``, the worker is a thread of this process. Given an ``EngineProcess`` (what
``quickdraft serve`` runs), a ProcessWorker forwards the queue's jobs to the engine's own process
and its events back (``server/engine_process.py``), so the two never contend for one GIL.

Handlers reject bad input before it is queued (OpenAI-shaped 4xx errors), so the engine only sees
requests it can serve. The worker takes jobs from ``RequestQueue.take()`` as its batch has room;
each job keeps its own event queue and cancel flag.

A job stops early when its client disconnects or its deadline (``request_timeout_s`` after it
arrived) passes: the engine checks ``job.cancelled()`` after every step. A job still waiting when
its deadline passes is withdrawn and answered 503; one already generating returns what it has
with ``finish_reason: "length"`` (the time limit acts like a token limit).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from quickdraft.batch import DEFAULT_MAX_BATCH
from quickdraft.errors import ContextLengthError, QuickdraftError, SamplingParamsError
from quickdraft.output import StreamEvent
from quickdraft.sampling_params import SamplingParams
from quickdraft.server.engine_process import EngineInfo, EngineProcess, ProcessWorker, engine_info
from quickdraft.server.metrics import Metrics
from quickdraft.server.schemas import (
    ChatCompletionRequest,
    ChatCompletionResponse,
    CompletionRequest,
    CompletionResponse,
    ErrorResponse,
    Health,
    ModelCard,
    ModelList,
    UNSUPPORTED,
    SamplingFields,
)
from quickdraft.server.worker import EngineWorker, GenerationJob, NotRun, QueueFull, RequestQueue

if TYPE_CHECKING:  # the HTTP process of an engine process never imports the engine (nor torch)
    from quickdraft.engine import Engine

log = logging.getLogger(__name__)

DEFAULT_MAX_QUEUE = 64
DEFAULT_REQUEST_TIMEOUT_S = 300.0
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
DEFAULT_GAMMA = "auto"  # the CLI's default (quickdraft generate --gamma auto)
RETRY_AFTER_S = 1
# Temperatures (and top_p) below this decode greedily, as in vLLM: logits / 5e-324 overflow to inf
# and top_p = 5e-324 masks every token (NaN probabilities), while the distribution at such a
# setting is the argmax's point mass anyway.
GREEDY_BELOW = 1e-5


# ---- errors ---------------------------------------------------------------------------------
class APIError(Exception):
    """An error answered in OpenAI's shape: {"error": {"message", "type", "param", "code"}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", *, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code
        self.headers = headers

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorResponse, "description": "Invalid request: malformed JSON, wrong types, out-of-range "
                                                 "parameters, a prompt longer than the context."},
    404: {"model": ErrorResponse, "description": "Unknown model."},
    413: {"model": ErrorResponse, "description": "Request body too large."},
    429: {"model": ErrorResponse, "description": "The request queue is full; retry after Retry-After seconds."},
    503: {"model": ErrorResponse, "description": "The request waited in the queue past its timeout."},
}


def _error_from_quickdraft(exc: QuickdraftError, param: str | None = None) -> APIError:
    if isinstance(exc, ContextLengthError):
        return APIError(400, str(exc), param=param or "messages", code="context_length_exceeded")
    if isinstance(exc, SamplingParamsError):
        return APIError(400, str(exc), param=param)
    return APIError(400, str(exc), param=param)


def _validation_message(errors: list[dict[str, Any]]) -> tuple[str, str | None]:
    """A one-line message and the offending parameter from pydantic's error list."""
    by_param: dict[str, list[str]] = {}
    for err in errors:
        if err.get("type") == "json_invalid":
            reason = err.get("ctx", {}).get("error", "parse error")
            return f"the request body is not valid JSON ({reason})", None
        where = _param_name(err.get("loc", ()))
        message = err.get("msg", "invalid value")
        if where.startswith("logit_bias.") and err.get("type") == "string_pattern_mismatch":
            message = "keys must be token ids, as strings of digits (e.g. \"50256\")"
        if where.split(".")[0] in UNSUPPORTED:
            name = where.split(".")[0]
            where, message = name, f"not supported by quickdraft; send {UNSUPPORTED[name]} or leave it out"
        if where == "body":  # no JSON object at all: missing, a list, or not sent as JSON
            message = "the request body must be a JSON object, sent with Content-Type: application/json"
        if message not in by_param.setdefault(where, []):
            by_param[where].append(message)
    parts = [(f"{where}: " if where != "body" else "") + " or ".join(messages)
             for where, messages in list(by_param.items())[:3]]
    if len(by_param) > 3:
        parts.append(f"and {len(by_param) - 3} more")
    first = next(iter(by_param), "body")
    return "; ".join(parts) or "invalid request", None if first == "body" else first


_UNION_TAG = re.compile(r"^(str|int|float|bool|none|list|dict)$|[\[\]-]")


def _param_name(loc: tuple | list) -> str:
    """("body", "prompt", "list[int]", 0) -> "prompt.0": the request's path, without pydantic's
    union-member tags."""
    parts = [str(x) for x in loc if x != "body" and not (isinstance(x, str) and _UNION_TAG.search(x))]
    return ".".join(parts) or "body"


# ---- the app --------------------------------------------------------------------------------
@dataclass
class ServerState:
    engine: Engine | EngineInfo
    model_name: str
    queue: RequestQueue
    worker: EngineWorker | ProcessWorker
    metrics: Metrics
    request_timeout_s: float
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def drafter_name(self) -> str | None:
        return self.engine.drafter.name if self.engine.drafter is not None else None


class _Guard:
    """ASGI middleware: caps the request body size (413) and counts requests by endpoint and status."""

    ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")

    def __init__(self, app, metrics: Metrics, max_body_bytes: int) -> None:
        self.app, self.metrics, self.max_body_bytes = app, metrics, max_body_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        endpoint = path if path in self.ENDPOINTS else "/v1/models/{model}" if path.startswith("/v1/models/") else "other"
        status = {"code": 500}

        async def counting_send(message) -> None:
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            length = int(dict(scope.get("headers") or []).get(b"content-length", b"0") or 0)
        except ValueError:
            length = 0
        if length > self.max_body_bytes:
            err = _too_large(self.max_body_bytes)
            self.metrics.inc("errors_total", type=err.type, code=str(err.status))
            response = JSONResponse(err.body(), status_code=err.status, headers={"Connection": "close"})
            await response(scope, receive, counting_send)
        else:
            received = 0

            async def limited_receive():
                nonlocal received
                message = await receive()
                if message["type"] == "http.request":
                    received += len(message.get("body", b""))
                    if received > self.max_body_bytes:
                        raise HTTPException(413, _too_large(self.max_body_bytes).message)
                return message

            await self.app(scope, limited_receive, counting_send)
        self.metrics.inc("requests_total", endpoint=endpoint, status=str(status["code"]))


def _too_large(limit: int) -> APIError:
    return APIError(413, f"the request body exceeds {limit} bytes", code="request_too_large")


def create_app(
    engine: Engine | EngineProcess,
    *,
    model_name: str = "quickdraft",
    max_queue: int = DEFAULT_MAX_QUEUE,
    request_timeout_s: float = DEFAULT_REQUEST_TIMEOUT_S,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_batch: int = DEFAULT_MAX_BATCH,
) -> FastAPI:
    """The FastAPI app serving ``engine`` as ``model_name``. The worker starts with the app (its
    lifespan) and stops with it; an EngineProcess stops with it too. ``max_batch`` > 1 batches
    concurrent requests (continuous batching); 1 serves them one at a time. An EngineProcess
    batches as it was built to (its own ``max_batch``)."""
    if request_timeout_s <= 0:
        raise ValueError(f"request_timeout_s must be > 0, got {request_timeout_s}")
    if max_batch < 1:
        raise ValueError(f"max_batch must be >= 1, got {max_batch}")
    metrics = Metrics()
    queue = RequestQueue(max_queue)
    worker = (ProcessWorker(engine, queue, metrics) if isinstance(engine, EngineProcess)
              else EngineWorker(engine, queue, metrics, max_batch))
    kernel_build = engine.info.kernels if isinstance(engine, EngineProcess) else EngineInfo.of(engine).kernels
    engine = engine_info(engine)
    state = ServerState(engine, model_name, queue, worker, metrics, request_timeout_s)
    metrics.gauge("queue_depth", lambda: len(queue))
    metrics.gauge("running_requests", lambda: worker.running)
    metrics.gauge("batch_size", lambda: worker.batch_size)
    metrics.gauge("step_gamma", lambda: worker.step_gamma)
    metrics.gauge("threads", lambda: worker.threads)

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        worker.start()
        try:
            yield
        finally:
            worker.stop()

    app = FastAPI(
        title="quickdraft",
        description="OpenAI-compatible API for lossless speculative decoding.",
        version=_version(),
        lifespan=lifespan,
    )
    app.state.quickdraft = state
    app.add_middleware(_Guard, metrics=metrics, max_body_bytes=max_body_bytes)

    def error_response(err: APIError) -> JSONResponse:
        metrics.inc("errors_total", type=err.type, code=str(err.status))
        return JSONResponse(err.body(), status_code=err.status, headers=err.headers)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, exc: APIError) -> JSONResponse:
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        # OpenAI answers invalid parameters with 400 (not FastAPI's 422); the schema says so too.
        message, param = _validation_message(list(exc.errors()))
        return error_response(APIError(400, message, param=param))

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        kind = "invalid_request_error" if exc.status_code < 500 else "server_error"
        code = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}.get(exc.status_code)
        return error_response(APIError(exc.status_code, str(exc.detail), kind, code=code,
                                       headers=getattr(exc, "headers", None)))

    @app.exception_handler(Exception)
    async def _internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(APIError(500, "internal server error", "server_error"))

    # ---- endpoints --------------------------------------------------------------------------
    def model_card() -> ModelCard:
        return ModelCard(id=model_name, created=state.created, context_length=engine.context_length,
                         drafter=state.drafter_name)

    @app.get("/v1/models", response_model=ModelList)
    async def list_models() -> ModelList:
        return ModelList(data=[model_card()])

    @app.get("/v1/models/{model:path}", response_model=ModelCard, responses={404: ERROR_RESPONSES[404]})
    async def retrieve_model(model: str) -> ModelCard:
        _check_model(model)
        return model_card()

    @app.get("/health", response_model=Health)
    async def health() -> Health:
        return Health(model=model_name, queued=len(queue), running=worker.running, max_queue=queue.max_queue,
                      kernels=kernel_build)

    @app.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> PlainTextResponse:
        return PlainTextResponse(metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    post_responses = {
        200: {"content": {"text/event-stream": {"schema": SSE_EVENT}},
              "description": "A JSON response, or server-sent events when stream is true."},
        **ERROR_RESPONSES,
    }

    @app.post("/v1/completions", response_model=CompletionResponse, responses=post_responses)
    async def completions(body: CompletionRequest, request: Request):
        _check_model(body.model)
        prompt_ids = await run_in_threadpool(_encode, body.prompt, "prompt")
        max_tokens = _max_tokens(len(prompt_ids), body.max_tokens, "max_tokens", "prompt", default_to_rest=False)
        job = _submit(body, prompt_ids, max_tokens)
        echo = ""
        if body.echo:
            echo = body.prompt if isinstance(body.prompt, str) else engine.decode(list(body.prompt))
        if body.stream:
            return await _stream(request, job, _CompletionChunks(model_name, echo), body)
        result = await _collect(request, job)
        return CompletionResponse(
            id=_new_id("cmpl"), created=int(time.time()), model=model_name,
            choices=[{"index": 0, "text": echo + result.text, "finish_reason": _finish_reason(result)}],
            usage=_usage(result), speculative=_speculative(result),
        )

    @app.post("/v1/chat/completions", response_model=ChatCompletionResponse, responses=post_responses)
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        _check_model(body.model)
        if engine.tokenizer is None:
            raise APIError(400, "this model has no tokenizer, so it cannot chat; use /v1/completions with token "
                                "ids", param="messages")
        messages = [{"role": m.role, "content": m.text(), **({"name": m.name} if m.name else {})}
                    for m in body.messages]
        prompt_ids = await run_in_threadpool(_encode_chat, messages)
        requested = body.max_completion_tokens or body.max_tokens
        param = "max_completion_tokens" if body.max_completion_tokens else "max_tokens"
        max_tokens = _max_tokens(len(prompt_ids), requested, param, "messages", default_to_rest=True)
        job = _submit(body, prompt_ids, max_tokens)
        if body.stream:
            return await _stream(request, job, _ChatChunks(model_name), body)
        result = await _collect(request, job)
        return ChatCompletionResponse(
            id=_new_id("chatcmpl"), created=int(time.time()), model=model_name,
            choices=[{"index": 0, "message": {"role": "assistant", "content": result.text},
                      "finish_reason": _finish_reason(result)}],
            usage=_usage(result), speculative=_speculative(result),
        )

    # ---- request handling -------------------------------------------------------------------
    def _check_model(name: str) -> None:
        if name != model_name:
            raise APIError(404, f"the model {name!r} does not exist; this server serves {model_name!r}",
                           param="model", code="model_not_found")

    def _encode_chat(messages: list[dict[str, str]]) -> list[int]:
        try:
            prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
        except Exception as exc:  # the template is the model's code: any failure is about these messages
            raise APIError(400, f"the model's chat template rejected these messages: {exc}", param="messages") from exc
        return _encode(prompt, "messages")

    # Tokenizing (up to max_body_bytes of text) runs in a thread pool, off the event loop.
    def _encode(prompt: str | list[int], param: str) -> list[int]:
        try:
            return engine.encode(prompt)
        except QuickdraftError as exc:
            raise _error_from_quickdraft(exc, param) from exc

    def _max_tokens(n_prompt: int, requested: int | None, param: str, prompt_param: str, *,
                    default_to_rest: bool) -> int:
        """The generation length: the request's, checked against the context, or the default."""
        context = engine.context_length
        if n_prompt >= context:
            raise APIError(400, f"the prompt has {n_prompt} tokens, but the model's context holds {context}: "
                                f"shorten the prompt", param=prompt_param, code="context_length_exceeded")
        rest = context - n_prompt
        if requested is None:
            return rest if default_to_rest else min(16, rest)
        if requested > rest:
            raise APIError(400, f"the prompt ({n_prompt} tokens) + {param} ({requested}) exceeds the model's context "
                                f"({context}); lower {param} to at most {rest}", param=param,
                           code="context_length_exceeded")
        return requested

    def _submit(body: SamplingFields, prompt_ids: list[int], max_tokens: int) -> GenerationJob:
        temperature = 1.0 if body.temperature is None else body.temperature
        top_p = 1.0 if body.top_p is None else float(body.top_p)
        if temperature < GREEDY_BELOW or top_p < GREEDY_BELOW:
            temperature = 0.0  # top_p that small keeps only the most likely token: greedy, in effect
        top_k = 0 if body.top_k in (None, -1) else body.top_k
        try:
            sampling = SamplingParams(temperature=float(temperature), top_k=top_k,
                                      top_p=top_p, seed=body.seed, rule=body.sampling_rule or "auto",
                                      presence_penalty=float(body.presence_penalty or 0),
                                      frequency_penalty=float(body.frequency_penalty or 0),
                                      logit_bias={int(token): bias for token, bias in (body.logit_bias or {}).items()})
        except QuickdraftError as exc:
            raise _error_from_quickdraft(exc) from exc
        try:
            sampling.check_vocabulary(engine.vocab_limit)
        except QuickdraftError as exc:
            raise _error_from_quickdraft(exc, param="logit_bias") from exc
        gamma: int | str = DEFAULT_GAMMA if body.gamma is None else body.gamma
        if engine.drafter is None:
            gamma = 0
        elif isinstance(gamma, int) and gamma > engine.max_gamma:
            raise APIError(400, f"gamma {gamma} exceeds this server's max_gamma {engine.max_gamma}", param="gamma")
        job = GenerationJob(prompt_ids, max_tokens, sampling, gamma, body.stop_list(),
                            deadline=time.monotonic() + request_timeout_s, loop=asyncio.get_running_loop())
        worker.start()  # normally started by the lifespan; an app driven without one still works
        try:
            queue.put(job)
        except QueueFull:
            metrics.inc("requests_rejected_total")
            raise APIError(429, f"the server's request queue is full ({queue.max_queue} waiting); retry after "
                                f"{RETRY_AFTER_S} s", "rate_limit_error", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None
        return job

    async def _next(job: GenerationJob) -> StreamEvent:
        """The job's next event; raises APIError for a job that failed or never ran."""
        while True:
            if job.finished or job.cancel_reason is not None:
                item = await job.events.get()
            else:
                try:
                    # While queued, the deadline is enforced here; once running, by the engine.
                    item = await asyncio.wait_for(job.events.get(), max(0.0, job.deadline - time.monotonic()) + 0.05)
                except asyncio.TimeoutError:
                    if queue.withdraw(job):
                        job.cancel("timeout")
                        metrics.inc("generations_cancelled_total", reason="timeout")
                        raise _queue_timeout() from None
                    continue  # running: the engine stops at its next step
            if isinstance(item, StreamEvent):
                return item
            if isinstance(item, NotRun):
                raise _queue_timeout() if item.reason == "timeout" else APIError(
                    503, f"the request was not run ({item.reason})", "server_error", code="not_run")
            if isinstance(item, QuickdraftError):
                raise _error_from_quickdraft(item)
            raise APIError(500, f"generation failed: {getattr(item, 'type_name', type(item).__name__)}", "server_error")

    def _watch(request: Request, job: GenerationJob) -> asyncio.Task:
        """A task that cancels ``job`` when its client disconnects."""

        async def watch() -> None:
            while True:
                message = await request.receive()
                if message["type"] == "http.disconnect":
                    _abandon(job, "disconnect")
                    return

        return asyncio.create_task(watch())

    def _abandon(job: GenerationJob, reason: str) -> None:
        if job.finished:
            return
        job.cancel(reason)
        if queue.withdraw(job):
            job.finished = True
            metrics.inc("generations_cancelled_total", reason=reason)

    async def _collect(request: Request, job: GenerationJob):
        watcher = _watch(request, job)
        try:
            while True:
                event = await _next(job)
                if event.result is not None:
                    return event.result
        finally:
            watcher.cancel()
            _abandon(job, "disconnect")  # no-op when the job finished

    async def _stream(request: Request, job: GenerationJob, chunks: _Chunks, body: SamplingFields):
        watcher = _watch(request, job)
        try:
            first = await _next(job)  # errors before the first token still get a status code
        except BaseException:
            watcher.cancel()
            _abandon(job, "disconnect")
            raise
        include_usage = bool(body.stream_options and body.stream_options.include_usage)

        async def events() -> AsyncIterator[str]:
            try:
                for piece in chunks.start():
                    yield _sse(piece)
                event = first
                while True:
                    if event.text:
                        yield _sse(chunks.delta(event.text))
                    if event.result is not None:
                        result = event.result
                        usage, spec = _usage(result).model_dump(), _speculative(result).model_dump()
                        yield _sse(chunks.finish(_finish_reason(result), usage, spec))
                        if include_usage:
                            yield _sse(chunks.usage_only(usage, spec))
                        break
                    try:
                        event = await _next(job)
                    except APIError as err:
                        metrics.inc("errors_total", type=err.type, code=str(err.status))
                        yield _sse(err.body())
                        break
                yield "data: [DONE]\n\n"
            finally:
                watcher.cancel()
                _abandon(job, "disconnect")

        return StreamingResponse(events(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    def _finish_reason(result) -> str:
        # "cancelled" reaches a client only through the timeout (a disconnected client sees nothing).
        return "stop" if result.finish_reason == "stop" else "length"

    app.openapi = lambda: _openapi(app)
    return app


def _queue_timeout() -> APIError:
    return APIError(503, "the request waited in the queue past the server's request timeout; retry later",
                    "server_error", code="queue_timeout", headers={"Retry-After": str(RETRY_AFTER_S)})


def _usage(result) -> Any:
    from quickdraft.server.schemas import Usage

    n_prompt, n_out = len(result.prompt_ids), len(result.token_ids)
    return Usage(prompt_tokens=n_prompt, completion_tokens=n_out, total_tokens=n_prompt + n_out)


def _speculative(result) -> Any:
    from quickdraft.server.schemas import SpeculativeStats

    s = result.stats
    return SpeculativeStats(drafter=s.drafter, drafted=s.drafted, accepted=s.accepted,
                            acceptance_rate=s.acceptance_rate, mean_accepted_length=s.mean_accepted_length,
                            num_drafts=s.num_drafts, target_calls=s.target_calls,
                            accepted_per_position=list(s.accepted_per_position))


def _new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def _sse(payload: dict[str, Any]) -> str:
    return f"data: {json.dumps(payload, separators=(',', ':'))}\n\n"


class _Chunks:
    """The chunk objects of one streamed response."""

    object_name = ""

    def __init__(self, model: str) -> None:
        self.model, self.created = model, int(time.time())
        self.id = _new_id("cmpl")

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        return {"id": self.id, "object": self.object_name, "created": self.created, "model": self.model,
                "choices": choices, **extra}

    def start(self) -> list[dict[str, Any]]:
        return []

    def delta(self, text: str) -> dict[str, Any]:
        raise NotImplementedError

    def finish(self, reason: str, usage: dict[str, Any], speculative: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def usage_only(self, usage: dict[str, Any], speculative: dict[str, Any]) -> dict[str, Any]:
        return self._chunk([], usage=usage, speculative=speculative)


class _CompletionChunks(_Chunks):
    object_name = "text_completion"

    def __init__(self, model: str, echo: str = "") -> None:
        super().__init__(model)
        self.echo = echo

    def start(self) -> list[dict[str, Any]]:
        return [self.delta(self.echo)] if self.echo else []

    def delta(self, text: str) -> dict[str, Any]:
        return self._chunk([{"index": 0, "text": text, "logprobs": None, "finish_reason": None}])

    def finish(self, reason: str, usage: dict[str, Any], speculative: dict[str, Any]) -> dict[str, Any]:
        return self._chunk([{"index": 0, "text": "", "logprobs": None, "finish_reason": reason}], usage=usage,
                           speculative=speculative)


class _ChatChunks(_Chunks):
    object_name = "chat.completion.chunk"

    def __init__(self, model: str) -> None:
        super().__init__(model)
        self.id = _new_id("chatcmpl")

    def start(self) -> list[dict[str, Any]]:
        return [self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                              "finish_reason": None}])]

    def delta(self, text: str) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": None}])

    def finish(self, reason: str, usage: dict[str, Any], speculative: dict[str, Any]) -> dict[str, Any]:
        return self._chunk([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": reason}], usage=usage,
                           speculative=speculative)


# One server-sent event: its data is a JSON chunk (a response object with partial choices; the last
# chunk carries usage and speculative), an error object, or "[DONE]" at the end.
SSE_EVENT = {"type": "object", "properties": {"data": {"type": "string"}, "event": {"type": "string"}},
             "required": ["data"]}


def _openapi(app: FastAPI) -> dict[str, Any]:
    """FastAPI's schema, less the 422 responses it adds by default: this server answers invalid
    requests with 400 (OpenAI's status), and the schema must say what the server does."""
    if app.openapi_schema:
        return app.openapi_schema
    from fastapi.openapi.utils import get_openapi

    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    for path_item in schema.get("paths", {}).values():
        for operation in path_item.values():
            if isinstance(operation, dict):
                operation.get("responses", {}).pop("422", None)
    components = schema.get("components", {}).get("schemas", {})
    components.pop("HTTPValidationError", None)
    components.pop("ValidationError", None)
    app.openapi_schema = schema
    return schema


def _version() -> str:
    from quickdraft import __version__

    return __version__
