"""The OpenAI-compatible server, over real HTTP on loopback, through the official `openai` client."""

from __future__ import annotations

import contextlib
import io
import json
import re
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("fastapi")
openai = pytest.importorskip("openai")

from hf_factory import make_hf_checkpoint  # noqa: E402
from server_helpers import hang_up_after_first_token, metric, wait_for  # noqa: E402
from tokenizer_factory import write_char_tokenizer  # noqa: E402

from quickdraft import Engine, SamplingParams, kernels  # noqa: E402
from quickdraft.model.loader import load_model  # noqa: E402
from quickdraft.server.app import create_app  # noqa: E402
from quickdraft.server.cli import BackgroundServer  # noqa: E402
from quickdraft.server.schemas import UNSUPPORTED  # noqa: E402

MODEL = "tiny"
DRAFTER = "prompt-lookup"  # cheap, and accepts often on a random model's repetitive text


@pytest.fixture(scope="module")
def target_dir(tmp_path_factory) -> Path:
    path = make_hf_checkpoint("llama", tmp_path_factory.mktemp("server") / "target", seed=1)
    write_char_tokenizer(path)
    return path


@pytest.fixture(scope="module")
def engine(target_dir) -> Engine:
    return Engine(str(target_dir), drafter=DRAFTER)


@pytest.fixture(scope="module")
def server(engine):
    with BackgroundServer(create_app(engine, model_name=MODEL)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def slow_engine(target_dir) -> Engine:
    """An engine that never meets EOS and takes >= ``step_seconds`` a step: generations last as long as a
    test needs."""
    engine = Engine(load_model(target_dir), drafter=None, exact=False)
    engine.eos_token_ids = frozenset()
    engine.step_seconds = 0.02
    fast_stream = engine.stream

    def slow_stream(*args, **kwargs):
        for event in fast_stream(*args, **kwargs):
            time.sleep(engine.step_seconds)
            yield event

    engine.stream = slow_stream
    return engine


def check_speculative(spec: dict, completion_tokens: int) -> None:
    assert spec["drafter"] == DRAFTER
    assert 0 <= spec["accepted"] <= spec["drafted"]
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted"] / spec["drafted"] if spec["drafted"] else 0.0)
    assert spec["mean_accepted_length"] == pytest.approx(completion_tokens / spec["target_calls"])
    assert sum(spec["accepted_per_position"]) == spec["accepted"]


# ---- the happy paths, through the openai client ------------------------------------------------
def test_models_lists_the_served_model(client, engine):
    models = client.models.list().data
    assert [m.id for m in models] == [MODEL]
    assert models[0].model_extra["context_length"] == engine.context_length
    assert client.models.retrieve(MODEL).id == MODEL


def test_greedy_completion_equals_quickdraft_generate(client, target_dir, engine):
    from quickdraft.cli import main as cli_main

    prompt = "def fib(n):\n    return"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert cli_main(["generate", "--target", str(target_dir), "--drafter", DRAFTER, "--prompt", prompt,
                         "--max-new-tokens", "24", "--json"]) == 0
    expected = json.loads(out.getvalue())

    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
    choice = response.choices[0]
    assert choice.text == expected["text"]
    assert choice.finish_reason == ("length" if expected["finish_reason"] == "length" else "stop")
    n_prompt = len(engine.encode(prompt))
    assert response.usage.prompt_tokens == n_prompt
    assert response.usage.completion_tokens == len(expected["token_ids"])
    assert response.usage.total_tokens == n_prompt + len(expected["token_ids"])
    spec = response.model_extra["speculative"]
    check_speculative(spec, response.usage.completion_tokens)
    assert spec["drafted"] > 0, "prompt lookup drafts on this text: the statistics must show it"


def test_greedy_completion_on_token_ids_equals_engine(client, engine):
    ids = [40, 41, 42, 43, 40, 41, 42]
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0)
    expected = engine.generate(ids, 16, gamma="auto")
    assert response.choices[0].text == expected.text
    assert response.usage.prompt_tokens == len(ids)
    assert response.usage.completion_tokens == len(expected.token_ids)


