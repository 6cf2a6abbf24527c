"""Usage: python plain_vs_transformers.py THREADS [MODEL_DIR]

Our plain decode (exact off) vs transformers generate() on the same random ~25M Llama, fp32, same process."""
import sys, time, statistics, torch, warnings
threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
torch.set_num_threads(threads)
import transformers
from pathlib import Path
out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/quickdraft-llama25")
if not (out / "config.json").exists():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=8192, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=1024,
                                   tie_word_embeddings=True, rms_norm_eps=1e-6)
    m = transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
    m.save_pretrained(out)
from quickdraft.engine import Engine
from quickdraft.model.loader import load_model
ours = Engine(load_model(out), exact=False); ours.eos_token_ids = frozenset()
hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
hf.generation_config.eos_token_id = None; hf.generation_config.pad_token_id = 0
print("params", sum(p.numel() for p in hf.parameters()), "threads", threads)
prompt = list(range(100, 164)); N = 128
def run_ours():
    return ours.generate(prompt, N, gamma=0).token_ids
def run_hf():
    ids = torch.tensor([prompt])
    with torch.inference_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = hf.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=N, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()
a, b = run_ours(), run_hf()
print("greedy outputs identical:", a == b, "first diff at", next((i for i,(x,y) in enumerate(zip(a,b)) if x!=y), None))
res = {"ours": {"wall": [], "cpu": []}, "hf": {"wall": [], "cpu": []}}
for r in range(5):
    for name, f in (("ours", run_ours), ("hf", run_hf)) if r % 2 == 0 else (("hf", run_hf), ("ours", run_ours)):
        w0, c0 = time.perf_counter(), time.thread_time()
        f()
        res[name]["wall"].append((time.perf_counter() - w0) / N * 1e3); res[name]["cpu"].append((time.thread_time() - c0) / N * 1e3)
for clock in ("wall", "cpu"):
    o, h = statistics.median(res["ours"][clock]), statistics.median(res["hf"][clock])
    ratios = statistics.median(x / y for x, y in zip(res["ours"][clock], res["hf"][clock]))
    print(f"{clock}: ours {o:.2f} ms/token, transformers {h:.2f} ms/token, ours/hf {o/h:.2f} (median of paired ratios {ratios:.2f})")
