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

# --- MLIR's C API as a shared library ----------------------------------------
# Debian ships MLIR as one shared library (libMLIR.so) but its C API only as
# static archives, and mlir-sys links shared (MLIR_SYS_LINK_SHARED in
# .cargo/config.toml) only against a libMLIR-C.so. Linked statically, every
# test binary carried its own ~300 MB copy of MLIR and LLVM: a clean build
# of the tests took ~9 GB of disk and once filled CI's. This library is the
# archives wrapped around libMLIR.so (~1 MB, under a second to link); it is
# rebuilt when Debian's libMLIR.so is newer.
mlir_lib=/usr/lib/llvm-22/lib
if [ ! -s "$mlir_lib/libMLIR-C.so" ] || [ "$mlir_lib/libMLIR.so.22.1" -nt "$mlir_lib/libMLIR-C.so" ]; then
  echo "setup: linking $mlir_lib/libMLIR-C.so (MLIR's C API over libMLIR.so)"
  capi_tmp=$(mktemp -d)
  run_quiet g++ -shared -o "$capi_tmp/libMLIR-C.so" -fuse-ld=mold \
    -Wl,--whole-archive "$mlir_lib"/libMLIRCAPI*.a -Wl,--no-whole-archive \
    -L"$mlir_lib" -lMLIR -lLLVM-22 -Wl,--no-undefined -Wl,-rpath,'$ORIGIN'
  run_quiet $sudo install -m 0644 "$capi_tmp/libMLIR-C.so" "$mlir_lib/libMLIR-C.so.tmp"
  run_quiet $sudo mv -f "$mlir_lib/libMLIR-C.so.tmp" "$mlir_lib/libMLIR-C.so"
  rm -rf "$capi_tmp"
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
  run_quiet python3 -m pip download --quiet --no-cache-dir --no-deps --require-hashes \
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
  run_quiet python3 -m pip download --quiet --no-cache-dir --no-deps --require-hashes \
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

# --- Python environments: Triton, and torch beside it ------------------------
# A Python 3.12 (Triton's wheel and torch's need it), or nothing.
find_python312() {
  local candidate
  for candidate in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    if command -v "$candidate" >/dev/null 2>&1 && "$candidate" -c 'import sys; assert sys.version_info[:2] == (3, 12)' >/dev/null 2>&1; then
      command -v "$candidate"
      return
    fi
  done
}

# A Python 3.12 environment at DIR holding exactly the hash-pinned wheels
# the requirements on stdin name, made when DIR has none that imports
# IMPORTS. Built beside its final place and renamed into it, so a half-made
# environment is never used.
pinned_env() { # DIR IMPORTS WHAT
  local dir=$1 imports=$2 what=$3 python312 tmp
  if [ -x "$dir/bin/python" ] && "$dir/bin/python" -c "import $imports" >/dev/null 2>&1; then
    cat >/dev/null
    return 0
  fi
  python312=$(find_python312)
  if [ -z "$python312" ]; then
    echo "setup: failed: $what needs Python 3.12 (python3.12 not found)" >&2
    exit 1
  fi
  echo "setup: installing $what into $dir"
  tmp="$dir.partial"
  rm -rf "$tmp" "$dir"
  run_quiet "$python312" -m venv --without-pip "$tmp"
  cat >"$tmp/requirements.txt"
  run_quiet "$python312" -m pip --python "$tmp/bin/python" install --quiet --no-cache-dir --no-deps \
    --require-hashes --only-binary=:all: --disable-pip-version-check -r "$tmp/requirements.txt"
  run_quiet "$tmp/bin/python" -c "import $imports"
  mv "$tmp" "$dir"
}

# Triton (the GPU compiler, compile-only, and its CPU interpreter): its
# wheel (cp312-abi3, no dependencies, ~290 MB, ~1 GB installed) and NumPy;
# `bin/python` of it is what runtime::triton runs.
triton_version="3.9.0"
triton_sha256="5e52ab4e2f1d64f0ac494c9aa723697b793f81a91c4cae4c36608ca0bc4267bf"
numpy_version="2.3.5"
numpy_sha256="0d8163f43acde9a73c2a33605353a4f1bc4798745a8b1d73183b28e5b435ae28"
pinned_env "$cache/triton-$triton_version" "triton, numpy" "Triton $triton_version (the GPU compiler, ~1 GB)" <<REQ
triton==$triton_version --hash=sha256:$triton_sha256
numpy==$numpy_version --hash=sha256:$numpy_sha256
REQ

# torch 2.15.0 from PyPI with everything it depends on (its Linux wheel is
# the CUDA build: it loads the CUDA libraries' wheels even to run on the
# CPU) and the same Triton and NumPy: tessera_torch runs Tessera's Triton
# programs under Triton's interpreter there (tests/conformance/torch_op.py).
# ~2.9 GB download, ~4.5 GB installed.
pinned_env "$cache/torch-2.15.0-triton-$triton_version" "torch, triton, numpy" \
  "torch 2.15.0 (CPU use) with Triton $triton_version" <<REQ
