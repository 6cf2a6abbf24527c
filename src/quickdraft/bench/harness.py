"""The benchmark: every method on the same weights, the same prompts, in one process.

Method of measurement (what makes the ratios trustworthy on a noisy machine):
- every configuration first runs a warm-up generation for each cache size the rounds will need (so
  no compilation lands in a measured round), then ``repeats`` measured rounds;
- each round runs every configuration on every prompt, in an order rotated from round to round,
  so that a slow patch of the machine hits all methods alike;
- speedups are per-round ratios against our plain decoding (1-row forwards, exact mode off) of the
  same round, then the median over rounds; tokens/s is the median over rounds;
- EOS is ignored (like vLLM's ``ignore_eos``) so every method generates exactly
  ``max_new_tokens`` per prompt; prompts are tokenized once, outside the timed region.

For each speculative configuration the drafter is wrapped so that every step's (drafted,
accepted) pair is recorded; from them comes α, the per-token acceptance probability of
Leviathan et al. (accepted / (accepted + rejections)), which the bound needs. The engine's own
``acceptance_rate`` (accepted / drafted) is reported beside it.
"""

from __future__ import annotations

import json
import logging
import os
import platform
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import torch

from quickdraft import kernels
from quickdraft.bench.llama_cpp import DRAFT_MAX, LlamaCpp, LlamaCppRun, same_output, token_bytes
from quickdraft.drafters.base import Draft, DraftContext, Drafter
from quickdraft.drafters.factory import draft_head_ids, make_drafter
from quickdraft.drafters.lookup_then_model import LookupThenModelDrafter
from quickdraft.engine import Engine, engine_max_gamma, expected_speedup, quantize_target
from quickdraft.drafters.trees import AUTO_TREE_BUDGETS, TreeShape
from quickdraft.tree import TokenTree
from quickdraft.errors import QuickdraftError
from quickdraft.model.compiled import static_capacity
from quickdraft.model.loader import LoadedModel, default_draft_dtype, dtype_name, load_model, parse_dtype
from quickdraft.sampling import SamplingParams

log = logging.getLogger(__name__)

BASELINE = "plain"
# "wall": time.perf_counter; "cpu": this process's CPU time, for a machine shared with other work
# (run with --threads 1 then: spinning OpenMP threads would count as work).
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
PLAIN_EXACT = "plain exact"
LLAMA_CPP_PLAIN = "llama.cpp plain"
LLAMA_CPP_DRAFT = f"llama.cpp speculative draft {DRAFT_MAX}"


def warmup_prompts(prompt_ids: Sequence[list[int]], max_new_tokens: int, max_gamma: int) -> list[list[int]]:
    """The longest prompt of each cache-size class the measured rounds will reach.

    Compiled steps are built once per (rows, cache capacity), on the first generation that needs
    that capacity; a warm-up that misses a capacity moves seconds of compilation into a measured
    round (it made compiled plain decoding look slower than eager on a 6-prompt bench).
    """
    by_capacity: dict[int, list[int]] = {}
    for ids in prompt_ids:
        capacity = static_capacity(len(ids) + max_new_tokens + max_gamma + 1)
        if len(ids) > len(by_capacity.get(capacity, [])):
            by_capacity[capacity] = ids
    return [by_capacity[c] for c in sorted(by_capacity)]


# ---- settings -------------------------------------------------------------------------------
@dataclass
class BenchSettings:
    target: str
    draft: str | None = None
    dtype: str = "auto"  # the target's: auto = bf16 where the hardware has bf16 dot products
    draft_dtype: str | None = None  # None: default_draft_dtype
    compile_drafter: bool = True  # torch.compile the draft model's steps (compiled during the warm-up)
    compile_target: bool = True  # the same for the target's steps in every non-exact engine, plain included
    full_draft_head: bool = False  # draft over the whole vocabulary even where draft_head.json cuts the head
    native_forwards: bool = False  # set by the run: the target ran quickdraft's whole forwards in C++ (model/native.py)
    quantized_draft: bool = True  # model drafters' products quantised where the kernels take them (early exit's too)
    quantized_products: bool = False  # set by the run: the drafts ran quantised products (quantized_draft, and the kernels took them)
    target_bits: int | None = None  # 8: the target's own products int8 (Engine's target_bits), plain decoding's too
    device: str = "cpu"
    prompts: str | None = None  # JSONL of {"id", "kind", "prompt"}; None: the shipped set
    prompt_limit: int | None = None  # use the first N prompts, continuations and grounded interleaved
    max_new_tokens: int = 128
    repeats: int = 3
    gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    sampling_gammas: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7, 8)
    temperature: float = 0.8
    # token-tree node budgets (or "auto") to run: the draft model greedy, exact and sampled; early exit
    # and prompt lookup greedy. () for chains only
    trees: tuple[int | str, ...] = (16,)
    max_gamma: int = 8  # the engines' max_gamma: the largest γ, and exact mode's row bucket (>= max_gamma + 1)
    exact: bool = True  # also run exact-mode variants (reported beside, never as the baseline)
    early_exit: str | None = "early-exit"  # drafter spec, None to skip
    self_draft: str | None = "self"  # a trained self-draft (model/self_draft.py); skipped where the target has none
    prompt_lookup: str | None = "prompt-lookup"
    peers: bool = True  # transformers generate(): plain, assisted, prompt lookup
    llama_cpp: str | None = None  # a scripts/llama_cpp/build.sh directory: llama.cpp plain and speculative as peers
    full_sampling: bool = True  # sampling runs of every method; False: plain, draft auto (early exit
    # without a draft model), hf plain, hf assisted
    hf_lookup_tokens: int = 10  # prompt_lookup_num_tokens for the transformers peer (its docs' value)
    threads: int | None = None
    seed: int = 0
    clock: str = "wall"  # wall | cpu (see CLOCKS)

    @classmethod
    def quick(cls, **overrides: Any) -> BenchSettings:
        """The `--quick` preset: a few prompts, short outputs, γ ∈ {2, 4} and auto, sampling for the core
        methods only (< 3 minutes on 2 cores)."""
        base = dict(prompt_limit=4, max_new_tokens=32, repeats=2, gammas=(2, 4), sampling_gammas=(),
                    full_sampling=False)
        base.update(overrides)
        return cls(**base)


