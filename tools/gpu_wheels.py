#!/usr/bin/env python3
"""The wheels of tools/gpu_requirements.txt: which apply to a Python, which are in a folder.

  gpu_wheels.py pins    --python 3.12 [--bundled]       name==version lines for that Python
  gpu_wheels.py missing DIR --python 3.12 [--bundled] [--installed]
                                          pins without a wheel for it in DIR (exit 1 if any);
                                          --installed: nor installed at that version in this Python
  gpu_wheels.py copy    SRC DST --python 3.11 --python 3.12   the bundled pins' wheels, SRC -> DST

--bundled leaves out the lines marked "# machine" (installed on the GPU machine, not in dist/).
A wheel fits a Python X.Y when it is pure (py3-none), abi3 (cpNN-abi3 with NN <= XY) or cpXY-cpXY,
for any platform or manylinux/linux x86_64. Standard library only, plus the `packaging` that
every pip vendors, so it runs on the GPU machine's Python too.
"""
import argparse
import os
import re
import shutil
import sys

try:
    from packaging.markers import Marker
    from packaging.version import Version
except ImportError:  # a bare venv: pip's own copy
    from pip._vendor.packaging.markers import Marker
    from pip._vendor.packaging.version import Version

REQUIREMENTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gpu_requirements.txt")


def normalize(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(python, bundled, path=REQUIREMENTS):
    """[(name, version, line)] of the pins whose marker holds for `python` ("3.12")."""
    env = {"python_version": python, "python_full_version": python + ".0", "extra": "",
           "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64",
           "implementation_name": "cpython", "platform_python_implementation": "CPython",
           "os_name": "posix"}
    pins = []
    with open(path) as f:
        for number, raw in enumerate(f, 1):
            line, _, comment = raw.partition("#")
            line = line.strip()
            if not line:
                continue
            if bundled and comment.strip() == "machine":
                continue
            spec, _, marker = line.partition(";")
            m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s]+)", spec.strip())
            if not m:
                sys.exit(f"{path}:{number}: not an exact pin: {line}")
            if marker.strip() and not Marker(marker.strip()).evaluate(env):
                continue
            pins.append((normalize(m.group(1)), m.group(2), spec.strip()))
    return pins


def wheel_fits(filename, python):
    """(name, version) of a wheel that installs on CPython `python`, manylinux x86_64; else None."""
    parts = filename[:-len(".whl")].split("-")
    if not filename.endswith(".whl") or len(parts) not in (5, 6):
        return None
    name, version, pys, abis, plats = parts[0], parts[1], parts[-3], parts[-2], parts[-1]
    xy = int(python.replace(".", ""))
    if not any(p == "any" or (p.startswith(("manylinux", "linux")) and p.endswith("x86_64"))
               for p in plats.split(".")):
        return None
    ok = False
    for py in pys.split("."):
        for abi in abis.split("."):
            if abi == "none" and py in ("py3", f"py{xy}", f"cp{xy}"):
                ok = True
            elif abi == "abi3" and py.startswith("cp") and int(py[2:]) <= xy:
                ok = True
            elif abi == f"cp{xy}" and py == f"cp{xy}":
                ok = True
    return (normalize(name), Version(version)) if ok else None


def wheels_for(folder, pins, python):
    """{pin line: wheel filename or None}."""
    found = {}
    files = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    for name, version, line in pins:
        found[line] = None
        for f in files:
            if wheel_fits(f, python) == (name, Version(version)):
                found[line] = f
                break
    return found


def installed(line):
    """Whether this Python has the pin `name==version` installed."""
    import importlib.metadata
    name, _, version = line.partition("==")
    try:
        return Version(importlib.metadata.version(name)) == Version(version)
    except importlib.metadata.PackageNotFoundError:
        return False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["pins", "missing", "copy"])
    ap.add_argument("folders", nargs="*")
    ap.add_argument("--python", action="append", required=True, help="X.Y, repeatable")
    ap.add_argument("--bundled", action="store_true")
    ap.add_argument("--installed", action="store_true")
    ap.add_argument("--requirements", default=REQUIREMENTS)
    a = ap.parse_args()
    if a.command == "pins":
        for python in a.python:
            for _, _, line in read_pins(python, a.bundled, a.requirements):
                print(line)
        return 0
    if a.command == "missing":
        missing = []
        for python in a.python:
            for line, f in wheels_for(a.folders[0], read_pins(python, a.bundled, a.requirements), python).items():
                if f is None and not (a.installed and installed(line)):
                    missing.append(f"{line} (cp{python.replace('.', '')})")
        for m in missing:
            print(m)
        return 1 if missing else 0
    src, dst = a.folders
    os.makedirs(dst, exist_ok=True)
    missing = []
    for python in a.python:
        for line, f in wheels_for(src, read_pins(python, True, a.requirements), python).items():
            if f is None:
                missing.append(f"{line} (cp{python.replace('.', '')})")
            elif not os.path.exists(os.path.join(dst, f)):
                shutil.copy2(os.path.join(src, f), dst)
    if missing:
        print(f"no wheel in {src} for: " + ", ".join(missing) + " (run tools/setup.sh)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
