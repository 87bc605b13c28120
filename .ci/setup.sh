#!/usr/bin/env bash
# Installs what Tessera needs on a fresh Debian 12 machine, each piece only
# when it is missing, and prints nothing when everything is already there.
#
#  * MLIR/LLVM 22 from Debian (melior 0.27 / mlir-sys 220), mlir-opt-22, and
#    the mold linker (.cargo/config.toml points cargo at both); valgrind for
#    the leak check of the PJRT bindings (tests/leaks/run.sh);
#  * the PJRT CPU plugin: the pinned `lammps-jax-pjrt-cpu` wheel from PyPI,
#    hash-checked, unpacked into the cache folder outside git
#    ($TESSERA_CACHE, default ~/.cache/tessera);
#  * libtpu, the TPU compiler, from its pinned PyPI wheel, hash-checked, for
#    the compile-only TPU check (runtime::tpu, `tessera compile`);
#  * Triton, the GPU compiler (NVIDIA and AMD, compile-only here) and its CPU
#    interpreter, with NumPy, hash-pinned, in a Python 3.12 environment in
#    the cache folder (runtime::triton, `tessera compile --gpu`, the
#    triton-interp path).
set -euo pipefail

log=$(mktemp)
trap 'rm -f "$log"' EXIT
run_quiet() {
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: failed: $*" >&2
    exit 1
  fi
}

sudo=""
if [ "$(id -u)" -ne 0 ]; then sudo="sudo"; fi

# --- MLIR 22, tools, linker -------------------------------------------------
packages=(libmlir-22-dev llvm-22-dev libpolly-22-dev libclang1-22 libclang-common-22-dev
  libzstd-dev mlir-22-tools mold valgrind)
missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  run_quiet $sudo apt-get update -q
  run_quiet env DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- PJRT CPU plugin ----------------------------------------------------------
