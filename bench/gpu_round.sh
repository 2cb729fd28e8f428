#!/usr/bin/env bash
# The GPU round (issue 34, docs/GPU_ROUND.md): every GPU check and figure of
# ds4 from one command, on a machine with an NVIDIA GPU and no cargo, no
# network: the bundle of bench/gpu_bundle.sh (one stripped ds4-bench with
# the cuda feature, the Vulkan loader as .deb files) and this script.
#
#   bash gpu-bundle/gpu_round.sh --bundle gpu-bundle     (the device)
#   bash bench/gpu_round.sh --dry                        (rehearsal: CI)
#
# Steps, each under its own time cap (a failed or timed-out step is
# recorded and the round goes on), in at most 8 minutes on an H100:
#   env        nvidia-smi, the driver, NVRTC, `ds4-bench --list-devices`
#   check      `ds4-bench --check cuda`, then `--check wgpu` through the
#              NVIDIA Vulkan driver (the carried loader unpacked here)
#   model      the 4-layer Flash-width bench model (random blocks, 8.85 GiB)
#   bandwidth  `ds4-bench --bandwidth --bw-decode` on cuda, then wgpu
#   speed      prefill and decode tokens/s: cuda (graph on, off, tensor-core
#              prefill), wgpu (subgroup and workgroup-memory kernels)
#   sessions   `ds4-bench --sessions 1,8,16` on cuda
# Every figure lands in 8 files under $OUT (the device tool returns at most
# 8): summary.txt, round.log, env.txt, check-cuda.csv, check-wgpu.csv,
# bandwidth.txt, speed.csv, sessions.csv; the summary table is printed last.
#
# --dry: the same steps on this machine against lavapipe (Mesa's CPU Vulkan
# driver) and the CUDA host emulator of tests/cuda_emu (its libcuda.so:
# DS4_CUDA_EMU_DIR, else target/tmp/cuda-emu-current, which any cargo test
# of the CUDA half leaves), with tiny sizes: the quick self-check and the
# tiny q8 model instead of the bench model. Exit status: 0 when every step
# passed, 1 otherwise (the round itself always runs to the end).
set -uo pipefail

here=$(cd "$(dirname "$0")" && pwd)
dry=0
bundle=""
bin=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry) dry=1 ;;
        --bundle) bundle="$2"; shift ;;
        --bin) bin="$2"; shift ;;
        -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
        *) echo "gpu_round.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done

if [ "$dry" = 1 ]; then
    OUT=${OUT:-$here/../target/gpu-round-dry}
else
    OUT=${OUT:-$PWD/gpu-round-out}
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${WORK:-$(mktemp -d "${TMPDIR:-/tmp}/ds4-round.XXXXXX")}
mkdir -p "$WORK"
LOG="$OUT/round.log"
: > "$LOG"
SUMMARY=()
FAILED=0
t_round=$(date +%s)

say() { echo "$*" | tee -a "$LOG"; }

# step NAME CAP_S CMD...: runs CMD under `timeout`, its output into the log
# (and the terminal), and records ok / FAIL (rc) / TIMEOUT with the time.
step() {
    local name=$1 cap=$2
    shift 2
    local t0 t1 rc status left
    # The round's own budget: a step gets at most what is left of it, and
    # none when less than 15 s are (recorded as skipped).
    left=$(( ROUND_BUDGET - ($(date +%s) - t_round) ))
    if [ "$left" -lt 15 ]; then
        LAST_STATUS="SKIPPED"; LAST_SECS=0; FAILED=1
        say "-- $name: skipped, the round's ${ROUND_BUDGET} s are spent"
        return
    fi
    [ "$cap" -gt $((left - 5)) ] && cap=$((left - 5))
    say ""
    say "== $name (cap ${cap} s): $*"
    t0=$(date +%s.%N)
    timeout -k 10 "$cap" "$@" 2>&1 | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    t1=$(date +%s.%N)
    if [ "$rc" = 0 ]; then
        status=ok
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        status="TIMEOUT"
        FAILED=1
    else
        status="FAIL rc $rc"
        FAILED=1
    fi
    LAST_SECS=$(awk -v a="$t0" -v b="$t1" 'BEGIN{printf "%.1f", b-a}')
    LAST_STATUS=$status
    say "-- $name: $status in $LAST_SECS s"
}

