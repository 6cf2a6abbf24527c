"""quickdraft's own CPU kernels, built from C++ on first use and cached.

Three kernels (``bf16_kernels.cpp``): ``linear_bf16`` (weight products), ``attend_bf16``
(attention over a cache window) and ``rms_norm_bf16``, for bf16 decode steps of a few rows - 1-row plain decoding, verify
steps of 2-33 rows, token trees, batched steps - and a whole forward (``forward``, bf16 or fp32
weights, the latter packed by ``pack_f32``). Built for the CPU's best instruction set (``isa()``):
AMX tiles for the bf16 products (Intel Sapphire Rapids on, where Linux lends the tile registers),
AVX512-BF16 dot products (Zen 4, Intel Cooper Lake on), else AVX2 + FMA with the bf16 weights
widened in registers. A row's result is the same bits whatever the other rows, which exact mode's
probes then find.

The library is compiled once per source, torch version and compiler into ``kernels/`` of
quickdraft's cache (``user_cache.cache_dir``, default ``~/.cache/quickdraft``), in ~10-20 s, with the C++ compiler that
torch.compile needs anyway. Where it cannot be built or loaded (no compiler, neither instruction
set, not Linux), or with ``QUICKDRAFT_KERNELS=0``, ``available()`` is False and models keep torch's
products: nothing but speed depends on these kernels.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from quickdraft.user_cache import cache_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("bf16_kernels.cpp")
BLOCK_COLUMNS = 64  # the packed layout's column block (kBlockColumns in the C++ source)
# The instruction sets the source is built for, best first: the CPU flags each needs, the compiler's.
# Every CPU with AVX512-BF16 also has DQ and VNNI (int8 dot products: pack_int8's drafts).
ISAS = {
    "amx_bf16": ({"amx_tile", "amx_bf16", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
                  "fma"},
                 ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx512bf16", "-mfma",
                  "-mamx-tile", "-mamx-bf16")),
    "avx512_bf16": ({"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16", "fma"},
                    ("-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512dq", "-mavx512vnni", "-mavx512bf16", "-mfma")),
    "avx2": ({"avx2", "fma"}, ("-mavx2", "-mfma")),
}


def _cpuinfo_field(name: str) -> str | None:
    """The first value of ``name`` in /proc/cpuinfo (Linux), else None."""
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    for line in cpuinfo.splitlines():
        if line.startswith(name):
            return line.partition(":")[2].strip()
    return None


def _cpu_flags() -> set[str]:
    return set((_cpuinfo_field("flags") or "").split())


@functools.cache
def cpu_name() -> str:
    """The CPU's model name, or the machine's architecture where /proc/cpuinfo does not say."""
    return _cpuinfo_field("model name") or platform.machine()


@functools.cache
def _tile_registers_granted() -> bool:
    """Ask Linux for the AMX tile registers (arch_prctl ARCH_REQ_XCOMP_PERM, XTILEDATA): a process
    that uses them unasked is killed (SIGILL). The grant holds for the whole process and its forks."""
    import ctypes

    sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata = 158, 0x1023, 18
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(sys_arch_prctl, arch_req_xcomp_perm, xfeature_xtiledata) == 0
    except (OSError, AttributeError):
        return False


def runnable_isas() -> list[str]:
    """The builds this CPU runs, best first (AMX only where Linux lends the tile registers)."""
    flags = _cpu_flags()
    return [name for name, (needs, _) in ISAS.items()
            if needs <= flags and (name != "amx_bf16" or _tile_registers_granted())]


def isa() -> str | None:
    """The instruction set the kernels are built for on this CPU (``QUICKDRAFT_KERNELS_ISA`` may
    pick a lesser one, e.g. ``avx512_bf16`` on an AMX CPU or ``avx2`` on an AVX-512 one), or None
    when it has none of them."""
    usable = runnable_isas()
    wanted = os.environ.get("QUICKDRAFT_KERNELS_ISA")
    if wanted:
        if wanted not in ISAS:
            raise ValueError(f"QUICKDRAFT_KERNELS_ISA={wanted!r}: choose one of {', '.join(ISAS)}")
        return wanted if wanted in usable else None
    return usable[0] if usable else None


def _compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")


# -ffp-contract=off: no multiply and add fused unless the source says so (the coupled rule's noise
# must have the bits torch's separate operations give).
_FLAGS = ("-shared", "-fPIC", "-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off")


def _command(compiler: str, output: Path, isa_flags: tuple[str, ...]) -> list[str]:
    from torch.utils import cpp_extension

    torch_lib = Path(torch.__file__).parent / "lib"
    bundled_omp = sorted(torch_lib.glob("libgomp*.so*"))
    return [compiler, str(SOURCE), "-o", str(output), *_FLAGS, *isa_flags,
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            *(f"-I{p}" for p in cpp_extension.include_paths()), f"-L{torch_lib}", f"-Wl,-rpath,{torch_lib}",
            "-lc10", "-ltorch_cpu", *(str(p) for p in bundled_omp[:1])]


def _library_path(compiler: str, isa_flags: tuple[str, ...]) -> Path:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    key = hashlib.sha256(SOURCE.read_bytes() + torch.__version__.encode() + " ".join(_FLAGS + isa_flags).encode()
                         + "".join(version).encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"quickdraft_kernels_{key}.so"


def _build(compiler: str, library: Path, isa_flags: tuple[str, ...]) -> None:
    print("quickdraft: building its CPU kernels (once, ~20 s)...", file=sys.stderr)
    # Build beside the target and rename: concurrent processes (test workers, replicas) never load
    # a half-written library.
    with tempfile.TemporaryDirectory(dir=library.parent) as scratch:
        partial = Path(scratch) / library.name
        done = subprocess.run(_command(compiler, partial, isa_flags), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "compiler failed")
        os.replace(partial, library)


def _build_once(compiler: str, library: Path, isa_flags: tuple[str, ...]) -> None:
    """Build unless another process does it now: processes that start together on a fresh machine
    (test workers, a server's replicas) wait for one build instead of each compiling for ~20 s."""
    import fcntl  # POSIX only, like the kernels (available() runs on Linux alone)

    library.parent.mkdir(parents=True, exist_ok=True)
    with open(library.parent / f"{library.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not library.exists():
            _build(compiler, library, isa_flags)


def _built_library(compiler: str, isa_flags: tuple[str, ...]) -> Path:
    """The cached library of this build, built first if it is not there yet."""
    library = _library_path(compiler, isa_flags)
    if not library.exists():
        _build_once(compiler, library, isa_flags)
    return library


def build_only(name: str) -> None:
    """Build the kernels for the instruction set ``name`` into the cache without loading them (a
    test run prepares a lesser build that a subprocess loads); nothing without a compiler."""
    compiler = _compiler()
    if compiler is not None:
        _built_library(compiler, ISAS[name][1])


_loaded_library: Path | None = None  # the build loaded_isa() loaded


def build_id() -> str | None:
    """The loaded build's identity (its source, flags, torch and compiler, hashed into the library's
    name), None without kernels: what a measured kernel speed, kept across processes, depends on."""
    return _loaded_library.stem.rsplit("_", 1)[-1] if available() and _loaded_library is not None else None


@functools.cache
def loaded_isa() -> str | None:
    """The instruction set of the kernels this process loaded (built now if needed): ``isa()``, or
    a lesser one this CPU runs when that one cannot be built here (a compiler without AMX, say);
    None when none loads. ``QUICKDRAFT_KERNELS_ISA`` allows only the build it names."""
    global _loaded_library
    if os.environ.get("QUICKDRAFT_KERNELS", "1") == "0" or not sys.platform.startswith("linux"):
        return None
    chosen = isa()
    if chosen is None:
        return None
    compiler = _compiler()
    if compiler is None:
        log.warning("no C++ compiler: products stay torch's")
        return None
    runnable = runnable_isas()
    fallbacks = [] if os.environ.get("QUICKDRAFT_KERNELS_ISA") else runnable[runnable.index(chosen) + 1:]
    for candidate in (chosen, *fallbacks):
        isa_flags = ISAS[candidate][1]
        try:
            library = _built_library(compiler, isa_flags)
            torch.ops.load_library(str(library))
            _loaded_library = library
        except Exception as exc:  # noqa: BLE001 - any failure: a lesser build, or torch's products
            log.warning("quickdraft's %s kernels are unavailable (%s: %s)", candidate, type(exc).__name__, exc)
            continue
        _register_fake()
        return candidate
    log.warning("quickdraft's CPU kernels are unavailable; products stay torch's")
    return None


def available() -> bool:
    """True when the kernels are loaded (built now if needed): ``loaded_isa()`` says which."""
    return loaded_isa() is not None


def key_block_lanes() -> int | None:
    """The slots per key block (``KVCache.key_blocks``) of the loaded build: its fp32 lanes per
    vector register (16 with AVX-512, 8 with AVX2); None without kernels."""
    loaded = loaded_isa()
    return None if loaded is None else 8 if loaded == "avx2" else 16


def _register_fake() -> None:
    @torch.library.register_fake("quickdraft::linear_bf16")
    def _(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n_out: int) -> torch.Tensor:
        return x.new_empty((*x.shape[:-1], n_out))

    @torch.library.register_fake("quickdraft::attend_bf16")
    def _(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        batch, n_head, t, d = q.shape
        return q.new_empty((batch, t, n_head, d)).transpose(1, 2)  # the kernel's layout: [B, T, Hq, D] memory

    @torch.library.register_fake("quickdraft::rms_norm_bf16")
    def _(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        return x.new_empty(x.shape)


def _column_blocks(weight: torch.Tensor) -> torch.Tensor:
    """[N, K] -> [ceil(N/64), 64, K]: the output columns in blocks of 64, the last padded with zeros."""
    n, k = weight.shape
    blocks = -(-n // BLOCK_COLUMNS)
    padded = torch.zeros(blocks * BLOCK_COLUMNS, k, dtype=weight.dtype)
    padded[:n] = weight.detach().cpu()
    return padded.view(blocks, BLOCK_COLUMNS, k)


def pack_bf16(weight: torch.Tensor) -> torch.Tensor:
    """A [N, K] bf16 weight (K even) in ``linear_bf16``'s layout [ceil(N/64), K/2, 64, 2]."""
    n, k = weight.shape
    if weight.dtype != torch.bfloat16 or k % 2:
        raise ValueError(f"pack_bf16 needs a bf16 weight with an even input size, got {weight.dtype} [{n}, {k}]")
    return _column_blocks(weight).view(-1, BLOCK_COLUMNS, k // 2, 2).permute(0, 2, 1, 3).contiguous()


def pack_f32(weight: torch.Tensor) -> torch.Tensor:
    """A [N, K] fp32 weight in the fp32 whole-forward layout [ceil(N/64), K, 64]."""
    if weight.dtype != torch.float32:
        raise ValueError(f"pack_f32 needs an fp32 weight, got {weight.dtype}")
    return _column_blocks(weight).permute(0, 2, 1).contiguous()


def pack_int8(weight: torch.Tensor) -> torch.Tensor:
    """A [N, K] weight (K a multiple of 4) quantised to int8 for the whole forward's int8 products (a
    draft's, ``int8_products()``): per column, round(w * 127 / max|w|), in the layout
    [ceil(N/64), K/4 * 256 + 512] int8 - per block of 64 columns, K/4 lines of each column's four
    consecutive input weights, then the columns' fp32 scales and int32 offsets (128 x the column's
    sum, which takes back the activations' shift to unsigned bytes)."""
    lines, trailer = _quantised_lines(weight, 127, "pack_int8")
    return torch.cat([lines.reshape(lines.shape[0], -1), trailer], dim=1).contiguous()


def pack_int4(weight: torch.Tensor) -> torch.Tensor:
    """``pack_int8`` at 15 levels a column (round(w * 7 / max|w|)), each line's four 64-byte vectors
    folded into two: byte j of the first holds vector 0's level + 8 in its low nibble and vector 1's
    in its high one, the second vectors 2 and 3 likewise -> [ceil(N/64), K/4 * 128 + 512] uint8. Half
    of int8's bytes for a draft's products (the kernel unpacks them to int8's line)."""
    lines, trailer = _quantised_lines(weight, 7, "pack_int4")
    vectors = (lines.view(lines.shape[0], lines.shape[1], 4, 64).to(torch.int16) + 8).to(torch.uint8)
    folded = vectors[:, :, 0::2] | (vectors[:, :, 1::2] << 4)  # [blocks, K/4, 2, 64]
    return torch.cat([folded.reshape(lines.shape[0], -1), trailer.view(torch.uint8)], dim=1).contiguous()


def _quantised_lines(weight: torch.Tensor, top: int, op: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(levels in lines [blocks, K/4, 256] int8, trailer [blocks, 512] int8: the fp32 scales and int32
    offsets) of a [N, K] weight quantised per column to the levels -top..top."""
    n, k = weight.shape
    if k % 4:
        raise ValueError(f"{op} needs an input size that is a multiple of 4, got [{n}, {k}]")
    columns = weight.detach().cpu().float()
    largest = columns.abs().amax(dim=1)
    scale = torch.where(largest > 0, largest / top, torch.ones_like(largest))
    levels = torch.round(columns / scale[:, None]).clamp_(-top, top).to(torch.int8)
    blocks = _column_blocks(levels)  # [blocks, 64, K]
    lines = blocks.view(blocks.shape[0], BLOCK_COLUMNS, k // 4, 4).permute(0, 2, 1, 3).reshape(blocks.shape[0], k // 4, -1)
    scales = torch.ones(blocks.shape[0] * BLOCK_COLUMNS)
    scales[:n] = scale
    offsets = 128 * blocks.sum(dim=2, dtype=torch.int32)
    return lines, torch.cat([scales.view(blocks.shape[0], BLOCK_COLUMNS).view(torch.int8), offsets.view(torch.int8)], dim=1)


def int8_products() -> bool:
    """True when the loaded kernels take ``pack_int8``'s weights (their AVX-512 builds)."""
    return available() and bool(torch.ops.quickdraft.int8_products())


def _require_kernels() -> None:
    if not available():
        raise RuntimeError("quickdraft's CPU kernels are not available on this machine")


def set_min_task_work(work: int) -> None:
    """The least work a thread takes in a product or attention (bytes read times rows): below twice
    it, the call runs on the calling thread alone. Bits do not depend on it."""
    _require_kernels()
    torch.ops.quickdraft.set_min_task_work(work)


def min_task_work() -> int:
    _require_kernels()
    return int(torch.ops.quickdraft.min_task_work())


def linear_bf16(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n_out: int) -> torch.Tensor:
    """x [..., K] bf16 @ Wᵀ (+ bias) -> [..., n_out] bf16, W packed by ``pack_bf16`` (or by ``pack_int8``:
    the rows quantised to 8 bits too, the int8 product of a draft's whole forward)."""
    return torch.ops.quickdraft.linear_bf16(x, packed, bias, n_out)


def attend_bf16(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """q [B, Hq, T, D] over keys, values [B, Hkv, C, D] (a cache window) where mask [B or 1, T, C]
    is True -> [B, Hq, T, D], all bf16 but the mask; softmax scale 1/sqrt(D)."""
    return torch.ops.quickdraft.attend_bf16(q, keys, values, mask)


def rms_norm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``RMSNorm`` of bf16 rows: weight * bf16(x / rms(x)), the reduction in fp32."""
    return torch.ops.quickdraft.rms_norm_bf16(x, weight, eps)


# Optional tensor arguments left out, made once: a batched draft of 32 sequences created ~100 empty
# tensors a call for its per-sequence ones. The kernels only read their sizes.
_NO_TENSOR = torch.empty(0)
_NO_SECONDS = torch.empty(0, dtype=torch.float64)
_NO_IDS = torch.empty(0, dtype=torch.long)
_NO_ROWS = torch.empty(0, 0)  # no noise or bias rows [k, V], no logits to fill [k, V]
_NO_DRAWS = torch.empty(0, dtype=torch.float64)


def forward(tokens: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
            cos: torch.Tensor, signed_sin: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
            key_blocks: list[torch.Tensor], weights: list[torch.Tensor], n_layers: int, n_head: int, n_kv: int,
            head_dim: int, intermediate: int, vocab: int, eps: float, logits_rows: int, input_features: torch.Tensor | None = None,
            feature_proj: torch.Tensor | None = None, features_out: torch.Tensor | None = None) -> torch.Tensor:
    """A Llama-family forward over a step's rows in one call, bf16 or fp32 after the weights' dtype
    (see ``model/native.py``): -> logits of the last ``logits_rows`` rows of each sequence
    [B, logits_rows, vocab] (0 for a prefill, which only writes the cache). ``key_blocks``: the
    cache's (``KVCache.key_blocks``, written with the keys and scored in place), or [] to transpose
    the keys in each call. ``input_features``
    [B * T, E], projected by ``feature_proj`` (packed E -> E), are added to the rows' embeddings;
    ``features_out`` [B, slots, E] receives each row's residual stream after the last layer run at
    its slot (a feature draft's inputs and outputs)."""
    none = _NO_TENSOR
    return torch.ops.quickdraft.forward(tokens, positions, slots, mask, cos, signed_sin, keys, values, key_blocks, weights,
                                        n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps, logits_rows,
                                        none if input_features is None else input_features,
                                        none if feature_proj is None else feature_proj,
                                        none if features_out is None else features_out)


def draft_greedy(tokens: torch.Tensor, start: int, k: int, vocab_limit: int, cos: torch.Tensor,
                 signed_sin: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                 key_blocks: list[torch.Tensor], weights: list[torch.Tensor], n_layers: int, n_head: int, n_kv: int,
                 head_dim: int, intermediate: int, vocab: int, eps: float, head_ids: torch.Tensor | None = None,
                 gumbel: torch.Tensor | None = None, temperature: float = 1.0, uniforms: torch.Tensor | None = None,
                 logits_out: torch.Tensor | None = None, input_features: torch.Tensor | None = None,
                 feature_proj: torch.Tensor | None = None, features_out: torch.Tensor | None = None,
                 hold_features: bool = False, step_seconds: torch.Tensor | None = None) -> torch.Tensor:
    """Feed tokens [1, T] after ``start`` cached tokens, then draft ``k`` tokens greedily in one call
    (``forward``'s steps, the argmax of each fed back): -> int64 [k]. ``head_ids`` [vocab] maps the
    head's rows to token ids when the head covers a subset of the vocabulary. ``gumbel`` [k, V]
    (float32, by token id) makes each step a Gumbel-max draw at ``temperature`` instead. ``uniforms``
    [k] (float64 in [0, 1)) makes each step an inverse-CDF draw from softmax(logit / temperature +
    gumbel), ``gumbel`` then an additive bias. ``logits_out`` [k, vocab] (float32) receives each
    step's logits. A feature draft passes ``forward``'s ``input_features`` (of the fed tokens),
    ``feature_proj`` and ``features_out``: each drafted token is fed with its step's feature, or with
    ``hold_features`` the last fed one again. ``step_seconds`` [k] (float64) receives each step's
    time, the first's from the call's start (it feeds ``tokens``)."""
    ids = _NO_IDS if head_ids is None else head_ids
    none = _NO_TENSOR
    noise = _NO_ROWS if gumbel is None else gumbel
    scale = 1.0 if gumbel is None and uniforms is None else 1.0 / temperature
    return torch.ops.quickdraft.draft_greedy(tokens, start, k, vocab_limit, cos, signed_sin, keys, values, key_blocks,
                                             weights,
                                             n_layers, n_head, n_kv, head_dim, intermediate, vocab, eps, ids, noise,
                                             scale, _NO_DRAWS if uniforms is None else uniforms,
                                             _NO_ROWS if logits_out is None else logits_out,
                                             none if input_features is None else input_features,
                                             none if feature_proj is None else feature_proj,
                                             none if features_out is None else features_out, hold_features,
                                             _NO_SECONDS if step_seconds is None else step_seconds)


def draft_batch(tokens: torch.Tensor, positions: torch.Tensor, ks: list[int], window: int, vocab_limit: int,
                cos: torch.Tensor, signed_sin: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                key_blocks: list[torch.Tensor], weights: list[torch.Tensor], n_layers: int, n_head: int, n_kv: int,
                head_dim: int, intermediate: int, vocab: int, eps: float, head_ids: torch.Tensor | None,
                gumbel: list[torch.Tensor | None], temperatures: list[float],
                uniforms: list[torch.Tensor | None] | None = None,
                logits_out: list[torch.Tensor | None] | None = None, input_features: torch.Tensor | None = None,
                feature_proj: torch.Tensor | None = None, features_out: torch.Tensor | None = None,
                hold_features: bool = False, step_seconds: torch.Tensor | None = None) -> torch.Tensor:
    """``draft_greedy`` for a batch: sequence b feeds tokens[b] (its real rows last, front padding at
    scratch positions) and drafts ks[b] tokens, each step one [B, rows] forward over cache slots
    [0, window) -> int64 [B, max(ks)], -1 past a sequence's own count. ``gumbel[b]`` [ks[b], V]
    races sequence b's draws at ``temperatures[b]``; None drafts its argmax. ``uniforms[b]`` [ks[b]]
    (float64) draws sequence b's tokens from softmax(logit / T + gumbel[b]) instead, and
    ``logits_out[b]`` [ks[b], head rows] (float32) receives its steps' logits. A feature draft passes
    ``input_features`` [B * T, E] of the fed rows, ``feature_proj`` and ``features_out`` [B, slots, E],
    as for ``draft_greedy``. ``step_seconds`` [max(ks)] (float64) receives each batched step's time,
    the first's from the call's start."""
    ids = _NO_IDS if head_ids is None else head_ids
    none = [None] * len(ks)
    uniforms, logits_out = uniforms or none, logits_out or none
    noise = [_NO_ROWS if g is None else g for g in gumbel]
    inverse = [1.0 if g is None and u is None else 1.0 / t for g, u, t in zip(gumbel, uniforms, temperatures)]
    draws = [_NO_DRAWS if u is None else u for u in uniforms]
    kept = [_NO_ROWS if out is None else out for out in logits_out]
    return torch.ops.quickdraft.draft_batch(tokens, positions, torch.tensor(ks, dtype=torch.long), window, vocab_limit,
                                            cos, signed_sin, keys, values, key_blocks, weights, n_layers, n_head, n_kv,
                                            head_dim,
                                            intermediate, vocab, eps, ids, noise, inverse, draws, kept,
                                            _NO_TENSOR if input_features is None else input_features,
                                            _NO_TENSOR if feature_proj is None else feature_proj,
                                            _NO_TENSOR if features_out is None else features_out, hold_features,
                                            _NO_SECONDS if step_seconds is None else step_seconds)


def first_maxima(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximum (logits [rows, vocab], bf16 or fp32, rows contiguous) -> int64 [rows]:
    torch.max(logits, -1)'s indices (for a row holding a NaN, torch.max's own)."""
    return torch.ops.quickdraft.first_maxima(logits)


def nucleus_keep(probs: torch.Tensor, top_p: float, margin: float) -> torch.Tensor:
    """fp32 probability rows [rows, vocab] with the tokens past each row's top-p nucleus zeroed, not
    renormalised: ``sampling._nucleus``'s definition, bit for bit, in one call."""
    return torch.ops.quickdraft.nucleus_keep(probs, top_p, margin)


def nucleus_race(probs: torch.Tensor, noise: torch.Tensor, top_p: float, margin: float) -> torch.Tensor:
    """The coupled rule's token per row [rows] (int64): the first maximum of ``nucleus_keep(probs) /
    noise``, bit for bit, mostly without building the nucleus (the whole row's race winner is checked
    against it)."""
    return torch.ops.quickdraft.nucleus_race(probs, noise, top_p, margin)


def exponential_noise(keys: torch.Tensor, vocab: int) -> torch.Tensor:
    """Exp(1) noise [len(keys), vocab] (fp32), row i a pure function of keys[i] (int64): the coupled
    rule's noise, ``randomness.position_noise`` gives the definition."""
    return torch.ops.quickdraft.exponential_noise(keys, vocab)
