#!/usr/bin/env bash
# Convert the embedded model pairs to GGUF (f32 and bf16) with llama.cpp's converter.
#
#   scripts/llama_cpp/convert.sh [CACHE_DIR]
#
# CACHE_DIR as for build.sh (which must have unpacked the llama.cpp source there). Writes
# CACHE_DIR/gguf/<pair>-<model>-<dtype>.gguf, e.g. embedded-target-f32.gguf, where
# `quickdraft bench --llama-cpp CACHE_DIR` looks for them. The converter runs in its own venv,
# CACHE_DIR/convert-venv (torch, transformers): nothing is added to the project's environment.
# Re-running skips files already written.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
# The converter's own pin (its requirements file).
TRANSFORMERS_VERSION="4.57.6"

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
cache_dir="${1:-${QUICKDRAFT_LLAMA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quickdraft/llama.cpp}}"
source_dir="$cache_dir/llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}/vendor/llama.cpp"
venv="$cache_dir/convert-venv"
out_dir="$cache_dir/gguf"
assets="$repo/src/quickdraft/assets"

log() { echo "[llama.cpp convert] $*"; }

if [[ ! -f "$source_dir/convert_hf_to_gguf.py" ]]; then
    echo "llama.cpp source not found at $source_dir: run scripts/llama_cpp/build.sh $cache_dir first" >&2
    exit 1
fi

if [[ ! -x "$venv/bin/python" ]] || ! "$venv/bin/python" -c "import torch, transformers, sentencepiece" 2>/dev/null; then
    log "creating the conversion venv $venv"
    python3 -m venv "$venv"
    # The converter only reads tensors: the torch build the project already uses (a CPU one) will
    # do, and a plain `torch` could pull gigabytes of CUDA libraries. QUICKDRAFT_CONVERT_TORCH overrides.
    torch_spec="${QUICKDRAFT_CONVERT_TORCH:-}"
    if [[ -z "$torch_spec" && -x "$repo/.venv/bin/python" ]]; then
        torch_spec="torch==$("$repo/.venv/bin/python" -c 'import torch; print(torch.__version__)' 2>/dev/null || true)"
    fi
    [[ "$torch_spec" == "torch==" || -z "$torch_spec" ]] && torch_spec="torch"
    log "installing $torch_spec, transformers==$TRANSFORMERS_VERSION and the converter's other needs"
    "$venv/bin/python" -m pip install --quiet "$torch_spec" numpy sentencepiece protobuf safetensors \
        pyyaml tqdm requests "transformers==$TRANSFORMERS_VERSION"
fi

declare -A pairs=([embedded]="$assets" [embedded-copy]="$assets/copy")
for pair in embedded embedded-copy; do
    for model in target draft; do
        model_dir="${pairs[$pair]}/$model"
        [[ -f "$model_dir/config.json" ]] || { log "skipping $model_dir (not installed)"; continue; }
        for dtype in f32 bf16; do
            outfile="$out_dir/$pair-$model-$dtype.gguf"
            if [[ -f "$outfile" ]]; then
                log "exists: $outfile"
                continue
            fi
            log "converting $model_dir -> $outfile"
            # Write under a temporary name so that an interrupted run leaves no half file behind.
            "$venv/bin/python" "$here/gguf_convert.py" "$source_dir" "$model_dir" "$outfile.part" "$dtype"
            mv "$outfile.part" "$outfile"
        done
    done
done
log "done: $out_dir"