# record NAME FIGURE: one row of the summary table for the last step.
record() {
    SUMMARY+=("$(printf '%-28s %-12s %8s s  %s' "$1" "$LAST_STATUS" "$LAST_SECS" "$2")")
}

# ---- the binary -----------------------------------------------------------
if [ -z "$bin" ]; then
    if [ -n "$bundle" ]; then
        if [ -f "$bundle/ds4-bench.gz" ]; then
            gzip -dc "$bundle/ds4-bench.gz" > "$WORK/ds4-bench" && chmod +x "$WORK/ds4-bench"
            bin="$WORK/ds4-bench"
        else
            bin="$bundle/ds4-bench"
        fi
    else
        bin="$here/../target/release/ds4-bench"
    fi
fi
if [ ! -x "$bin" ]; then
    echo "gpu_round.sh: no ds4-bench at $bin (build the bundle: bash bench/gpu_bundle.sh)" >&2
    exit 1
fi

# ---- sizes ------------------------------------------------------------------
if [ "$dry" = 1 ]; then
    CHECK_SIZE=quick
    MODEL_KIND=tiny:q8
    BW_ARGS=(--bw-mib 2 --bw-trials 1 --bw-max-out 24 --bw-decode-steps 1)
    SPEED_CTX=8; SPEED_GEN=1
    SESSIONS=1,2; SESSION_PROMPT=4; SESSION_GEN=1
    CAP_CHECK=240; CAP_MODEL=60; CAP_BW=60; CAP_SPEED=60; CAP_SESSIONS=90
    ROUND_BUDGET=${ROUND_BUDGET:-900}
else
    CHECK_SIZE=full
    MODEL_KIND=flash:4
    BW_ARGS=(--bw-mib 1024 --bw-trials 3 --bw-decode-steps 8)
    SPEED_CTX=512; SPEED_GEN=64
    SESSIONS=1,8,16; SESSION_PROMPT=64; SESSION_GEN=32
    CAP_CHECK=150; CAP_MODEL=100; CAP_BW=45; CAP_SPEED=35; CAP_SESSIONS=50
    # 8 minutes in all, the unpacking included.
    ROUND_BUDGET=${ROUND_BUDGET:-470}
fi

# ---- env: driver, NVRTC, Vulkan loader ---------------------------------------
{
    echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "host: $(uname -srm), $(nproc) CPUs, $(awk '/MemTotal/{printf "%.0f GiB", $2/1048576}' /proc/meminfo)"
    echo "mode: $([ "$dry" = 1 ] && echo "dry (lavapipe + the CUDA host emulator)" || echo device)"
    echo "binary: $bin"
    [ -f "${bundle:-/nonexistent}/MANIFEST" ] && sed 's/^/bundle: /' "$bundle/MANIFEST"
} > "$OUT/env.txt"

if [ "$dry" = 1 ]; then
    # The emulator's libcuda.so stands in for the driver.
    emu=${DS4_CUDA_EMU_DIR:-$here/../target/tmp/cuda-emu-current}
    if [ -f "$emu/libcuda.so" ]; then
        export LD_LIBRARY_PATH="$(cd "$emu" && pwd -P)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "cuda: the host emulator $(cd "$emu" && pwd -P)/libcuda.so" >> "$OUT/env.txt"
    else
        echo "cuda: no emulator at $emu (run cargo test --release --features cuda --test cuda_cli once)" >> "$OUT/env.txt"
    fi
    export XDG_RUNTIME_DIR=${XDG_RUNTIME_DIR:-$(mktemp -d)}
else
    if command -v nvidia-smi >/dev/null 2>&1; then
        nvidia-smi >> "$OUT/env.txt" 2>&1
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem,power.limit \
            --format=csv >> "$OUT/env.txt" 2>&1
    else
        echo "nvidia-smi: not found" >> "$OUT/env.txt"
    fi
fi