@dataclass(frozen=True)
class Method:
    name: str  # unique label, e.g. "draft γ=4" or "hf assisted"
    # plain | draft | early-exit | self-draft | prompt-lookup | lookup+draft | lookup+self-draft | hf-plain | hf-assisted | hf-lookup | llama-cpp-plain | llama-cpp-draft
    family: str
    gamma: int | str  # 0 = plain decoding
    exact: bool
    temperature: float
    rule: str = "auto"  # SamplingParams.rule; the bench seeds every run, so "auto" is the coupled rule
    tree: int | str | None = None  # token trees of this many nodes (or "auto") instead of chains

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def peer(self) -> bool:
        return self.family.startswith(("hf-", "llama-cpp-"))

    @property
    def decoding(self) -> str:
        return "greedy" if self.greedy else f"T={self.temperature:g}"


# ---- prompts --------------------------------------------------------------------------------
def load_prompts(path: str | Path | None = None, limit: int | None = None) -> list[dict[str, str]]:
    """The prompt set: continuations and input-grounded tasks, interleaved so that a limit keeps both."""
    if path is None:
        text = resources.files("quickdraft.bench").joinpath("prompts/bench.jsonl").read_text()
    else:
        text = Path(path).read_text()
    prompts = []
    for line_no, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise QuickdraftError(f"prompt file {path or 'bench.jsonl'} line {line_no}: not JSON ({exc})") from exc
        if not isinstance(record, dict) or not isinstance(record.get("prompt"), str):
            raise QuickdraftError(f"prompt file {path or 'bench.jsonl'} line {line_no}: needs a string field 'prompt'")
        record.setdefault("id", f"prompt-{line_no}")
        record.setdefault("kind", "continuation")
        prompts.append(record)
    if not prompts:
        raise QuickdraftError(f"prompt file {path} holds no prompts")
    by_kind: dict[str, list[dict[str, str]]] = {}
    for record in prompts:
        by_kind.setdefault(record["kind"], []).append(record)
    interleaved = [r for group in zip_longest_all(list(by_kind.values())) for r in group]
    return interleaved[:limit] if limit else interleaved


def zip_longest_all(groups: list[list[dict[str, str]]]) -> list[list[dict[str, str]]]:
    depth = max(len(g) for g in groups)
    return [[g[i] for g in groups if i < len(g)] for i in range(depth)]


def encode_prompt(target: LoadedModel, text: str) -> list[int]:
    """Token ids of a prompt; a model without a tokenizer (a random test pair) gets its bytes
    modulo the vocabulary, which keeps the prompt's repetitions (what prompt lookup feeds on)."""
    if target.tokenizer is not None:
        return target.tokenizer.encode(text)
    return [b % target.config.vocab_size for b in text.encode()]


