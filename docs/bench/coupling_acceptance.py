"""Per-token acceptance of the two sampling rules, teacher-forced on target samples: optimal rejection
sampling sum(min(p, q)) vs the coupled (exponential-race / Gumbel) rule, on an embedded pair.

    .venv/bin/python docs/bench/coupling_acceptance.py [embedded|embedded-copy]
"""
import json, torch
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams, probabilities
from quickdraft.assets import embedded_target_path, embedded_draft_path
torch.set_num_threads(2)
import sys
pair = sys.argv[1] if len(sys.argv) > 1 else "embedded"
T = load_model(embedded_target_path(pair)); D = load_model(embedded_draft_path(pair))
prompts = [json.loads(l)["prompt"] for l in open("src/quickdraft/bench/prompts/bench.jsonl")]
for temp in (0.8, 1.0, 0.5):
  params = SamplingParams(temperature=temp)
  opt, gum = [], []
  g = torch.Generator().manual_seed(0)
  for pr in prompts:
    ids = T.tokenizer.encode(pr)
    with torch.inference_mode():
        # sample a continuation from the target (plain, no cache: short)
        x = torch.tensor([ids])
        for _ in range(64):
            lg = T.model(x)[0, -1, :8192]
            nxt = torch.multinomial(probabilities(lg, params), 1, generator=g)
            x = torch.cat([x, nxt[None]], 1)
        p = probabilities(T.model(x)[0, len(ids)-1:-1, :8192], params)
        q = probabilities(D.model(x)[0, len(ids)-1:-1, :8192], params)
    opt.append(torch.minimum(p, q).sum(-1))
    E = torch.empty(200, *p.shape).exponential_(generator=g)
    gum.append(((p / E).argmax(-1) == (q / E).argmax(-1)).float().mean(0))
  print(pair, temp, "optimal", float(torch.cat(opt).mean()), "gumbel", float(torch.cat(gum).mean()))
