"""Round 43. A CPU hog that starts while quickdraft decodes (a server's neighbour job), with and without the thread
governor. The engine is built as `quickdraft generate` builds it (threads: the free cores at start-up; the
governor follows them afterwards), and decodes the bench's prompts back to back: IDLE seconds alone, HOG seconds beside
`python -c "while True: pass"` started mid-run, then IDLE seconds after it is killed. Prints each phase's median
tokens/s and the thread counts the steps ran with.

    .venv/bin/python docs/bench/round43/hog_mid_run.py governor|fixed|governor-batch|fixed-batch [IDLE_S] [HOG_S]
        (-batch: 4 requests at a time through the batch scheduler, as `quickdraft serve` runs them)
    .venv/bin/python docs/bench/round43/hog_mid_run.py idle-ab [ROUNDS]   # no hog: governor on/off alternating in one process
"""
import collections, statistics, subprocess, sys, time
import torch
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.cli import apply_threads
from quickdraft.engine import Engine

mode = sys.argv[1]
governor = apply_threads()
engine = Engine(default_target_path(), f"prompt-lookup+{default_draft_path()}", exact=True, dtype="auto")
prompts = [p["prompt"] for p in load_prompts()]
engine.generate(prompts[0], 16)
counter = [0]


def one_request() -> float:
    if mode.endswith("-batch"):  # tokens/s of 4 requests decoded together, from the first submit to the last token
        batch = [prompts[(counter[0] + i) % len(prompts)] for i in range(4)]
        counter[0] += 4
        start = time.perf_counter()
        results = engine.generate_batch(batch, 128, gamma="auto", max_batch=4)
        return sum(len(r.token_ids) for r in results) / (time.perf_counter() - start)
    prompt = prompts[counter[0] % len(prompts)]
    counter[0] += 1
    return engine.generate(prompt, 128, gamma="auto").stats.tokens_per_s


def phase(seconds: float) -> tuple[float, dict[int, int]]:
    rates, threads_seen = [], collections.Counter()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        rates.append(one_request())
        threads_seen[torch.get_num_threads()] += 1
    return statistics.median(rates), dict(threads_seen)


if mode == "idle-ab":
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 6
    ratios, start_threads = [], torch.get_num_threads()
    for r in range(rounds):
        rates, seen = {}, {}
        for arm in (("on", "off") if r % 2 == 0 else ("off", "on")):
            torch.set_num_threads(start_threads)  # what the governor left does not carry into the other arm
            engine.thread_governor = governor if arm == "on" else None
            rates[arm], seen[arm] = phase(3)
        ratios.append(rates["on"] / rates["off"])
        print(f"round {r}: governor on {rates['on']:.0f} tok/s {seen['on']} (changes so far {governor.changes}), off {rates['off']:.0f} tok/s {seen['off']}, "
              f"on/off {ratios[-1]:.3f}", flush=True)
    print(f"median on/off {statistics.median(ratios):.3f} (threads now {torch.get_num_threads()})")
    sys.exit()

if mode.startswith("governor"):
    assert governor is not None and engine.follow_free_cores(governor), "no governor here"
idle_s = float(sys.argv[2]) if len(sys.argv) > 2 else 6
hog_s = float(sys.argv[3]) if len(sys.argv) > 3 else 10
print(f"{mode}: started with {torch.get_num_threads()} threads", flush=True)
before = phase(idle_s)
hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
try:
    beside = phase(hog_s)
finally:
    hog.kill()
    hog.wait()
after = phase(idle_s)
for name, (rate, seen) in (("idle", before), ("beside the hog", beside), ("after it", after)):
    print(f"{mode}: {name}: {rate:.0f} tok/s (requests by thread count {seen})")
print(f"{mode}: kept beside the hog {beside[0] / before[0]:.0%}; after it {after[0] / before[0]:.0%}")
