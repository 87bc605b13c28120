#!/usr/bin/env bash
# Writes the self-contained H200 check into DIR (default target/gpu-check):
# Tessera's flash attention lowered to decomposed StableHLO at a few shapes,
# and h200_attention.py, which runs them through the CUDA PJRT plugin
# (jax-cuda13-pjrt 0.11.2 with jax 0.11.2, present on the GPU machines)
# against jax.nn.dot_product_attention and an f64 reference. Nothing else in
# the project needs a GPU; run the script on the GPU machine with
#   python3 DIR/h200_attention.py DIR            (or --platform cpu here)
set -euo pipefail
cd "$(dirname "$0")/../.."
out="${1:-target/gpu-check}"
mkdir -p "$out"
cargo build --quiet --release -p tessera-cli --bin tessera
for s in 1024 2048 4096; do
  for causal in false true; do
    ./target/release/tessera lower flash_attention --target decomposed \
      --config causal=$causal --config sm_scale=0.08838834764831845 \
      --config block_q=128 --config block_k=128 \
      --shape q=1x8x${s}x128 --shape k=1x8x${s}x128 --shape v=1x8x${s}x128 \
      --out "$out/fa_s${s}_causal_${causal}.mlir"
  done
done
cp tests/gpu/h200_attention.py "$out/"
du -sh "$out"
