"""Usage: python make_random_pair.py OUT_DIR [TARGET_LAYERS]

A random Llama pair shaped like the embedded one (target width 384, draft width 128), for timing."""
import sys, torch
from pathlib import Path
from quickdraft.model.config import ModelConfig
from quickdraft.model.transformer import Transformer
from quickdraft.model.weights import save_pretrained
out = Path(sys.argv[1])
torch.manual_seed(0)
for name, layers, width, heads, kv, hd, inter in (("target", int(sys.argv[2]) if len(sys.argv)>2 else 6, 384, 6, 2, 64, 1024), ("draft", 2, 128, 4, 4, 32, 320)):
    config = ModelConfig(model_type="llama", vocab_size=8192, n_embd=width, n_layer=layers, n_head=heads, n_kv_head=kv,
                         head_dim=hd, intermediate_size=inter, block_size=1024, norm_eps=1e-6, tie_word_embeddings=True)
    m = Transformer(config)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim()==2: p.normal_(0, 0.02*3)
    save_pretrained(m, out / name)
    print(name, sum(p.numel() for p in m.parameters()))
