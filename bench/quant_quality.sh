#!/usr/bin/env bash
# Quantization quality of ds4-quantize beside llama.cpp's quantizers, on the same tensors with
# the same imatrix (issue 37; docs/TOOLS.md "Quality beside llama.cpp").
#
#   bash bench/quant_quality.sh [WORKDIR]      # default /tmp/ds4-quant-quality
#
# 1. builds ggml-base (the quantizers llama-quantize calls) from the llama.cpp source the peers
#    script uses (llama-cpp-python 0.3.36's vendored ggml-org/llama.cpp@0c1e57098), once;
# 2. writes the tiny V4 checkpoint (`make_checkpoint.py --model v4 --tame`) and converts it with
#    `ds4-quantize --recipe f32` (the exact values), q2 and q4;
# 3. collects an imatrix with the engine on the f32 file (`ds4 --imatrix-dataset`), over a text
#    from this repository, and converts q2 and q4 again with it;
# 4. prints, per type (IQ2_XXS, Q2_K, Q4_K) and with and without the imatrix, the RMSE of ds4's
#    tensors and of ggml's `ggml_quantize_chunk` on the same values with the same importance
#    (tools/quant_quality.py), and the importance-weighted RMSE.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
W="${1:-/tmp/ds4-quant-quality}"
mkdir -p "$W"
PEER="$W/llamacpp"
SRC="$PEER/src"
LIB="$PEER/build/bin/libggml-base.so"

if [ ! -e "$LIB" ]; then
    command -v cmake >/dev/null || { apt-get update -qq && apt-get install -y -qq cmake g++; }
    if [ ! -f "$SRC/CMakeLists.txt" ]; then
        rm -rf "$PEER/sd" && mkdir -p "$PEER/sd"
        python3 -m pip download -q --no-deps --no-binary llama-cpp-python \
            "llama-cpp-python==0.3.36" -d "$PEER/sd"
        tar -xzf "$PEER"/sd/llama_cpp_python-*.tar.gz -C "$PEER/sd"
        mv "$PEER"/sd/llama_cpp_python-*/vendor/llama.cpp "$SRC"
        rm -rf "$PEER/sd"
    fi
    cmake -S "$SRC" -B "$PEER/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON \
        -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF >/dev/null
    cmake --build "$PEER/build" --target ggml-base -j"$(nproc)" >/dev/null
fi

cd "$ROOT"
cargo build --release --locked --bin ds4 --bin ds4-quantize 2>/dev/null
BIN="$ROOT/target/release"
CK="$W/checkpoint"
if [ ! -f "$CK/config.json" ]; then
    python3 tools/checkpoint/make_checkpoint.py --model v4 --tame --vocab 129280 --out "$CK"
fi
q() { [ -f "$W/$2.gguf" ] || "$BIN/ds4-quantize" --hf "$CK" --recipe "$1" -o "$W/$2.gguf" --quiet "${@:3}"; }
q f32 f32
q q2 q2
q q4 q4

# The imatrix: the engine's, on the exact (f32) conversion, over this repository's docs.
if [ ! -f "$W/imatrix.gguf" ]; then
    cat docs/*.md > "$W/dataset.txt"
    "$BIN/ds4" -m "$W/f32.gguf" --backend cpu --imatrix-dataset "$W/dataset.txt" \
        --imatrix-out "$W/imatrix.gguf" --imatrix-chunk 256 --imatrix-chunks 8
fi
q q2 q2-imatrix --imatrix "$W/imatrix.gguf"
q q4 q4-imatrix --imatrix "$W/imatrix.gguf"

GGUF_PY="$SRC/gguf-py"
echo "## without an imatrix"
python3 tools/quant_quality.py --f32 "$W/f32.gguf" --ours "$W/q2.gguf" --ours "$W/q4.gguf" \
    --ggml "$LIB" --gguf-py "$GGUF_PY" --json "$W/plain.json"
echo "## with the engine's imatrix"
python3 tools/quant_quality.py --f32 "$W/f32.gguf" --ours "$W/q2-imatrix.gguf" \
    --ours "$W/q4-imatrix.gguf" --imatrix "$W/imatrix.gguf" \
    --ggml "$LIB" --gguf-py "$GGUF_PY" --json "$W/imatrix.json"
