"""Load test of ``quickdraft serve``: N concurrent streaming clients for a fixed time, on loopback.

    python -m quickdraft.bench.load                    # 32 clients, 60 s, the embedded pair
    python -m quickdraft.bench.load --clients 8 --duration 10 --json load.json
    python -m quickdraft.bench.load --sweep 1,4,8,16,32 --duration 20 --out load-sweep   # batched vs plain vs one at a time
    python -m quickdraft.bench.load --sweep 4,16 --repeats 3 --config "batched speculative" --config "batched plain"
    python -m quickdraft.bench.load --replica-sweep 1,2 --sweep 1,8 --threads 1   # single process vs Ray Serve replicas

The server runs as a subprocess on 127.0.0.1 (so its memory is its own), on the embedded model pair
when it is installed, else on a small random pair built on the fly (said so in the report). Every
client streams one request after another until the time is up; the requests still running then
finish (bounded by --drain-timeout), and nothing starts after. Reported: failed requests (any
status other than 200, an error event, a stream without ``[DONE]``, or a transport error), p50/p99
time to first token and total latency, total generated tokens per second, and the server's RSS
(10 s into the run, at the end, and its peak: the larger of the kernel's
high-water mark and once-a-second samples) to show that memory stays bounded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from quickdraft.batch import DEFAULT_MAX_BATCH

TEXT_PROMPTS = [
    'def read_config(path):\n    """Read a JSON configuration file and return it as a dict."""\n',
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "import os\n\n\ndef list_python_files(root):\n",
    "def fibonacci(n):\n    if n < 2:\n        return n\n",
    "for i in range(10):\n    print(",
    "def parse_args(argv=None):\n    parser = argparse.ArgumentParser(",
]


@dataclass
class RequestRecord:
    ok: bool
    ttft_s: float | None  # time to the first generated text
    total_s: float
    tokens: int
    error: str | None = None


@dataclass
class LoadReport:
    model: str
    random_model: bool
    drafter: str | None
    clients: int
    duration_s: float
    max_tokens: int
    requests: int
    failed: int
    unfinished: int
    errors: dict[str, int]
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    latency_p50_s: float | None
    latency_p99_s: float | None
    generated_tokens: int
    wall_s: float
    tokens_per_s: float
    server_rss_after_warmup_bytes: int | None
    server_rss_end_bytes: int | None
    server_peak_rss_bytes: int | None
    config: str = "default"
    acceptance_rate: float | None = None  # over the whole run, from the server's counters
    mean_accepted_length: float | None = None  # tokens per target forward
    machine: dict[str, Any] = field(default_factory=dict)
    server_kernels: str | None = None  # the kernel build the server's engine loaded (its /health)
    sweep_round: int = 0  # a sweep's round: each round runs every configuration once, one after another
    server_threads: tuple[int, int, int] | None = None  # its quickdraft_threads gauge once a second: min, median, max

    def lines(self) -> list[str]:
        mib = lambda b: "n/a" if b is None else f"{b / 2**20:.0f} MiB"  # noqa: E731
        sec = lambda s: "n/a" if s is None else f"{s:.2f} s"  # noqa: E731
        model = ("a RANDOM Llama pair (target 6 layers x 256; draft = its first 2 layers; char tokenizer): the "
                 "embedded pair is not installed" if self.random_model else self.model)
        drafter = "the pair's draft model" if self.random_model else (self.drafter or "none")
        return [
            f"model: {model}; drafter: {drafter}",
            f"{self.clients} streaming clients for {self.duration_s:.0f} s, max_tokens {self.max_tokens}: "
            f"{self.requests} requests, {self.failed} failed, {self.unfinished} unfinished",
            f"time to first token: p50 {sec(self.ttft_p50_s)}, p99 {sec(self.ttft_p99_s)}",
            f"total latency:       p50 {sec(self.latency_p50_s)}, p99 {sec(self.latency_p99_s)}",
            f"throughput: {self.generated_tokens} tokens in {self.wall_s:.1f} s = {self.tokens_per_s:.1f} tokens/s",
            f"speculation (server counters, warm-up included): acceptance rate "
            f"{'n/a' if self.acceptance_rate is None else f'{self.acceptance_rate:.2f}'}, "
            f"{'n/a' if self.mean_accepted_length is None else f'{self.mean_accepted_length:.2f}'} tokens per target "
            f"forward",
            f"server RSS: {mib(self.server_rss_after_warmup_bytes)} after warm-up, {mib(self.server_rss_end_bytes)} "
            f"at the end, peak {mib(self.server_peak_rss_bytes)}",
            f"server's engine kernels: {self.server_kernels or 'none (torch products)'}; threads: "
            f"{threads_range(self.server_threads)}",
        ] + ([f"errors: {self.errors}"] if self.errors else [])


def threads_range(seen: tuple[int, int, int] | None) -> str:
    """The server's thread count over a run: one figure where it held, else its range and median."""
    if seen is None:
        return "n/a"
    low, median, high = seen
    return str(low) if low == high else f"{low}–{high} (median {median})"


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (q in [0, 100])."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))  # ceil(q/100 * n)
    return ordered[rank - 1]


