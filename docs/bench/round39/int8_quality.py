"""Held-out cross-entropy of the default target with bf16 and with int8 weight products (native forwards),
on the stdlib files its held-out prompts come from (train/corpus.py holds these files out of training).
`python docs/bench/round39/int8_quality.py` from the repository root."""
import json, math, sys, sysconfig, torch
from pathlib import Path
from quickdraft.assets import default_target_path
from quickdraft.model.loader import load_model
torch.set_num_threads(1)
lib = Path(sysconfig.get_paths()["stdlib"])
sources = sorted({json.loads(l)["source"].split(":")[0] for l in open("src/quickdraft/assets/prompts_heldout.jsonl")})
files = [lib / s for s in sources if (lib / s).exists()]
loaded = load_model(default_target_path(), dtype="bf16")
model, tok = loaded.model, loaded.tokenizer
assert model.pack_products()
window, chunk = 256, 64
streams = [tok.encode(f.read_text(errors="ignore")) for f in files]
def nll(model):
    total = count = 0.0
    for ids in streams:
        for w in range(0, len(ids) - 1, window):
            seq = torch.tensor([ids[w: w + window + 1]])
            if seq.shape[1] < 2: continue
            cache = model.new_cache(window + 64)
            with torch.inference_mode():
                logits = torch.cat([model(seq[:, i: i + chunk], i, cache) for i in range(0, seq.shape[1] - 1, chunk)], 1)
            logits = logits[0, : seq.shape[1] - 1].float()
            total += torch.nn.functional.cross_entropy(logits, seq[0, 1:], reduction="sum").item(); count += seq.shape[1] - 1
    return total / count, int(count)
bf16, n = nll(model)
assert model.quantize_target_products()
int8, _ = nll(model)
print(f"{len(files)} held-out stdlib files, {n} tokens: cross-entropy bf16 {bf16:.4f} (ppl {math.exp(bf16):.2f}), int8 {int8:.4f} (ppl {math.exp(int8):.2f}), +{100*(math.exp(int8-bf16)-1):.2f}% perplexity")