# NVRTC: DS4_NVRTC if set, else the CUDA toolkit's, else the loader path's,
# else a PyPI wheel (the torch venv's nvidia-cuda-nvrtc). It must not be
# newer than the driver: a driver rejects PTX of a newer ISA, so PTX is
# compiled here at the first CUDA start (a second or two a family) into
# a fresh cache that every later step reads.
find_nvrtc() {
    local c
    for c in /usr/local/cuda/lib64/libnvrtc.so* /usr/local/cuda-*/lib64/libnvrtc.so* \
             /usr/local/cuda/targets/x86_64-linux/lib/libnvrtc.so*; do
        [ -f "$c" ] && { echo "$c"; return; }
    done
    c=$(ldconfig -p 2>/dev/null | awk '/libnvrtc\.so/{print $NF; exit}')
    [ -n "$c" ] && { echo "$c"; return; }
    for py in python3 /opt/torch/.venv/bin/python3; do
        c=$("$py" -c "import nvidia, os, glob; print(sorted(p for d in nvidia.__path__ for s in ('cu13','cuda_nvrtc','cu12') for p in glob.glob(os.path.join(d, s, 'lib', 'libnvrtc.so*')) if 'builtins' not in p)[0])" 2>/dev/null)
        [ -n "$c" ] && { echo "$c"; return; }
    done
}
if [ -z "${DS4_NVRTC:-}" ]; then
    DS4_NVRTC=$(find_nvrtc || true)
fi
if [ -n "${DS4_NVRTC:-}" ]; then
    export DS4_NVRTC
    echo "nvrtc: $DS4_NVRTC" >> "$OUT/env.txt"
else
    unset DS4_NVRTC
    echo "nvrtc: not found (the CUDA steps will say so)" >> "$OUT/env.txt"
fi
export DS4_CUDA_CACHE="$WORK/ptx"

