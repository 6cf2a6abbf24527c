"""The server with its engine in a process of its own (``quickdraft serve``'s default): same outputs
as the engine alone, cancellation and deadlines across the process boundary, coalesced streaming,
start-up errors, and a dead engine answered rather than hung on."""

from __future__ import annotations

import functools
import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")

from hf_factory import make_hf_checkpoint  # noqa: E402
from server_helpers import hang_up_after_first_token, metric, wait_for  # noqa: E402
from tokenizer_factory import write_char_tokenizer  # noqa: E402

from quickdraft import Engine, kernels  # noqa: E402
from quickdraft.errors import ModelNotFoundError, QuickdraftError  # noqa: E402
from quickdraft.model.loader import load_model  # noqa: E402
from quickdraft.sampling import SamplingParams  # noqa: E402
from quickdraft.server.app import create_app  # noqa: E402
from quickdraft.server.cli import BackgroundServer  # noqa: E402
from quickdraft.server.engine_process import EngineProcess  # noqa: E402

MODEL = "tiny"
PROMPTS = ["hello", "abc abc abc", "the cat sat", "once upon a time"]


# Built in the engine process: module-level, so that spawn can import them.
def build_engine(path: str) -> Engine:
    return Engine(path, drafter="prompt-lookup")


def build_slow_engine(path: str, step_seconds: float) -> Engine:
    """Never meets EOS, and takes >= step_seconds a step (one request at a time)."""
    engine = Engine(load_model(Path(path)), drafter=None, exact=False)
    engine.eos_token_ids = frozenset()
    fast_stream = engine.stream

    def slow_stream(*args, **kwargs):
        for event in fast_stream(*args, **kwargs):
            time.sleep(step_seconds)
            yield event

    engine.stream = slow_stream
    return engine


def build_missing() -> Engine:
    raise ModelNotFoundError("no model at /nowhere")


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    path = make_hf_checkpoint("llama", tmp_path_factory.mktemp("engine_process") / "target", seed=1)
    write_char_tokenizer(path)
    return path


def stream_pieces(url: str, body: dict) -> list[str]:
    """The streamed text, event by event."""
    pieces = []
    with httpx.stream("POST", url + "/v1/completions", json={**body, "stream": True}, timeout=60) as response:
        assert response.status_code == 200
        for line in response.iter_lines():
            if line.startswith("data: {"):
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0]["text"]:
                    pieces.append(chunk["choices"][0]["text"])
    return pieces


def test_concurrent_requests_get_what_the_engine_gives_each_alone(target_dir):
    alone = Engine(str(target_dir), drafter="prompt-lookup")
    samplings = [SamplingParams(), SamplingParams(temperature=0.9, top_p=0.9, seed=5),
                 SamplingParams(frequency_penalty=1.0, presence_penalty=0.3, logit_bias={5: 3.0})]
    expected = {(p, i): alone.generate(p, 24, samplings[i]).text for p in PROMPTS for i in range(len(samplings))}
    assert all(expected[(p, 2)] != expected[(p, 0)] for p in PROMPTS), "the penalties must change the text"
    process = EngineProcess(functools.partial(build_engine, str(target_dir)), max_batch=4)
    with BackgroundServer(create_app(process, model_name=MODEL)) as srv:
        got: dict = {}

        def one(prompt: str, i: int) -> None:
            s = samplings[i]
            body = {"model": MODEL, "prompt": prompt, "max_tokens": 24, "temperature": s.temperature, "top_p": s.top_p,
                    "seed": s.seed, "frequency_penalty": s.frequency_penalty, "presence_penalty": s.presence_penalty,
                    "logit_bias": {str(token): bias for token, bias in s.logit_bias}}
            got[(prompt, i)] = "".join(stream_pieces(srv.url, body)) if i else httpx.post(
                srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]

        threads = [threading.Thread(target=one, args=key) for key in expected]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert got == expected
        assert metric(srv.url, "generations_total", finish_reason="length") + metric(
            srv.url, "generations_total", finish_reason="stop") == len(expected)
        health = httpx.get(srv.url + "/health").json()
        assert health["running"] == 0
        assert health["kernels"] == process.info.kernels == kernels.loaded_isa()  # the engine process's build
        assert metric(srv.url, "threads") >= 1  # the engine process's count, sent with its events
    assert not process.process.is_alive(), "the engine process stops with the app"


