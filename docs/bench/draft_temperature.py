"""Would the draft guess better at another temperature? Per-token acceptance at T = 0.8 against the
temperature the draft drafts at (round 15), teacher-forced on target samples.

    .venv/bin/python docs/bench/draft_temperature.py [--temperature 0.8] [--tokens 48] [--races 64]

The coupled rule verifies without the draft's q (the target's own race decides), so a draft may
race its logits at any temperature τ without losing exactness; rejection sampling needs q at the
request's temperature, but Σ min(p, q_τ) shows what a sharper or flatter draft would buy there too.
For each bench prompt the target samples ``--tokens`` tokens at T; at every position: Σ min(p, q_τ)
(rejection's acceptance) and, over ``--races`` draws of Gumbel noise g, how often
argmax(log p + g) = argmax(log q_τ + g) (the coupled rule's).
"""

from __future__ import annotations

import argparse

import torch

from quickdraft.assets import embedded_draft_path, embedded_target_path
from quickdraft.bench.harness import load_prompts
from quickdraft.model.loader import load_model
from quickdraft.sampling import SamplingParams, probabilities


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--races", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(1)
    target, draft = load_model(embedded_target_path("embedded")), load_model(embedded_draft_path("embedded"))
    vocab = target.config.vocab_size
    params = SamplingParams(temperature=args.temperature)
    generator = torch.Generator().manual_seed(0)
    p_rows, draft_logits = [], []
    with torch.inference_mode():
        for record in load_prompts():
            ids = target.tokenizer.encode(record["prompt"])
            x = torch.tensor([ids])
            for _ in range(args.tokens):
                logits = target.model(x)[0, -1, :vocab]
                x = torch.cat([x, torch.multinomial(probabilities(logits, params), 1, generator=generator)[None]], 1)
            p_rows.append(probabilities(target.model(x)[0, len(ids) - 1:-1, :vocab], params))
            draft_logits.append(draft.model(x)[0, len(ids) - 1:-1, :vocab].float())
    p, logits = torch.cat(p_rows), torch.cat(draft_logits)
    log_p = p.clamp_min(1e-30).log()
    print(f"{p.shape[0]} positions, target samples at T = {args.temperature}")
    print("| draft temperature | rejection: Σ min(p, q) | coupled: races agreeing |")
    print("|---|---|---|")
    for tau in (0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0):
        q = torch.softmax(logits / tau, -1)
        rejection = torch.minimum(p, q).sum(-1).mean().item()
        log_q = q.clamp_min(1e-30).log()
        agree = 0.0
        for _ in range(args.races):
            gumbel = -torch.log(torch.empty_like(p).exponential_(generator=generator))
            agree += (torch.argmax(log_p + gumbel, -1) == torch.argmax(log_q + gumbel, -1)).float().mean().item()
        print(f"| {tau} | {rejection:.3f} | {agree / args.races:.3f} |")


if __name__ == "__main__":
    main()