# ---- the server under test -------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_tree(pid: int) -> list[int]:
    """pid and its descendants (Linux): the server's engine runs in a child process."""
    pids, i = [pid], 0
    while i < len(pids):
        for task in Path(f"/proc/{pids[i]}/task").glob("*/children"):
            try:
                pids += [int(c) for c in task.read_text().split()]
            except OSError:
                pass
        i += 1
    return pids


def _tree_status(pid: int, key: str) -> int | None:
    """``_proc_status`` summed over the process and its descendants (for VmHWM, an upper bound of
    the tree's peak: each process's own peak, whenever it was)."""
    values = [v for p in _process_tree(pid) if (v := _proc_status(p, key)) is not None]
    return sum(values) if values else None


def _proc_status(pid: int, key: str) -> int | None:
    """VmRSS / VmHWM of a process in bytes (Linux); None elsewhere."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def choose_models(target: str | None, drafter: str | None, workdir: Path) -> tuple[str, str | None, bool, bool]:
    """(target, drafter, random?, text prompts?): the given model, else the embedded pair, else a random
    pair (with a character-level tokenizer)."""
    if target:
        return target, drafter, False, (Path(target) / "tokenizer.json").exists() or not Path(target).exists()
    from quickdraft.assets import default_target_path, embedded_pair_available
    from quickdraft.cli import embedded_default_drafter

    if embedded_pair_available():
        return default_target_path(), drafter or embedded_default_drafter(default_target_path()), False, True
    random_target, random_draft = random_pair(workdir)
    return random_target, drafter or random_draft, True, True


def random_pair(workdir: Path, seed: int = 0) -> tuple[str, str]:
    """A random Llama target (6 layers x 256) and a draft made of its first 2 layers (+ its embedding,
    norm and head), with a character-level tokenizer. The weights are widened (as in the tests'
    factory) so the text is not one repeated token and the draft agrees only partly (acceptance
    about 0.4-0.6), as a trained pair would, rather than trivially always."""
    import torch

    from quickdraft.model.config import ModelConfig
    from quickdraft.model.transformer import Transformer
    from quickdraft.model.weights import save_pretrained

    torch.manual_seed(seed)
    shape = dict(model_type="llama", vocab_size=128, n_embd=256, n_head=4, n_kv_head=4, head_dim=64,
                 intermediate_size=512, block_size=1024, norm_eps=1e-6, tie_word_embeddings=True)
    target = Transformer(ModelConfig(n_layer=6, **shape))
    with torch.no_grad():
        for name, p in target.named_parameters():
            if p.dim() == 2 and name.startswith("layers."):
                p.mul_(3.0)
        target.norm.weight.mul_(4.0)
    draft = Transformer(ModelConfig(n_layer=2, **shape))
    draft.load_state_dict({k: v for k, v in target.state_dict().items() if k in draft.state_dict()})
    paths = []
    for name, model in (("target", target), ("draft", draft)):
        save_pretrained(model, workdir / name)
        _write_char_tokenizer(workdir / name)
        paths.append(str(workdir / name))
    return paths[0], paths[1]


def _write_char_tokenizer(model_dir: Path) -> None:
    """One token per printable ASCII character (+ newline, + EOS), so a random model serves text:
    the clients then see tokens as they stream, as with a real model."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE

    chars = ["\n"] + [chr(c) for c in range(32, 127)]
    tokenizer = Tokenizer(BPE(vocab={"<|endoftext|>": 0, **{ch: i + 1 for i, ch in enumerate(chars)}}, merges=[]))
    tokenizer.normalizer = normalizers.Replace(Regex(r"[^\n -~]"), "?")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.add_special_tokens([AddedToken("<|endoftext|>", special=True, normalized=False)])
    tokenizer.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))


