#!/bin/bash
# The GPU bundle's Python packages install offline (DESIGN §6): tools/install_dist.sh installs
# the wheels that tools/setup.sh fetched into .venv/gpu_wheels/ (the files tools/make_dist.sh
# copies into dist/wheels/) into a fresh venv over a Python that has torch and nothing else, as
# the GPU machine's /opt/torch/.venv has, with no network (a new network namespace where the
# machine allows one; --no-index always). Then deepspeed, transformers, peft, accelerate and
# liger_kernel import at the pinned versions, from the fresh venv, over that torch. A wheel taken
# out of the folder fails the install up front, naming the pin. The cp312 wheels that dist/ holds
# for the GPU machine's Python are checked by name (they cannot install here).
set -u
WORK="${TEST_TMPDIR:-$(mktemp -d)}"
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
export PYTHONDONTWRITEBYTECODE=1 PIP_NO_COMPILE=1 PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# Should anything try the network outside a namespace: a proxy that refuses at once.
export http_proxy=http://127.0.0.1:9 https_proxy=http://127.0.0.1:9 HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9

python="$PWD/external/torch/python"   # tools/setup.sh's .venv (third_party/repos.bzl)
prefix=$("$python" -c 'import sys; print(sys.prefix)')
wheels="$prefix/gpu_wheels"
if ! "$python" tools/gpu_wheels.py missing "$wheels" --python 3.11 >"$WORK/missing" ||
   ! "$python" tools/gpu_wheels.py missing "$wheels" --python 3.12 --bundled >>"$WORK/missing"; then
  echo "FAIL: no wheels in $wheels for: $(tr '\n' ' ' <"$WORK/missing")(run tools/setup.sh)"
  exit 1
fi
echo "PASS: $wheels has a wheel for every pin, cp311 and cp312 ($(ls "$wheels" | wc -l) files)"

offline=()
if unshare -n true 2>/dev/null; then offline=(unshare -n)
elif unshare -rn true 2>/dev/null; then offline=(unshare -rn)
fi
echo "network: ${offline[*]:-no namespace here; --no-index and a refusing proxy}"

# The base: torch and what torch needs, from .venv, through a folder of links to exactly those
# distributions (not .venv's deepspeed or transformers), seen by a bare venv through a .pth file.
"$python" - "$WORK/torch_only" <<'PY' || fail "could not link torch's distributions"
import importlib.metadata as m, os, re, sys
from packaging.requirements import Requirement
out = sys.argv[1]
norm = lambda n: re.sub(r"[-_.]+", "-", n).lower()
seen, todo = set(), [("torch", ())]
while todo:
    name, extras = todo.pop()
    if (norm(name), extras) in seen:
        continue
    seen.add((norm(name), extras))
    for r in m.distribution(name).requires or []:
        req = Requirement(r)
        if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in ("",) + extras):
            todo.append((req.name, tuple(sorted(req.extras))))
os.makedirs(out)
for name in sorted({n for n, _ in seen}):
    dist = m.distribution(name)
    for top in {str(f).split("/")[0] for f in dist.files}:
        src = str(dist.locate_file(top))
        dst = os.path.join(out, top)
        if not top.startswith("..") and not top.endswith(".pth") and top != "__pycache__" \
                and os.path.exists(src) and not os.path.lexists(dst):
            os.symlink(src, dst)
print(f"base: torch and {len({n for n, _ in seen}) - 1} distributions it needs")
PY
"$python" -m venv --without-pip "$WORK/base"
base_site=$("$WORK/base/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$WORK/torch_only" > "$base_site/torch_only.pth"
if "$WORK/base/bin/python3" - <<'PY'
import importlib.util, importlib.metadata as m, sys
assert importlib.util.find_spec("torch") is not None, "no torch"
for name in ("deepspeed", "transformers", "peft", "accelerate", "liger_kernel", "pydantic", "numpy", "pip"):
    if importlib.util.find_spec(name) is not None:
        sys.exit(f"the base already has {name}")
print(f"base: torch, no deepspeed, transformers, peft, accelerate, liger_kernel, pydantic, numpy or pip")
PY
then echo "PASS: the base Python has torch and none of the pinned packages"
else fail "the base Python is not torch alone"
fi

# The install, offline, as on the GPU machine.
start=$SECONDS
if "${offline[@]}" env TORCH_PYTHON="$WORK/base/bin/python3" WHEELS="$wheels" \
     tools/install_dist.sh "$WORK/venv" >"$WORK/install.log" 2>&1; then
  echo "PASS: tools/install_dist.sh installed offline in $((SECONDS - start)) s"
else
  cat "$WORK/install.log"
  fail "tools/install_dist.sh failed"
fi
grep '^install_dist: ok' "$WORK/install.log" || fail "install_dist printed no ok line"

# install_dist.sh imported them; here, where from (without importing them again).
if "$WORK/venv/bin/python3" - "$WORK" <<'PY'
import importlib.util, os, sys
work = sys.argv[1]
for name in ("deepspeed", "transformers", "peft", "accelerate", "liger_kernel", "pydantic", "numpy"):
    origin = importlib.util.find_spec(name).origin
    assert origin.startswith(work + "/venv/"), f"{name} from {origin}"
origin = importlib.util.find_spec("torch").origin
assert origin.startswith(work + "/torch_only/"), f"torch from {origin}"
info = open(os.path.join(os.path.dirname(importlib.util.find_spec("deepspeed").origin), "git_version_info_installed.py")).read()
assert "installed_ops=" in info and "True" not in info.split("installed_ops=")[1].split("\n")[0], info
print("from: deepspeed, transformers, peft, accelerate, liger_kernel, pydantic, numpy in the fresh venv; torch in the base; no prebuilt DeepSpeed ops")
PY
then echo "PASS: the pinned packages are the fresh venv's, over the base's torch"
else fail "the pinned packages are not where the install put them"
fi

# A wheel taken out: the install stops before pip, naming the pin.
mkdir "$WORK/short"
for f in "$wheels"/*.whl; do
  [[ $(basename "$f") == pydantic_core-* ]] || ln -s "$f" "$WORK/short/"
done
if TORCH_PYTHON="$WORK/base/bin/python3" WHEELS="$WORK/short" tools/install_dist.sh "$WORK/venv2" >"$WORK/short.log" 2>&1; then
  fail "install_dist.sh succeeded without pydantic-core's wheel"
elif grep -q "pydantic-core==2.50.5 (cp311)" "$WORK/short.log"; then
  echo "PASS: without pydantic-core's wheel, install_dist.sh stops and names it"
else
  cat "$WORK/short.log"
  fail "install_dist.sh's failure does not name pydantic-core"
fi

echo "$failures failures"
[[ $failures == 0 ]]
