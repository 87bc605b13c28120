#!/usr/bin/env bash
# Conformance of Tessera's tpu_custom_call output with Pallas itself, and of its
# exported artifacts inside JAX programs.
#
# Creates (once, in the cache folder) a Python 3.12 venv with jax/jaxlib
# 0.11.2 from PyPI, exports the Pallas equivalents of four Tessera kernels
# for platforms=["tpu"] on this CPU-only machine, and compares: custom_call
# attributes, backend_config keys, kernel signature and attributes, and the
# copy, semaphore and scope ops one by one. Tessera's
# Mosaic body must deserialize (mosaic-serde{serialize=false}), verify with
# the tpu dialect registered, and survive a serialize/deserialize round trip.
# Also counts the HBM traffic of Pallas's flash attention against `tessera cost`
# (target/conformance/pallas_traffic.md), and libtpu's schedule estimate of
# Tessera's kernels against Pallas's (target/conformance/tpu_estimate.md).
# Runs the kernels across chips beside Pallas's TPU interpret mode, outputs and
# races (target/conformance/pallas_mesh.md). Kernels' random numbers against
# jax.random bit for bit (target/conformance/random/report.md), and 4-bit
# codecs against ml_dtypes (target/conformance/fp4/report.md). The fused
# linear cross-entropy beside tokamax's (target/conformance/llm_kernels.md).
# Then the version matrix (versions.py): the same checks' core with jax 0.12.0.1
# and libtpu 0.0.51, the newest supported, beside 0.11.2 and 0.0.48.1.
# Writes target/conformance/report.md listing every remaining difference
# with its reason; exits non-zero on a failed check or an unexplained
# difference. The checks run side by side (one per core), each one's output
# printed whole when all have ended.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=""
for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    python=$(command -v "$candidate")
    break
  fi
done
if [ -z "$python" ]; then
  echo "conformance: skipped, no Python 3.12 on this machine (jaxlib 0.11.2 needs it)"
  exit 0
fi

cache="${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"
# A venv of jax/jaxlib VERSION with this checkout's tessera-jax (python)
# installed as a user installs it, on every run (no sys.path edits in the
# scripts). Made once in the cache folder, beside its final place and renamed
# into it, so a half-made venv is never used.
jax_venv() { # VERSION
  local v="$cache/conformance-venv-jax-$1"
  if [ ! -x "$v/bin/python" ] || ! "$v/bin/python" -c 'import jax, setuptools' 2>/dev/null; then
    echo "conformance: creating $v (jax==$1, jaxlib==$1)" >&2
    rm -rf "$v" "$v.partial"
    "$python" -m venv "$v.partial"
    "$v.partial/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check "jax==$1" "jaxlib==$1" 'setuptools>=77' >&2
    mv "$v.partial" "$v"
  fi
  "$v/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps --no-build-isolation ./python >&2
  echo "$v"
}
venv=$(jax_venv 0.11.2)
# tokamax's and tpu-inference's kernels (llm_kernels.py), hash-pinned, once per venv.
if ! "$venv/bin/python" -c 'import importlib.util as u; assert all(u.find_spec(m) for m in ("tokamax", "jaxtyping", "tpu_inference"))' 2>/dev/null; then
  "$venv/bin/python" -m pip install --quiet --no-cache-dir --disable-pip-version-check --no-deps \
    --require-hashes -r tests/conformance/anchors.txt >&2
fi

out=target/conformance
mkdir -p "$out"
# The command as `cargo test --workspace` built it for the CLI's tests
# (test profile: opt-level 1, dependencies at 2), found fresh after the
# tests: a release build would compile the whole workspace a second time,
# and even `cargo build -p tessera-cli` resolves features without the
# dev-dependencies and rebuilds runtime, kernels and tooling (45 s on 2
# cores) for nothing these checks measure. `--no-run` leaves that build
# at target/debug/tessera.
cargo test --quiet --workspace --no-run
tessera=./target/debug/tessera
# Both venvs exist before any check starts (the checks run side by side).
newer=$(jax_venv 0.12.0.1)