def test_disconnect_and_deadline_reach_the_engine_process(target_dir):
    process = EngineProcess(functools.partial(build_slow_engine, str(target_dir), 0.02), max_batch=1)
    with BackgroundServer(create_app(process, model_name=MODEL, request_timeout_s=1.5)) as srv:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0, "stream": True}
        hang_up_after_first_token(srv.url, body)
        wait_for(lambda: metric(srv.url, "generations_cancelled_total", reason="disconnect") == 1)
        assert 0 < metric(srv.url, "generation_tokens_total") < 100, "the engine stopped within a few steps"
        assert httpx.get(srv.url + "/health").json()["running"] == 0

        # The deadline (1.5 s; 400 tokens take 8 s) is the engine process's to enforce once it runs.
        started = time.monotonic()
        timed_out = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=30).json()
        assert timed_out["choices"][0]["finish_reason"] == "length"
        assert 0 < timed_out["usage"]["completion_tokens"] < 400 and time.monotonic() - started < 4
        assert metric(srv.url, "generations_cancelled_total", reason="timeout") == 1


def test_streamed_text_is_coalesced_but_the_first_token_is_not_held(target_dir):
    """At a 0.3 s interval and >= 20 ms a token, 40 tokens come in a few events, at most one per
    interval besides the first and last; the first event holds the first token alone (it was not
    held for the interval). Bounds follow the stream's measured duration, not the machine's speed."""
    process = EngineProcess(functools.partial(build_slow_engine, str(target_dir), 0.02), max_batch=1,
                            stream_interval_s=0.3)
    with BackgroundServer(create_app(process, model_name=MODEL)) as srv:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 40, "temperature": 0}
        whole = httpx.post(srv.url + "/v1/completions", json=body, timeout=30).json()["choices"][0]["text"]
        started = time.monotonic()
        pieces = stream_pieces(srv.url, body)
        seconds = time.monotonic() - started
        assert "".join(pieces) == whole
        assert len(pieces[0]) == 1  # one character token: the first token went at once
        assert 3 <= len(pieces) <= seconds / 0.3 + 2 and len(pieces) < 40  # unmerged: one event a token


def test_an_engine_that_fails_to_start_raises_its_error():
    with pytest.raises(QuickdraftError, match="no model at /nowhere"):
        EngineProcess(build_missing, max_batch=2)


def test_a_dead_engine_process_fails_its_requests_instead_of_hanging(target_dir):
    process = EngineProcess(functools.partial(build_slow_engine, str(target_dir), 0.05), max_batch=1)
    with BackgroundServer(create_app(process, model_name=MODEL)) as srv:
        result: list[httpx.Response] = []
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0}
        request = threading.Thread(target=lambda: result.append(
            httpx.post(srv.url + "/v1/completions", json=body, timeout=30)))
        request.start()
        wait_for(lambda: httpx.get(srv.url + "/health").json()["running"] == 1)
        os.kill(process.pid, signal.SIGKILL)
        request.join(30)
        assert result and result[0].status_code == 500
        assert "EngineProcessExited" in result[0].json()["error"]["message"]
        later = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
        assert later.status_code == 500


HTTP_SIDE = """
import functools, json, sys, httpx
from quickdraft.cli import build_engine, build_parser
from quickdraft.server.app import create_app
from quickdraft.server.cli import BackgroundServer
from quickdraft.server.engine_process import EngineProcess
args = build_parser().parse_args(["serve", "--target", sys.argv[1], "--drafter", "prompt-lookup", "--threads", "1"])
process = EngineProcess(functools.partial(build_engine, args), max_batch=2)
with BackgroundServer(create_app(process, model_name="tiny")) as srv:
    body = {"model": "tiny", "prompt": "abc abc", "max_tokens": 8, "temperature": 0.9, "top_p": 0.9, "seed": 1}
    text = httpx.post(srv.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["text"]
    with httpx.stream("POST", srv.url + "/v1/completions", json={**body, "stream": True}, timeout=60) as r:
        streamed = [line for line in r.iter_lines() if line.startswith("data: ")]
print(json.dumps({"torch": "torch" in sys.modules, "text": text, "events": len(streamed)}))
"""


def test_the_http_process_never_imports_torch(target_dir):
    """The engine process holds the model; the HTTP process, which only tokenizes and relays, stays
    without torch (~340 MiB of its RSS), requests, events and results included."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", HTTP_SIDE, str(target_dir)], capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["events"] >= 2 and report["text"]
    assert report["torch"] is False
