#!/usr/bin/env bash
# How far a Tessera artifact gets into TorchTPU without a TPU (tests/torchtpu/probe.py).
#
# Creates (once, in the cache folder) a Python 3.12 venv with torch-tpu 0.2.0 and
# the versions it needs (torch 2.15.0, libtpu 0.0.51) plus jax/jaxlib 0.11.2:
# about 7 GB (torch's CUDA dependencies come with it from PyPI) and a few minutes
# to install, which is why CI does not run it. Report in target/torchtpu/report.md.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=""
for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    python=$(command -v "$candidate")
    break
  fi
done
[ -n "$python" ] || { echo "torchtpu: no Python 3.12 on this machine"; exit 1; }

cache="${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"
venv="$cache/torchtpu-venv-0.2.0"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch_tpu, jax' 2>/dev/null; then
  echo "torchtpu: creating $venv (torch-tpu 0.2.0, torch 2.15.0, libtpu 0.0.51, jax 0.11.2; ~7 GB)"
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check \
    torch-tpu==0.2.0 torch==2.15.0 libtpu==0.0.51 jax==0.11.2 jaxlib==0.11.2
fi
# The JAX loader's package (python), this checkout's.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps ./python

out=target/torchtpu
mkdir -p "$out"
cargo build --quiet --release -p tessera-cli --bin tessera
"$venv/bin/python" tests/torchtpu/probe.py ./target/release/tessera "$out"
