"""Usage: python static_step_e2e.py TARGET_DIR DRAFT_DIR [GAMMA] [NEW_TOKENS]

End-to-end prototype: the current Engine with its models' forwards routed to compiled static-shape
steps (inductor max-autotune + freezing; full cache window, positions as a tensor) for the row counts
of the decode loop (target: 1 and γ+1; draft: 1 and 2), eager otherwise. Same process, same prompts:
eager plain vs eager γ vs compiled plain vs compiled γ. CPU time and wall time."""
import sys, time, statistics, torch, torch.nn.functional as F
torch.set_num_threads(1)
import torch._inductor.config as ic
ic.freezing = True
ic.max_autotune_gemm_backends = "CPP,ATEN"
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model

tpath, dpath = sys.argv[1], sys.argv[2]
GAMMA = int(sys.argv[3]) if len(sys.argv) > 3 else 4
N = int(sys.argv[4]) if len(sys.argv) > 4 else 96

class StaticStep(torch.nn.Module):
    def __init__(self, model, cap):
        super().__init__()
        self.m = model; cfg = model.config; self.cfg = cfg
        cos, sin = model._rope(torch.arange(cap), cap)
        half = cfg.head_dim // 2
        self.register_buffer("cos", cos.clone())
        self.register_buffer("sin_signed", torch.cat((-sin[:, :half], sin[:, half:]), -1).clone())
        self.register_buffer("slots", torch.arange(cap))
    def rope(self, x, cos, sin):
        half = x.shape[-1] // 2
        return x * cos + torch.cat((x[..., half:], x[..., :half]), -1) * sin
    def forward(self, tokens, pos, keys, values):
        m, cfg = self.m, self.cfg; M = tokens.shape[1]
        x = m.embed(tokens)
        cos, sin = self.cos[pos], self.sin_signed[pos]
        mask = self.slots[None, :] <= pos[:, None]
        nh, nkv, hd = cfg.n_head, cfg.n_kv_head, cfg.head_dim
        for i, blk in enumerate(m.layers):
            h = F.rms_norm(x, (cfg.n_embd,), blk.attn_norm.weight, cfg.norm_eps)
            q, k, v = blk.attn.qkv(h).split(blk.attn.split, -1)
            q = self.rope(q.view(1, M, nh, hd).transpose(1, 2), cos, sin)
            k = self.rope(k.view(1, M, nkv, hd).transpose(1, 2), cos, sin)
            v = v.view(1, M, nkv, hd).transpose(1, 2)
            keys[i].index_copy_(2, pos, k); values[i].index_copy_(2, pos, v)
            y = F.scaled_dot_product_attention(q, keys[i], values[i], attn_mask=mask, enable_gqa=nkv != nh)
            x = x + blk.attn.out(y.transpose(1, 2).reshape(1, M, -1))
            h = F.rms_norm(x, (cfg.n_embd,), blk.mlp_norm.weight, cfg.norm_eps)
            g, u = blk.mlp.up(h).chunk(2, -1)
            x = x + blk.mlp.down(F.silu(g) * u)
        return m.lm_head(F.rms_norm(x, (cfg.n_embd,), m.norm.weight, cfg.norm_eps))

CAP = None  # the engine's cache capacity for these runs, set once the prompt is known
class Router:
    """Replaces model.forward: compiled graph when (rows, capacity) was compiled, eager otherwise."""
    def __init__(self, model, rows):
        self.model, self.eager = model, model.forward
        self.step = StaticStep(model, CAP).eval()
        self.graphs = {}
        self.rows = rows; self.hits = 0; self.misses = 0
    def compile(self, cache):
        for M in self.rows:
            t0 = time.time()
            g = torch.compile(self.step, mode="max-autotune", dynamic=False, fullgraph=True)
            with torch.no_grad():
                g(torch.zeros(1, M, dtype=torch.long), torch.arange(M), cache.keys, cache.values)
            self.graphs[M] = g
            print(f"  compiled {M} rows in {time.time() - t0:.0f}s", flush=True)
    def __call__(self, tokens, positions=0, cache=None, *, exit_layer=None, full_window=False):
        M = tokens.shape[1]
        if cache is not None and exit_layer is None and cache.capacity == CAP and M in self.graphs:
            self.hits += 1
            start = int(positions)
            return self.graphs[M](tokens, torch.arange(start, start + M), cache.keys, cache.values)
        self.misses += 1
        return self.eager(tokens, positions, cache, exit_layer=exit_layer, full_window=full_window)

t = load_model(tpath); d = load_model(dpath)
prompt_text = 'def read_config(path):\n    """Read a JSON configuration file and return it as a dict."""\n'
prompt = t.tokenizer.encode(prompt_text) if t.tokenizer else list(range(1, 33))
engine = Engine(t, d, exact=False); engine.eos_token_ids = frozenset()
from quickdraft.engine import _round_up, CACHE_ROUNDING
CAP = _round_up(len(prompt) + N + engine.max_gamma + 1, CACHE_ROUNDING)
print("prompt tokens", len(prompt), "cache capacity", CAP)

def measure(label, gamma, rounds=3):
    engine.generate(prompt, 16, gamma=gamma)
    wall, cpu, res = [], [], None
    for _ in range(rounds):
        w0, c0 = time.perf_counter(), time.thread_time()
        res = engine.generate(prompt, N, gamma=gamma)
        wall.append(time.perf_counter() - w0); cpu.append(time.thread_time() - c0)
    return {"label": label, "wall": statistics.median(wall), "cpu": statistics.median(cpu), "ids": res.token_ids,
            "alpha": res.stats.acceptance_rate, "per_call": res.stats.mean_accepted_length}

out = {}
out["eager plain"] = measure("eager plain", 0)
out["eager γ"] = measure("eager γ", GAMMA)
tr, dr = Router(t.model, [1, GAMMA + 1]), Router(d.model, [1, 2])
tr.compile(t.model.new_cache(CAP)); dr.compile(d.model.new_cache(CAP))
t.model.forward, d.model.forward = tr, dr
out["compiled plain"] = measure("compiled plain", 0)
out["compiled γ"] = measure("compiled γ", GAMMA)
print(f"target graph hits {tr.hits}, eager fallbacks {tr.misses}; draft hits {dr.hits}, fallbacks {dr.misses}")
base = out["eager plain"]
for k, r in out.items():
    print(f"{k:15s}: {N / r['cpu']:.1f} tok/s CPU ({base['cpu'] / r['cpu']:.2f}x eager plain), {N / r['wall']:.1f} tok/s wall ({base['wall'] / r['wall']:.2f}x); "
          f"accepted/drafted {r['alpha']:.2f}, tokens/call {r['per_call']:.2f}; same output as eager plain: {r['ids'] == base['ids']}")
print(f"compiled γ vs compiled plain: CPU {out['compiled plain']['cpu'] / out['compiled γ']['cpu']:.2f}x, wall {out['compiled plain']['wall'] / out['compiled γ']['wall']:.2f}x")
print(f"eager γ vs eager plain: CPU {base['cpu'] / out['eager γ']['cpu']:.2f}x, wall {base['wall'] / out['eager γ']['wall']:.2f}x")
