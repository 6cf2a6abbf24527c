import time, torch, statistics, json
from quickdraft.assets import default_target_path
from quickdraft.engine import Engine
from quickdraft.drafters import draft_model as dmod
torch.set_num_threads(1)
e = Engine(default_target_path(), "self", exact=False, dtype="auto")
cu=[]
orig = dmod.catch_up
def patched(*a, **k):
    s = orig(*a, **k); cu.append(s); return s
dmod.catch_up = patched
prompts=[json.loads(l) for l in open('src/quickdraft/bench/prompts/bench.jsonl')]
for p in prompts[:3]: e.generate(p['prompt'],128,gamma="auto")
for p in prompts:
    cu.clear()
    s=time.perf_counter(); r=e.generate(p['prompt'],128,gamma="auto"); w=time.perf_counter()-s
    s=time.perf_counter(); q=e.generate(p['prompt'],128,gamma=0); w0=time.perf_counter()-s
    st=r.stats
    print(f"{p['kind']:12s} prompt {st.prompt_tokens:4d} prefill {st.prefill_seconds*1e3:5.1f} ms  draft catch-up {sum(cu)*1e3:5.1f} ms  spec wall {w*1e3:5.1f} plain wall {w0*1e3:5.1f} ratio {w0/w:.2f} decode-only ratio {(q.stats.decode_seconds)/(st.decode_seconds-sum(cu)):.2f}")