# ---- the recording drafter ------------------------------------------------------------------
class RecordingDrafter(Drafter):
    """Delegates to a drafter and records every step's (drafted, accepted) pair."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.name = inner.name
        self.steps: list[tuple[int, int]] = []
        self._proposed = 0

    def begin(self, prompt_ids: list[int], context: DraftContext) -> None:
        self._proposed = 0
        self.inner.begin(prompt_ids, context)

    def propose(self, tokens, k, sampling, sampler, confidence_stop=None) -> Draft:  # noqa: ANN001
        draft = self.inner.propose(tokens, k, sampling, sampler, confidence_stop)
        self._proposed = len(draft.tokens)
        return draft

    def propose_tree(self, tokens, shape, sampling, sampler) -> TokenTree:  # noqa: ANN001
        tree = self.inner.propose_tree(tokens, shape, sampling, sampler)
        self._proposed = tree.depth  # α counts along the deepest candidate, as for a chain of that length
        return tree

    def accept_path(self, path: list[int]) -> None:
        self._record(len(path))
        self.inner.accept_path(path)

    def accept(self, n_accepted: int) -> None:
        self._record(n_accepted)
        self.inner.accept(n_accepted)

    def _record(self, n_accepted: int) -> None:
        if self._proposed:
            self.steps.append((self._proposed, n_accepted))
        self._proposed = 0

    @property
    def relative_cost_hint(self) -> float:
        return self.inner.relative_cost_hint


def alpha_from_steps(steps: Sequence[tuple[int, int]]) -> float | None:
    """Per-token acceptance probability α (maximum likelihood, truncated geometric):
    accepted / (accepted + rejections); a step that accepts all it drafted has no rejection."""
    accepted = sum(n for _, n in steps)
    trials = sum(min(n + 1, drafted) for drafted, n in steps)
    return accepted / trials if trials else None


# ---- one round of one method ----------------------------------------------------------------
@dataclass
class RoundResult:
    tokens: int = 0
    seconds: float = 0.0  # by the bench's clock
    wall_seconds: float = 0.0
    outputs: list[list[int]] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)  # generated tokens, per prompt
    peer_runs: list[LlamaCppRun] = field(default_factory=list)  # llama.cpp's runs, per prompt: text, not our ids
    prompt_seconds: list[float] = field(default_factory=list)  # per prompt, by the bench's clock
    target_seconds: float = 0.0
    target_calls: int = 0
    decode_seconds: float = 0.0  # ours: after prefill, as llama.cpp's own timers count
    decode_tokens: int = 0
    drafter_seconds: float = 0.0
    drafter_calls: int = 0
    drafted: int = 0
    accepted: int = 0
    num_drafts: int = 0
    accepted_per_position: list[int] = field(default_factory=list)
    drafted_per_position: list[int] = field(default_factory=list)
    steps: list[tuple[int, int]] = field(default_factory=list)

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0

    def add_stats(self, stats: Any) -> None:
        self.decode_seconds += stats.decode_seconds
        self.decode_tokens += stats.generated_tokens
        self.target_seconds += stats.target_seconds
        self.target_calls += stats.target_calls
        self.drafter_seconds += stats.drafter_seconds
        self.drafter_calls += stats.drafter_calls
        self.drafted += stats.drafted
        self.accepted += stats.accepted
        self.num_drafts += stats.num_drafts
        self.accepted_per_position = _add_lists(self.accepted_per_position, stats.accepted_per_position)
        self.drafted_per_position = _add_lists(self.drafted_per_position, stats.drafted_per_position)


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


Runner = Callable[[list[int], int, int], tuple[list[int], Any]]  # (prompt ids, max new, seed) -> (ids, stats)


class OurRunner:
    def __init__(self, engine: Engine, method: Method) -> None:
        self.engine, self.method = engine, method
        self.recorder = engine.drafter if isinstance(engine.drafter, RecordingDrafter) else None

    def __call__(self, ids: list[int], max_new: int, seed: int) -> tuple[list[int], Any]:
        sampling = SamplingParams(temperature=self.method.temperature, seed=seed, rule=self.method.rule)
        result = self.engine.generate(ids, max_new, sampling, self.method.gamma)
        return result.token_ids, result.stats


SPECULATIVE_FAMILIES = ("draft", "early-exit", "self-draft", "prompt-lookup", "lookup+draft", "lookup+self-draft")


def has_self_draft(spec: str, target: LoadedModel) -> bool:
    """Whether ``spec`` (self or self:PATH) names a self-draft that exists for this target."""
    from quickdraft.drafters.self_draft import default_self_draft_path
    from quickdraft.model.self_draft import is_self_draft_dir

    path = spec.partition(":")[2]
    return is_self_draft_dir(Path(path) if path else default_self_draft_path(target))


# ---- the benchmark --------------------------------------------------------------------------
def _head_tokens(head_ids: torch.Tensor | None) -> int | None:
    return None if head_ids is None else len(head_ids)


class Bench:
    def __init__(self, settings: BenchSettings, progress: bool = True) -> None:
        self.settings = settings
        self.progress = progress
        self.notes: list[str] = []

    # -- setup
    def _engines(self, target: LoadedModel, draft: LoadedModel | None) -> list[tuple[Method, Callable]]:
        s = self.settings
        runs: list[tuple[Method, Callable]] = []
        modes = [False, True] if s.exact else [False]
        engines: dict[tuple[str, bool], Engine] = {}

        def engine(kind: str, exact: bool, tree: int | str | None = None) -> Engine:
            key = (kind, exact, tree)
            if key not in engines:
                drafter = None
                if kind == "draft":
                    drafter = RecordingDrafter(make_drafter(draft, target, compile=s.compile_drafter,
                                                            full_draft_head=s.full_draft_head,
                                                            quantized_draft=s.quantized_draft))
                elif kind == "early-exit":
                    drafter = RecordingDrafter(make_drafter(s.early_exit, target, quantized_draft=s.quantized_draft))
                elif kind == "self-draft":
                    drafter = RecordingDrafter(make_drafter(s.self_draft, target, quantized_draft=s.quantized_draft))
                elif kind == "prompt-lookup":
                    drafter = RecordingDrafter(make_drafter(s.prompt_lookup, target))
                elif kind in ("lookup+draft", "lookup+self-draft"):
                    model = make_drafter(draft, target, compile=s.compile_drafter, full_draft_head=s.full_draft_head,
                                         quantized_draft=s.quantized_draft) if kind == "lookup+draft" \
                        else make_drafter(s.self_draft, target, quantized_draft=s.quantized_draft)
                    assert model is not None
                    drafter = RecordingDrafter(LookupThenModelDrafter(model))
                e = Engine(target, drafter, exact=exact, dtype=s.dtype, device=s.device, max_gamma=s.max_gamma,
                           compile_target=s.compile_target, tree_nodes=tree)
                if exact and not e.exact:
                    raise QuickdraftError("exact mode is unavailable on this platform; rerun with --no-exact")
                e.eos_token_ids = frozenset()  # ignore EOS: every method generates max_new_tokens
                engines[key] = e
            return engines[key]

        def add(name: str, family: str, gamma: int | str, exact: bool, temperature: float, rule: str = "auto",
                tree: int | str | None = None, engine_kind: str | None = None) -> None:
            method = Method(name, family, gamma, exact, temperature, rule, tree)
            runs.append((method, OurRunner(engine(engine_kind or family, exact, tree), method)))

        max_gamma = engine_max_gamma(s.max_gamma, s.compile_target, native=target.model.native is not None)
        too_big = sorted({g for g in (*s.gammas, *s.sampling_gammas) if g > max_gamma})
        if too_big:
            self.notes.append(f"γ {too_big} skipped: above max_gamma {max_gamma}"
                              + (" (compiled target steps)" if s.compile_target else ""))
        self_draft = s.self_draft is not None and has_self_draft(s.self_draft, target)
        for temperature, gammas in ((0.0, s.gammas), (s.temperature, s.sampling_gammas)):
            gammas = [g for g in gammas if g <= max_gamma]
            suffix = "" if temperature == 0 else f" T={temperature:g}"
            full = temperature == 0 or s.full_sampling
            for exact in modes if full else [False]:
                tag = " exact" if exact else ""
                add(f"plain{tag}{suffix}", "plain", 0, exact, temperature)
            if draft is not None:
                for g in gammas:
                    add(f"draft γ={g}{suffix}", "draft", g, False, temperature)
                for exact in modes if full else [False]:
                    add(f"draft auto{' exact' if exact else ''}{suffix}", "draft", "auto", exact, temperature)
                if temperature > 0:  # the seeded runs use the coupled rule; rejection sampling beside it
                    add(f"draft auto rejection{suffix}", "draft", "auto", False, temperature, "rejection")
                for nodes in s.trees:
                    add(f"draft tree {nodes}{suffix}", "draft", "auto", False, temperature, tree=nodes)
                    if temperature == 0 and s.exact:
                        add(f"draft tree {nodes} exact", "draft", "auto", True, temperature, tree=nodes)
                        # Exact mode's promise is per engine: a tree engine pads every forward to hold a
                        # tree and attends in slot order, so its own plain decoding is the reference.
                        add(f"{PLAIN_EXACT} tree {nodes}", "plain", 0, True, temperature, tree=nodes,
                            engine_kind="draft")
                    if temperature > 0:
                        add(f"draft tree {nodes} rejection{suffix}", "draft", "auto", False, temperature, "rejection",
                            tree=nodes)
            if self_draft:  # the self-drafting row of issue 18: greedy and sampled, also in --quick
                add(f"self-draft auto{suffix}", "self-draft", "auto", False, temperature)
                if temperature == 0 and s.exact:
                    add("self-draft auto exact", "self-draft", "auto", True, temperature)
                if temperature > 0:
                    add(f"self-draft auto rejection{suffix}", "self-draft", "auto", False, temperature, "rejection")
            if not full and draft is not None:
                continue
            if s.early_exit and target.config.n_layer > 1:
                add(f"early exit auto{suffix}", "early-exit", "auto", False, temperature)
            if s.prompt_lookup and full:
                add(f"prompt lookup auto{suffix}", "prompt-lookup", "auto", False, temperature)
                if draft is not None:  # lookup where the context matches, the draft model elsewhere
                    add(f"prompt lookup + draft auto{suffix}", "lookup+draft", "auto", False, temperature)
                if self_draft:  # issue 18's self-speculation (no second model) behind lookup
                    add(f"prompt lookup + self-draft auto{suffix}", "lookup+self-draft", "auto", False, temperature)
            for nodes in s.trees if temperature == 0 and full else ():
                if s.early_exit and target.config.n_layer > 1:
                    add(f"early exit tree {nodes}", "early-exit", "auto", False, temperature, tree=nodes)
                if self_draft:
                    add(f"self-draft tree {nodes}", "self-draft", "auto", False, temperature, tree=nodes)
                if s.prompt_lookup:
                    add(f"prompt lookup tree {nodes}", "prompt-lookup", "auto", False, temperature, tree=nodes)
        if draft is None:
            self.notes.append("no draft model given: draft-model speculation and the assisted peer were skipped")
        return runs

    def _exact_note(self, engines: Sequence[Engine]) -> None:
        """How exact mode ran, read after the warm-up (compiled engines settle it when first used);
        a speculative engine's, whose row buckets are the ones that matter."""
        for e in sorted(engines, key=lambda e: e.drafter is None):
            if not e.exact:
                continue
            if e.model.native is not None:
                self.notes.append("exact mode: native forwards, unpadded; every row count up to γ + 1 probed to give "
                                  "each row the bits of one token at a time")
            elif e.target_steps is not None:
                self.notes.append(f"exact mode: compiled target steps in row buckets {e.target_steps.row_buckets}, "
                                  "each row's bits the same in every bucket (probed)")
            else:
                self.notes.append(f"exact mode: every target forward after prefill runs {e.exact_rows} rows "
                                  f"(max_gamma {e.max_gamma})")
            return

    def _peers(self, target: LoadedModel, draft: LoadedModel | None) -> list[tuple[Method, Callable]]:
        s = self.settings
        if not s.peers:
            return []
        if s.target_bits is not None:
            self.notes.append("the peers were skipped: they would run the target's bf16 weights, not its int8 products")
            return []
        try:
            from quickdraft.bench.peers import HFPeer
        except ImportError as exc:  # transformers is a bench/test dependency only
            self.notes.append(f"transformers is not installed ({exc}); the peers were skipped")
            return []
        try:
            peer = HFPeer(target.path, draft.path if draft is not None else None, dtype=target.model.dtype,
                          draft_dtype=draft.model.dtype if draft is not None else None, device=s.device)
        except Exception as exc:  # noqa: BLE001 - any failure to load a peer is reported, not fatal
            self.notes.append(f"transformers could not load the models ({type(exc).__name__}: {exc}); peers skipped")
            return []
        runs = []
        for temperature in (0.0, s.temperature):
            suffix = "" if temperature == 0 else f" T={temperature:g}"
            families = [("hf-plain", "hf plain")]
            if temperature == 0 or s.full_sampling:
                families.append(("hf-lookup", f"hf prompt lookup ({s.hf_lookup_tokens})"))
            if peer.assistant is not None:
                families.insert(1, ("hf-assisted", "hf assisted"))
            for family, name in families:
                gamma = s.hf_lookup_tokens if family == "hf-lookup" else ("hf" if family == "hf-assisted" else 0)
                method = Method(name + suffix, family, gamma, False, temperature)
                runs.append((method, peer.runner(method, s.hf_lookup_tokens)))
        self.notes.append(f"transformers {peer.version}: assisted generation with its defaults "
                          f"({peer.assistant_defaults()}); prompt lookup with "
                          f"prompt_lookup_num_tokens={s.hf_lookup_tokens}")
        return runs

    def _llama_cpp(self, target: LoadedModel, draft: LoadedModel | None,
                   prompt_ids: list[list[int]]) -> list[tuple[Method, Callable]]:
        """llama.cpp plain and speculative (greedy; a missing build or GGUF is an error: it was asked for)."""
        s = self.settings
        if not s.llama_cpp:
            return []
        if target.tokenizer is None:
            raise QuickdraftError("the llama.cpp peer needs a target with a tokenizer: it is given the prompts as text")
        threads = s.threads or torch.get_num_threads()
        peer = LlamaCpp.for_models(s.llama_cpp, s.target, s.draft, s.dtype, s.draft_dtype, threads)
        texts = [target.tokenizer.decode(ids, skip_special_tokens=False) for ids in prompt_ids]
        differ = [i for i, (text, ids) in enumerate(zip(texts, prompt_ids)) if peer.tokenize(text) != ids]
        self.notes.append(
            f"llama.cpp {peer.version()} ({peer.bin_dir}) on {peer.target.name}"
            + (f" and {peer.draft.name}" if peer.draft else "") + f", {threads} thread(s), KV cache "
            f"{peer.cache_type}, greedy, EOS ignored; tokenization "
            + (f"DIFFERS from ours on prompts {differ}" if differ else f"equals ours on all {len(texts)} prompts")
            + ". tokens/s by llama.cpp's own timers, loading and prompt processing excluded (ours include the "
            "prefill): plain = eval runs / (eval + sampling time) of llama-completion; speculative = "
            f"llama-speculative-simple's decode line (draft of {peer.draft_max}, drafting, verifying and sampling); "
            "= plain compares bytes with our plain greedy output")

        def runner(speculative: bool) -> Callable:
            def run(ids: list[int], max_new: int, seed: int) -> tuple[list[int], LlamaCppRun]:
                text = target.tokenizer.decode(ids, skip_special_tokens=False)
                return [], (peer.speculative(text, max_new) if speculative else peer.plain(text, max_new))
            return run

        runs = [(Method(LLAMA_CPP_PLAIN, "llama-cpp-plain", 0, False, 0.0), runner(False))]
        if draft is not None:
            runs.append((Method(LLAMA_CPP_DRAFT, "llama-cpp-draft", peer.draft_max, False, 0.0), runner(True)))
        return runs

    # -- run
    def run(self) -> dict[str, Any]:
        threads = torch.get_num_threads()
        if self.settings.threads:
            torch.set_num_threads(self.settings.threads)
        try:
            return self._run()
        finally:
            torch.set_num_threads(threads)

    def _run(self) -> dict[str, Any]:
        s = self.settings
        if s.clock not in CLOCKS:
            raise QuickdraftError(f"unknown clock {s.clock!r}; choose one of {', '.join(CLOCKS)}")
        started = time.perf_counter()
        # Resolve "auto" and the draft's default now, so the report names the dtypes that ran.
        s.dtype = dtype_name(parse_dtype(s.dtype, s.device))
        s.draft_dtype = dtype_name(parse_dtype(s.draft_dtype, s.device) if s.draft_dtype
                                   else default_draft_dtype(s.dtype, s.device))
        target = load_model(s.target, dtype=s.dtype, device=s.device)
        target.model.pack_products()  # as every engine does; native forwards lift the compiled steps' γ cap
        quantize_target(target.model, s.target_bits)
        s.native_forwards = target.model.native is not None
        s.quantized_products = s.quantized_draft and kernels.int8_products()
        draft = load_model(s.draft, dtype=s.draft_dtype, device=s.device) if s.draft else None
        prompts = load_prompts(s.prompts, s.prompt_limit)
        prompt_ids = [encode_prompt(target, p["prompt"]) for p in prompts]
        room = min(target.config.block_size, draft.config.block_size if draft else target.config.block_size)
        room -= s.max_new_tokens + 1
        if room < 1:
            raise QuickdraftError(f"max_new_tokens {s.max_new_tokens} leaves no room for a prompt in the "
                                  f"context ({target.config.block_size})")
        if any(len(ids) > room for ids in prompt_ids):
            self.notes.append(f"prompts longer than {room} tokens were cut to their last {room} tokens "
                              "so that prompt + max_new_tokens fits the context")
            prompt_ids = [ids[-room:] for ids in prompt_ids]
        llama_cpp = self._llama_cpp(target, draft, prompt_ids)  # first: a missing build fails before any compiling
        runs = self._engines(target, draft) + self._peers(target, draft) + llama_cpp
        methods = [m for m, _ in runs]
        log.info("bench: %d configurations x %d prompts x %d rounds", len(runs), len(prompts), s.repeats)

        bar = _progress(len(runs) * (1 + s.repeats * len(prompts)), self.progress)
        # Scratch slots past the output: a chain's γ + 1 rows, a tree's grown nodes (its capacity classes may differ).
        warmups: list[list[int]] = []
        for scratch in {engine_max_gamma(s.max_gamma, s.compile_target, native=target.model.native is not None),
                        *(TreeShape.for_budget(max(AUTO_TREE_BUDGETS) if nodes == "auto" else nodes).grown_nodes
                          for nodes in s.trees)}:
            warmups += [ids for ids in warmup_prompts(prompt_ids, s.max_new_tokens, scratch) if ids not in warmups]
        for method, runner in runs:  # warm-up: a full generation per cache size the rounds will use
            bar.set_description(f"warm-up {method.name}")
            for ids in warmups:
                runner(ids, s.max_new_tokens, s.seed)
            bar.update(1)
        self._exact_note([runner.engine for _, runner in runs if isinstance(runner, OurRunner)])
        rounds: list[dict[str, RoundResult]] = []
        clock = CLOCKS[s.clock]
        for r in range(s.repeats):
            results = {method.name: RoundResult() for method, _ in runs}
            # Prompt-major: every configuration runs on a prompt, in an order rotated from prompt to
            # prompt and round to round, before the next prompt; a ratio compares runs seconds apart.
            for i, ids in enumerate(prompt_ids):
                shift = (r * len(prompt_ids) + i) % len(runs)
                for method, runner in runs[shift:] + runs[:shift]:
                    bar.set_description(f"round {r + 1}/{s.repeats} prompt {i + 1} {method.name}")
                    recorder = getattr(runner, "recorder", None)
                    if recorder is not None:
                        recorder.steps = []
                    rr = results[method.name]
                    t0, w0 = clock(), time.perf_counter()
                    out, stats = runner(ids, s.max_new_tokens, s.seed + i)
                    elapsed, wall = clock() - t0, time.perf_counter() - w0
                    n_tokens = len(out)
                    if isinstance(stats, LlamaCppRun):
                        # Another process: its own decode timer, not ours, which would count its loading.
                        n_tokens = min(stats.n_tokens, s.max_new_tokens)
                        elapsed = wall = stats.seconds_for(n_tokens)
                        rr.peer_runs.append(stats)
                    elif stats is not None:
                        rr.add_stats(stats)
                    rr.seconds += elapsed
                    rr.prompt_seconds.append(elapsed)
                    rr.wall_seconds += wall
                    rr.tokens += n_tokens
                    rr.prompt_tokens.append(n_tokens)
                    rr.outputs.append(list(out))
                    if recorder is not None:
                        rr.steps.extend(recorder.steps)
                    bar.update(1)
            rounds.append(results)
        bar.close()
        text_of = (lambda ids: token_bytes(target.tokenizer, ids)) if target.tokenizer is not None else None
        rows = summarize(methods, rounds, [p["kind"] for p in prompts], text_of)
        headline = headline_figures(rows)
        return {
            "settings": _jsonable(asdict(s)),
            "machine": machine_description(),
            "prompts": [{"id": p["id"], "kind": p["kind"], "tokens": len(ids)} for p, ids in zip(prompts, prompt_ids)],
            "target": {"path": str(target.path), "parameters": target.n_params, "layers": target.config.n_layer,
                       "hidden_size": target.config.n_embd, "vocab_size": target.config.vocab_size},
            "draft": None if draft is None else {"path": str(draft.path), "parameters": draft.n_params,
                                                 "layers": draft.config.n_layer, "hidden_size": draft.config.n_embd,
                                                 "vocab_size": draft.config.vocab_size,
                                                 "head_tokens": _head_tokens(draft_head_ids(draft, s.full_draft_head))},
            "baseline": BASELINE,
            "headline": headline,
            "results": rows,
            "notes": self.notes,
            "wall_seconds": time.perf_counter() - started,
        }


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, disable=not enabled, leave=False, unit="gen", dynamic_ncols=True)


