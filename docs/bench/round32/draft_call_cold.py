"""The default draft's one-call draft (2 tokens fed, k drafted, 250 cached) after evicting N MB from the caches
(a target forward streams 25 MB of weights). Run: python docs/bench/round32/draft_call_cold.py"""
import time, torch, statistics
from quickdraft.assets import default_draft_path
from quickdraft.model.loader import load_model
from quickdraft.model.draft_head import load_draft_head, with_subset_head
torch.set_num_threads(1)
d = load_model(default_draft_path(), dtype="bf16").model
d = with_subset_head(d, load_draft_head(default_draft_path(), d.config.vocab_size)); d.pack_products()
toks = torch.randint(2, 8000, (600,)).tolist()
dc = d.new_cache(512)
bufs = {mb: torch.ones(mb * 262144) for mb in (0, 1, 2, 4, 8, 16, 32, 64)}
with torch.inference_mode():
    d(torch.tensor([toks[:300]]), 0, dc)
    for mb, b in bufs.items():
        for k in (1, 3):
            ts = []
            for _ in range(200):
                if mb: b.add_(1.0)
                dc.length = 250
                s = time.perf_counter(); d.native.draft_greedy(toks[250:252], k, 8192, dc); ts.append(time.perf_counter() - s)
            print(f"evict {mb} MB, k {k}: {statistics.median(ts)*1e6:.0f} us")
