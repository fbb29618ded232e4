#!/usr/bin/env bash
# FLUX.1-dev on a trn2.3xlarge with the AWS Neuron SDK 2.29, end to end: compile at tp4 and tp2cp2
# (Ulysses), compare every neuron program with the inductor backend's on the same inputs, serve each
# layout and time the paper's request (seed 42, 28 steps, 1024x1024); JSON + markdown in --out, the
# paper's figures beside ours (Tables 3 and 5: 270 ms per step, 14.2 s resident request at tp4).
#
#   bench/trn2_acceptance.sh --checkpoint DIR [--out DIR] [--layouts "tp4 tp2cp2"] [--requests N]
#                            [--cooldown S] [--prompt TEXT] [--skip-compare] [--dry-run]
#
# --dry-run prints every command and runs none. Without the SDK or a Trainium device the script
# runs up to its first SDK call (lower + opt), then stops with one line naming what is missing, exit 2.
# Exit 0: every layout compiled, served, and each program's cosine with inductor's >= 0.999;
# 1: a layout was refused or a program disagrees (the report says which); 2: usage or what is missing.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
HELPER=("$PY" "$REPO/bench/trn2_acceptance.py")

CKPT="" OUT="trn2-acceptance" LAYOUTS="tp4 tp2cp2" REQUESTS=5 COOLDOWN=90 DRY=0 COMPARE=1
PROMPT="a red fox in snow"  # DESIGN.md's request; the paper names none, only seed 42 and the shape
usage() { echo "usage: bench/trn2_acceptance.sh --checkpoint DIR [--out DIR] [--layouts \"tp4 tp2cp2\"]" \
               "[--requests N] [--cooldown S] [--prompt TEXT] [--skip-compare] [--dry-run]" >&2; exit 2; }
need() { [ $# -ge 2 ] && [ -n "$2" ] || { echo "trn2_acceptance: $1 needs a value" >&2; usage; }; }
while [ $# -gt 0 ]; do
    case "$1" in
        --checkpoint) need "$@"; CKPT=$2; shift 2 ;;
        --out) need "$@"; OUT=$2; shift 2 ;;
        --layouts) need "$@"; LAYOUTS=$2; shift 2 ;;
        --requests) need "$@"; REQUESTS=$2; shift 2 ;;
        --cooldown) need "$@"; COOLDOWN=$2; shift 2 ;;
        --prompt) need "$@"; PROMPT=$2; shift 2 ;;
        --skip-compare) COMPARE=0; shift ;;
        --dry-run) DRY=1; shift ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "trn2_acceptance: unknown argument $1" >&2; usage ;;
    esac
done
for n in "$REQUESTS" "$COOLDOWN"; do
    [[ "$n" =~ ^[0-9]+$ ]] && [ "$n" -le 100000 ] || { echo "trn2_acceptance: --requests/--cooldown take a whole number, got '$n'" >&2; exit 2; }
done
[ "$REQUESTS" -ge 1 ] || { echo "trn2_acceptance: --requests must be at least 1" >&2; exit 2; }
for L in $LAYOUTS; do
    case "$L" in tp4|tp2|tp2cp2|tp4+sp) ;; *) echo "trn2_acceptance: --layouts: '$L' is not one of tp4 tp2 tp2cp2 tp4+sp" >&2; exit 2 ;; esac
done
if [ -z "$CKPT" ]; then
    [ "$DRY" = 1 ] && CKPT="<checkpoint>" || { echo "trn2_acceptance: --checkpoint DIR is required (a diffusers-format FLUX.1-dev directory)" >&2; exit 2; }
fi

run() {  # print the command; run it unless --dry-run
    printf '+'; printf ' %q' "$@"; printf '\n'
    [ "$DRY" = 1 ] || "$@"
}
opt_args() {  # the difflet opt arguments of a layout name
    case "$1" in tp2cp2) echo "--parallel tp2cp2 --attention ulysses" ;; *) echo "--parallel $1" ;; esac
}

[ "$DRY" = 1 ] || mkdir -p "$OUT"
export DIFFLET_STORE="$OUT/store"  # an empty store: compile times are the one-time build (paper 7.1)
[ "$DRY" = 1 ] && echo "export DIFFLET_STORE=$OUT/store"

# 1. no SDK needed: the checkpoint, lowering with its configs, one plan per layout
run "${HELPER[@]}" preflight --checkpoint "$CKPT"
run difflet lower "$REPO/models/flux.dsl" --weights "$CKPT" --profile height=1024,width=1024 -o "$OUT/flux.ir"
for L in $LAYOUTS; do
    # shellcheck disable=SC2046  # opt_args is split on purpose
    run difflet opt "$OUT/flux.ir" $(opt_args "$L") --target trn2 --backend neuron -o "$OUT/flux.$L.ir"
done
run difflet opt "$OUT/flux.ir" --parallel tp1 --target cpu --backend inductor -o "$OUT/flux.cpu.ir"

# 2. the first SDK call: stop here, one line, exit 2, when the SDK or the device is missing
run "${HELPER[@]}" sdk --json "$OUT/sdk.json"

# 3. compile every layout for neuron (a layout codegen refuses is reported, the others go on)
FAILED=0 BUILT=""
for L in $LAYOUTS; do
    if run "${HELPER[@]}" timed --json "$OUT/compile-$L.json" -- \
            difflet codegen "$OUT/flux.$L.ir" --backend neuron --weights "$CKPT" -o "$OUT/art-$L"; then
        BUILT="$BUILT $L"
    else
        FAILED=1
    fi
done

# 4. the reference: the same description through the inductor backend on this host's CPU
if [ "$COMPARE" = 1 ]; then
    run "${HELPER[@]}" timed --json "$OUT/compile-cpu.json" -- \
        difflet codegen "$OUT/flux.cpu.ir" --backend inductor --weights "$CKPT" -o "$OUT/art-cpu"
fi

# 5. per built layout: programs vs inductor with the denoiser's step time, then resident serving
#    (serve starts `difflet-runtime --artifacts ART --port 0` and sends gRPC Generate requests)
[ "$DRY" = 1 ] && BUILT=" $LAYOUTS"
for L in $BUILT; do
    if [ "$COMPARE" = 1 ]; then
        run "${HELPER[@]}" compare --neuron "$OUT/art-$L" --reference "$OUT/art-cpu" \
            --json "$OUT/compare-$L.json" || FAILED=1
    fi
    run "${HELPER[@]}" serve --artifacts "$OUT/art-$L" --json "$OUT/serve-$L.json" --image "$OUT/flux-$L.png" \
        --prompt "$PROMPT" --seed 42 --steps 28 --size 1024 --requests "$REQUESTS" --cooldown "$COOLDOWN" || FAILED=1
done

# 6. the report: $OUT/trn2_acceptance.json and .md
# shellcheck disable=SC2086  # one argument per layout
run "${HELPER[@]}" report --dir "$OUT" --layouts $LAYOUTS || FAILED=1  # 1: a program disagrees
exit "$FAILED"