# The Vulkan loader (and the GL dispatch libraries the NVIDIA ICD links)
# from the bundle, unpacked into a private folder on LD_LIBRARY_PATH: no
# root, nothing written outside $WORK. Where no ICD file of NVIDIA's is in
# the loader's search path, point it at the driver's (the lent machines
# mount the driver under /usr/local/nvidia).
if [ -n "$bundle" ] && ls "$bundle"/deb/*.deb >/dev/null 2>&1; then
    for f in "$bundle"/deb/*.deb; do dpkg -x "$f" "$WORK/vk" 2>>"$OUT/env.txt"; done
    vklib=$(find "$WORK/vk" -name 'libvulkan.so.1' -printf '%h\n' 2>/dev/null | head -1)
    if [ -n "$vklib" ]; then
        export LD_LIBRARY_PATH="$vklib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
        echo "vulkan loader: $vklib (carried)" >> "$OUT/env.txt"
    fi
else
    echo "vulkan loader: the system's ($(ldconfig -p 2>/dev/null | awk '/libvulkan\.so\.1/{print $NF; exit}'))" >> "$OUT/env.txt"
fi
if [ "$dry" = 0 ] && [ -z "${VK_DRIVER_FILES:-}" ] \
    && ! ls /usr/share/vulkan/icd.d/nvidia* /etc/vulkan/icd.d/nvidia* >/dev/null 2>&1; then
    for j in /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json /usr/share/vulkan/icd.d/nvidia_icd.x86_64.json; do
        if [ -f "$j" ]; then export VK_DRIVER_FILES=$j; echo "vulkan ICD: $j" >> "$OUT/env.txt"; break; fi
    done
fi

step "env: list devices" 60 "$bin" --list-devices
record "env: list devices" "$(grep -m1 -E '^cuda' "$LOG" | cut -c1-70)"
grep -E '^(cuda|[0-9]+: )' "$LOG" >> "$OUT/env.txt"
cat "$OUT/env.txt" >> "$LOG"

# ---- the self-checks ------------------------------------------------------------
MODELS="$WORK/models"
for b in cuda wgpu; do
    step "check $b ($CHECK_SIZE)" "$CAP_CHECK" "$bin" --check "$b" --check-size "$CHECK_SIZE" \
        --check-dir "$MODELS" --csv "$OUT/check-$b.csv"
    record "check $b" "$(grep -E "^self-check $b " "$LOG" | tail -1 | sed 's/^self-check [a-z]* ([a-z]*): //')"
done

# ---- the bench model -----------------------------------------------------------
model="$WORK/bench-model.gguf"
step "model $MODEL_KIND" "$CAP_MODEL" "$bin" --make-model "$MODEL_KIND" -m "$model"
record "model $MODEL_KIND" "$(du -h "$model" 2>/dev/null | cut -f1)"
have_model=0
[ -f "$model" ] && have_model=1

# A plain-text prompt of well over SPEED_CTX tokens (the bench model has the
# V4 vocabulary).
prompt="$WORK/prompt.txt"
for i in $(seq 1 $((SPEED_CTX / 4 + 64))); do
    echo "Paragraph $i: the quick brown fox jumps over the lazy dog, then counts to $((i * 7))."
done > "$prompt"

# ---- bandwidth -----------------------------------------------------------------
: > "$OUT/bandwidth.txt"
for b in cuda wgpu; do
    args=(--bandwidth --backend "$b" "${BW_ARGS[@]}" --csv "$WORK/bw-$b.csv")
    [ "$have_model" = 1 ] && args+=(--bw-decode -m "$model")
    step "bandwidth $b" "$CAP_BW" "$bin" "${args[@]}"
    record "bandwidth $b" "$(grep -E '^device read' "$LOG" | tail -1 | tr -s ' ' | cut -c1-60)"
    { echo "# $b"; sed -n "/^== bandwidth $b/,/^-- bandwidth $b/p" "$LOG"; echo "# $b csv";
      cat "$WORK/bw-$b.csv" 2>/dev/null; } >> "$OUT/bandwidth.txt"
done

# ---- prefill and decode speed ---------------------------------------------------
echo "config,ctx_tokens,prefill_tokens,prefill_tps,gen_tokens,gen_tps,kvcache_bytes" > "$OUT/speed.csv"
speed() { # LABEL BACKEND [ENV...]
    local label=$1 backend=$2
    shift 2
    local csv="$WORK/speed-${label// /-}.csv"
    step "speed $label" "$CAP_SPEED" env "$@" "$bin" -m "$model" --backend "$backend" \
        --prompt-file "$prompt" --ctx-start "$SPEED_CTX" --ctx-max "$SPEED_CTX" -n "$SPEED_GEN" \
        --warm-weights --csv "$csv"
    local row
    row=$(tail -n +2 "$csv" 2>/dev/null | head -1)
    [ -n "$row" ] && echo "$label,$(echo "$row" | cut -d, -f1-6)" >> "$OUT/speed.csv"
    record "speed $label" "$(echo "$row" | awk -F, 'NF>=5{printf "prefill %.1f tok/s, decode %.1f tok/s", $3, $5}')"
}
if [ "$have_model" = 1 ]; then
    speed "cuda" cuda DS4_CUDA_GRAPH=1 DS4_CUDA_MMA=0
    speed "cuda graph off" cuda DS4_CUDA_GRAPH=0 DS4_CUDA_MMA=0
    speed "cuda tensor cores" cuda DS4_CUDA_GRAPH=1 DS4_CUDA_MMA=1
    speed "wgpu subgroups" wgpu DS4_WGPU_FEATURES=all
    speed "wgpu workgroup" wgpu DS4_WGPU_FEATURES=f16,timestamps
fi

# ---- batched sessions ----------------------------------------------------------------
if [ "$have_model" = 1 ]; then
    step "sessions $SESSIONS cuda" "$CAP_SESSIONS" "$bin" -m "$model" --backend cuda \
        --sessions "$SESSIONS" --session-prompt "$SESSION_PROMPT" -n "$SESSION_GEN" \
        --csv "$OUT/sessions.csv"
    record "sessions $SESSIONS cuda" "$(tail -n 1 "$OUT/sessions.csv" 2>/dev/null | awk -F, 'NF>=8{printf "%s sessions: %.1f tok/s together", $2, $7}')"
fi

# ---- summary ------------------------------------------------------------------------
total=$(( $(date +%s) - t_round ))
{
    echo "ds4 GPU round ($([ "$dry" = 1 ] && echo dry || echo device)), $(date -u +%Y-%m-%dT%H:%M:%SZ), $total s in all"
    head -1 "$OUT/env.txt" >/dev/null
    grep -m1 -E '^cuda(:0| )' "$OUT/env.txt" || true
    printf '%-28s %-12s %10s  %s\n' step status time figure
    for row in "${SUMMARY[@]}"; do echo "$row"; done
    echo "result: $([ "$FAILED" = 0 ] && echo "every step passed" || echo "some steps FAILED (round.log has why)")"
    echo "files: $(cd "$OUT" && ls | tr '\n' ' ')"
} > "$OUT/summary.txt"
echo
cat "$OUT/summary.txt" | tee -a "$LOG"
[ "${KEEP_WORK:-0}" = 1 ] || rm -rf "$WORK"
exit "$FAILED"