# XLA's CPU plugin as shipped in a PyPI wheel (PJRT C API 0.115, the XLA of
# jax 0.11.2). The hash pins the exact file.
wheel_name="lammps-jax-pjrt-cpu==0.11.2"
wheel_sha256="1319390d948b39f69f7dade496b7c385149d9ca6097a6b62114da113216d9ad1"
cache="${TESSERA_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/tessera}"
plugin_dir="$cache/pjrt/cpu-0.11.2"
plugin="$plugin_dir/pjrt_c_api_cpu_plugin.so"
if [ ! -s "$plugin" ]; then
  echo "setup: fetching the PJRT CPU plugin ($wheel_name) into $plugin_dir"
  mkdir -p "$cache/pjrt"
  tmp=$(mktemp -d "$cache/pjrt/download.XXXXXX")
  printf '%s --hash=sha256:%s\n' "$wheel_name" "$wheel_sha256" >"$tmp/requirements.txt"
  run_quiet python3 -m pip download --quiet --no-deps --require-hashes \
    -r "$tmp/requirements.txt" -d "$tmp"
  whl=$(ls "$tmp"/*.whl)
  echo "$wheel_sha256  $whl" | sha256sum --check --quiet
  python3 - "$whl" "$tmp/plugin.so" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    name = next(n for n in z.namelist() if n.endswith("pjrt_c_api_cpu_plugin.so"))
    with z.open(name) as src, open(sys.argv[2], "wb") as dst:
        shutil.copyfileobj(src, dst)
PY
  mkdir -p "$plugin_dir"
  mv "$tmp/plugin.so" "$plugin"
  rm -rf "$tmp"
fi

# --- libtpu (the TPU compiler, compile-only) ---------------------------------
# The `libtpu` wheel jax 0.11.2 pins: the TPU compiler (Mosaic included) as a
# PJRT plugin. Tessera only compiles with it (no TPU here); it is a
# development and test dependency under Google's terms (see README), fetched
# here and never committed or redistributed. The wheel holds no Python
# extension: its file for one Python tag is pinned whatever Python runs pip.
# A second version, the one jax 0.12.0.1 and torch-tpu 0.2.0 pin, is the
# other side of the version matrix (tests/conformance/versions.py).
fetch_libtpu() { # VERSION SHA256 PYTHON-TAG (e.g. 311)
  local version=$1 sha256=$2 tag=$3
  local dir="$cache/libtpu/$version"
  [ -s "$dir/libtpu.so" ] && return 0
  echo "setup: fetching libtpu $version (the TPU compiler, ~220 MB) into $dir"
  mkdir -p "$cache/libtpu"
  local tmp
  tmp=$(mktemp -d "$cache/libtpu/download.XXXXXX")
  printf 'libtpu==%s --hash=sha256:%s\n' "$version" "$sha256" >"$tmp/requirements.txt"
  run_quiet python3 -m pip download --quiet --no-deps --require-hashes \
    --only-binary=:all: --python-version "${tag:0:1}.${tag:1}" --implementation cp --abi "cp$tag" \
    --platform manylinux_2_31_x86_64 -r "$tmp/requirements.txt" -d "$tmp"
  local whl
  whl=$(ls "$tmp"/*.whl)
  echo "$sha256  $whl" | sha256sum --check --quiet
  python3 - "$whl" "$tmp" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    for want in ("libtpu/libtpu.so", "libtpu/LICENSE"):
        with z.open(want) as src, open(sys.argv[2] + "/" + want.split("/")[-1], "wb") as dst:
            shutil.copyfileobj(src, dst)
PY
  mkdir -p "$dir"
  mv "$tmp/LICENSE" "$dir/LICENSE"
  mv "$tmp/libtpu.so" "$dir/libtpu.so"
  rm -rf "$tmp"
}
fetch_libtpu 0.0.48.1 62cd0567e8ac1e41f786245586041b9dddcc851095a2d8c0f380924365e8fc92 311
fetch_libtpu 0.0.51 aeb662a3174a89fd9a94ac64c965a72f43c65436f5546abbcb8968c9d9552631 312

# --- Triton (the GPU compiler, compile-only, and its CPU interpreter) --------
# Triton's wheel (cp312-abi3, no dependencies, ~290 MB, ~1 GB installed)
# and NumPy, both hash-pinned, in their own environment: `bin/python` of
# it is what runtime::triton runs. Built beside its final place and
# renamed into it, so a half-made environment is never used.
triton_version="3.9.0"
triton_sha256="5e52ab4e2f1d64f0ac494c9aa723697b793f81a91c4cae4c36608ca0bc4267bf"
numpy_version="2.3.5"
numpy_sha256="0d8163f43acde9a73c2a33605353a4f1bc4798745a8b1d73183b28e5b435ae28"
triton_env="$cache/triton-$triton_version"
if [ ! -x "$triton_env/bin/python" ] || ! "$triton_env/bin/python" -c 'import triton, numpy' >/dev/null 2>&1; then
  python312=""
  for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      python312=$(command -v "$candidate")
      break
    fi
  done
  if [ -z "$python312" ]; then
    echo "setup: failed: Triton $triton_version needs Python 3.12 (python3.12 not found)" >&2
    exit 1
  fi
  echo "setup: installing Triton $triton_version (the GPU compiler, ~1 GB) into $triton_env"
  tmp="$triton_env.partial"
  rm -rf "$tmp" "$triton_env"
  run_quiet "$python312" -m venv --without-pip "$tmp"
  printf 'triton==%s --hash=sha256:%s\nnumpy==%s --hash=sha256:%s\n' \
    "$triton_version" "$triton_sha256" "$numpy_version" "$numpy_sha256" >"$tmp/requirements.txt"
  run_quiet "$python312" -m pip --python "$tmp/bin/python" install --quiet --no-deps \
    --require-hashes --only-binary=:all: --disable-pip-version-check -r "$tmp/requirements.txt"
  run_quiet "$tmp/bin/python" -c 'import triton, numpy'
  mv "$tmp" "$triton_env"
fi
