"""A lone request through the batch scheduler (generate_batch, 32 slots) against the single-sequence loop
(generate), the embedded pair's default drafter, 32 new tokens, 1 thread: the load test's 1-client ratio
without the server. Optional argument: a kernels .so to load instead of this checkout's build."""
import sys, time, torch, statistics
from pathlib import Path
from bench_common import use_kernels
if len(sys.argv) > 1:
    use_kernels(sys.argv[1])
from quickdraft.assets import default_target_path
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.cli import embedded_default_drafter
from quickdraft.engine import Engine
torch.set_num_threads(1)
target = default_target_path()
e = Engine(target, embedded_default_drafter(target), exact=True, dtype="auto")
prompts = TEXT_PROMPTS[:8]
for p in prompts[:2]:
    e.generate(p, 32, gamma="auto"); e.generate_batch([p], 32, max_batch=32)
chain, batched = [], []
for _ in range(5):
    s = time.perf_counter(); n = sum(len(e.generate(p, 32, gamma="auto").token_ids) for p in prompts); chain.append(n / (time.perf_counter() - s))
    s = time.perf_counter(); n = sum(len(e.generate_batch([p], 32, max_batch=32)[0].token_ids) for p in prompts); batched.append(n / (time.perf_counter() - s))
c, b = statistics.median(chain), statistics.median(batched)
print(f"{Path(sys.argv[1]).stem if len(sys.argv) > 1 else 'checkout'}: chain {c:.0f} tok/s, batched lone {b:.0f} tok/s, batched/chain {b/c:.3f}")