class ServerProcess:
    """``quickdraft serve`` in a subprocess on a free loopback port."""

    def __init__(self, target: str, drafter: str | None, *, max_queue: int, request_timeout_s: float,
                 startup_timeout_s: float = 180.0, extra_args: tuple[str, ...] = (), model_name: str = "load") -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "quickdraft.cli", "serve", "--target", target, "--host", "127.0.0.1",
               "--port", str(self.port), "--served-model-name", model_name, "--max-queue", str(max_queue),
               "--request-timeout", str(request_timeout_s), "--log-level", "warning"]
        if drafter:
            cmd += ["--drafter", drafter]
        cmd += list(extra_args)
        self.cmd, self.startup_timeout_s = cmd, startup_timeout_s
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> ServerProcess:
        import httpx

        # A file, not a pipe: nobody reads the server's log while it runs, and a full pipe would block it.
        self._log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.DEVNULL, stderr=self._log, text=True,
                                     start_new_session=True)
        deadline = time.monotonic() + self.startup_timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited ({self.proc.returncode}): {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.__exit__(None, None, None)
                raise RuntimeError(f"the server did not answer on {self.url} within {self.startup_timeout_s:.0f} s: "
                                   f"{self.log()[-2000:]}")
            time.sleep(0.25)

    def log(self) -> str:
        """What the server wrote to stderr so far."""
        self._log.seek(0)
        text = self._log.read()
        self._log.seek(0, 2)
        return text

    def rss(self) -> int | None:
        return _tree_status(self.proc.pid, "VmRSS") if self.proc else None

    def peak_rss(self) -> int | None:
        return _tree_status(self.proc.pid, "VmHWM") if self.proc else None

    def health(self) -> dict[str, Any]:
        import httpx

        return httpx.get(self.url + "/health", timeout=30).json()

    def counters(self) -> dict[str, float]:
        """The server's unlabelled Prometheus counters (quickdraft_num_draft_tokens_total ...)."""
        import httpx

        out = {}
        for line in httpx.get(self.url + "/metrics", timeout=30).text.splitlines():
            if line.startswith("quickdraft_") and "{" not in line:
                name, value = line.split()
                out[name.removeprefix("quickdraft_")] = float(value)
        return out

    def __exit__(self, *exc_info) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()  # a Ray server then stops its replicas and its local Ray instance
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
                self.proc.wait()


# ---- the clients -------------------------------------------------------------------------------
async def _one_request(client, url: str, body: dict[str, Any]) -> RequestRecord:
    start = time.perf_counter()
    ttft, tokens, done, error = None, 0, False, None
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return RequestRecord(False, None, time.perf_counter() - start, 0, f"HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    error = f"error event: {chunk['error'].get('code') or chunk['error'].get('type')}"
                    continue
                choices = chunk.get("choices") or []
                if ttft is None and choices and (choices[0].get("text") or choices[0].get("delta", {}).get("content")):
                    ttft = time.perf_counter() - start
                if chunk.get("usage"):
                    tokens = chunk["usage"]["completion_tokens"]
    except Exception as exc:  # a transport error is a failed request, whatever it is
        return RequestRecord(False, ttft, time.perf_counter() - start, tokens, type(exc).__name__)
    total = time.perf_counter() - start
    if ttft is None and tokens:
        ttft = total  # the text arrived in the last chunk (e.g. a random model's ids decode to "")
    ok = done and error is None
    return RequestRecord(ok, ttft, total, tokens, error or (None if done else "no [DONE]"))


async def _client_loop(client, requests: list[tuple[str, dict[str, Any]]], offset: int, stop_at: float,
                       records: list[RequestRecord]) -> None:
    i = offset
    while time.monotonic() < stop_at:
        url, body = requests[i % len(requests)]
        records.append(await _one_request(client, url, body))
        i += 1


async def _drive(requests: list[tuple[str, dict[str, Any]]], clients: int, duration_s: float,
                 drain_timeout_s: float) -> tuple[list[RequestRecord], int, float]:
    """``clients`` loops, each sending one (url, body) after another until ``duration_s`` has passed."""
    import httpx

    records: list[RequestRecord] = []
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    timeout = httpx.Timeout(duration_s + drain_timeout_s, connect=30)
    async with httpx.AsyncClient(limits=limits, timeout=timeout) as client:
        start = time.monotonic()
        stop_at = start + duration_s
        tasks = [asyncio.create_task(_client_loop(client, requests, i, stop_at, records)) for i in range(clients)]
        done, pending = await asyncio.wait(tasks, timeout=duration_s + drain_timeout_s)
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
        wall = time.monotonic() - start
    return records, len(pending), wall


def make_bodies(text: bool, max_tokens: int, vocab_size: int = 512, gamma: int | str | None = None) -> list[dict[str, Any]]:
    """Streaming requests: text prompts (completions and chat) or token-id prompts; ``gamma``
    (e.g. 0: plain decoding) is sent with every request when given."""
    if text:
        bodies = []
        for i, prompt in enumerate(TEXT_PROMPTS):
            if i % 2:
                bodies.append({"messages": [{"role": "user", "content": prompt}]})
            else:
                bodies.append({"prompt": prompt})
    else:
        bodies = [{"prompt": [(7 * i + 3 * j) % (vocab_size - 1) + 1 for j in range(24 + 4 * i)]} for i in range(6)]
    # Half greedy, half sampled (seeded): both verification paths run.
    sampling = [{"temperature": 0}, {"temperature": 0.8, "top_p": 0.95, "seed": 1}]
    extra = {} if gamma is None else {"gamma": gamma}
    return [{"model": "load", "max_tokens": max_tokens, "stream": True, **sampling[(i // 2) % 2], **extra, **b}
            for i, b in enumerate(bodies)]


def run_load(clients: int = 32, duration_s: float = 60.0, max_tokens: int = 32, target: str | None = None,
             drafter: str | None = None, drain_timeout_s: float = 240.0, warmup_requests: int = 2,
             max_batch: int | None = None, gamma: int | str | None = None, threads: int | None = None,
             config: str = "default", replicas: int | None = None, server_args: tuple[str, ...] = ()) -> LoadReport:
    if clients < 1 or duration_s <= 0 or max_tokens < 1:
        raise ValueError("clients, duration and max_tokens must be positive")
    extra_args: tuple[str, ...] = tuple(server_args)
    if max_batch is not None:
        extra_args += ("--max-batch", str(max_batch))
    if threads is not None:
        extra_args += ("--threads", str(threads))
    if replicas is not None:
        extra_args += ("--replicas", str(replicas))
    with tempfile.TemporaryDirectory(prefix="quickdraft-load-") as tmp:
        target, drafter, random_model, text = choose_models(target, drafter, Path(tmp))
        bodies = make_bodies(text, max_tokens, gamma=gamma)
        with ServerProcess(target, drafter, max_queue=max(64, 2 * clients),
                           request_timeout_s=duration_s + drain_timeout_s, extra_args=extra_args) as server:
            endpoint = lambda b: server.url + ("/v1/chat/completions" if "messages" in b else "/v1/completions")  # noqa: E731
            routed = [(endpoint(b), b) for b in bodies]

            async def main() -> tuple[list[RequestRecord], int, float]:
                import httpx

                async with httpx.AsyncClient(timeout=120) as warm:
                    for url, body in routed[:warmup_requests]:
                        await _one_request(warm, url, body)
                return await _drive(routed, clients, duration_s, drain_timeout_s)

            samples: list[int] = []  # the server's RSS, once a second
            threads_seen: list[int] = []  # and its engine's thread count (the governor moves it with the free cores)

            async def with_rss() -> tuple[list[RequestRecord], int, float]:
                task = asyncio.create_task(main())
                while not task.done():
                    samples.append(server.rss() or 0)
                    threads = (await asyncio.to_thread(server.counters)).get("threads")
                    if threads is not None:
                        threads_seen.append(int(threads))
                    await asyncio.wait([task], timeout=1.0)
                return task.result()

            records, unfinished, wall = asyncio.run(with_rss())
            warm_index = min(len(samples) - 1, int(min(10.0, duration_s / 4)))
            rss_warm = samples[warm_index] or None
            rss_end = server.rss()
            peak = max([server.peak_rss() or 0, rss_end or 0, *samples]) or None
            counters = server.counters()
            server_kernels = server.health().get("kernels")
    ok = [r for r in records if r.ok]
    errors: dict[str, int] = {}
    for r in records:
        if not r.ok:
            errors[r.error or "unknown"] = errors.get(r.error or "unknown", 0) + 1
    ttfts = [r.ttft_s for r in ok if r.ttft_s is not None]
    totals = [r.total_s for r in ok]
    tokens = sum(r.tokens for r in ok)
    return LoadReport(
        model=target, random_model=random_model, drafter=drafter, clients=clients, duration_s=duration_s,
        max_tokens=max_tokens, requests=len(records), failed=len(records) - len(ok), unfinished=unfinished,
        errors=errors, ttft_p50_s=percentile(ttfts, 50), ttft_p99_s=percentile(ttfts, 99),
        latency_p50_s=percentile(totals, 50), latency_p99_s=percentile(totals, 99), generated_tokens=tokens,
        wall_s=wall, tokens_per_s=tokens / wall if wall > 0 else 0.0, server_rss_after_warmup_bytes=rss_warm,
        server_rss_end_bytes=rss_end, server_peak_rss_bytes=peak, machine=_machine(), config=config,
        server_kernels=server_kernels,
        server_threads=(min(threads_seen), int(statistics.median_low(threads_seen)), max(threads_seen))
        if threads_seen else None,
        acceptance_rate=(counters.get("num_accepted_tokens_total", 0) / counters["num_draft_tokens_total"]
                         if counters.get("num_draft_tokens_total") else None),
        mean_accepted_length=(counters.get("generation_tokens_total", 0) / counters["num_target_calls_total"]
                              if counters.get("num_target_calls_total") else None),
    )


def _machine() -> dict[str, Any]:
    """The bench's machine description, with the load average the clients ran under."""
    from quickdraft.bench.harness import machine_description

    return {**machine_description(), "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None}


# name -> (server --max-batch, the gamma every request sends: None = the server's default, auto,
# more server flags). "In process" is the server before its engine had a process of its own.
SWEEP_CONFIGS = {
    "batched speculative": (32, None, ()),
    "batched plain": (32, 0, ()),
    "batched speculative, in process": (32, None, ("--in-process",)),
    "batched speculative, drafts unquantised": (32, None, ("--no-quantized-draft",)),
    "batched speculative, int8 target": (32, None, ("--target-bits", "8")),
    "batched plain, int8 target": (32, 0, ("--target-bits", "8")),
    "one at a time": (1, None, ()),
}

# a speculative configuration -> the plain one on the same target, for the "speculative vs plain" column
PLAIN_OF = {"batched speculative": "batched plain", "batched speculative, int8 target": "batched plain, int8 target"}

HF_BATCHED = "hf batched generate"


def hf_batched_report(clients: int, max_tokens: int, target: str | None, threads: int | None) -> LoadReport | None:
    """transformers' ``generate()`` on one static padded batch of ``clients`` prompts, in this
    process (no server: the upper bound of a static batch, no queueing, no streaming), greedy, in
    the dtype quickdraft serve picks. None without transformers or a tokenizer."""
    import torch

    try:
        from quickdraft.bench.peers import hf_batched_generate_seconds, load_hf_model
    except ImportError:
        return None
    from quickdraft.model.loader import dtype_name, load_model, parse_dtype

    with tempfile.TemporaryDirectory(prefix="quickdraft-load-") as tmp:
        target, _, random_model, text = choose_models(target, None, Path(tmp))
        ours = load_model(target)
        if ours.tokenizer is None:
            return None
        prompts = [ours.tokenizer.encode(TEXT_PROMPTS[i % len(TEXT_PROMPTS)]) for i in range(clients)]
        previous = torch.get_num_threads()
        if threads:
            torch.set_num_threads(threads)
        try:
            model = load_hf_model(Path(target), dtype_name(parse_dtype("auto", "cpu")))
            hf_batched_generate_seconds(model, prompts, 4)  # warm-up
            seconds = min(hf_batched_generate_seconds(model, prompts, max_tokens) for _ in range(2))
        finally:
            torch.set_num_threads(previous)
    per_request = max_tokens / seconds
    return LoadReport(
        model=target, random_model=random_model, drafter=None, clients=clients, duration_s=seconds,
        max_tokens=max_tokens, requests=clients, failed=0, unfinished=0, errors={}, ttft_p50_s=None,
        ttft_p99_s=None, latency_p50_s=seconds, latency_p99_s=seconds, generated_tokens=clients * max_tokens,
        wall_s=seconds, tokens_per_s=clients * per_request, server_rss_after_warmup_bytes=None,
        server_rss_end_bytes=None, server_peak_rss_bytes=None, machine=_machine(), config=HF_BATCHED)


def run_sweep(levels: list[int], duration_s: float, max_tokens: int, target: str | None, drafter: str | None,
              threads: int | None, out: Path, repeats: int = 1, configs: list[str] | None = None,
              hf: bool = True) -> list[LoadReport]:
    """Every configuration at every concurrency level (a fresh server per point), transformers'
    static batched generate() beside them, then a table with ratios and a plot of aggregate tokens/s.

    ``repeats`` rounds, each running every point once: a configuration's figures are its median
    over the rounds, and a ratio between two configurations is the median of the ratios within a
    round (their servers ran minutes apart, not a whole sweep apart: on a VM whose speed drifts by
    ±20% between consecutive servers, one round's ratios are mostly drift)."""
    names = configs or list(SWEEP_CONFIGS)
    for name in names:
        if name not in SWEEP_CONFIGS:
            raise ValueError(f"unknown sweep configuration {name!r}: choose from {', '.join(SWEEP_CONFIGS)}")
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    reports = []
    for round_index in range(repeats):
        for clients in levels:
            for name in names:
                max_batch, gamma, server_args = SWEEP_CONFIGS[name]
                print(f"sweep round {round_index + 1}/{repeats}: {name}, {clients} clients", file=sys.stderr,
                      flush=True)
                report = run_load(clients, duration_s, max_tokens, target, drafter, max_batch=max_batch, gamma=gamma,
                                  threads=threads, config=name, server_args=server_args)
                reports.append(replace(report, sweep_round=round_index))
            if hf:
                print(f"sweep round {round_index + 1}/{repeats}: {HF_BATCHED}, batch {clients}", file=sys.stderr,
                      flush=True)
                hf_report = hf_batched_report(clients, max_tokens, target, threads)
                if hf_report is not None:
                    reports.append(replace(hf_report, sweep_round=round_index))
    out.mkdir(parents=True, exist_ok=True)
    (out / "load_sweep.json").write_text(json.dumps([asdict(r) for r in reports], indent=2))
    (out / "load_sweep.md").write_text("\n".join([machine_line(reports[0].machine), servers_kernels_line(reports), "",
                                                  *sweep_table(reports)]) + "\n")
    _plot_sweep(reports, out / "load_sweep.png")
    return reports


def machine_line(machine: dict[str, Any]) -> str:
    """Where a sweep ran, and which build of quickdraft's CPU kernels this process loaded (a build
    that failed leaves every engine on torch's products: 2-3x slower, with only a log line)."""
    return (f"Machine: {machine.get('cpu')}, {machine.get('cpus')} CPUs, torch {machine.get('torch')}, "
            f"quickdraft kernels: {machine.get('kernels') or 'none (torch products)'}.")


def servers_kernels_line(reports: list[LoadReport]) -> str:
    """Which kernel build each configuration's server loaded (its /health): a server that fell back
    to torch's products would be 2-3x slower than the others and say so only in its own log."""
    builds: dict[str, set[str]] = {}
    for r in reports:
        if r.config != HF_BATCHED:
            builds.setdefault(r.server_kernels or "none (torch products)", set()).add(r.config)
    if len(builds) == 1:
        return f"Servers' engine kernels: {next(iter(builds))} in every configuration."
    return "Servers' engine kernels differ: " + "; ".join(
        f"{build} in {', '.join(sorted(configs))}" for build, configs in sorted(builds.items())) + "."


def _round_ratios(reports: list[LoadReport], config: str, base: str, clients: int) -> list[float]:
    """tokens/s of ``config`` over ``base``'s at ``clients``, in every round that ran both."""
    by_round = {(r.config, r.sweep_round): r for r in reports if r.clients == clients}
    return [r.tokens_per_s / b.tokens_per_s for (c, round_index), r in sorted(by_round.items())
            if c == config and (b := by_round.get((base, round_index))) is not None and b.tokens_per_s]


def sweep_table(reports: list[LoadReport]) -> list[str]:
    """One row per (clients, configuration): medians over the sweep's rounds, ratios as the median
    of each round's ratio (the spread of tokens/s and ratios shown when there are several rounds)."""
    runs: dict[tuple[str, int], list[LoadReport]] = {}
    for r in reports:
        runs.setdefault((r.config, r.clients), []).append(r)
    rounds = max(len(v) for v in runs.values())
    lines = ["| clients | configuration | tokens/s | per request tokens/s | TTFT p50 | TTFT p99 | failed | "
             "vs one at a time | speculative vs plain | server threads |", "|---|---|---|---|---|---|---|---|---|---|"]

    def ratio(values: list[float]) -> str:
        if not values:
            return ""
        spread = f" ({min(values):.2f}–{max(values):.2f})" if len(values) > 1 else ""
        return f"{statistics.median(values):.2f}×{spread}"

    for (config, clients), group in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rates = [r.tokens_per_s for r in group]
        middle = sorted(group, key=lambda r: r.tokens_per_s)[(len(group) - 1) // 2]  # its latencies
        per_request = middle.max_tokens / middle.latency_p50_s if middle.latency_p50_s else 0.0
        ttft = lambda v: "–" if v is None else f"{v:.2f} s"  # noqa: E731
        rate = f"{statistics.median(rates):.1f}" + (f" ({min(rates):.0f}–{max(rates):.0f})" if len(rates) > 1 else "")
        vs_one = ratio(_round_ratios(reports, config, "one at a time", clients)) if config != "one at a time" else "1.00×"
        plain = PLAIN_OF.get(config)
        vs_plain = ratio(_round_ratios(reports, config, plain, clients)) if plain else ""
        seen = [r.server_threads for r in group if r.server_threads is not None]
        threads = threads_range((min(t[0] for t in seen), int(statistics.median_low(t[1] for t in seen)),
                                 max(t[2] for t in seen)) if seen else None)
        lines.append(f"| {clients} | {config} | {rate} | {per_request:.1f} | {ttft(middle.ttft_p50_s)} | "
                     f"{ttft(middle.ttft_p99_s)} | {sum(r.failed for r in group)} | {vs_one} | {vs_plain} | "
                     f"{threads} |")
    if rounds > 1:
        lines.append(f"\nMedians over {rounds} rounds (range in brackets); each ratio is the median of the ratios "
                     "within a round.")
    return lines


def _plot_sweep(reports: list[LoadReport], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for config in [*SWEEP_CONFIGS, HF_BATCHED]:
        by_clients: dict[int, list[float]] = {}
        for r in reports:
            if r.config == config:
                by_clients.setdefault(r.clients, []).append(r.tokens_per_s)
        if not by_clients:
            continue
        points = sorted((c, statistics.median(v)) for c, v in by_clients.items())
        ax.plot([c for c, _ in points], [t for _, t in points], marker="o", label=config)
    ax.set_xlabel("concurrent streaming clients")
    ax.set_ylabel("aggregate tokens/s")
    ax.set_xscale("log", base=2)
    ax.legend()
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def replica_config(replicas: int | None) -> str:
    return "single process" if replicas is None else f"Ray Serve, {replicas} replica{'s' if replicas > 1 else ''}"


def run_replica_sweep(levels: list[int], replica_counts: list[int], duration_s: float, max_tokens: int,
                      target: str | None, drafter: str | None, threads: int, out: Path) -> list[LoadReport]:
    """Single-process serving, then Ray Serve with each replica count (``threads`` per engine), at
    each concurrency level: aggregate throughput and the latency Ray's hops add."""
    reports = []
    for replicas in [None, *replica_counts]:
        for clients in levels:
            config = replica_config(replicas)
            print(f"replica sweep: {config}, {clients} clients", file=sys.stderr, flush=True)
            reports.append(run_load(clients, duration_s, max_tokens, target, drafter, threads=threads,
                                    config=config, replicas=replicas))
    out.mkdir(parents=True, exist_ok=True)
    (out / "replica_sweep.json").write_text(json.dumps([asdict(r) for r in reports], indent=2))
    (out / "replica_sweep.md").write_text("\n".join(replica_table(reports)) + "\n")
    return reports


def replica_table(reports: list[LoadReport]) -> list[str]:
    by = {(r.config, r.clients): r for r in reports}
    ms = lambda v: "–" if v is None else f"{v * 1000:.0f} ms"  # noqa: E731
    lines = ["| clients | configuration | tokens/s | vs single process | TTFT p50 | latency p50 | latency p99 | "
             "requests | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for (config, clients), r in sorted(by.items(), key=lambda kv: (kv[0][1], kv[1].config != "single process",
                                                                    kv[0][0])):
        base = by.get(("single process", clients))
        ratio = f"{r.tokens_per_s / base.tokens_per_s:.2f}×" if base and base.tokens_per_s else "–"
        lines.append(f"| {clients} | {config} | {r.tokens_per_s:.1f} | {ratio} | {ms(r.ttft_p50_s)} | "
                     f"{ms(r.latency_p50_s)} | {ms(r.latency_p99_s)} | {r.requests} | {r.failed} |")
    single = by.get(("single process", 1))
    for r in reports:
        if r.clients == 1 and r.config != "single process" and single and single.latency_p50_s and r.latency_p50_s:
            lines.append(f"\nPer-request overhead of {r.config} at 1 client: "
                         f"{(r.latency_p50_s - single.latency_p50_s) * 1000:+.0f} ms p50 latency, "
                         f"{((r.ttft_p50_s or 0) - (single.ttft_p50_s or 0)) * 1000:+.0f} ms p50 time to first token "
                         f"({r.max_tokens} streamed tokens a request).")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quickdraft.bench.load", description=__doc__.split("\n")[0])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0, help="seconds during which requests start")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per request")
    parser.add_argument("--target", help="model directory (default: the embedded pair, else a random pair)")
    parser.add_argument("--drafter", help="drafter spec or draft model (default: the server's default, on the "
                        "embedded pair prompt lookup then its draft)")
    parser.add_argument("--drain-timeout", type=float, default=240.0,
                        help="seconds the requests running at the end may take to finish")
    parser.add_argument("--json", help="also write the report as JSON to this path")
    parser.add_argument("--max-batch", type=int, help=f"the server's --max-batch (default: its own, {DEFAULT_MAX_BATCH})")
    parser.add_argument("--gamma", help="gamma sent with every request (0 = plain decoding; default: the server's)")
    parser.add_argument("--threads", type=int, help="the server's torch threads")
    parser.add_argument("--sweep", help="concurrency levels, e.g. 1,4,8,16,32: every configuration at each")
    parser.add_argument("--out", type=Path, default=Path("load-sweep"), help="the sweep's output directory")
    parser.add_argument("--repeats", type=int, default=1,
                        help="sweep rounds (medians over them; ratios within each round, then their median)")
    parser.add_argument("--config", action="append", choices=list(SWEEP_CONFIGS), dest="configs",
                        help="a configuration of the sweep, repeated for several (default: all)")
    parser.add_argument("--no-hf", action="store_true", help="leave transformers' batched generate() out of the sweep")
    parser.add_argument("--replicas", type=int, help="serve on Ray Serve with this many replicas")
    parser.add_argument("--replica-sweep", metavar="COUNTS",
                        help="e.g. 1,2: single-process serving, then Ray Serve with each replica count, at each "
                             "--sweep level (default 1,8), --threads per engine (default 1)")
    args = parser.parse_args(argv)
    if args.replica_sweep:
        levels = [int(c) for c in (args.sweep or "1,8").split(",")]
        reports = run_replica_sweep(levels, [int(c) for c in args.replica_sweep.split(",")], args.duration,
                                    args.max_tokens, args.target, args.drafter, args.threads or 1, args.out)
        print("\n".join(replica_table(reports)))
        return 0 if all(r.failed == 0 and r.unfinished == 0 for r in reports) else 1
    if args.sweep:
        if args.repeats < 1:
            parser.error(f"--repeats must be >= 1, got {args.repeats}")
        reports = run_sweep([int(c) for c in args.sweep.split(",")], args.duration, args.max_tokens, args.target,
                            args.drafter, args.threads, args.out, repeats=args.repeats, configs=args.configs,
                            hf=not args.no_hf)
        print("\n".join(sweep_table(reports)))
        return 0 if all(r.failed == 0 and r.unfinished == 0 for r in reports) else 1
    gamma = None if args.gamma is None else (args.gamma if args.gamma == "auto" else int(args.gamma))
    report = run_load(args.clients, args.duration, args.max_tokens, args.target, args.drafter, args.drain_timeout,
                      max_batch=args.max_batch, gamma=gamma, threads=args.threads, replicas=args.replicas)
    for line in report.lines():
        print(line)
    if args.json:
        Path(args.json).write_text(json.dumps(asdict(report), indent=2))
    return 0 if report.failed == 0 and report.unfinished == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
