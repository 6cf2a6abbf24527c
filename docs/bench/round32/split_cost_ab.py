"""auto γ planning with the draft call's fixed cost measured apart (step_seconds) vs without, one process."""
import statistics, sys, torch
sys.path.insert(0, "docs/bench")  # run from the repository root
from arm_rounds import prompt_ids, rotated_rounds
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams
torch.set_num_threads(1)
rounds = int(sys.argv[1]); which = sys.argv[2].split(",")
spec = sys.argv[3] if len(sys.argv) > 3 else str(default_draft_path())
target = load_model(default_target_path(), dtype="auto")
split = Engine(target, spec, exact=False); split.eos_token_ids = frozenset()
nosplit = Engine(target, spec, exact=False); nosplit.eos_token_ids = frozenset()
inner = nosplit.drafter.model if hasattr(nosplit.drafter, "lookup") else nosplit.drafter
orig = inner.propose
def stripped(*a, **k):
    d = orig(*a, **k); d.step_seconds = None; return d
inner.propose = stripped
plain = Engine(target, None, exact=False); plain.eos_token_ids = frozenset()
engines = {"split": split, "nosplit": nosplit}
prompts = prompt_ids(target)
S = {"greedy": SamplingParams(), "coupled": SamplingParams(temperature=0.8, seed=1),
     "rejection": SamplingParams(temperature=0.8, rule="rejection")}
arms = ["plain", "split", "nosplit"]
for name in which:
    s = S[name]
    def run(p, arm):
        r = plain.generate(p, 128, s, 0) if arm == "plain" else engines[arm].generate(p, 128, s, "auto")
        return len(r.token_ids), r.stats.accepted, r.stats.drafted
    res = rotated_rounds(prompts, arms, run, rounds)
    print(f"## {name}, {spec}, {rounds} rounds")
    for arm in arms[1:]:
        sp = [t[arm].rate / t["plain"].rate for t in res]
        acc = sum(t[arm].accepted for t in res) / sum(t[arm].drafted for t in res)
        dpc = sum(t[arm].drafted for t in res) / sum(t[arm].tokens - t[arm].accepted for t in res)
        print(f"  {arm}: {statistics.median(sp):.3f}x  ({' '.join(f'{x:.2f}' for x in sp)})  acceptance {acc:.3f}  drafted/call {dpc:.2f}", flush=True)
    m = split.acceptance_memory
    print("  split memory c, f:", {str(k): (round(v, 3), round(m.fixed_costs.get(k, 0), 3)) for k, v in m.costs.items()})
