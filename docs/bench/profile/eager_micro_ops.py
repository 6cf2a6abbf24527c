"""Usage: python eager_micro_ops.py TARGET_DIR

Prototype eager micro-optimizations of the forward (no compile): fused rms_norm, one rope call
for q and k with a sign-folded sin table sliced (not gathered), no mask for causal 1-row steps,
lm_head as mm(x, W^T contiguous). Measures CPU time per forward vs the current forward."""
import sys, time, statistics, torch, torch.nn.functional as F
torch.set_num_threads(1)
from quickdraft.model.loader import load_model
from quickdraft.model.config import ModelConfig
from quickdraft.model.transformer import Transformer

def make_fast(model, lm_head_t=True):
    cfg = model.config
    cos, sin = model._rope(torch.arange(1024), 1024)
    half = cfg.head_dim // 2
    sin_s = torch.cat((-sin[:, :half], sin[:, half:]), -1)
    wt = model.lm_head.weight.t().contiguous() if lm_head_t else None
    nh, nkv, hd, E = cfg.n_head, cfg.n_kv_head, cfg.head_dim, cfg.n_embd
    def rope(x, c, s):
        return x * c + torch.cat((x[..., half:], x[..., :half]), -1) * s
    @torch.inference_mode()
    def forward(tokens, start, cache):
        M = tokens.shape[1]; end = start + M
        x = model.embed(tokens)
        c, s = cos[start:end], sin_s[start:end]
        if M == 1:
            mask = None
        else:
            slots = torch.arange(end); pos = torch.arange(start, end)
            mask = slots[None, :] <= pos[:, None]
        for i, blk in enumerate(model.layers):
            h = F.rms_norm(x, (E,), blk.attn_norm.weight, cfg.norm_eps)
            qkv = blk.attn.qkv(h)
            qk = rope(qkv[..., : (nh + nkv) * hd].view(1, M, nh + nkv, hd).transpose(1, 2), c, s)
            q, k = qk[:, :nh], qk[:, nh:]
            v = qkv[..., (nh + nkv) * hd:].view(1, M, nkv, hd).transpose(1, 2)
            cache.keys[i][:, :, start:end] = k; cache.values[i][:, :, start:end] = v
            y = F.scaled_dot_product_attention(q, cache.keys[i][:, :, :end], cache.values[i][:, :, :end], attn_mask=mask, enable_gqa=nkv != nh)
            x = x + blk.attn.out(y.transpose(1, 2).reshape(1, M, -1))
            h = F.rms_norm(x, (E,), blk.mlp_norm.weight, cfg.norm_eps)
            g, u = blk.mlp.up(h).chunk(2, -1)
            x = x + blk.mlp.down(F.silu(g) * u)
        h = F.rms_norm(x, (E,), model.norm.weight, cfg.norm_eps)
        return torch.matmul(h, wt) if wt is not None else model.lm_head(h)
    return forward

def bench(fns, n=20, rounds=9):
    res = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            t0 = time.thread_time()
            for _ in range(n): f()
            res[k].append((time.thread_time() - t0) / n * 1e3)
    return {k: statistics.median(v) for k, v in res.items()}

target = load_model(sys.argv[1]).model.eval()  # e.g. the target written by make_random_pair.py
cfg = ModelConfig(model_type="llama", vocab_size=64, n_embd=32, n_layer=8, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64, block_size=1024, norm_eps=1e-6, tie_word_embeddings=True)
tiny = Transformer(cfg).eval()
for name, model in (("8-layer tiny width (fixed cost)", tiny), ("15.7M target", target)):
    cache = model.new_cache(512)
    fast = make_fast(model); fast_nt = make_fast(model, lm_head_t=False)
    for M in (1, 5):
        toks = torch.zeros(1, M, dtype=torch.long)
        with torch.inference_mode():
            ref = model(toks, 200, cache)
        d = (fast(toks, 200, cache) - ref).abs().max().item()
        def cur():
            with torch.inference_mode(): model(toks, 200, cache)
        r = bench({"current": cur, "fast ops": lambda: fast_nt(toks, 200, cache), "fast ops + lm_head W^T": lambda: fast(toks, 200, cache)})
        print(f"{name} M={M}: " + ", ".join(f"{k} {v:.2f} ms" for k, v in r.items()) + f"; max |diff| {d:.1e}", flush=True)