cuda-bindings==13.5.0 --hash=sha256:a46a8cc84112d769d0f57bf3ae3fedc115cf09348f14da85a1a8200968b6f262
cuda-pathfinder==1.9.1 --hash=sha256:b743c132f90ad2d1e71d43fd28f31ebcde518f943e50fd44aca62b2a80d5230d
cuda-toolkit==13.2.2 --hash=sha256:d12edc1aad1356236a2ee10c0d794b1aff5d3e79bfeca54867c3bb8e5afd87b0
filelock==3.20.0 --hash=sha256:339b4732ffda5cd79b13f4e2711a31b0365ce445d95d243bb996273d072546a2
fsspec==2025.9.0 --hash=sha256:530dc2a2af60a414a832059574df4a6e10cce927f6f4a78209390fe38955cfb7
jinja2==3.1.6 --hash=sha256:85ece4451f492d0c13c5dd7c13a64681a86afae63a5f347908daf103ce6d2f67
markupsafe==3.0.3 --hash=sha256:d6dd0be5b5b189d31db7cda48b91d7e0a9795f31430b7f271219ab30f1d3ac9d
mpmath==1.3.0 --hash=sha256:a0b2b9fe80bbcd81a6647ff13108738cfb482d481d826cc0e02f5b35e5c88d2c
networkx==3.5 --hash=sha256:0030d386a9a06dee3565298b4a734b68589749a544acbb6c412dc9e2489ec6ec
numpy==$numpy_version --hash=sha256:$numpy_sha256
nvidia-cublas==13.4.1.3 --hash=sha256:a5917cb642cfb07f4a0231ee16aec7e2e0357d8cb8b1b78a0c9c68dba3e6afc7
nvidia-cuda-cccl==13.3.5.0.6 --hash=sha256:d5230098fa2df5021e1a00c0c4eee41797671a91119d31e892463e5ccf3ee326
nvidia-cuda-cupti==13.2.86 --hash=sha256:8fa29f15dd8336181f961764d9d95236fc6b931dd0c8fcf8cd70aab0c310b586
nvidia-cuda-nvrtc==13.2.86 --hash=sha256:8111c5130e967b78222ea2124145f8efe9ce201b752b2579a2513100a53be1c5
nvidia-cuda-runtime==13.2.86 --hash=sha256:3498247680dfddce31bad102af7e3e26fc795342a3cac64722bb0fa95e7f60f0
nvidia-cudnn-cu13==9.26.0.51 --hash=sha256:9c976d539786698c71d6bcdbe2053b7485fae062ff7e1215d2f2ff67b1a2149a
nvidia-cufft==12.2.0.57 --hash=sha256:34da27fadf3979b0b042c43823f0530be8408b86df31ee0108e1ca0b621d4ef6
nvidia-cufile==1.17.1.22 --hash=sha256:87feaf8c3ad20d3d03a01933181801ff6892bace5c8f0b1e4b48f319d3e62d36
nvidia-cusolver==12.2.0.11 --hash=sha256:fab5778f6769947389a1a6abc07e635576825a08c0ffc68c3ae7f1392c794b42
nvidia-cusparse==12.7.10.12 --hash=sha256:25907c75e4db1581685f06f61cc6cdecc04611765516a52373e0a18ebd69fa00
nvidia-cusparselt-cu13==0.8.1 --hash=sha256:786ce87568c303fadb5afcc7102d454cd3040d75f6f8626f5db460d1871f4dd0
nvidia-nccl-cu13==2.30.7 --hash=sha256:cefa7fdb9710efd0f39c5f1be1d61ff6fc9a996c451265bd7fbdcf9455ed4b50
nvidia-nvjitlink==13.5.37 --hash=sha256:280d7cb9649704145f074b8dbde500de04ce02d0872e066e20a83c17bcaa93eb
nvidia-nvshmem-cu13==3.7.2 --hash=sha256:b9a4f843c62b5dded8ad33fd6d220e007dcd39f06cee549292f5ba14ce4c235c
nvidia-nvtx==13.2.86 --hash=sha256:968ce72baee2a01791c7d3254000eac81f24677b0b91c62d21b449a1f309c245
setuptools==84.2.1 --hash=sha256:ca140b45d5325a9478f880e351484f62fef15f336462e449ca0c03c873d589c2
sympy==1.14.0 --hash=sha256:e091cc3e99d2141a0ba2847328f5479b05d94a6635cb96148ccb3f34671bd8f5
torch==2.15.0 --hash=sha256:6d8c86f4e33a9f12a58149bd9b0d64351632b8eb44479be8ff85e5389932dd79
triton==$triton_version --hash=sha256:$triton_sha256
typing-extensions==4.15.0 --hash=sha256:f0fa19c6845758ab08074a0cfa8b7aecb71c999ca73d62883bc25cc018c4e548
REQ
