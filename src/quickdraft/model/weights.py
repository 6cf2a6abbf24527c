"""Load a Hugging Face checkpoint directory (or hub repo id) into our Transformer.

Weights come from safetensors only (one file or sharded with an index). Pickle files are never
unpickled: a checkpoint that only has ``.bin``/``.pt`` weights is refused with a way out.
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from quickdraft.errors import ModelFormatError, ModelNotFoundError
from quickdraft.model.config import ModelConfig
from quickdraft.model.transformer import Transformer

log = logging.getLogger(__name__)

SINGLE_FILE = "model.safetensors"
DTYPE_NAMES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}  # config.json torch_dtype
INDEX_FILE = "model.safetensors.index.json"
PICKLE_PATTERNS = ("pytorch_model*.bin", "*.pt", "*.pth", "*.ckpt")
HUB_PATTERNS = ["*.json", "*.safetensors", "tokenizer*", "*.jinja"]


def resolve_model_dir(path_or_id: str | Path) -> Path:
    """A local directory as it is; an embedded pair's name (``embedded``, ``embedded-copy``) as its
    target; otherwise a hub repo id, downloaded through huggingface_hub."""
    path = Path(path_or_id).expanduser()
    if path.is_dir():
        return path
    text = str(path_or_id)
    from quickdraft.assets import EMBEDDED_PAIRS, embedded_target_path

    if text in EMBEDDED_PAIRS:
        return Path(embedded_target_path(text))
    looks_like_repo_id = text.count("/") == 1 and not text.startswith((".", "/", "~"))
    if not looks_like_repo_id:
        raise ModelNotFoundError(f"model {text!r} not found: no such directory, and it is not a hub repo id (org/name)")
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    try:
        return Path(snapshot_download(repo_id=text, allow_patterns=HUB_PATTERNS))
    except (HfHubHTTPError, LocalEntryNotFoundError, OSError, ValueError) as exc:
        raise ModelNotFoundError(
            f"model {text!r} not found locally and could not be fetched from the hub ({type(exc).__name__}: {exc}); "
            "pass a local directory with config.json and model.safetensors"
        ) from exc


def safetensors_files(model_dir: Path) -> list[Path]:
    index = model_dir / INDEX_FILE
    if index.exists():
        try:
            weight_map = json.loads(index.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as exc:
            raise ModelFormatError(f"corrupt {index}: expected JSON with a 'weight_map'") from exc
        files = [model_dir / name for name in dict.fromkeys(weight_map.values())]
        missing = [f for f in files if not f.exists()]
        if missing:
            raise ModelFormatError(f"missing shard {missing[0]} listed in {index}")
        return files
    single = model_dir / SINGLE_FILE
    if single.exists():
        return [single]
    pickles = [p for pattern in PICKLE_PATTERNS for p in model_dir.glob(pattern)]
    if pickles:
        raise ModelFormatError(
            f"{pickles[0]} is a pickle checkpoint, which quickdraft never loads (unpickling runs code). "
            "Convert it to safetensors, e.g. with transformers: "
            "AutoModelForCausalLM.from_pretrained(dir).save_pretrained(dir, safe_serialization=True)"
        )
    raise ModelFormatError(f"missing weights in {model_dir}: expected {SINGLE_FILE} or {INDEX_FILE}")


def iter_checkpoint_tensors(
    files: list[Path], *, dtype: torch.dtype, device: str | torch.device = "cpu"
) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor, copied out of its memory map in the requested dtype and device.

    One map per tensor: a map stays resident while any view of it lives, so copying tensor by
    tensor and dropping each map keeps peak memory near the weights' size (the fused QKV and
    gate/up matrices could not stay views of the file anyway).
    """
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as handle:
                names = list(handle.keys())
            for name in names:
                with safe_open(str(file), framework="pt") as handle:
                    tensor = handle.get_tensor(name).to(device=device, dtype=dtype, copy=True)
                yield name, tensor
        except (SafetensorError, OSError) as exc:
            raise ModelFormatError(f"corrupt weights file {file}: {exc}") from exc