def test_penalties_and_logit_bias_reach_the_engine(client, engine):
    ids = [40, 41, 42, 43, 40, 41, 42]
    sent = dict(frequency_penalty=1.2, presence_penalty=0.5, logit_bias={"44": 2.5, "40": -100})
    response = client.completions.create(model=MODEL, prompt=ids, max_tokens=16, temperature=0, **sent)
    expected = engine.generate(ids, 16, SamplingParams(frequency_penalty=1.2, presence_penalty=0.5,
                                                       logit_bias={44: 2.5, 40: -100}), gamma="auto")
    assert response.choices[0].text == expected.text
    assert expected.text != engine.generate(ids, 16, gamma="auto").text
    forced = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=5,
                                            temperature=0, logit_bias={str(engine.encode("z")[0]): 100})
    assert forced.choices[0].message.content == "z" * 5


def test_greedy_chat_equals_generate_on_the_chat_template(client, engine):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi"}]
    prompt = engine.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    expected = engine.generate(prompt, 20, gamma="auto")
    response = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=20, temperature=0)
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content == expected.text
    assert response.usage.prompt_tokens == len(engine.encode(prompt))
    assert response.usage.completion_tokens == len(expected.token_ids)
    check_speculative(response.model_extra["speculative"], response.usage.completion_tokens)


def test_streamed_completion_equals_the_non_streamed_one(client):
    kwargs = dict(model=MODEL, prompt="abcabcabc", max_tokens=24, temperature=0)
    whole = client.completions.create(**kwargs)
    chunks = list(client.completions.create(stream=True, **kwargs))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    last = chunks[-1]
    assert last.choices[0].finish_reason == whole.choices[0].finish_reason
    assert all(c.choices[0].finish_reason is None for c in chunks[:-1])
    assert last.usage.completion_tokens == whole.usage.completion_tokens
    check_speculative(last.model_extra["speculative"], last.usage.completion_tokens)


def test_streamed_chat_equals_the_non_streamed_one(client):
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "xyzxyz"}], max_tokens=24, temperature=0)
    whole = client.chat.completions.create(**kwargs)
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert [c.choices[0].finish_reason for c in finish] == [whole.choices[0].finish_reason]
    usage_only = chunks[-1]  # include_usage: a last chunk with no choices, as OpenAI sends
    assert usage_only.choices == []
    assert usage_only.usage.completion_tokens == whole.usage.completion_tokens
    check_speculative(usage_only.model_extra["speculative"], usage_only.usage.completion_tokens)


def test_stream_ends_with_done(server):
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 8, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/completions", json=body, timeout=60) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in response.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines)
    assert lines[-1] == "data: [DONE]"
    assert "usage" in json.loads(lines[-2][len("data: "):])


def test_sampling_with_a_seed_is_reproducible(client):
    kwargs = dict(model=MODEL, prompt="Once upon", max_tokens=16, temperature=0.9, top_p=0.95, seed=1234)
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first


