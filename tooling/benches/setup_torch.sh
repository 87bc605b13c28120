#!/usr/bin/env bash
# The optional PyTorch baseline of `tessera bench`: makes (once) a cached
# Python 3.12 venv with torch 2.15.0 from PyPI (~3 GB: PyPI's wheel carries
# the CUDA libraries even for CPU use) and prints its python. `tessera bench`
# finds it there (or takes $TESSERA_TORCH_PYTHON) and then measures
# PyTorch's matmul and scaled_dot_product_attention in the same run. The
# test command does not need it.
set -euo pipefail
python=""
for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
  if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
    python=$(command -v "$candidate"); break
  fi
done
[ -n "$python" ] || { echo "setup_torch: no Python 3.12 on this machine" >&2; exit 1; }
cache="${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"
venv="$cache/bench-venv-torch-2.15.0"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  echo "setup_torch: creating $venv (torch 2.15.0, ~3 GB)" >&2
  rm -rf "$venv"
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check torch==2.15.0 numpy
fi
echo "$venv/bin/python"