def _strip_prefix(name: str) -> str:
    for prefix in ("model.", "transformer."):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def _convert_llama(raw: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    out = {"embed.weight": raw.pop("embed_tokens.weight"), "norm.weight": raw.pop("norm.weight")}
    for i in range(config.n_layer):
        p = f"layers.{i}."
        out[p + "attn_norm.weight"] = raw.pop(p + "input_layernorm.weight")
        out[p + "mlp_norm.weight"] = raw.pop(p + "post_attention_layernorm.weight")
        out[p + "attn.qkv.weight"] = torch.cat([raw.pop(f"{p}self_attn.{n}_proj.weight") for n in "qkv"])
        if config.qkv_bias:
            out[p + "attn.qkv.bias"] = torch.cat([raw.pop(f"{p}self_attn.{n}_proj.bias") for n in "qkv"])
        out[p + "attn.out.weight"] = raw.pop(p + "self_attn.o_proj.weight")
        out[p + "mlp.up.weight"] = torch.cat([raw.pop(p + "mlp.gate_proj.weight"), raw.pop(p + "mlp.up_proj.weight")])
        out[p + "mlp.down.weight"] = raw.pop(p + "mlp.down_proj.weight")
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = raw.pop("lm_head.weight")
    return out


def _convert_gpt2(raw: dict[str, torch.Tensor], config: ModelConfig) -> dict[str, torch.Tensor]:
    # GPT-2 stores its linear layers as Conv1D, [in, out]: transpose to nn.Linear's [out, in].
    out = {"embed.weight": raw.pop("wte.weight"), "pos_embed.weight": raw.pop("wpe.weight")}
    out["norm.weight"], out["norm.bias"] = raw.pop("ln_f.weight"), raw.pop("ln_f.bias")
    renames = {"ln_1": "attn_norm", "ln_2": "mlp_norm"}
    linears = {"attn.c_attn": "attn.qkv", "attn.c_proj": "attn.out", "mlp.c_fc": "mlp.up", "mlp.c_proj": "mlp.down"}
    for i in range(config.n_layer):
        p, q = f"h.{i}.", f"layers.{i}."
        for old, new in renames.items():
            out[f"{q}{new}.weight"], out[f"{q}{new}.bias"] = raw.pop(f"{p}{old}.weight"), raw.pop(f"{p}{old}.bias")
        for old, new in linears.items():
            out[f"{q}{new}.weight"] = raw.pop(f"{p}{old}.weight").t().contiguous()
            out[f"{q}{new}.bias"] = raw.pop(f"{p}{old}.bias")
    if not config.tie_word_embeddings and "lm_head.weight" in raw:
        out["lm_head.weight"] = raw.pop("lm_head.weight")
    return out


def load_transformer(
    model_dir: Path, config: ModelConfig, *, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu"
) -> Transformer:
    files = safetensors_files(model_dir)
    raw = {_strip_prefix(name): t for name, t in iter_checkpoint_tensors(files, dtype=dtype, device=device)}
    if config.tie_word_embeddings:
        raw.pop("lm_head.weight", None)  # some checkpoints store the tied copy too
    try:
        state = _convert_gpt2(raw, config) if config.is_gpt2 else _convert_llama(raw, config)
    except KeyError as exc:
        raise ModelFormatError(f"weights in {model_dir} lack tensor {exc.args[0]!r} required by config.json") from exc
    leftovers = [n for n in raw if not n.endswith((".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"))]
    if leftovers:
        log.warning("ignoring %d unexpected tensors in %s, e.g. %s", len(leftovers), model_dir, leftovers[0])
    with torch.device("meta"), _weights_left_uninitialised():
        model = Transformer(config)
    _check_shapes(model, state, model_dir)
    model.load_state_dict(state, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.lm_head.weight = model.embed.weight
    model.inv_freq = model.inv_freq.to(device)  # computed on the CPU when the model was built
    return model.eval().requires_grad_(False)


_INITIALISERS = ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_", "kaiming_normal_", "xavier_uniform_",
                 "xavier_normal_", "zeros_", "ones_", "constant_")


@contextlib.contextmanager
def _weights_left_uninitialised() -> Iterator[None]:
    """Modules built here only to receive a checkpoint's tensors skip ``torch.nn.init``. On the
    meta device their random initialisation computes nothing, but it runs through torch's reference
    implementations, whose first call imports ``torch._dynamo``: ~0.8 s of every ``quickdraft
    generate``'s ~2.8 s start-up, for a compiler it does not use by default. (Process-wide while a
    model is built, as transformers' ``no_init_weights`` is.)"""
    saved = {name: getattr(torch.nn.init, name) for name in _INITIALISERS}
    try:
        for name in _INITIALISERS:
            setattr(torch.nn.init, name, lambda tensor, *args, **kwargs: tensor)
        yield
    finally:
        for name, function in saved.items():
            setattr(torch.nn.init, name, function)


def _check_shapes(model: Transformer, state: dict[str, torch.Tensor], model_dir: Path) -> None:
    expected = {n: p.shape for n, p in model.state_dict().items() if n != "inv_freq"}
    if model.config.tie_word_embeddings:
        expected.pop("lm_head.weight", None)
    for name, shape in expected.items():
        if name not in state:
            raise ModelFormatError(f"weights in {model_dir} lack tensor {name!r}")
        if state[name].shape != shape:
            raise ModelFormatError(
                f"weights in {model_dir}: tensor {name!r} has shape {tuple(state[name].shape)}, config.json implies {tuple(shape)}"
            )


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """Our Llama-family weights under Hugging Face's names (the inverse of loading)."""
    config = model.config
    if config.is_gpt2:
        raise NotImplementedError("saving is implemented for the Llama family, which is what quickdraft trains")
    sd = {n: t.detach().contiguous() for n, t in model.state_dict().items() if n != "inv_freq"}
    q_dim, kv_dim = config.n_head * config.head_dim, config.n_kv_head * config.head_dim
    out = {"model.embed_tokens.weight": sd["embed.weight"], "model.norm.weight": sd["norm.weight"]}
    for i in range(config.n_layer):
        p, h = f"layers.{i}.", f"model.layers.{i}."
        out[h + "input_layernorm.weight"] = sd[p + "attn_norm.weight"]
        out[h + "post_attention_layernorm.weight"] = sd[p + "mlp_norm.weight"]
        for name, part in zip("qkv", sd[p + "attn.qkv.weight"].split((q_dim, kv_dim, kv_dim))):
            out[f"{h}self_attn.{name}_proj.weight"] = part.contiguous()
        if config.qkv_bias:
            for name, part in zip("qkv", sd[p + "attn.qkv.bias"].split((q_dim, kv_dim, kv_dim))):
                out[f"{h}self_attn.{name}_proj.bias"] = part.contiguous()
        out[h + "self_attn.o_proj.weight"] = sd[p + "attn.out.weight"]
        gate, up = sd[p + "mlp.up.weight"].chunk(2)
        out[h + "mlp.gate_proj.weight"], out[h + "mlp.up_proj.weight"] = gate.contiguous(), up.contiguous()
        out[h + "mlp.down_proj.weight"] = sd[p + "mlp.down.weight"]
    if not config.tie_word_embeddings:
        out["lm_head.weight"] = sd["lm_head.weight"]
    return out


def hf_config_dict(config: ModelConfig) -> dict[str, object]:
    """A Hugging Face config.json for a Llama-family ModelConfig."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.n_embd,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "max_position_embeddings": config.block_size,
        "rms_norm_eps": config.norm_eps,
        "rope_theta": config.rope_theta,
        "tie_word_embeddings": config.tie_word_embeddings,
        "attention_bias": config.qkv_bias,
        "hidden_act": "silu",
        "bos_token_id": config.bos_token_id,
        "eos_token_id": list(config.eos_token_ids) if len(config.eos_token_ids) != 1 else config.eos_token_ids[0],
        "torch_dtype": "float32",
    }


def save_pretrained(model: Transformer, out_dir: Path, *, dtype: torch.dtype | None = None) -> None:
    """Write config.json + model.safetensors in Hugging Face layout (tokenizer files are separate)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    state = hf_state_dict(model)
    if dtype is not None:
        state = {n: t.to(dtype) for n, t in state.items()}
    config = hf_config_dict(model.config)
    if dtype is not None:
        config["torch_dtype"] = DTYPE_NAMES[dtype]
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(state, str(out_dir / SINGLE_FILE), metadata={"format": "pt"})


def cast_saved_weights(model_dir: Path, dtype: torch.dtype) -> None:
    """Rewrite ``model_dir``'s single-file weights (and config.json's torch_dtype) in ``dtype``."""
    from safetensors.torch import load_file, save_file

    weights = model_dir / SINGLE_FILE
    tensors = {k: v.to(dtype) if v.is_floating_point() else v for k, v in load_file(weights).items()}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    config = json.loads((model_dir / "config.json").read_text())
    config["torch_dtype"] = DTYPE_NAMES[dtype]
    (model_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