# The checks are independent programs (each writes its own files under
# $out), mostly one busy core each: they run as jobs, as many at once as
# the machine has cores, longest first, each one's output kept in
# $out/logs/NAME.log and printed, in this order, when all have ended. The
# script fails if any check failed, after every check has run.
logs="$out/logs"
rm -rf "$logs"
mkdir -p "$logs"
slots=$(nproc 2>/dev/null || echo 2)
names=()
check() { # NAME COMMAND...
  local name=$1
  shift
  while [ "$(jobs -rp | wc -l)" -ge "$slots" ]; do wait -n || true; done
  ( set +e; start=$SECONDS; "$@" >"$logs/$name.log" 2>&1; echo $? >"$logs/$name.rc"
    echo $((SECONDS - start)) >"$logs/$name.seconds" ) &
  names+=("$name")
}
for k in add_f32 matmul_bf16_f32 flash_attention_causal_bf16 double_buffered_rows_f32; do
  "$tessera" lower "$k" --target mosaic --out "$out/$k.tessera.mlir"
done
# The version matrix: an artifact loaded and run in jax 0.12.0.1, and every
# preset compiled with libtpu 0.0.51 (the tests compile them with 0.0.48.1);
# with --full the two libtpus' estimates side by side, moves of more than 5%
# reported (target/conformance/versions.md).
check versions "$newer/bin/python" tests/conformance/versions.py "$tessera" "$out" \
  "$cache/libtpu/0.0.48.1/libtpu.so" "$cache/libtpu/0.0.51/libtpu.so"
