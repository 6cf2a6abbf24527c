"""Two drafts (product-like: bf16, their cut heads, auto γ) against plain decoding, one process."""
import statistics, sys, torch
sys.path.insert(0, "docs/bench")  # run from the repository root
from arm_rounds import prompt_ids, rotated_rounds
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams
torch.set_num_threads(1)
rounds = int(sys.argv[1]); which = sys.argv[2].split(","); drafts = sys.argv[3:]
target = load_model(default_target_path(), dtype="auto")
engines = {}
for d in drafts:
    engines[d] = e = Engine(target, d, exact=False); e.eos_token_ids = frozenset()
plain = Engine(target, None, exact=False); plain.eos_token_ids = frozenset()
prompts = prompt_ids(target)
S = {"greedy": SamplingParams(), "coupled": SamplingParams(temperature=0.8, seed=1),
     "rejection": SamplingParams(temperature=0.8, rule="rejection")}
arms = ["plain", *drafts]
for name in which:
    s = S[name]
    def run(p, arm):
        r = plain.generate(p, 128, s, 0) if arm == "plain" else engines[arm].generate(p, 128, s, "auto")
        return len(r.token_ids), r.stats.accepted, r.stats.drafted
    res = rotated_rounds(prompts, arms, run, rounds)
    print(f"## {name}, {rounds} rounds (plain {statistics.median(t['plain'].rate for t in res):.0f} tokens/s)")
    for arm in arms[1:]:
        sp = [t[arm].rate / t["plain"].rate for t in res]
        acc = sum(t[arm].accepted for t in res) / sum(t[arm].drafted for t in res)
        tpc = sum(t[arm].tokens for t in res) / sum(t[arm].tokens - t[arm].accepted for t in res)
        print(f"  {arm}: {statistics.median(sp):.3f}x  ({' '.join(f'{x:.2f}' for x in sp)})  acceptance {acc:.3f}  tokens/call {tpc:.2f}", flush=True)
    if len(drafts) == 2:
        rel = [t[drafts[1]].rate / t[drafts[0]].rate for t in res]
        print(f"  {drafts[1]} / {drafts[0]}: median {statistics.median(rel):.3f} ({' '.join(f'{x:.3f}' for x in rel)})")