# ---- summary --------------------------------------------------------------------------------
def speedup_by_kind(runs: list[RoundResult], base: list[RoundResult], kinds: Sequence[str]) -> dict[str, float]:
    """Per prompt kind: the median over rounds of (tokens/s on that kind's prompts) / the baseline's."""
    out = {}
    for kind in dict.fromkeys(kinds):
        ratios = []
        for r, b in zip(runs, base):
            idx = [i for i, k in enumerate(kinds)
                   if k == kind and i < len(r.prompt_tokens) and i < len(b.prompt_tokens)]
            tokens, base_tokens = sum(r.prompt_tokens[i] for i in idx), sum(b.prompt_tokens[i] for i in idx)
            seconds, base_seconds = sum(r.prompt_seconds[i] for i in idx), sum(b.prompt_seconds[i] for i in idx)
            if seconds and base_seconds and base_tokens:
                ratios.append((tokens / seconds) / (base_tokens / base_seconds))
        if ratios:
            out[kind] = statistics.median(ratios)
    return out


def summarize(methods: list[Method], rounds: list[dict[str, RoundResult]], kinds: Sequence[str] = (),
              text_of: Callable[[list[int]], bytes] | None = None) -> list[dict[str, Any]]:
    """One row per method: medians over rounds, acceptance figures over all rounds; with the prompts'
    kinds, the speedup per kind as well (continuations and input-grounded tasks differ most for
    prompt lookup). ``text_of``: our token ids -> bytes, to compare llama.cpp's text with our output."""
    rows = []
    for m in methods:
        per_round = [rd[m.name] for rd in rounds]
        # The baseline: our plain decoding (exact mode off) with the same sampling parameters.
        base_name = BASELINE if m.greedy else f"{BASELINE} T={m.temperature:g}"
        base_name = base_name if base_name in rounds[0] else BASELINE
        base = [rd[base_name] for rd in rounds]
        tps = statistics.median(r.tokens_per_s for r in per_round)
        speedup = statistics.median(r.tokens_per_s / b.tokens_per_s for r, b in zip(per_round, base) if b.tokens_per_s)
        row: dict[str, Any] = {
            "method": m.name, "family": m.family, "decoding": m.decoding, "temperature": m.temperature,
            "gamma": m.gamma, "tree": m.tree, "exact": m.exact, "peer": m.peer, "rule": None if m.greedy or m.peer else m.rule,
            "tokens_per_s": tps, "tokens_per_s_rounds": [r.tokens_per_s for r in per_round],
            "tokens_per_wall_s": statistics.median(r.tokens / r.wall_seconds for r in per_round if r.wall_seconds),
            "speedup": speedup, "baseline": base_name,
            "speedup_by_kind": speedup_by_kind(per_round, base, kinds) if kinds else {},
            "tokens": per_round[0].tokens,
        }
        plain_step = [b.target_seconds / b.target_calls for b in base if b.target_calls]
        if not m.peer:
            decode_rates = [r.decode_tokens / r.decode_seconds for r in per_round if r.decode_seconds]
            row["decode_tokens_per_s"] = statistics.median(decode_rates) if decode_rates else None
            target_step = [r.target_seconds / r.target_calls for r in per_round if r.target_calls]
            row["target_ms_per_call"] = 1000 * statistics.median(target_step) if target_step else None
            # verify cost: one target call here relative to a 1-row call of plain decoding
            row["verify_cost"] = (statistics.median(t / p for t, p in zip(target_step, plain_step))
                                  if target_step and plain_step else None)
        if m.family in SPECULATIVE_FAMILIES:
            steps = [s for r in per_round for s in r.steps]
            drafted = sum(r.drafted for r in per_round)
            accepted = sum(r.accepted for r in per_round)
            num_drafts = sum(r.num_drafts for r in per_round)
            target_calls = sum(r.target_calls for r in per_round)
            acc_pos = _sum_lists([r.accepted_per_position for r in per_round])
            dra_pos = _sum_lists([r.drafted_per_position for r in per_round])
            alpha = alpha_from_steps(steps)
            gamma_mean = drafted / num_drafts if num_drafts else 0.0
            if m.family == "prompt-lookup":
                cost = 0.0
            else:
                ratios = [(r.drafter_seconds / r.drafter_calls) / p
                          for r, p in zip(per_round, plain_step) if r.drafter_calls and p]
                cost = statistics.median(ratios) if ratios else None
            # Leviathan's bound is a chain's: no bound for trees (gamma_mean is then nodes per step).
            known = alpha is not None and cost is not None and gamma_mean > 0 and m.tree is None
            bound = expected_speedup(alpha, gamma_mean, cost) if known else None
            # The same bound with the verifying forward's measured cost in place of Leviathan's
            # assumption that it costs one plain step: what is left after that is overhead.
            verify = row.get("verify_cost")
            bound_verify = bound * (gamma_mean * cost + 1) / (gamma_mean * cost + verify) if known and verify else None
            row.update({
                "alpha": alpha,
                "acceptance_rate": accepted / drafted if drafted else None,
                "mean_accepted_length": sum(r.tokens for r in per_round) / target_calls if target_calls else None,
                "gamma_mean": gamma_mean,
                "draft_steps_fraction": num_drafts / target_calls if target_calls else None,
                "per_position_acceptance": [a / d if d else None for a, d in zip(acc_pos, dra_pos)],
                "accepted_per_position": acc_pos,
                "drafted_per_position": dra_pos,
                "cost": cost,
                "drafter_ms_per_call": (1000 * statistics.median(r.drafter_seconds / r.drafter_calls for r in per_round
                                                                 if r.drafter_calls)
                                        if any(r.drafter_calls for r in per_round) else None),
                "bound": bound,
                "efficiency": speedup / bound if bound else None,
                "bound_with_verify_cost": bound_verify,
            })
        if m.family.startswith("llama-cpp-"):
            row.update(llama_cpp_figures(per_round, [rd[BASELINE] for rd in rounds], text_of))
        # Greedy, and seeded sampling under the coupled rule ("auto" with a seed), must reproduce plain
        # decoding's tokens (bit for bit in exact mode; outside it up to last-bit ties).
        elif m.greedy or (not m.peer and m.rule in ("auto", "coupled")):
            reference = (BASELINE if not m.exact else PLAIN_EXACT) + ("" if m.greedy else f" T={m.temperature:g}")
            if m.exact and m.tree is not None:  # the tree engine's own plain decoding (none for itself)
                reference = f"{PLAIN_EXACT} tree {m.tree}" if m.family != "plain" else ""
            if reference in rounds[0]:
                same = [r.outputs == rd[reference].outputs for r, rd in zip(per_round, rounds)]
                per_prompt = [all(rd[m.name].outputs[i] == rd[reference].outputs[i] for rd in rounds)
                              for i in range(len(per_round[0].outputs))]
                row["equals_plain"] = all(same)
                row["equals_plain_fraction"] = sum(per_prompt) / len(per_prompt)
                row["equals_plain_reference"] = reference
        rows.append(row)
    return rows


