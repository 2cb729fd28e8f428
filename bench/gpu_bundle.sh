#!/usr/bin/env bash
# The GPU round's bundle (docs/GPU_ROUND.md): everything a machine with an
# NVIDIA GPU and no cargo, no network needs to run bench/gpu_round.sh, in
# one git-ignored folder, gpu-bundle/:
#
#   ds4-bench.gz   the release ds4-bench with the `cuda` feature, stripped
#                  (no debug info, no symbols), gzip -9 (the one binary: it
#                  carries the self-check, --list-devices and the model
#                  generator --make-model)
#   gpu_round.sh   the round itself (a copy of bench/gpu_round.sh)
#   deb/*.deb      the Vulkan loader and the GL dispatch libraries it pulls
#                  in on the NVIDIA driver (libvulkan1, libglvnd0, ...), for
#                  machines without them (the lent GPUs: ../.library/device)
#   MANIFEST       commit, build time, sizes and SHA-256 of each file
#
# Prints the bundle's size (it must stay ≤ 48 MiB: the device tool carries
# at most 64 MiB with the working tree), the exact `carry` list and the
# command line for the device tool's `run`.
#
#   bash bench/gpu_bundle.sh [--no-build] [--no-deb] [--out DIR]
#
# --no-build: bundle target/release/ds4-bench as it is (CI: already built
# with --features cuda); --no-deb: no Vulkan loader (a machine that has one).
# Reuses the release profile's cached build (debug info is stripped here,
# not turned off in the profile, so no second build of the crate).
set -euo pipefail
cd "$(dirname "$0")/.."
out=gpu-bundle
build=1
deb=1
while [ $# -gt 0 ]; do
    case "$1" in
        --no-build) build=0 ;;
        --no-deb) deb=0 ;;
        --out) out="$2"; shift ;;
        *) echo "gpu_bundle.sh: unknown option $1" >&2; exit 2 ;;
    esac
    shift
done
# The packages of ../.library/device/README.md's recipe: the loader, and the
# GL vendor-neutral dispatch the NVIDIA ICD library links against.
DEBS=(libvulkan1 libglvnd0 libegl1 libgl1 libglx0 libopengl0 libgles2)
LIMIT_MIB=48

t0=$(date +%s)
if [ "$build" = 1 ]; then
    echo "== cargo build --release --features cuda --bin ds4-bench"
    cargo build --release --locked --features cuda --bin ds4-bench
fi
bin=target/release/ds4-bench
[ -x "$bin" ] || { echo "gpu_bundle.sh: $bin is missing (build it, or drop --no-build)" >&2; exit 1; }
if "$bin" --list-devices 2>/dev/null | grep -q 'built without the cuda feature'; then
    echo "gpu_bundle.sh: $bin was built without --features cuda" >&2
    exit 1
fi

rm -rf "$out"
mkdir -p "$out"
strip --strip-all -o "$out/ds4-bench" "$bin"
gzip -9 -n "$out/ds4-bench"
cp bench/gpu_round.sh "$out/gpu_round.sh"

if [ "$deb" = 1 ]; then
    mkdir -p "$out/deb"
    # This machine's lists, for amd64 whatever the host (the lent machines
    # are x86-64); a private lists folder when the system's is not ours.
    o=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64)
    if ! (cd "$out/deb" && apt-get "${o[@]}" download "${DEBS[@]}" >/dev/null 2>&1); then
        lists=$(mktemp -d)
        mkdir -p "$lists/partial"
        o+=(-oDir::State::Lists="$lists")
        apt-get "${o[@]}" update >/dev/null 2>&1 || true
        if ! (cd "$out/deb" && apt-get "${o[@]}" download "${DEBS[@]}" >/dev/null 2>&1); then
            echo "gpu_bundle.sh: apt-get download ${DEBS[*]} failed (no package lists or network)" >&2
            rm -rf "$lists"
            exit 1
        fi
        rm -rf "$lists"
    fi
fi

commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
dirty=$(git status --porcelain --untracked-files=no 2>/dev/null | grep -q . && echo " (uncommitted changes)" || true)
{
    echo "ds4 GPU round bundle"
    echo "commit: $commit$dirty"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), $(ldd --version 2>/dev/null | head -1)"
    echo "rustc: $(rustc --version 2>/dev/null || echo unknown)"
    (cd "$out" && find . -type f ! -name MANIFEST | sort | while read -r f; do
        printf '%10d  %s  %s\n' "$(stat -c %s "$f")" "$(sha256sum "$f" | cut -c1-16)" "${f#./}"
    done)
} > "$out/MANIFEST"

bytes=$(du -sb "$out" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN{printf "%.2f", b/1048576}')
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
tree_mib=$(awk -v b="$tree" 'BEGIN{printf "%.1f", b/1048576}')
cat "$out/MANIFEST"
echo
echo "bundle: $out/ ($bytes bytes = $mib MiB; limit $LIMIT_MIB MiB) in $(( $(date +%s) - t0 )) s"
echo "tracked tree beside it: $tree_mib MiB (the device tool carries at most 64 MiB in all)"
if awk -v b="$bytes" -v l="$LIMIT_MIB" 'BEGIN{exit !(b > l*1048576)}'; then
    echo "gpu_bundle.sh: the bundle is over $LIMIT_MIB MiB" >&2
    exit 1
fi
cat <<EOF

carry: ["$out"]
command: bash $out/gpu_round.sh --bundle $out
device tool: run(command="bash $out/gpu_round.sh --bundle $out", carry=["$out"], timeout_s=540)
elsewhere (any NVIDIA machine, the bundle copied there): OUT=results bash $out/gpu_round.sh --bundle $out
EOF
