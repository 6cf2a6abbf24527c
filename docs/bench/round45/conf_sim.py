import sys, json, torch, statistics, pickle
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.drafters.draft_model import DraftModelDrafter
torch.set_num_threads(1)
spec = sys.argv[1]; src = sys.argv[2]; gamma = sys.argv[3] if len(sys.argv) > 3 else "6"
e = Engine(default_target_path(), spec, exact=False, dtype="auto")
calls = []  # (top probs per step, n_accepted)
def patched(self, tokens, k, sampling, sampler, adjuster=None):
    head_rows = self.model.lm_head.out_features
    lo = torch.empty(k, head_rows, dtype=torch.float32)
    start = self.cache.length
    drafted = self.model.native.draft_greedy(tokens[start:], k, self.vocab_limit, self.cache, logits_out=lo)
    p = torch.softmax(lo, -1).max(-1).values.tolist()
    calls.append([p, None])
    self._base = len(tokens); self._fed = k - 1; self.cache.length = self._base + self._fed
    from quickdraft.drafters.base import Draft
    return Draft(drafted, None, k)
orig_accept = DraftModelDrafter.accept
def accept(self, n):
    if calls and calls[-1][1] is None: calls[-1][1] = n
    orig_accept(self, n)
DraftModelDrafter._propose_natively = patched
DraftModelDrafter.accept = accept
if src == "heldout":
    prompts = [json.loads(l)['prompt'] for l in open('src/quickdraft/assets/prompts_heldout.jsonl')][:40]
else:
    prompts = [json.loads(l)['prompt'] for l in open('src/quickdraft/bench/prompts/bench.jsonl')]
for p in prompts:
    e.generate(p, 128, gamma=int(gamma))
pickle.dump(calls, open(f"/tmp/conf_{src}.pkl", "wb"))
print(len(calls), "calls")