# Tessera artifacts inside JAX programs (tessera export + the tessera-jax package installed above):
# called on CPU against jax.nn.dot_product_attention and f64, exported for TPU and
# compiled with libtpu. Report in target/conformance/jax/report.md.
mkdir -p "$out/jax"
check jax_export "$venv/bin/python" tests/conformance/jax_export.py "$tessera" "$out/jax"
# Issue 49's kernels beside the anchors: the fused linear cross-entropy
# against tokamax's Pallas kernel (numerics in interpret mode on the same
# inputs, a training step's peak HBM against the unfused JAX graph; libtpu's
# estimate with --full), attention sinks against splash's, dropout inside
# attention against jax.random's mask and jax.grad, the router against tokamax's, the
# fused cache write against Pallas's reference, the gated delta rule against
# tokamax's definition (target/conformance/llm_kernels.md).
check llm_kernels "$venv/bin/python" tests/conformance/llm_kernels.py "$tessera" "$out"
# libtpu's static schedule estimate: Tessera's flash attention (forward and
# backward) and matmul against Pallas's own at the same blocks, each program
# compiled in its own child process; fails when an asserted configuration's
# Tessera/Pallas ratio is above its target (target/conformance/tpu_estimate.md;
# the reported rows, XLA's dot, splash, paged and megablox, with --full).
check tpu_estimate "$venv/bin/python" tests/conformance/tpu_estimate.py "$tessera" "$out"
# Tessera artifacts inside SPMD JAX programs: flash attention per shard in
# shard_map over 8 CPU devices (batch and heads sharded) and its gradient with
# shard_map's default checks; the collective kernels exported from their kernel
# files and called per shard over 4 CPU devices; each program exported for TPU
# and compiled with libtpu for the 4 chips of v5e, v6e, v5p and v7x slices
# (target/conformance/spmd/report.md).
check jax_spmd "$venv/bin/python" tests/conformance/jax_spmd.py "$tessera" "$out"
# Masked attention beside splash attention on the same masks and segment ids:
# outputs against splash (interpret mode) and f64, and Tessera must move no more
# q/k/v bytes than splash's index maps over its own mask info
# (target/conformance/splash.md).
check splash "$venv/bin/python" tests/conformance/splash.py "$tessera" "$out"
# HBM traffic of flash attention against Pallas's own (same pipeline rule):
# Tessera must move no more bytes, causal or not, with a valid length or a
# sliding window (against splash attention) or neither.
check pallas_traffic "$venv/bin/python" tests/conformance/pallas_traffic.py "$tessera" "$out"
# Tessera kernels inside PyTorch programs: export --gpu artifacts through
# tessera_torch (torch.library custom ops with autograd) on the CPU, Triton's
# interpreter running the programs a GPU compiles, against SDPA and float64
# (target/conformance/torch/report.md). Its environment is .ci/setup.sh's.
torch_env="$cache/torch-2.15.0-triton-3.9.0"
check torch_op env PYTHONPATH=python/src "$torch_env/bin/python" tests/conformance/torch_op.py "$tessera" "$out/torch"
# tessera_torch against hostile input: issue 70's findings 1 and 8 by name, then
# 2,000 generated artifacts (flipped bytes, edited fields) and 2,000 calls
# (counts, dtypes, shapes, meta tensors), each an answer or a tessera_torch
# error (target/conformance/hostile_torch.md; the script alone with --full: 10,000 each).
check torch_hostile env PYTHONPATH=python/src "$torch_env/bin/python" tests/conformance/torch_hostile.py "$tessera" "$out"
# Kernels across chips beside Pallas's TPU interpret mode on 4 CPU devices: the
# ring all-gather and the collective matmul give Pallas's outputs on Tessera's
# interpreter and SPMD program, and every race Pallas's detector reports in the
# matmul without its handshake is found by Tessera's interpreter too
# (target/conformance/pallas_mesh.md).
check pallas_mesh "$venv/bin/python" tests/conformance/pallas_mesh.py "$tessera" "$out"
# Random numbers in kernels against jax.random, bit for bit: random_bits (plain
# and one folded key per row) and dropout (f32, bf16) under jax.jit on CPU with
# keys jax made (target/conformance/random/report.md).
check jax_random "$venv/bin/python" tests/conformance/jax_random.py "$tessera" "$out/random"
# 4-bit codecs (int4, float4_e2m1fn, float8_e8m0fnu scales, the halves
# packing) in a kernel on every backend against ml_dtypes, bit for bit
# (target/conformance/fp4/report.md).
check fp4 "$venv/bin/python" tests/conformance/fp4.py "$tessera" "$out/fp4"
# Tessera's tpu_custom_call and Mosaic bodies against Pallas's own exports
# (target/conformance/report.md).
check compare "$venv/bin/python" tests/conformance/compare.py "$out"

wait
failed=()
# The hostile suite's table: a row per surface, written by the Rust
# harnesses (cargo test, which the test command runs first) and by
# torch_hostile.py; each surface must have run at least 2,000 cases, all
# held.
hostile_rows=$out/hostile
{
  echo "# The hostile suite (issue 70): generated cases per surface, each judged"
  echo
  echo "| surface | cases | held | note |"
  echo "|---|---|---|---|"
  cat "$hostile_rows"/*.md 2>/dev/null
} >"$out/hostile.md"
for surface in kernel_files CLI_flags_and_shapes tuning_files artifacts tessera_torch_calls; do
  row=$(cat "$hostile_rows/$surface.md" 2>/dev/null || true)
  if [ -z "$row" ]; then
    failed+=("hostile: no row for ${surface//_/ } (run cargo test first)")
  elif ! awk -F'|' '{ exit !($3 + 0 >= 2000 && $3 + 0 == $4 + 0) }' <<<"$row"; then
    failed+=("hostile: $row")
  fi
done
cat "$out/hostile.md"
for name in "${names[@]}"; do
  echo "== conformance: $name ($(cat "$logs/$name.seconds" 2>/dev/null || echo '?') s)"
  cat "$logs/$name.log"
  rc=$(cat "$logs/$name.rc" 2>/dev/null || echo "no exit status")
  [ "$rc" = 0 ] || failed+=("$name (exit $rc)")
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "conformance: failed: ${failed[*]} (logs in $logs)"
  exit 1
fi
