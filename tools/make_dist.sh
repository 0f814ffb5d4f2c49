#!/usr/bin/env bash
# Bundles zplan, zrun and consolidate with the non-torch shared libraries
# they need (Abseil, Protobuf, zlib; Cairo and what it links for zplan --plot)
# into dist/ (git-ignored, about 10 MiB, half of it Cairo's), for a GPU
# machine that has torch 2.11 but no Bazel or Debian -dev packages (DESIGN §6).
# LibTorch, CUDA and NCCL come from that machine's torch wheel; --plot's
# labels use the fonts fontconfig finds there (DejaVu Sans where installed).
# dist/wheels/: the Python packages real DeepSpeed runs need there (tools/gpu_requirements.txt),
# from the wheels tools/setup.sh fetched into .venv/gpu_wheels/, for tools/install_dist.sh to
# install offline there (about 39 MiB: pure and abi3 wheels once, binary ones for cp311 and
# cp312; not numpy, which that machine's torch venv has).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bazel build //planner:zplan //executor:zrun //tools:consolidate
rm -rf dist && mkdir -p dist/bin dist/lib
cp bazel-bin/planner/zplan bazel-bin/executor/zrun bazel-bin/tools/consolidate dist/bin/
for bin in dist/bin/*; do
  ldd "$bin" | awk '/=> \// {print $3}' |
    grep -E 'libabsl_|libprotobuf|libz\.so|libcairo|libpixman|libpng16|libfreetype|libfontconfig|libexpat|libbrotli|libX|libxcb|libbsd|libmd\.so' |
    while read -r lib; do
      cp -n "$lib" dist/lib/
    done
done
"$root/.venv/bin/python3" tools/gpu_wheels.py copy "$root/.venv/gpu_wheels" dist/wheels --python 3.11 --python 3.12
"$root/.venv/bin/python3" tools/build_causal_conv1d.py fetch dist/wheels  # from pip's cache after setup
chmod -R u+w dist
size_mib=$(( $(du -sb dist | cut -f1) / 1024 / 1024 ))
echo "dist: $size_mib MiB ($(ls dist/lib | wc -l) libraries; $(ls dist/wheels | wc -l) wheels," \
     "$(du -sh dist/wheels | cut -f1)); on the GPU machine: tools/install_dist.sh"
if ((size_mib >= 64)); then
  echo "make_dist: dist/ is $size_mib MiB, over the 64 MiB a GPU session carries" >&2
  exit 1
fi