def llama_cpp_figures(runs: list[RoundResult], base: list[RoundResult],
                      text_of: Callable[[list[int]], bytes] | None) -> dict[str, Any]:
    """llama.cpp's acceptance (accepted / drafted, its own counts) and whether its text equals our
    plain greedy output, prompt by prompt over every round."""
    peer_runs = [run for r in runs for run in r.peer_runs]
    drafted = sum(run.drafted for run in peer_runs)
    out: dict[str, Any] = {"acceptance_rate": sum(run.accepted for run in peer_runs) / drafted if drafted else None}
    if text_of is not None:
        per_prompt = [all(same_output(r.peer_runs[i], text_of(b.outputs[i]), len(b.outputs[i]))
                          for r, b in zip(runs, base))
                      for i in range(len(runs[0].peer_runs))]
        out.update(equals_plain=all(per_prompt), equals_plain_fraction=sum(per_prompt) / len(per_prompt),
                   equals_plain_reference=BASELINE)
    return out


def headline_figures(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures the acceptance criteria name: best speculative speedups (greedy, sampling), the
    efficiency at the best fixed γ, quickdraft vs transformers' assisted generation and plain."""
    def best(decoding: str, families: tuple[str, ...], exact: bool = False) -> dict[str, Any] | None:
        group = [r for r in rows if r["family"] in families and r["exact"] == exact
                 and (r["decoding"] == "greedy") == (decoding == "greedy")]
        return max(group, key=lambda r: r["speedup"]) if group else None

    def named(name: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["method"] == name), None)

    out: dict[str, Any] = {}
    speculative = SPECULATIVE_FAMILIES
    for decoding in ("greedy", "sampling"):
        b = best(decoding, speculative)
        if b is not None:
            out[f"best_{decoding}"] = {"method": b["method"], "speedup": b["speedup"], "tokens_per_s": b["tokens_per_s"]}
        d = best(decoding, ("draft",))
        if d is not None:
            out[f"best_draft_{decoding}"] = {"method": d["method"], "speedup": d["speedup"],
                                             "tokens_per_s": d["tokens_per_s"], "efficiency": d.get("efficiency")}
        e = best(decoding, ("draft",), exact=True)
        if e is not None:
            out[f"best_draft_{decoding}_exact"] = {"method": e["method"], "speedup": e["speedup"],
                                                   "tokens_per_s": e["tokens_per_s"]}
        suffix = "" if decoding == "greedy" else next((r["method"][r["method"].index(" T="):] for r in rows
                                                      if r["method"].startswith("plain T=")), None)
        if suffix is None:
            continue
        assisted, hf_plain = named("hf assisted" + suffix), named("hf plain" + suffix)
        if d is not None and assisted is not None:
            out[f"vs_hf_assisted_{decoding}"] = d["tokens_per_s"] / assisted["tokens_per_s"]
        plain = named("plain" + suffix)
        if plain is not None and hf_plain is not None:
            out[f"plain_vs_hf_plain_{decoding}"] = plain["tokens_per_s"] / hf_plain["tokens_per_s"]
    # The bars: our plain vs llama.cpp's plain, our speculative (best, and exact) vs llama.cpp's.
    llama_plain, llama_draft = named(LLAMA_CPP_PLAIN), named(LLAMA_CPP_DRAFT)
    for ours, theirs, key in ((named(BASELINE), llama_plain, "plain_vs_llama_cpp_plain"),
                              (named(PLAIN_EXACT), llama_plain, "plain_exact_vs_llama_cpp_plain"),
                              (best("greedy", ("draft",)), llama_draft, "draft_vs_llama_cpp_speculative"),
                              (best("greedy", ("draft",), exact=True), llama_draft,
                               "draft_exact_vs_llama_cpp_speculative")):
        if ours is not None and theirs is not None and theirs["tokens_per_s"]:
            # llama.cpp's rate excludes prompt processing: so does ours in "ratio" (decode only);
            # "ratio_wall" counts our prefill too.
            decode = ours.get("decode_tokens_per_s") or ours["tokens_per_s"]
            out[key] = {"ratio": decode / theirs["tokens_per_s"], "method": ours["method"],
                        "ratio_wall": ours["tokens_per_s"] / theirs["tokens_per_s"]}
    return out


def _sum_lists(lists: list[list[int]]) -> list[int]:
    out: list[int] = []
    for values in lists:
        out = _add_lists(out, values)
    return out


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def machine_description() -> dict[str, Any]:
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info: dict[str, Any] = {
        "cpu": model,
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "kernels": kernels.loaded_isa(),  # the instruction set of our CPU kernels
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        import transformers

        info["transformers"] = transformers.__version__
    except ImportError:
        info["transformers"] = None
    return info


def run_bench(settings: BenchSettings, progress: bool = True) -> dict[str, Any]:
    return Bench(settings, progress).run()
