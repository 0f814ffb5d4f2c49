#!/usr/bin/env bash
# Installs the Python packages bundled in dist/wheels/ (tools/make_dist.sh), offline, into a venv
# over the GPU machine's torch, so that real DeepSpeed + transformers run there (DESIGN §6):
#
#   tools/install_dist.sh [VENV]          # default VENV: dist/venv
#   source dist/venv/bin/activate         # then: import deepspeed, transformers, peft, liger_kernel
#
# The venv has no packages of its own but what tools/gpu_requirements.txt pins: a .pth file puts
# the torch Python's site folders after its own, so torch (and what torch needs) come from there,
# and the pins installed here shadow the versions found there (transformers 5.17.0 on the GPU
# machine). pip runs from the bundled pip wheel with --no-index: it never reaches a network.
#
# Environment: TORCH_PYTHON, the Python with torch (default /opt/torch/.venv/bin/python3);
# WHEELS, the wheel folder (default dist/wheels).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${1:-$root/dist/venv}
wheels=${WHEELS:-$root/dist/wheels}
requirements=$root/tools/gpu_requirements.txt
torch_python=${TORCH_PYTHON:-/opt/torch/.venv/bin/python3}

fail() { echo "install_dist: $*" >&2; exit 1; }
[[ -x $torch_python ]] || fail "no Python at $torch_python: set TORCH_PYTHON to the python3 that has torch"
[[ -d $wheels ]] || fail "no wheel folder $wheels: run tools/make_dist.sh on a development machine and copy dist/ here"

# The torch Python's site folders: its sys.path less the standard library.
base_paths=$("$torch_python" - <<'PY'
import importlib.util, os, sys
if importlib.util.find_spec("torch") is None:
    sys.exit(1)
stdlib = os.path.dirname(os.__file__)
for entry in sys.path:
    if entry and os.path.isdir(entry) and entry not in (stdlib, os.path.join(stdlib, "lib-dynload")):
        print(os.path.abspath(entry))
PY
) || fail "$torch_python has no torch"
py_version=$("$torch_python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# pip comes from the bundle, as a wheel run in place (pip's documented bootstrap); the install
# puts that pip in the venv too.
pip_pin=$(grep -E '^pip==' "$requirements" | cut -d' ' -f1)
pip_wheel=$(compgen -G "$wheels/pip-${pip_pin#pip==}-py3-none-any.whl" | head -1) ||
  fail "$pip_pin: no wheel pip-${pip_pin#pip==}-py3-none-any.whl in $wheels"

[[ -x $venv/bin/python3 ]] || "$torch_python" -m venv --without-pip "$venv"
site=$("$venv/bin/python3" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf '%s\n' "$base_paths" > "$site/zplan_torch_base.pth"

# Say what is missing before pip does: a pin whose wheel for this Python is not in the folder and
# that the torch Python does not have either (numpy, which dist/ leaves to the machine).
if ! missing=$(PYTHONPATH="$pip_wheel" "$venv/bin/python3" "$root/tools/gpu_wheels.py" missing "$wheels" \
                 --python "$py_version" --installed); then
  fail "missing for Python $py_version, neither in $wheels nor installed under $torch_python:" \
       $'\n '"${missing//$'\n'/$'\n' }"$'\n'"(rebuild the bundle: tools/setup.sh, then tools/make_dist.sh)"
fi

"$venv/bin/python3" "$pip_wheel/pip" install -q --no-index --find-links "$wheels" --only-binary=:all: \
  --disable-pip-version-check -r "$requirements"

# What a DeepSpeed run imports, at the pinned versions.
"$venv/bin/python3" - "$requirements" <<'PY'
import importlib.metadata as m, re, sys
pins = {}
for line in open(sys.argv[1]):
    spec = line.partition("#")[0].partition(";")[0].strip()
    if "==" in spec:
        name, version = spec.split("==")
        pins[re.sub(r"[-_.]+", "-", name).lower()] = version
import torch, deepspeed, transformers, peft, accelerate, liger_kernel  # noqa: E401,F401
wrong = []
shown = []
for name in ("deepspeed", "transformers", "accelerate", "peft", "liger-kernel", "huggingface-hub", "tokenizers"):
    have = m.version(name)
    shown.append(f"{name} {have}")
    if have != pins[name]:
        wrong.append(f"{name} {have} (pinned {pins[name]})")
if wrong:
    sys.exit("install_dist: wrong versions: " + ", ".join(wrong))
print(f"install_dist: ok, {', '.join(shown)} over torch {torch.__version__} ({torch.__file__.rsplit('/torch/', 1)[0]})")
PY
echo "install_dist: activate with: source $venv/bin/activate"
