import sys, time, pathlib, tempfile, gc
sys.path.insert(0, "tests")
import test_sampling_exact as T
from quickdraft.engine import Engine
from quickdraft.sampling_params import SamplingParams
import torch
torch.set_num_threads(1)
root = pathlib.Path(tempfile.mkdtemp())
target, draft = T.tiny_vocab_pair(root, layers=0)
engine = Engine(target, draft, exact=False)
configs = [(SamplingParams(t, k, p, rule=rule), gamma) for t, k, p, gamma, rule in T.CONFIGS]
n = int(sys.argv[1])
T.batched_samples(engine, configs, 200)
for mode in ["on", "off", "on", "off"]:
    if mode == "off": gc.disable()
    else: gc.enable()
    s = time.perf_counter(); T.batched_samples(engine, configs, n); w = time.perf_counter() - s
    print(mode, f"{w:.2f}s", gc.get_count(), gc.get_stats()[2])
gc.enable()
