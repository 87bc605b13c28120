#!/usr/bin/env bash
# Tessera's GPU device check: on an NVIDIA GPU (Hopper or newer for the
# tutorial baseline's TMA path), with python3 holding torch, triton and
# jax[cuda] (jax-cuda13-pjrt/plugin; the CUDA image's):
#
#   1. every catalog kernel and preset (`tessera cases`): its Triton program
#      compiled by the installed Triton and run on the GPU through
#      tessera_torch, each output copied back and compared in float64 with
#      the kernel's f64 reference and tolerance             -> $OUT/cases.md
#   2. flash attention forward and backward, bf16, d=128, S=1k..16k, causal
#      and not, exported with `tessera export --gpu` and called through
#      tessera_torch: TFLOP/s beside torch's scaled_dot_product_attention
#      (cuDNN / flash) and Triton's tutorial kernel, with ratios -> $OUT/bench.md
#   3. an exported artifact through JAX on the GPU (its cuda branch, XLA's
#      Triton custom call), forward and jax.grad against float64 -> $OUT/jax.md
#   4. Tessera's graph runtime on JAX's CUDA PJRT plugin: `tessera train`
#      (a transformer's forward, backward and AdamW through flash attention,
#      rms_norm and swiglu kernels, each a Triton custom call) must reach its
#      loss threshold                                        -> $OUT/runtime.md
#      (needs the tessera binary on the GPU machine: $TESSERA_BIN or the one
#      `cargo build` made; skipped without it)
#
# Usage:
#   tests/gpu/run.sh                    prepare here (cargo, and Triton from
#                                       .ci/setup.sh for the TTIR) and run
#   tests/gpu/run.sh --prepare DIR      prepare only, into DIR (under 64 MiB):
#                                       on a machine without a GPU. DIR is
#                                       the caller's (relative to where you
#                                       are); it must be new, empty or an
#                                       earlier --prepare folder, which is
#                                       replaced only once the new one is
#                                       whole; any failure exits non-zero
#   TESSERA_GPU_INPUTS=DIR tests/gpu/run.sh
#                                       run on inputs prepared elsewhere: the
#                                       GPU machine needs no Rust, no Tessera
#
# TESSERA_GPU_STEPS (default "cases bench jax runtime") runs only the steps
# named; "tune" (not a default) times the attention backward's dq and dk/dv
# programs alone at three block shapes x warps x stages (-> $OUT/tune.md),
# the table its GPU rule in kernels/src/attention/vjp.rs is read from.
#
# Triton's tutorial (python/tutorials/06-fused-attention.py of the Triton
# release installed) is a baseline, never part of Tessera: --prepare copies
# it from $TRITON_TUTORIAL_ATTENTION or downloads it; without it the
# tutorial columns are empty. Writes $OUT (default target/gpu) and exits 0
# when every kernel is within tolerance and the JAX check passes; speed is
# reported, not asserted. Each step has its own time limit; the whole run
# stays under 8 minutes on an H200.
set -uo pipefail
# Paths on the command line are the caller's: resolved before the cd.
caller=$(pwd)
cd "$(dirname "$0")/../.."
root=$(pwd)

# What --prepare leaves in a folder it made, so a later --prepare knows the
# folder is its own to replace; it replaces nothing else.
MARK=.tessera-gpu-inputs

