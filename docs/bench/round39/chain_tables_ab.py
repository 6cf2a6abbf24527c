"""A/B in one process, alternating per prompt: a chain's positions and causal mask as views of cached tables and a subset head's row limit kept per limit (new) against both built per call (old), for plain decoding and the self-draft on the default target. `python docs/bench/round39/chain_tables_ab.py [rounds]`."""
import statistics, sys, time, torch
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.bench.load import TEXT_PROMPTS
from quickdraft.model.transformer import Transformer
from quickdraft.model.native import NativeForward
torch.set_num_threads(1)
new_chain = Transformer._native_chain
new_limit = NativeForward._head_rows_below
def old_chain(self, tokens, start, cache, window, exit_layer=None, logits_rows=None):
    t, batch = tokens.shape[1], tokens.shape[0]
    pos = torch.arange(start, start + t, device=tokens.device)
    mask = self._attention_mask(pos, window, False)
    return self.native(tokens, pos.expand(batch, t), pos.expand(batch, t), mask[None], cache, exit_layer, logits_rows=logits_rows)
def old_limit(self, vocab_limit):
    h = self.model.head_ids
    return vocab_limit if h is None else int(torch.searchsorted(h, vocab_limit))
engines = {d: Engine(default_target_path(), None if d == "none" else d, exact=False, dtype="auto") for d in ("none", "self")}
prompts = TEXT_PROMPTS[:6]
def run(d):
    e = engines[d]; n = 0; s = 0.0; texts = []
    for p in prompts:
        r = e.generate(p, 128, gamma=0 if d == "none" else "auto"); n += len(r.token_ids); s += r.stats.decode_seconds; texts.append(r.token_ids)
    return n / s, texts
for d in engines: run(d)
res = {(d, v): [] for d in engines for v in ("old", "new")}
def use(v):
    Transformer._native_chain = old_chain if v == "old" else new_chain
    NativeForward._head_rows_below = old_limit if v == "old" else new_limit
for rnd in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for d in engines:
        e = engines[d]
        sums = {"old": [0, 0.0], "new": [0, 0.0]}
        for i, p in enumerate(prompts):
            for v in (("old", "new") if (i + rnd) % 2 == 0 else ("new", "old")):
                use(v)
                r = e.generate(p, 128, gamma=0 if d == "none" else "auto")
                sums[v][0] += len(r.token_ids); sums[v][1] += r.stats.decode_seconds
        for v in sums: res[(d, v)].append(sums[v][0] / sums[v][1])
for d in engines:
    o, n = statistics.median(res[(d, "old")]), statistics.median(res[(d, "new")])
    print(f"{d}: old {o:.0f} new {n:.0f} tokens/s (decode), new/old {n/o:.3f}; per round new/old " + " ".join(f"{b/a:.3f}" for a, b in zip(res[(d, 'old')], res[(d, 'new')])))
o = statistics.median(res[("self", "old")]) / statistics.median(res[("none", "old")]); n = statistics.median(res[("self", "new")]) / statistics.median(res[("none", "new")])
print(f"self-draft speedup over plain: old {o:.3f}x new {n:.3f}x; outputs identical across variants")
