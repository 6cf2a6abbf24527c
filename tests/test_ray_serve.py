"""``quickdraft serve --replicas 2`` on a local Ray instance, through the official `openai` client:
the same answers as single-process serving, health and metrics for every replica, and a replica
killed mid-run that loses no request that had not started streaming."""

from __future__ import annotations

import concurrent.futures
import os
import signal
import threading
import time

import httpx
import pytest

pytest.importorskip("ray.serve")
openai = pytest.importorskip("openai")

# One worker runs this module (make test uses --dist loadgroup): one Ray instance at a time.
pytestmark = pytest.mark.xdist_group("ray")

from quickdraft.bench.load import ServerProcess  # noqa: E402
from quickdraft.cli import build_engine, build_parser  # noqa: E402
from quickdraft.server.app import create_app  # noqa: E402
from quickdraft.server.cli import BackgroundServer  # noqa: E402

MODEL = "quickdraft"
PROMPTS = ["def fibonacci(n):\n", "import os\n\n\ndef list_files(root):\n", "class Stack:\n    def push(self, item):\n",
           "for i in range(10):\n    print(", "def parse_args(argv=None):\n", "x = [1, 2, 3]\n"]
LONG = 800  # tokens: long enough that a kill lands mid-generation (a replica decodes ~1,000 tokens/s here)


# The embedded pair, 1 thread, eager steps (a replica that restarts is back in seconds).
ENGINE_FLAGS = ("--threads", "1", "--no-compile-drafter", "--max-batch", "4")


