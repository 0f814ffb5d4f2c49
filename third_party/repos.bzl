# Repository rules for an offline build (DESIGN §5).
#
# Everything comes from this machine: Debian's -dev packages (Abseil, Protobuf,
# GoogleTest, Gloo headers, Cairo), the CUDA toolkit headers under
# /usr/local/cuda and the torch==2.11.0 wheel in the project's Python
# environment (tools/setup.sh).
# Nothing here downloads.

_RULES_CC_DEFS = """\
# Debian's bazel-rules-cc is too new for Bazel 4.2.3 (it loads
# use_cpp_toolchain); these re-export the native rules instead, covering every
# symbol @bazel_tools loads from @rules_cc.
cc_binary = native.cc_binary
cc_import = native.cc_import
cc_library = native.cc_library
cc_proto_library = native.cc_proto_library
cc_test = native.cc_test
cc_toolchain = native.cc_toolchain
cc_toolchain_suite = native.cc_toolchain_suite
objc_library = native.objc_library
"""

def _files_repo_impl(rctx):
    for path, content in rctx.attr.files.items():
        rctx.file(path, content)

# A repository made of literal files: the local rules_cc shim and the
# remote_coverage_tools stub that cc_test requires.
files_repo = repository_rule(
    implementation = _files_repo_impl,
    attrs = {"files": attr.string_dict()},
)

_SYSTEM_BUILD = """\
package(default_visibility = ["//visibility:public"])

# Debian's libabsl-dev ships one shared library per Abseil component; link all
# of them (the list is read off the machine) so targets never miss a symbol.
cc_library(
    name = "absl",
    linkopts = [{absl_libs}],
)

cc_library(
    name = "protobuf",
    linkopts = ["-lprotobuf", "-lpthread"],
)

cc_library(
    name = "gtest",
    linkopts = ["-lgmock", "-lgtest", "-lpthread"],
)

cc_library(
    name = "gtest_main",
    linkopts = ["-lgmock", "-lgtest_main", "-lgtest", "-lpthread"],
)

# Cairo (libcairo2-dev) draws `zplan --plot`. Its headers are linked in from
# /usr/include/cairo so that `#include <cairo.h>` works as pkg-config has it.
cc_library(
    name = "cairo",
    hdrs = glob(["cairo_include/*.h"]),
    includes = ["cairo_include"],
    linkopts = ["-lcairo"],
)

sh_binary(
    name = "protoc",
    srcs = ["protoc.sh"],
)
"""

def _system_libs_impl(rctx):
    libdir = rctx.attr.libdir
    result = rctx.execute(["sh", "-c", "ls %s/libabsl_*.so" % libdir])
    if result.return_code != 0:
        fail("Abseil shared libraries not found in %s: run tools/setup.sh" % libdir)
    libs = []
    for path in result.stdout.strip().split("\n"):
        name = path.split("/")[-1][len("lib"):-len(".so")]
        libs.append('"-l%s"' % name)
    protoc = rctx.which("protoc")
    if protoc == None:
        fail("protoc not found: run tools/setup.sh (package protobuf-compiler)")
    rctx.file("protoc.sh", "#!/bin/sh\nexec %s \"$@\"\n" % protoc, executable = True)
    # Without libcairo2-dev only the targets that draw fail (cairo.h not
    # found); the rest builds.
    if rctx.path(rctx.attr.cairo_include + "/cairo.h").exists:
        rctx.symlink(rctx.attr.cairo_include, "cairo_include")
    else:
        rctx.file("cairo_include/README", "no cairo.h in %s: run tools/setup.sh (libcairo2-dev)\n" %
                                          rctx.attr.cairo_include)
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD.bazel", _SYSTEM_BUILD.format(absl_libs = ", ".join(libs)))

system_libs = repository_rule(
    implementation = _system_libs_impl,
    attrs = {
        "libdir": attr.string(default = "/usr/lib/x86_64-linux-gnu"),
        "cairo_include": attr.string(default = "/usr/include/cairo"),
    },
    local = True,
)

