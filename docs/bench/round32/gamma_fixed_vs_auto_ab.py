"""auto γ against fixed γ, one process, product-like engines (bf16 draft, cut head)."""
import statistics, sys, torch
sys.path.insert(0, "docs/bench")  # run from the repository root
from arm_rounds import prompt_ids, rotated_rounds
from quickdraft.assets import default_draft_path, default_target_path
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams
torch.set_num_threads(1)
rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 5
spec = sys.argv[2] if len(sys.argv) > 2 else str(default_draft_path())
which = sys.argv[3].split(",") if len(sys.argv) > 3 else ["rejection", "greedy"]
target = load_model(default_target_path(), dtype="auto")
engine = Engine(target, spec, exact=False); engine.eos_token_ids = frozenset()
plain = Engine(target, None, exact=False); plain.eos_token_ids = frozenset()
prompts = prompt_ids(target)
S = {"greedy": SamplingParams(), "coupled": SamplingParams(temperature=0.8, seed=1),
     "rejection": SamplingParams(temperature=0.8, rule="rejection")}
arms = ["plain", *(sys.argv[4].split(",") if len(sys.argv) > 4 else ["auto", "2", "3", "4", "5"])]
for name in which:
    s = S[name]
    def run(p, arm):
        r = plain.generate(p, 128, s, 0) if arm == "plain" else engine.generate(p, 128, s, arm if arm == "auto" else int(arm))
        return len(r.token_ids), r.stats.accepted, r.stats.drafted
    res = rotated_rounds(prompts, arms, run, rounds)
    print(f"## {name}, {spec}, {rounds} rounds")
    for arm in arms[1:]:
        sp = [t[arm].rate / t["plain"].rate for t in res]
        acc = sum(t[arm].accepted for t in res) / sum(t[arm].drafted for t in res)
        print(f"  {arm}: {statistics.median(sp):.3f}x  ({' '.join(f'{x:.2f}' for x in sp)})  acceptance {acc:.3f}", flush=True)