@pytest.fixture(scope="module")
def ray_server():
    """The server under test. Its teardown checks that SIGTERM (what service managers send) stops it
    and leaves no process of its local Ray instance behind."""
    args = ("--replicas", "2", *ENGINE_FLAGS, "--health-check-period", "2")
    server = ServerProcess("embedded", None, max_queue=64, request_timeout_s=120, startup_timeout_s=300,
                           extra_args=args, model_name=MODEL)
    with server:
        # Ray's daemons and the replicas' workers all live in the session the server leads.
        assert len(_session(server.proc.pid)) > 5
        yield server
    assert server.proc.returncode == 0, server.log()[-2000:]
    deadline = time.monotonic() + 30
    while (left := _session(server.proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == [], "processes of the server's Ray instance outlived it"


@pytest.fixture(scope="module")
def single_process():
    """Single-process `quickdraft serve` with the same flags: the answers replicas must reproduce."""
    args = build_parser().parse_args(["serve", "--target", "embedded", *ENGINE_FLAGS])
    engine = build_engine(args)
    with BackgroundServer(create_app(engine, model_name=MODEL, max_batch=args.max_batch)) as server:
        yield server


def client_for(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=120)


def wait_for_healthy(url: str, count: int, timeout_s: float = 120, excluding_pid: int | None = None) -> dict:
    """/health once ``count`` replicas answer it (the router learns of new replicas within seconds)."""
    deadline = time.monotonic() + timeout_s
    while True:
        health = httpx.get(url + "/health", timeout=30).json()
        each = health["replicas"]["each"]
        if health["replicas"]["healthy"] == count and excluding_pid not in {r["pid"] for r in each}:
            return health
        assert time.monotonic() < deadline, f"not {count} healthy replicas after {timeout_s:.0f} s: {health}"
        time.sleep(1)


def busy_replica(url: str, timeout_s: float = 30, finished=lambda: False) -> dict | None:
    """/health's entry for the replica with the most requests running or queued (its "pid" to kill);
    None once ``finished()`` says every request of the load is done (then none can be in flight)."""
    deadline = time.monotonic() + timeout_s
    probes = []  # seconds each /health took: a slow fan-out can outlast the requests it should see
    while True:
        start = time.monotonic()
        each = httpx.get(url + "/health", timeout=30).json()["replicas"]["each"]
        probes.append(round(time.monotonic() - start, 2))
        busiest = max(each, key=lambda r: r["running"] + r["queued"])
        if busiest["running"] + busiest["queued"] > 0:
            return busiest
        if finished():
            return None
        assert time.monotonic() < deadline, f"no replica has a request in flight: {each}; /health took {probes[:20]} s"
        time.sleep(0.05)


def test_replicas_answer_completions_chat_and_streams_as_single_process_serve(ray_server, single_process):
    ray, alone = client_for(ray_server.url), client_for(single_process.url)
    for prompt in PROMPTS[:3]:
        got = ray.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        want = alone.completions.create(model=MODEL, prompt=prompt, max_tokens=24, temperature=0)
        assert got.choices[0].text == want.choices[0].text
        assert got.model_extra["speculative"]["drafter"] == "prompt-lookup+draft-model"  # the pair's default
    messages = [{"role": "user", "content": "Write a function that adds two numbers."}]
    got = ray.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    want = alone.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0)
    assert got.choices[0].message.content == want.choices[0].message.content
    chunks = list(ray.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                              stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == "length"


def test_health_and_metrics_speak_for_every_replica(ray_server):
    client = client_for(ray_server.url)
    for prompt in PROMPTS[:4]:
        client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, temperature=0)
    health = wait_for_healthy(ray_server.url, 2)
    assert health["status"] == "ok"
    assert health["replicas"]["ray_states"] == {"RUNNING": 2}
    assert len({r["pid"] for r in health["replicas"]["each"]}) == 2
    text = httpx.get(ray_server.url + "/metrics", timeout=30).text
    total = _value(text, "quickdraft_generation_tokens_total")
    each = [float(line.split()[-1]) for line in text.splitlines()
            if line.startswith("quickdraft_replica_generation_tokens_total{")]
    assert len(each) == 2 and total == sum(each) > 0
    for router_counter in ("quickdraft_requests_retried_total", "quickdraft_replicas_lost_mid_response_total"):
        assert _value(text, router_counter) >= 0  # present from the start, 0 until a replica dies


def test_a_killed_replica_loses_no_request_that_had_not_started_streaming(ray_server, single_process):
    alone = client_for(single_process.url)
    expected = {p: alone.completions.create(model=MODEL, prompt=p, max_tokens=LONG, temperature=0).choices[0].text
                for p in PROMPTS}
    ray = client_for(ray_server.url)
    wait_for_healthy(ray_server.url, 2)
    # A kill must hit a request the relay had sent (it retries one that had not started, and cuts a
    # stream that had). Once (round 34, a fresh clone's suite) a kill left the relay's counters at 0,
    # every request still correct: none of the victim's requests reached the relay as lost (perhaps
    # still queued in Ray Serve's router, which re-routes those itself, or finished between /health
    # and the kill). So up to three kills, each checked for lost requests, and at least one of them
    # must show in the relay's counters.
    victims = []
    for _ in range(3):
        before = _relay_counters(ray_server.url)
        victims.append(_kill_a_busy_replica_under_load(ray_server.url, ray, expected))
        assert ray.completions.create(model=MODEL, prompt=PROMPTS[0], max_tokens=LONG, temperature=0
                                      ).choices[0].text == expected[PROMPTS[0]]  # the next requests succeed
        wait_for_healthy(ray_server.url, 2, excluding_pid=victims[-1]["pid"])  # and Ray brings the replica back
        if _relay_counters(ray_server.url) > before:
            break
    else:
        pytest.fail(f"three kills hit no request the relay had sent; the victims' /health entries: {victims}")


def _relay_counters(url: str) -> float:
    """Requests the relay retried after their replica died, plus responses cut mid-stream."""
    text = httpx.get(url + "/metrics", timeout=30).text
    return _value(text, "quickdraft_requests_retried_total") + _value(text, "quickdraft_replicas_lost_mid_response_total")


def _kill_a_busy_replica_under_load(url: str, ray: openai.OpenAI, expected: dict[str, str]) -> dict:
    """SIGKILL a replica with requests in flight under a load of whole and streamed completions;
    every whole one must still return its text, a streamed one its text or a clear error after a
    prefix of it. Returns the victim's /health entry."""

    def whole(prompt: str) -> str:
        return ray.completions.create(model=MODEL, prompt=prompt, max_tokens=LONG, temperature=0).choices[0].text

    streaming = threading.Event()

    def streamed(prompt: str) -> str:
        text = ""
        try:
            for chunk in ray.completions.create(model=MODEL, prompt=prompt, max_tokens=LONG, temperature=0,
                                                stream=True):
                text += chunk.choices[0].text if chunk.choices else ""
                streaming.set()
        except openai.APIError as exc:  # the replica died after this stream began: a clear error, not a hang
            assert "replica" in str(exc), exc
            return "cut:" + text
        return text

    # Five requests per prompt: far more than both replicas' batches hold (2 x 4), so that requests are
    # still running or queued on each replica when one is killed, however fast this machine decodes them
    # (with three, twice in fresh clones' suites all 20 had finished before /health saw one in flight).
    # A load that still ends before /health sees it (round 35: its first answer took 1.2 s on a busy
    # machine, and all 32 requests were done) is checked and sent again, up to three times.
    for _ in range(3):
        with concurrent.futures.ThreadPoolExecutor(5 * len(PROMPTS) + 2) as pool:
            victim = _kill_during_one_load(url, pool, whole, streamed, streaming, expected)
        if victim is not None:
            return victim
        streaming.clear()
    pytest.fail("three loads of 32 requests each ended before /health saw one of them in flight")


def _kill_during_one_load(url: str, pool: concurrent.futures.ThreadPoolExecutor, whole, streamed,
                          streaming: threading.Event, expected: dict[str, str]) -> dict | None:
    """One load of whole and streamed completions, and a kill of the busiest replica while it runs;
    every request checked. None when the load ended before a replica was seen busy (nothing killed)."""
    whole_runs = [(p, pool.submit(whole, p)) for p in PROMPTS * 5]
    stream_runs = {p: pool.submit(streamed, p) for p in PROMPTS[:2]}
    runs = [run for _, run in whole_runs] + list(stream_runs.values())
    assert streaming.wait(timeout=120)
    time.sleep(0.2)  # every request is running or queued on a replica
    # A replica with requests in flight (the router may have sent them all to one).
    try:
        victim = busy_replica(url, finished=lambda: all(run.done() for run in runs))
    except AssertionError as exc:  # seen once in a fresh clone's suite (round 32): say what the requests did
        done = [run for run in runs if run.done()]
        failures = [repr(run.exception()) for run in done if run.exception() is not None]
        raise AssertionError(f"{exc}; {len(done)} of {len(runs)} requests done, failures: {failures[:3]}") from exc
    if victim is not None:
        os.kill(victim["pid"], signal.SIGKILL)
    for prompt, run in whole_runs:
        assert run.result(timeout=180) == expected[prompt]  # nothing had been sent: retried elsewhere
    for prompt, run in stream_runs.items():
        text = run.result(timeout=180)
        if text.startswith("cut:"):
            assert expected[prompt].startswith(text.removeprefix("cut:"))
        else:
            assert text == expected[prompt]
    return victim


def test_serve_config_builder_takes_the_cli_flags():
    """What `serve run ...:app_builder replicas=2 threads=1` and a KubeRay RayService deploy."""
    from quickdraft.server.ray_serve import app_builder

    router = app_builder({"replicas": "3", "threads": "2", "no_compile_drafter": "true", "max_batch": "8"})
    engine = router._bound_deployment.init_args[0]._bound_deployment
    assert engine.num_replicas == 3 and engine.ray_actor_options == {"num_cpus": 2}
    assert engine.max_ongoing_requests == 8
    engine_args = engine.init_args[0]
    assert engine_args["threads"] == 2 and engine_args["compile_drafter"] is False
    autoscaled = app_builder({"min_replicas": "1", "max_replicas": "4"})._bound_deployment.init_args[0]
    scaling = autoscaled._bound_deployment._deployment_config.autoscaling_config
    assert (scaling.min_replicas, scaling.max_replicas) == (1, 4)


def _value(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in /metrics")


def _session(pid: int) -> list[int]:
    """The live processes of the session ``pid`` leads (ServerProcess starts the server in a new one)."""
    alive = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.getsid(int(entry)) == pid:
                    alive.append(int(entry))
            except ProcessLookupError:
                pass
    return alive


def test_a_missing_model_fails_before_ray_starts(tmp_path):
    import subprocess
    import sys

    missing = str(tmp_path / "no-such-model")
    run = subprocess.run([sys.executable, "-m", "quickdraft.cli", "serve", "--replicas", "2", "--target", missing],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode != 0
    assert "not found" in run.stderr and "Traceback" not in run.stderr
    assert "Ray" not in run.stderr  # no instance was started
