#!/usr/bin/env bash
# Build llama.cpp (CPU only) from the llama-cpp-python source package, whose sdist vendors it.
#
#   scripts/llama_cpp/build.sh [CACHE_DIR]
#
# CACHE_DIR: the argument, else $QUICKDRAFT_LLAMA_CPP_CACHE, else
# ${XDG_CACHE_HOME:-$HOME/.cache}/quickdraft/llama.cpp. The binaries land in CACHE_DIR/build/bin;
# that directory is what `quickdraft bench --llama-cpp` takes. Re-running skips work already done.
# About 14 minutes on 2 cores.
set -euo pipefail

LLAMA_CPP_PYTHON_VERSION="0.3.36"
TARGETS=(llama-completion llama-speculative-simple llama-tokenize)

cache_dir="${1:-${QUICKDRAFT_LLAMA_CPP_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/quickdraft/llama.cpp}}"
sdist_name="llama_cpp_python-${LLAMA_CPP_PYTHON_VERSION}"
source_dir="$cache_dir/$sdist_name/vendor/llama.cpp"
build_dir="$cache_dir/build"
bin_dir="$build_dir/bin"

log() { echo "[llama.cpp build] $*"; }

all_built() {
    local target
    for target in "${TARGETS[@]}"; do
        [[ -x "$bin_dir/$target" ]] || return 1
    done
}

if all_built; then
    log "already built: $bin_dir"
    exit 0
fi

mkdir -p "$cache_dir"

if [[ ! -f "$source_dir/CMakeLists.txt" ]]; then
    sdist="$cache_dir/$sdist_name.tar.gz"
    if [[ ! -f "$sdist" ]]; then
        log "downloading llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION (source package)"
        python3 -m pip download "llama-cpp-python==$LLAMA_CPP_PYTHON_VERSION" \
            --no-deps --no-binary :all: --dest "$cache_dir"
    fi
    log "unpacking $sdist"
    tar -xzf "$sdist" -C "$cache_dir"
fi

log "configuring (Release, CPU only) in $build_dir"
# Static libraries keep the bin directory self-contained; tests, server and HTTPS are not needed.
cmake -S "$source_dir" -B "$build_dir" -G Ninja \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_APP=OFF \
    -DLLAMA_OPENSSL=OFF

log "building ${TARGETS[*]} with 2 jobs (about 14 minutes on 2 cores)"
nice -n 10 cmake --build "$build_dir" --target "${TARGETS[@]}" -j 2

all_built || { log "build finished but binaries are missing from $bin_dir"; exit 1; }
log "done: $bin_dir"