def test_a_seeded_request_returns_the_same_text_whatever_gamma_and_neighbours(client):
    """The seed's promise (coupled rule): alone, at any gamma, streamed, or among concurrent requests."""
    prompts = ["abcabcabc", "Once upon", "xyxyxy", "hello"]

    def ask(prompt: str, seed: int, **extra) -> str:
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0.9, seed=seed,
                                         **extra).choices[0].text

    alone = {p: ask(p, seed) for seed, p in enumerate(prompts)}
    for gamma in (0, 1, 4):
        assert {p: ask(p, seed, extra_body={"gamma": gamma}) for seed, p in enumerate(prompts)} == alone
    stream = client.completions.create(model=MODEL, prompt=prompts[0], max_tokens=24, temperature=0.9, seed=0,
                                       stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == alone[prompts[0]]
    results: dict[tuple[str, int], str] = {}

    def worker(prompt: str, seed: int) -> None:
        results[(prompt, seed)] = ask(prompt, seed)

    threads = [threading.Thread(target=worker, args=(p, seed)) for _ in range(4) for seed, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert {p: results[(p, seed)] for seed, p in enumerate(prompts)} == alone


def test_stop_string_ends_the_completion(client, engine):
    prompt = "abcabcabc"
    full = engine.generate(prompt, 24, gamma="auto").text
    assert len(full) > 4
    stop = full[2:4]
    response = client.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0, stop=[stop])
    assert response.choices[0].text == full[: full.index(stop)]
    assert response.choices[0].finish_reason == "stop"


def test_metrics_count_what_a_request_did(client, server):
    names = ("num_drafts_total", "num_draft_tokens_total", "num_accepted_tokens_total", "generation_tokens_total",
             "prompt_tokens_total")
    before = {n: metric(server.url, n) for n in names}
    before_ok = metric(server.url, "requests_total", endpoint="/v1/completions", status="200")
    response = client.completions.create(model=MODEL, prompt="abababab", max_tokens=20, temperature=0)
    spec = response.model_extra["speculative"]
    delta = {n: metric(server.url, n) - before[n] for n in names}
    assert delta["num_drafts_total"] == spec["num_drafts"]
    assert delta["num_draft_tokens_total"] == spec["drafted"]
    assert delta["num_accepted_tokens_total"] == spec["accepted"]
    assert delta["generation_tokens_total"] == response.usage.completion_tokens
    assert delta["prompt_tokens_total"] == response.usage.prompt_tokens
    assert metric(server.url, "requests_total", endpoint="/v1/completions", status="200") == before_ok + 1
    text = httpx.get(server.url + "/metrics").text
    assert re.search(r'^quickdraft_num_accepted_tokens_per_pos_total\{position="0"\} \d+$', text, re.M)
    assert "# TYPE quickdraft_errors_total counter" in text


def test_health(server):
    body = httpx.get(server.url + "/health").json()
    assert body["status"] == "ok" and body["model"] == MODEL
    assert body["kernels"] == kernels.loaded_isa()  # the engine runs in this process here


# ---- bad input: OpenAI-shaped 4xx, never a 500 -------------------------------------------------
BAD_REQUESTS = [
    ("not json", b"{bad json", 400, None),
    ("array body", b"[1, 2]", 400, None),
    ("unknown model", {"model": "gpt-4", "prompt": "hi"}, 404, "model"),
    ("missing prompt", {"model": MODEL}, 400, "prompt"),
    ("prompt of the wrong type", {"model": MODEL, "prompt": {"text": "hi"}}, 400, "prompt"),
    ("temperature as a string", {"model": MODEL, "prompt": "hi", "temperature": "hot"}, 400, "temperature"),
    ("negative temperature", {"model": MODEL, "prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ("top_p zero", {"model": MODEL, "prompt": "hi", "top_p": 0}, 400, "top_p"),
    ("top_p above one", {"model": MODEL, "prompt": "hi", "top_p": 1.5}, 400, "top_p"),
    ("max_tokens zero", {"model": MODEL, "prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens a float", {"model": MODEL, "prompt": "hi", "max_tokens": 3.5}, 400, "max_tokens"),
    ("n of two", {"model": MODEL, "prompt": "hi", "n": 2}, 400, "n"),
    ("a presence penalty above 2", {"model": MODEL, "prompt": "hi", "presence_penalty": 2.5}, 400, "presence_penalty"),
    ("a frequency penalty below -2", {"model": MODEL, "prompt": "hi", "frequency_penalty": -3}, 400,
     "frequency_penalty"),
    ("a penalty as a string", {"model": MODEL, "prompt": "hi", "frequency_penalty": "0.5"}, 400, "frequency_penalty"),
    ("a logit bias on a token beyond the vocabulary", {"model": MODEL, "prompt": "hi", "logit_bias": {"50256": -100}},
     400, "logit_bias"),
    ("a logit bias keyed by a word", {"model": MODEL, "prompt": "hi", "logit_bias": {"hello": 5}}, 400, "logit_bias.hello"),
    ("a logit bias above 100", {"model": MODEL, "prompt": "hi", "logit_bias": {"5": 101}}, 400, "logit_bias.5"),
    # OpenAI parameters quickdraft does not implement: refused by name, never silently ignored
    ("logprobs", {"model": MODEL, "prompt": "hi", "logprobs": 1}, 400, "logprobs"),
    ("best_of two", {"model": MODEL, "prompt": "hi", "best_of": 2}, 400, "best_of"),
    ("stream not a bool", {"model": MODEL, "prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("too many stops", {"model": MODEL, "prompt": "hi", "stop": ["a", "b", "c", "d", "e"]}, 400, "stop"),
    ("negative seed", {"model": MODEL, "prompt": "hi", "seed": -1}, 400, "seed"),
    ("gamma beyond the engine", {"model": MODEL, "prompt": "hi", "gamma": 60}, 400, "gamma"),
    ("empty prompt", {"model": MODEL, "prompt": ""}, 400, "prompt"),
    ("token id outside the vocabulary", {"model": MODEL, "prompt": [5, 96]}, 400, "prompt"),
    ("prompt longer than the context", {"model": MODEL, "prompt": "x" * 600}, 400, "prompt"),
    ("max_tokens beyond the context", {"model": MODEL, "prompt": "hi", "max_tokens": 100_000}, 400, "max_tokens"),
]
BAD_CHAT_REQUESTS = [
    ("no messages", {"model": MODEL, "messages": []}, 400, "messages"),
    ("logprobs", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": True}, 400, "logprobs"),
    ("top_logprobs", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 3}, 400,
     "top_logprobs"),
    ("unknown role", {"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages.0.role"),
    ("content of the wrong type", {"model": MODEL, "messages": [{"role": "user", "content": 5}]}, 400, None),
    ("chat longer than the context", {"model": MODEL, "messages": [{"role": "user", "content": "y" * 600}]}, 400,
     "messages"),
]


@pytest.mark.parametrize(("path", "name", "body", "status", "param"),
                         [("/v1/completions", *case) for case in BAD_REQUESTS]
                         + [("/v1/chat/completions", *case) for case in BAD_CHAT_REQUESTS],
                         ids=[c[0] for c in BAD_REQUESTS] + ["chat: " + c[0] for c in BAD_CHAT_REQUESTS])
def test_invalid_request_gets_an_openai_error(server, path, name, body, status, param):
    if isinstance(body, bytes):
        response = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"})
    else:
        response = httpx.post(server.url + path, json=body)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"] == "invalid_request_error"
    if param is not None:
        assert error["param"] == param
    if param in UNSUPPORTED:
        assert error["message"] == f"{param}: not supported by quickdraft; send {UNSUPPORTED[param]} or leave it out"


def test_openai_parameters_at_their_off_value_are_accepted(server):
    """What OpenAI's clients send by default (penalties 0, no bias, no logprobs) is not refused."""
    off = {"presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "max_tokens": 2, "temperature": 0}
    completion = httpx.post(server.url + "/v1/completions",
                            json={"model": MODEL, "prompt": "hi", "logprobs": None, "best_of": 1, **off})
    chat = httpx.post(server.url + "/v1/chat/completions",
                      json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "logprobs": False,
                            "top_logprobs": 0, **off})
    assert completion.status_code == 200, completion.text
    assert chat.status_code == 200, chat.text


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="nope", prompt="hi")
    with pytest.raises(openai.BadRequestError):
        client.completions.create(model=MODEL, prompt="hi", max_tokens=10**6)


def test_oversized_body_gets_413(target_dir, engine):
    app = create_app(engine, model_name=MODEL, max_body_bytes=1000)
    with BackgroundServer(app) as srv:
        response = httpx.post(srv.url + "/v1/completions", json={"model": MODEL, "prompt": "z" * 5000})
        assert response.status_code == 413
        assert response.json()["error"]["code"] == "request_too_large"


# ---- concurrency: queue, disconnects, timeouts -------------------------------------------------
def test_client_disconnect_stops_its_generation(slow_engine):
    with BackgroundServer(create_app(slow_engine, model_name=MODEL, max_batch=1)) as srv:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0, "stream": True}
        hang_up_after_first_token(srv.url, body)
        wait_for(lambda: metric(srv.url, "generations_cancelled_total", reason="disconnect") == 1)
        generated = metric(srv.url, "generation_tokens_total")
        assert 0 < generated < 100, "the engine stopped within a few steps of the disconnect"
        assert metric(srv.url, "generations_total", finish_reason="cancelled") == 1

        # Non-streaming: a client that gives up waiting cancels too.
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=0.5)
        wait_for(lambda: metric(srv.url, "generations_cancelled_total", reason="disconnect") == 2)
        assert metric(srv.url, "generation_tokens_total") - generated < 100
        assert httpx.get(srv.url + "/health").json()["running"] == 0


def test_full_queue_answers_429_with_retry_after(slow_engine):
    with BackgroundServer(create_app(slow_engine, model_name=MODEL, max_queue=1, max_batch=1)) as srv:
        body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0, "stream": True}
        statuses: list[int] = []
        with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as running:
            assert running.status_code == 200  # generating; the next request waits in the queue
            waiting = threading.Thread(
                target=lambda: statuses.append(
                    httpx.post(srv.url + "/v1/completions", json={**body, "stream": False, "max_tokens": 2},
                               timeout=30).status_code))
            waiting.start()
            wait_for(lambda: httpx.get(srv.url + "/health").json()["queued"] == 1)
            refused = httpx.post(srv.url + "/v1/completions", json=body)
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            assert refused.json()["error"]["type"] == "rate_limit_error"
            assert metric(srv.url, "requests_rejected_total") == 1
        waiting.join(30)
        assert statuses == [200], "the queued request ran once the first one was cancelled"


def test_request_timeout_stops_generation_and_queued_requests_get_503(slow_engine):
    slow_engine.step_seconds = 1.5  # the running request outlasts the queued one's deadline by ~1 s
    try:
        with BackgroundServer(create_app(slow_engine, model_name=MODEL, request_timeout_s=0.6, max_batch=1)) as srv:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 400, "temperature": 0}
            results: list[httpx.Response] = []
            first = threading.Thread(target=lambda: results.append(httpx.post(srv.url + "/v1/completions", json=body,
                                                                              timeout=30)))
            first.start()
            wait_for(lambda: httpx.get(srv.url + "/health").json()["running"] == 1)
            queued = httpx.post(srv.url + "/v1/completions", json=body, timeout=30)
            first.join(30)
            assert queued.status_code == 503 and queued.json()["error"]["code"] == "queue_timeout"
            assert "Retry-After" in queued.headers
            timed_out = results[0]
            assert timed_out.status_code == 200
            assert timed_out.json()["choices"][0]["finish_reason"] == "length"
            assert 0 < timed_out.json()["usage"]["completion_tokens"] < 400
            assert metric(srv.url, "generations_cancelled_total", reason="timeout") == 2
    finally:
        slow_engine.step_seconds = 0.02


def test_load_report_percentiles_are_nearest_rank():
    from quickdraft.bench.load import percentile

    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([3.0], 99) == 3.0
    assert percentile([], 50) is None


def test_a_sweep_report_says_when_no_kernel_build_loaded():
    from quickdraft.bench.load import machine_line

    machine = {"cpu": "Intel(R) Xeon(R)", "cpus": 2, "torch": "2.13.0+cpu"}
    assert machine_line({**machine, "kernels": "amx_bf16"}).endswith("quickdraft kernels: amx_bf16.")
    assert "kernels: none (torch products)" in machine_line({**machine, "kernels": None})


def test_a_sweep_report_names_a_server_whose_engine_loaded_another_build():
    from dataclasses import replace

    from quickdraft.bench.load import HF_BATCHED, LoadReport, servers_kernels_line

    report = LoadReport("m", False, None, 4, 15.0, 32, 10, 0, 0, {}, None, None, None, None, 320, 15.0, 21.3, None,
                        None, None, server_kernels="amx_bf16")
    same = [replace(report, config=c) for c in ("batched plain", "one at a time")]
    hf = replace(report, config=HF_BATCHED, server_kernels=None)  # no server: not counted
    assert servers_kernels_line([*same, hf]) == "Servers' engine kernels: amx_bf16 in every configuration."
    fell_back = replace(report, config="batched speculative", server_kernels=None)
    assert servers_kernels_line([*same, fell_back]) == (
        "Servers' engine kernels differ: amx_bf16 in batched plain, one at a time; "
        "none (torch products) in batched speculative.")


def test_a_load_report_gives_the_servers_thread_count_or_its_range_when_it_moved():
    from dataclasses import replace

    from quickdraft.bench.load import LoadReport, sweep_table

    report = LoadReport("m", False, None, 4, 15.0, 32, 10, 0, 0, {}, None, None, None, None, 320, 15.0, 21.3, None,
                        None, None, config="batched plain", server_threads=(2, 2, 2))
    assert report.lines()[-1].endswith("threads: 2")
    moved = replace(report, server_threads=(1, 2, 2), sweep_round=1)
    assert moved.lines()[-1].endswith("threads: 1–2 (median 2)")
    row = next(line for line in sweep_table([report, moved]) if line.startswith("| 4 |"))
    assert row.split(" | ")[9] == "1–2 (median 2) |"


def test_a_sweep_of_several_rounds_reports_medians_and_the_median_of_each_rounds_ratio():
    from dataclasses import replace

    from quickdraft.bench.load import LoadReport, sweep_table

    report = LoadReport("m", False, None, 4, 15.0, 32, 10, 0, 0, {}, 0.1, 0.2, 0.5, 0.9, 320, 15.0, 0.0, None,
                        None, None)
    # The VM drifts between rounds: speculative runs 3x one at a time in two rounds and 6x in the
    # third, whose one-at-a-time server ran slow; the ratio of the medians (240 / 50) would say 4.8x.
    rates = {"batched speculative": [150.0, 300.0, 240.0], "batched plain": [100.0, 200.0, 160.0],
             "one at a time": [50.0, 100.0, 40.0],
             "batched speculative, int8 target": [240.0, 480.0, 360.0], "batched plain, int8 target": [200.0, 400.0, 300.0]}
    reports = [replace(report, config=config, tokens_per_s=rate, sweep_round=i, failed=int(config == "batched plain"))
               for config, series in rates.items() for i, rate in enumerate(series)]
    rows = {line.split(" | ")[1]: line for line in sweep_table(reports) if line.startswith("| 4 |")}
    speculative = rows["batched speculative"].split(" | ")
    assert speculative[2] == "240.0 (150–300)"
    assert speculative[9] == "n/a |"  # no thread counts seen
    assert speculative[7] == "3.00× (3.00–6.00)"  # per round: 3, 3, 6
    assert speculative[8].startswith("1.50× (1.50–1.50)")
    assert rows["batched plain"].split(" | ")[6] == "3"  # failures summed over the rounds
    # each speculative configuration against the plain one on its own target
    assert rows["batched speculative, int8 target"].split(" | ")[8].startswith("1.20× (1.20–1.20)")
    assert rows["batched plain, int8 target"].split(" | ")[8].strip(" |") == ""
    assert "Medians over 3 rounds" in sweep_table(reports)[-1]


def test_serve_is_a_quickdraft_subcommand():
    from quickdraft.cli import build_parser

    args = build_parser().parse_args(["serve", "--target", "some/dir", "--drafter", "prompt-lookup", "--port", "9000",
                                      "--max-queue", "8", "--request-timeout", "30"])
    assert (args.command, args.port, args.max_queue, args.request_timeout) == ("serve", 9000, 8, 30.0)
    assert args.host == "127.0.0.1"


def test_an_engine_failure_mid_stream_ends_the_stream_with_an_error_event(slow_engine):
    from quickdraft.errors import QuickdraftError

    def failing_stream(*args, **kwargs):
        events = slow_engine_stream(*args, **kwargs)
        yield next(events)
        raise QuickdraftError("the engine gave up")

    slow_engine_stream = slow_engine.stream
    slow_engine.stream = failing_stream
    try:
        with BackgroundServer(create_app(slow_engine, model_name=MODEL, max_batch=1)) as srv:
            body = {"model": MODEL, "prompt": "hello", "max_tokens": 50, "temperature": 0, "stream": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=30) as response:
                assert response.status_code == 200
                lines = [line for line in response.iter_lines() if line]
            assert lines[-1] == "data: [DONE]"
            error = json.loads(lines[-2][len("data: "):])["error"]
            assert error["message"] == "the engine gave up" and error["type"] == "invalid_request_error"
            assert httpx.get(srv.url + "/health").json()["running"] == 0  # and the server goes on serving
            ok = httpx.post(srv.url + "/v1/completions", json={**body, "stream": False}, timeout=30)
            assert ok.status_code == 400  # the same failure, non-streamed: a status code, not a hang
    finally:
        slow_engine.stream = slow_engine_stream


def test_echo_and_max_completion_tokens(client):
    echoed = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL, prompt="abc", max_tokens=5, temperature=0)
    assert echoed.choices[0].text == "abc" + plain.choices[0].text
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}],
                                          max_completion_tokens=3, temperature=0)
    assert chat.usage.completion_tokens <= 3