prepare() { # DIR (absolute, no trailing slash)
  local dir=$1
  if [ -e "$dir" ] || [ -L "$dir" ]; then
    if [ -L "$dir" ] || [ ! -d "$dir" ]; then
      echo "run.sh: $dir exists and is not a directory; name a new or empty directory" >&2
      return 2
    fi
    if [ -n "$(ls -A "$dir")" ] && [ ! -f "$dir/$MARK" ]; then
      echo "run.sh: $dir is not empty and not an earlier --prepare folder (no $MARK); name a new or empty directory" >&2
      return 2
    fi
  fi
  mkdir -p "$(dirname "$dir")" || return 1
  local tessera=${TESSERA_BIN:-}
  if [ -z "$tessera" ]; then
    .ci/setup.sh >&2 || return 1
    cargo build --quiet --release -p tessera-cli --bin tessera || return 1
    tessera=$root/target/release/tessera
  fi
  # A fresh staging folder beside DIR (never one that was there), removed
  # whatever happens; DIR is replaced only once it is whole.
  local p
  p=$(mktemp -d "$dir.partial.XXXXXX") || return 1
  trap 'rm -rf "${p:-}"; trap - RETURN' RETURN
  mkdir -p "$p/bench" "$p/jax" "$p/baselines" || return 1
  echo "tessera GPU check inputs, made by tests/gpu/run.sh --prepare" >"$p/$MARK" || return 1
  "$tessera" cases --out "$p/cases.d" >&2 || return 1
  # Packed: random test data, the largest part of what travels.
  (cd "$p" && mv cases.d cases && tar -cf - cases | xz -T0 -3 >cases.tar.xz && rm -rf cases) || return 1
  # Flash attention at the bench's shapes, 128 x 128 blocks: the forward
  # at 8 warps (no spills, 224 KiB of shared memory at 3 stages on sm_90),
  # the backward at 64-row query blocks (its GPU rule for head dim 128,
  # where 128 rows spill: `tessera compile --gpu sm_90`).
  local b=2 h=16 d=128 cases_json="" sep=""
  for s in 1024 2048 4096 8192 16384; do
    for causal in false true; do
      local name="fa_${s}_${causal}"
      "$tessera" export flash_attention --config dtype=bf16 --config causal=$causal \
        --config block_q=128 --config block_k=128 \
        --shape q=${b}x${h}x${s}x${d} --shape k=${b}x${h}x${s}x${d} --shape v=${b}x${h}x${s}x${d} \
        --gpu --out "$p/bench/$name" >&2 || return 1
      cases_json+="$sep{\"seq\": $s, \"causal\": $causal, \"dir\": \"$name\"}"
      sep=", "
    done
  done
  printf '{"batch": %d, "heads": %d, "head_dim": %d, "cases": [%s]}\n' $b $h $d "$cases_json" >"$p/bench/bench.json" || return 1
  # The backward's launch shapes (the `tune` step): the forward's blocks
  # (bq, bk) give the dq kernel bq x min(bk, 64) and the dk/dv kernel
  # min(bq, 64) x bk at head dim 128 on GPUs (attention/vjp.rs); bk stays
  # 128, as the artifact's TPU branch needs (col-major k: 128 lanes).
  mkdir -p "$p/tune" || return 1
  cases_json="" sep=""
  for s in 4096 8192; do
    for causal in false true; do
      for blocks in 128x128 64x128 32x128; do
        local bq=${blocks%x*} bk=${blocks#*x} name="tune_${s}_${causal}_${blocks}"
        "$tessera" export flash_attention --config dtype=bf16 --config causal=$causal \
          --config block_q=$bq --config block_k=$bk \
          --shape q=${b}x${h}x${s}x${d} --shape k=${b}x${h}x${s}x${d} --shape v=${b}x${h}x${s}x${d} \
          --gpu --out "$p/tune/$name" >&2 || return 1
        cases_json+="$sep{\"seq\": $s, \"causal\": $causal, \"dir\": \"$name\", \"dq\": \"${bq}x$((bk < 64 ? bk : 64))\", \"dkv\": \"$((bq < 64 ? bq : 64))x${bk}\"}"
        sep=", "
      done
    done
  done
  printf '{"batch": %d, "heads": %d, "head_dim": %d, "cases": [%s]}\n' $b $h $d "$cases_json" >"$p/tune/tune.json" || return 1
  "$tessera" export flash_attention --config dtype=bf16 --config causal=true \
    --shape q=1x2x256x64 --shape k=1x2x256x64 --shape v=1x2x256x64 --gpu --out "$p/jax/artifact" >&2 || return 1
  printf '{"what": "flash_attention, bf16, causal, 1x2x256x64", "shape": [1, 2, 256, 64], "causal": true, "fwd_tol": 0.03, "dq_tol": 0.1}\n' >"$p/jax/spec.json" || return 1
  local tut=${TRITON_TUTORIAL_ATTENTION:-}
  if [ -n "$tut" ] && [ -f "$tut" ]; then
    cp "$tut" "$p/baselines/06-fused-attention.py" || return 1
  else
    local v
    v=$("${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}/triton-3.9.0/bin/python" -c 'import triton; print(triton.__version__)' 2>/dev/null || echo 3.9.0)
    curl -fsSL --max-time 20 "https://raw.githubusercontent.com/triton-lang/triton/v$v/python/tutorials/06-fused-attention.py" \
      -o "$p/baselines/06-fused-attention.py" 2>/dev/null ||
      echo "run.sh: no Triton tutorial source (set TRITON_TUTORIAL_ATTENTION); its columns stay empty" >&2
  fi
  if [ -e "$dir" ]; then
    local old
    old=$(mktemp -d "$dir.old.XXXXXX") || return 1
    mv "$dir" "$old/" || return 1
    mv "$p" "$dir" || { mv "$old/$(basename "$dir")" "$dir"; rm -rf "$old"; return 1; }
    rm -rf "$old"
  else
    mv "$p" "$dir" || return 1
  fi
  echo "run.sh: prepared $dir ($(du -sh "$dir" | cut -f1))" >&2
}

if [ "${1:-}" = "--prepare" ]; then
  [ $# -eq 2 ] && [ -n "$2" ] || { echo "usage: tests/gpu/run.sh --prepare DIR" >&2; exit 2; }
  dir=$2
  while [ "${#dir}" -gt 1 ] && [ "${dir%/}" != "$dir" ]; do dir=${dir%/}; done
  case $dir in /*) ;; *) dir=$caller/$dir ;; esac
  case $(basename "$dir") in
    / | . | ..) echo "run.sh: --prepare $2 names no folder of its own; name a new or empty directory" >&2; exit 2 ;;
  esac
  prepare "$dir"
  exit $?
fi

OUT=${OUT:-$root/target/gpu}
mkdir -p "$OUT"
steps=" ${TESSERA_GPU_STEPS:-cases bench jax runtime} "
python=${PYTHON:-python3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$work/logs"
if [[ $steps == *" cases "* || $steps == *" bench "* || $steps == *" jax "* || $steps == *" tune "* ]]; then
  inputs=${TESSERA_GPU_INPUTS:-}
  if [ -z "$inputs" ]; then
    inputs=$root/target/gpu-inputs
    prepare "$inputs" || { echo "run.sh: preparing the inputs failed" >&2; exit 1; }
  fi
  cp -r "$inputs/." "$work/" || exit 1
  if [ -f "$work/cases.tar.xz" ]; then
    (cd "$work" && "$python" -c 'import tarfile; tarfile.open("cases.tar.xz").extractall(".", filter="data")') || exit 1
  fi
fi
export PYTHONPATH=$root/python/src${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false TRITON_CACHE_DIR=$work/triton-cache
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >"$OUT/gpu.txt" 2>&1 || true
"$python" -c 'import torch, triton, jax; print(f"torch {torch.__version__}, triton {triton.__version__}, jax {jax.__version__}")' >>"$OUT/gpu.txt" 2>&1
cat "$OUT/gpu.txt"
status=0
start=$(date +%s)

# 1. The catalog, 8 processes (Triton compiles one program at a time per
#    process; the GPU runs them all).
if [[ $steps == *" cases "* ]]; then
  for i in 0 1 2 3 4 5 6 7; do
    timeout 150 "$python" tests/gpu/device.py cases "$work" "$OUT" --shard $i/8 >"$work/logs/cases_$i.log" 2>&1 &
  done
  wait
  "$python" tests/gpu/device.py merge "$OUT" || status=1
  echo "run.sh: cases done at $(($(date +%s) - start)) s"
fi

# 2. Flash attention: compile every program first in 8 processes (Triton's
#    cache then serves the timing process), then time in one.
if [[ $steps == *" bench "* ]]; then
  for i in 0 1 2 3 4 5 6 7; do
    timeout 150 "$python" tests/gpu/device.py bench "$work" "$OUT" --warm $i/8 >"$work/logs/warm_$i.log" 2>&1 &
  done
  wait
  echo "run.sh: compiles done at $(($(date +%s) - start)) s"
  timeout 180 "$python" tests/gpu/device.py bench "$work" "$OUT" >"$work/logs/bench.log" 2>&1 ||
    echo "run.sh: the bench stopped early (see bench.log)"
  echo "run.sh: bench done at $(($(date +%s) - start)) s"
fi

# 2b. The backward's programs at other launch shapes (not a default step).
if [[ $steps == *" tune "* ]]; then
  for i in $(seq 0 15); do
    timeout 150 "$python" tests/gpu/device.py tune "$work" "$OUT" --warm $i/16 >"$work/logs/tunewarm_$i.log" 2>&1 &
  done
  wait
  timeout 150 "$python" tests/gpu/device.py tune "$work" "$OUT" >"$work/logs/tune.log" 2>&1 ||
    echo "run.sh: the tuning stopped early (see tune.log)"
  echo "run.sh: tune done at $(($(date +%s) - start)) s"
fi

# 3. JAX.
if [[ $steps == *" jax "* ]]; then
  timeout 90 "$python" tests/gpu/device.py jax "$work" "$OUT" >"$work/logs/jax.log" 2>&1 || status=1
  echo "run.sh: jax done at $(($(date +%s) - start)) s"
fi

# 4. The graph runtime on the CUDA plugin.
tessera=${TESSERA_BIN:-$root/target/release/tessera}
if [[ $steps == *" runtime "* ]]; then
  plugin=$("$python" -c 'import glob, os, jax_plugins.xla_cuda13 as m; print(glob.glob(os.path.join(os.path.dirname(m.__file__), "*.so"))[0])' 2>/dev/null)
  if [ ! -x "$tessera" ] || [ -z "$plugin" ]; then
    echo "skipped: no tessera binary ($tessera) or no CUDA PJRT plugin on this machine" >"$OUT/runtime.md"
  else
    {
      echo "\`tessera train\` on the PJRT plugin $plugin (TESSERA_PJRT_PLUGIN), kernel calls as Triton custom calls (TTIR from Triton $("$python" -c 'import triton; print(triton.__version__)')):"
      echo
      echo '```'
      TESSERA_PJRT_PLUGIN=$plugin TESSERA_TRITON_PYTHON=$(command -v "$python") TESSERA_CACHE=$work/tessera-cache \
        timeout 240 "$tessera" train --quiet 2>&1 | tail -15
      echo "exit status ${PIPESTATUS[0]}"
      echo '```'
    } >"$OUT/runtime.md"
    grep -q "^exit status 0$" "$OUT/runtime.md" || status=1
  fi
  echo "run.sh: runtime done at $(($(date +%s) - start)) s"
fi

for f in "$work"/logs/*.log; do echo "== $(basename "$f")"; tail -40 "$f"; done >"$OUT/logs.txt" 2>/dev/null
{
  echo "# Tessera on $(head -1 "$OUT/gpu.txt"), $(date -u +%Y-%m-%d)"
  sed -n 2p "$OUT/gpu.txt"
  for f in cases bench tune jax runtime; do
    echo
    echo "## $f"
    echo
    cat "$OUT/$f.md" 2>/dev/null || { echo "(no result: see $f.log)"; tail -5 "$OUT/$f.log" 2>/dev/null; }
  done
} >"$OUT/summary.md"
cat "$OUT/summary.md"
exit $status
