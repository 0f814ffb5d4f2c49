#!/usr/bin/env bash
# Installs everything zplan/zrun need to build and test on a fresh Debian 12
# machine, idempotently: Debian's Bazel and -dev packages, and a Python
# environment in .venv (git-ignored) holding torch==2.11.0 for LibTorch, and
# the DeepSpeed + transformers versions the planner models, for the oracle
# (tools/deepspeed_oracle.py; accelerate because transformers' DeepSpeed
# integration requires it, ninja for DeepSpeed's JIT ops, peft for its LoRA
# runs, liger-kernel for its fused linear cross-entropy runs).
# Running it again only checks.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
torch_version=2.11.0
# The versions the planner models (docs/deepspeed_model.md): the block of tools/gpu_requirements.txt
# that the GPU bundle carries too, so the oracle here and DeepSpeed there run the same ones.
mapfile -t python_packages < <(awk '/^# tools\/setup.sh.s pins/ {on = 1; next} on && /^$/ {exit} on {print $1}' \
                                  "$root/tools/gpu_requirements.txt")
((${#python_packages[@]})) || { echo "setup: no pins under \"# tools/setup.sh's pins\" in tools/gpu_requirements.txt" >&2; exit 1; }
packages=(
  bazel-bootstrap bazel-platforms bazel-rules-java   # Bazel 4.2.3, offline (DESIGN §5)
  libabsl-dev libprotobuf-dev protobuf-compiler       # Abseil, Protocol Buffers
  libgtest-dev libgmock-dev                           # GoogleTest
  libgloo-dev                                         # Gloo headers for c10d (absent from the wheel)
  libcairo2-dev fonts-dejavu-core                     # zplan --plot: Cairo and the font of its labels
  python3-venv
)

sudo_cmd=()
[[ $(id -u) -eq 0 ]] || sudo_cmd=(sudo)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

venv="$root/.venv"
if ! "$venv/bin/python3" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '$torch_version')" 2>/dev/null; then
  # The wheel and its CUDA libraries unpack to about 5 GiB, and pip needs room for the download
  # beside them: say so up front instead of failing halfway with ENOSPC.
  free_kib=$(df -Pk "$root" | awk 'NR == 2 {print $4}')
  if ((free_kib < 7 * 1024 * 1024)); then
    echo "setup: $((free_kib / 1024 / 1024)) GiB free under $root; the Python environment needs about 7 GiB: free some disk and run tools/setup.sh again" >&2
    exit 1
  fi
  echo "setup: creating $venv with torch==$torch_version (several GiB, cached by pip afterwards)"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "torch==$torch_version"
fi

if ! "$venv/bin/python3" - "${python_packages[@]}" 2>/dev/null <<'PY'
import importlib.metadata as m, sys
sys.exit(any(m.version(n) != v for n, v in (p.split("==") for p in sys.argv[1:])))
PY
then
  echo "setup: installing ${python_packages[*]} into $venv"
  # DeepSpeed's sdist imports torch while building: build it in the venv, beside its torch.
  "$venv/bin/pip" install -q --disable-pip-version-check wheel
  "$venv/bin/pip" install -q --disable-pip-version-check --no-build-isolation "${python_packages[@]}"
fi

# The wheels that tools/make_dist.sh bundles for the GPU machine (tools/gpu_requirements.txt),
# fetched once into .venv/gpu_wheels/, where //tests:dist_install_test installs them offline into
# a fresh venv: every pure and abi3 wheel, the binary ones for cp311 (here) and cp312 (the GPU
# machine's Python), and DeepSpeed's sdist built here into a wheel with no prebuilt ops
# (DS_BUILD_OPS=0: they JIT-compile there). About 50 MiB and 20 s once; only what is missing.
wheels="$venv/gpu_wheels"
gpu_wheels=("$venv/bin/python3" "$root/tools/gpu_wheels.py")
wheel_pins() {  # the pins whose wheels Python $1 needs (cp311, for the test: numpy too)
  local bundled=(); [[ $1 == 3.11 ]] || bundled=(--bundled)
  "${gpu_wheels[@]}" "$2" "${@:3}" --python "$1" "${bundled[@]}"
}
for py in 3.11 3.12; do
  wheel_pins "$py" missing "$wheels" >/dev/null && continue
  echo "setup: fetching the wheels for Python $py into $wheels"
  wheel_pins "$py" pins | grep -v '^deepspeed==' |
    "$venv/bin/pip" download -q --disable-pip-version-check --no-deps --only-binary=:all: -d "$wheels" \
      --python-version "$py" --implementation cp --platform manylinux_2_28_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_12_x86_64 --platform manylinux2010_x86_64 -r /dev/stdin
done
deepspeed_pin=$(wheel_pins 3.11 pins | grep '^deepspeed==')
if ! compgen -G "$wheels/deepspeed-${deepspeed_pin#deepspeed==}-py3-none-any.whl" >/dev/null; then
  echo "setup: building $deepspeed_pin into a wheel in $wheels"
  DS_BUILD_OPS=0 "$venv/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
    -w "$wheels" "$deepspeed_pin"
fi
# causal-conv1d ships an sdist only (a CUDA extension), built on the GPU machine (tools/build_causal_conv1d.py).
"$venv/bin/python3" "$root/tools/build_causal_conv1d.py" fetch "$wheels"
for py in 3.11 3.12; do
  if ! still=$(wheel_pins "$py" missing "$wheels"); then
    echo "setup: no wheel in $wheels for:" $still >&2
    exit 1
  fi
done

# DeepSpeed's CPU ops (the oracle's: Adam, offloaded Adam, shared-memory
# collectives), built here once rather than by the first test that loads them:
# torch's JIT build holds a `lock` file in the op's folder, and one killed
# midway leaves it, making every later load wait forever. Nothing else builds
# while setup runs, so a lock found now is such a leftover.
extensions="$venv/torch_extensions"
if [[ -d $extensions ]]; then
  find "$extensions" -name lock -print -delete | sed 's/^/setup: removed a lock an interrupted build left: /'
fi
# The venv's ninja, as the oracle runs them (deepspeed_oracle.py puts the venv
# first on PATH): ninja 1.13 hashes commands unlike Debian's 1.11, so ops
# built with the other one would be built again by the first test.
PATH="$venv/bin:$PATH" DS_ACCELERATOR=cpu TORCH_EXTENSIONS_DIR="$extensions" "$venv/bin/python3" -c '
from deepspeed.ops.op_builder.cpu import CPUAdamBuilder, FusedAdamBuilder, ShareMemCommBuilder
for builder in (CPUAdamBuilder(), FusedAdamBuilder(), ShareMemCommBuilder()):
    builder.load(verbose=False)
' >/dev/null

echo "setup: ok ($(bazel --version 2>/dev/null | head -1 || echo bazel), torch $("$venv/bin/python3" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