def test_concurrent_greedy_requests_are_batched_and_each_equals_its_output_alone(client, server, engine):
    prompts = [f"{'ab' * (i % 5 + 1)}c{i}" for i in range(16)]
    alone = {p: engine.generate_batch([p], 12 + i % 4, max_batch=16)[0].text for i, p in enumerate(prompts)}
    results: dict[str, str] = {}

    def worker(i: int, prompt: str) -> None:
        results[prompt] = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12 + i % 4,
                                                    temperature=0).choices[0].text

    threads = [threading.Thread(target=worker, args=(i, p)) for i, p in enumerate(prompts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert results == alone
    assert metric(server.url, "running_requests") == 0
    assert "quickdraft_batch_size" in httpx.get(server.url + "/metrics").text
    assert metric(server.url, "threads") == engine.threads >= 1


def test_a_client_that_disconnects_frees_its_batch_slot(target_dir):
    engine = Engine(load_model(target_dir), drafter=None, exact=False)
    engine.eos_token_ids = frozenset()
    with BackgroundServer(create_app(engine, model_name=MODEL, max_batch=2)) as srv:
        with httpx.Client(timeout=30) as http:
            with http.stream("POST", srv.url + "/v1/completions",
                             json={"model": MODEL, "prompt": "abc", "max_tokens": 400, "stream": True}) as response:
                next(response.iter_lines())  # streaming has started: the request holds a slot
        deadline = time.monotonic() + 20
        while metric(srv.url, "running_requests") > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert metric(srv.url, "running_requests") == 0
        assert metric(srv.url, "generations_cancelled_total", reason="disconnect") == 1