_TORCH_BUILD = """\
package(default_visibility = ["//visibility:public"])

# The Python this LibTorch came from (tools/setup.sh's .venv, with deepspeed
# and transformers), for tools and tests that drive a Python framework.
exports_files(["python"])

# LibTorch from the torch=={version} wheel at {torch_dir}.
# include/google (an old protobuf bundled in the wheel) is deliberately not
# linked into this repository, so it can never shadow the system protobuf.
cc_library(
    name = "torch",
    hdrs = glob(["include/**/*.h", "include/**/*.hpp", "include/**/*.cuh"]),
    includes = ["include", "include/torch/csrc/api/include"],
    defines = ["_GLIBCXX_USE_CXX11_ABI=1"],
    linkopts = [
        "-L{torch_dir}/lib",
        "-Wl,-rpath,{torch_dir}/lib",
        # libtorch_cuda registers the CUDA backend from static initialisers;
        # without --no-as-needed the linker drops it (pytorch#36437).
        "-Wl,--push-state,--no-as-needed",
        "-ltorch",
        "-ltorch_cpu",
        "-ltorch_cuda",
        "-lc10",
        "-lc10_cuda",
        "-Wl,--pop-state",
    ],
    deps = [":cuda_headers"],
)

# The CUDA runtime of the wheel (nvidia/cu13), for the few direct CUDA calls.
cc_library(
    name = "cudart",
    linkopts = [
        "-L{site}/nvidia/cu13/lib",
        "-Wl,-rpath,{site}/nvidia/cu13/lib",
        "-l:libcudart.so.13",
    ],
)

# CUDA runtime headers (for c10/cuda) and the NCCL headers that match
# torch's pinned nvidia-nccl-cu13.
cc_library(
    name = "cuda_headers",
    hdrs = glob(["cuda_include/**/*.h", "cuda_include/**/*.hpp", "nccl_include/**/*.h"]),
    includes = ["cuda_include", "nccl_include"],
)
"""

def _torch_impl(rctx):
    root = rctx.path(Label("//:WORKSPACE")).dirname
    python = rctx.os.environ.get("ZPLAN_PYTHON", "%s/.venv/bin/python3" % root)
    result = rctx.execute([python, "-c", "import os, torch; print(os.path.dirname(torch.__file__)); print(torch.__version__)"])
    if result.return_code != 0:
        fail("torch not importable with %s: run tools/setup.sh (%s)" % (python, result.stderr))
    lines = result.stdout.strip().split("\n")
    torch_dir, version = lines[-2], lines[-1]
    include = rctx.path(torch_dir + "/include")
    for child in include.readdir():
        if child.basename != "google":
            rctx.symlink(child, "include/" + child.basename)
    site = torch_dir[:-len("/torch")]
    # The CUDA toolkit headers are only needed by executor code that talks to
    # CUDA directly; without a toolkit those targets fail, the rest builds.
    if rctx.path(rctx.attr.cuda_include).exists:
        rctx.symlink(rctx.attr.cuda_include, "cuda_include")
    else:
        rctx.file("cuda_include/README", "no CUDA toolkit at %s\n" % rctx.attr.cuda_include)
    rctx.symlink(site + "/nvidia/nccl/include", "nccl_include")
    # A script, not a symlink: a venv's interpreter finds its site-packages
    # from the path it is started by.
    rctx.file("python", "#!/bin/sh\nexec %s \"$@\"\n" % python, executable = True)
    rctx.file("WORKSPACE", "workspace(name = \"%s\")\n" % rctx.name)
    rctx.file("BUILD.bazel", _TORCH_BUILD.format(torch_dir = torch_dir, version = version, site = site))

torch_repository = repository_rule(
    implementation = _torch_impl,
    attrs = {"cuda_include": attr.string(default = "/usr/local/cuda/include")},
    environ = ["ZPLAN_PYTHON"],
    local = True,
)

def zplan_dependencies():
    files_repo(
        name = "rules_cc",
        files = {
            "WORKSPACE": "workspace(name = \"rules_cc\")\n",
            "BUILD": "",
            "cc/BUILD": "",
            "cc/defs.bzl": _RULES_CC_DEFS,
        },
    )
    files_repo(
        name = "remote_coverage_tools",
        files = {
            "WORKSPACE": "workspace(name = \"remote_coverage_tools\")\n",
            "BUILD": "package(default_visibility = [\"//visibility:public\"])\n" +
                     "filegroup(name = \"coverage_report_generator\", srcs = [])\n" +
                     "filegroup(name = \"lcov_merger\", srcs = [])\n",
        },
    )
    system_libs(name = "system")
    torch_repository(name = "torch")
