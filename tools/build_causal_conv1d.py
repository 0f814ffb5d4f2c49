#!/usr/bin/env python3
"""causal-conv1d for the GPU machine, where it is built from its sdist: the package ships no wheel for
torch 2.11 + CUDA 13, and its setup.py compiles for nine architectures. This builds the extension
`causal_conv1d_cuda` from the same sources with the same nvcc flags for this machine's GPU alone
(torch.utils.cpp_extension.load, about a minute), beside the package's Python.

  build_causal_conv1d.py fetch DIR        the pinned sdist into DIR unless there (tools/setup.sh)
  build_causal_conv1d.py build DIR OUT    on the GPU machine: extract DIR's sdist into OUT, build the
                                          extension there; prints the PYTHONPATH entry that makes
                                          `import causal_conv1d` work (tools/gpu_deepspeed.sh)

Python only because it drives torch's extension builder.
"""
import argparse
import glob
import os
import subprocess
import sys
import tarfile

PIN = "causal-conv1d==1.7.0"  # modelled in planner/inventory.cc (SHORT_CONV_CAUSAL_CONV1D)
SDIST = "causal_conv1d-1.7.0.tar.gz"
# setup.py's nvcc flags (CUDAExtension's extra_compile_args), less its -gencode list.
NVCC_FLAGS = ["-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT16_OPERATORS__", "-U__CUDA_NO_BFLOAT16_CONVERSIONS__",
              "-U__CUDA_NO_BFLOAT162_OPERATORS__", "-U__CUDA_NO_BFLOAT162_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-lineinfo"]


def fetch(folder):
    if os.path.exists(os.path.join(folder, SDIST)):
        return 0
    # pip reads an sdist's metadata by running its setup.py; in an isolated build environment that
    # installs the newest CUDA torch (pyproject's build requirement, about 5 GiB: a CI machine ran out
    # of disk). This venv's torch serves, with the package's own switch that skips the nvcc checks.
    env = dict(os.environ, CAUSAL_CONV1D_SKIP_CUDA_BUILD="TRUE")
    return subprocess.call([sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check",
                            "--no-deps", "--no-build-isolation", "--no-binary", "causal-conv1d",
                            "-d", folder, PIN], env=env)


def build(folder, out):
    import torch
    from torch.utils import cpp_extension
    if not torch.cuda.is_available():
        sys.exit("build_causal_conv1d: no CUDA device; the extension is built for this machine's GPU")
    with tarfile.open(os.path.join(folder, SDIST)) as t:
        t.extractall(out, filter="data")
    src = os.path.join(out, SDIST[:-len(".tar.gz")])
    major, minor = torch.cuda.get_device_capability()
    os.environ["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
    build_dir = os.path.join(out, "build")
    os.makedirs(build_dir, exist_ok=True)
    cpp_extension.load(
        name="causal_conv1d_cuda",
        sources=[os.path.join(src, "csrc", f) for f in
                 ("causal_conv1d.cpp", "causal_conv1d_fwd.cu", "causal_conv1d_bwd.cu", "causal_conv1d_update.cu")],
        extra_cflags=["-O3"], extra_cuda_cflags=NVCC_FLAGS, extra_include_paths=[os.path.join(src, "csrc")],
        build_directory=build_dir, verbose=False)
    if not glob.glob(os.path.join(build_dir, "causal_conv1d_cuda*.so")):
        sys.exit(f"build_causal_conv1d: no causal_conv1d_cuda module in {build_dir}")
    print(os.pathsep.join([src, build_dir]))  # the package's Python, the extension
    return 0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("command", choices=["fetch", "build"])
    p.add_argument("folder", help="where the sdist is (or goes)")
    p.add_argument("out", nargs="?", help="build: where it is extracted and built")
    a = p.parse_args()
    if a.command == "fetch":
        return fetch(a.folder)
    if not a.out:
        p.error("build needs OUT")
    return build(a.folder, a.out)


if __name__ == "__main__":
    sys.exit(main())
