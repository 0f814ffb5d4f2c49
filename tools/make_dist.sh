#!/usr/bin/env bash
# Bundles zplan, zrun and consolidate with the non-torch shared libraries
# they need (Abseil, Protobuf, zlib; Cairo and what it links for zplan --plot)
# into dist/ (git-ignored, about 10 MiB, half of it Cairo's), for a GPU
# machine that has torch 2.11 but no Bazel or Debian -dev packages (DESIGN §6).
# LibTorch, CUDA and NCCL come from that machine's torch wheel; --plot's
# labels use the fonts fontconfig finds there (DejaVu Sans where installed).
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
chmod -R u+w dist
echo "dist: $(du -sh dist | cut -f1) ($(ls dist/lib | wc -l) libraries)"
