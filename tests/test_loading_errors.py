"""Bad checkpoints get clear errors naming the file; pickles are never unpickled."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from quickdraft.errors import ModelFormatError, ModelNotFoundError, UnsupportedModelError
from quickdraft.model.config import ModelConfig
from quickdraft.model.loader import load_model


@pytest.fixture
def checkpoint_copy(checkpoints, tmp_path):
    path = tmp_path / "model"
    shutil.copytree(checkpoints["target"], path)
    return path


def test_unsupported_architecture_names_the_supported_ones(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config["model_type"] = "mamba"
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UnsupportedModelError, match="'mamba' is not supported; supported: llama, mistral, qwen2, gpt2"):
        load_model(checkpoint_copy)


def test_missing_config_names_the_file(checkpoint_copy):
    (checkpoint_copy / "config.json").unlink()
    with pytest.raises(ModelFormatError, match=r"missing .*config\.json"):
        load_model(checkpoint_copy)


def test_corrupt_config_names_the_file(checkpoint_copy):
    (checkpoint_copy / "config.json").write_text("{not json")
    with pytest.raises(ModelFormatError, match=r"corrupt .*config\.json"):
        load_model(checkpoint_copy)


def test_missing_weights_are_named(checkpoint_copy):
    (checkpoint_copy / "model.safetensors").unlink()
    with pytest.raises(ModelFormatError, match="expected model.safetensors or model.safetensors.index.json"):
        load_model(checkpoint_copy)


def test_truncated_weights_file_is_reported_as_corrupt(checkpoint_copy):
    weights = checkpoint_copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(ModelFormatError, match=r"corrupt weights file .*model\.safetensors"):
        load_model(checkpoint_copy)


def test_weights_that_do_not_fit_the_config_are_named(checkpoint_copy):
    config = json.loads((checkpoint_copy / "config.json").read_text())
    config["intermediate_size"] = 100
    (checkpoint_copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelFormatError, match=r"tensor 'layers.0.mlp.up.weight' has shape \(256, 64\), config.json implies \(200, 64\)"):
        load_model(checkpoint_copy)


def test_pickle_checkpoints_are_refused_not_unpickled(checkpoint_copy, monkeypatch):
    (checkpoint_copy / "model.safetensors").unlink()
    torch.save({"x": torch.zeros(1)}, checkpoint_copy / "pytorch_model.bin")

    def never(*args, **kwargs):
        raise AssertionError("torch.load must never be called")

    monkeypatch.setattr(torch, "load", never)
    with pytest.raises(ModelFormatError, match="pickle checkpoint, which quickdraft never loads.*safetensors"):
        load_model(checkpoint_copy)


def test_sharded_checkpoints_load_like_single_files(checkpoints, tmp_path):
    from safetensors.torch import load_file, save_file

    single = load_file(str(checkpoints["target"] / "model.safetensors"))
    names = sorted(single)
    halves = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2 :]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(checkpoints["target"] / "config.json", sharded)
    weight_map = {}
    for file, part in halves.items():
        save_file({n: single[n] for n in part}, str(sharded / file))
        weight_map.update({n: file for n in part})
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    tokens = torch.arange(10)[None]
    with torch.inference_mode():
        assert torch.equal(load_model(sharded).model(tokens), load_model(checkpoints["target"]).model(tokens))


def test_missing_shard_is_named(checkpoints, tmp_path):
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    shutil.copy(checkpoints["target"] / "config.json", sharded)
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "model-1.safetensors"}}))
    with pytest.raises(ModelFormatError, match=r"missing shard .*model-1\.safetensors"):
        load_model(sharded)


def test_unknown_local_path_is_not_sent_to_the_hub(tmp_path):
    with pytest.raises(ModelNotFoundError, match="no such directory, and it is not a hub repo id"):
        load_model(tmp_path / "nowhere" / "model")


def test_hub_repo_id_that_cannot_be_fetched_gets_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    with pytest.raises(ModelNotFoundError, match="could not be fetched from the hub"):
        load_model("quickdraft-test/no-such-model")


def test_bf16_and_fp16_loading_keep_the_dtype(checkpoints):
    for dtype, torch_dtype in (("bf16", torch.bfloat16), ("fp16", torch.float16)):
        assert load_model(checkpoints["target"], dtype=dtype).model.dtype == torch_dtype


def test_config_reads_llama3_rope_scaling_and_rejects_unknown_scaling():
    base = {"model_type": "llama", "vocab_size": 10, "hidden_size": 8, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 16}
    scaled = ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "llama3", "factor": 8.0,
                                        "original_max_position_embeddings": 8192}})
    assert scaled.rope_scaling["rope_type"] == "llama3"
    with pytest.raises(UnsupportedModelError, match="rope scaling 'yarn' is not supported"):
        ModelConfig.from_hf_dict({**base, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
