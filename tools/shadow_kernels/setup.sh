#!/usr/bin/env bash
# Installs the pinned fla and causal-conv1d packages' Python (and the Triton they import) into DIR,
# for a shadow run on CPU ranks: their kernel launches emptied by this folder's sitecustomize.py, so
# what runs is every torch allocation and saved tensor of the packages' own Python. Memory only.
#
#   tools/shadow_kernels/setup.sh /tmp/shadow
#   PYTHONPATH=tools/shadow_kernels:/tmp/shadow .venv/bin/python tools/deepspeed_oracle.py ...
#       --kernels fla,causal_conv1d   # the packages transformers may import (the others are hidden)
#
# About 660 MiB (Triton); not part of CI. Pins: docs/family_sources.md, "The fused CUDA kernels".
set -euo pipefail
dir=${1:?usage: setup.sh DIR}
here=$(cd "$(dirname "$0")/../.." && pwd)
pip=("$here/.venv/bin/pip" --disable-pip-version-check -q)
"${pip[@]}" install --no-deps --target "$dir" triton==3.6.0 fla-core==0.6.0 flash-linear-attention==0.6.0
# causal-conv1d is a CUDA extension: its Python alone (the CUDA module is emptied by sitecustomize.py).
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"${pip[@]}" download --no-deps --no-binary causal-conv1d causal-conv1d==1.7.0 -d "$tmp"
tar -xzf "$tmp"/causal_conv1d-1.7.0.tar.gz -C "$tmp"
rm -rf "$dir/causal_conv1d"
cp -r "$tmp/causal_conv1d-1.7.0/causal_conv1d" "$dir/"
echo "PYTHONPATH=$here/tools/shadow_kernels:$dir"
