#!/usr/bin/env bash
# Downloads a published DeepSeek V4 Flash GGUF for ds4 from Hugging Face
# (antirez/deepseek-v4-gguf) and links it as ./ds4flash.gguf.
#
#   tools/download_model.sh q2          # 81 GB, IQ2_XXS/Q2_K experts (runs on CPU too)
#   tools/download_model.sh q2-imatrix  # same size, imatrix-weighted (preferred)
#   tools/download_model.sh q4          # 153 GB, Q4_K experts
#   tools/download_model.sh q4-imatrix
#   tools/download_model.sh mtp         # 3.6 GB optional MTP draft model
set -euo pipefail
repo="antirez/deepseek-v4-gguf"
case "${1:-}" in
  q2) f="DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2.gguf" ;;
  q2-imatrix) f="DeepSeek-V4-Flash-IQ2XXS-w2Q2K-AProjQ8-SExpQ8-OutQ8-chat-v2-imatrix.gguf" ;;
  q4) f="DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2.gguf" ;;
  q4-imatrix) f="DeepSeek-V4-Flash-Q4KExperts-F16HC-F16Compressor-F16Indexer-Q8Attn-Q8Shared-Q8Out-chat-v2-imatrix.gguf" ;;
  mtp) f="DeepSeek-V4-Flash-MTP-Q4K-Q8_0-F32.gguf" ;;
  *) sed -n '2,9p' "$0"; exit 2 ;;
esac
dir="${DS4_MODEL_DIR:-models}"
mkdir -p "$dir"
url="https://huggingface.co/$repo/resolve/main/$f"
echo "downloading $f into $dir/ (resumable)"
if command -v huggingface-cli >/dev/null 2>&1; then
  huggingface-cli download "$repo" "$f" --local-dir "$dir"
else
  curl -L --fail -C - -o "$dir/$f" "$url"
fi
if [ "$1" = mtp ]; then
  echo "use it with: ds4 --mtp $dir/$f"
else
  ln -sf "$dir/$f" ds4flash.gguf
  echo "linked ./ds4flash.gguf -> $dir/$f"
fi
