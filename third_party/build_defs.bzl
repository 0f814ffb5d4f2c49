# Build macros shared by the project's packages.

def zplan_proto_library(name, src, deps = []):
    """C++ library for one .proto file, compiled by the system protoc.

    Bazel 4.2.3's native proto rules need a protobuf source repository; the
    system protoc (same version as libprotobuf-dev) avoids one.

    Args:
      name: target name, e.g. "model_cc_proto".
      src: the .proto file in this package.
      deps: other zplan_proto_library targets this file imports.
    """
    base = src[:-len(".proto")]
    native.genrule(
        name = name + "_gen",
        srcs = [src] + [d + "_srcs" for d in deps],
        outs = [base + ".pb.h", base + ".pb.cc"],
        tools = ["@system//:protoc"],
        cmd = "$(location @system//:protoc) --proto_path=. --cpp_out=$(GENDIR) $(location %s)" % src,
    )
    native.filegroup(name = name + "_srcs", srcs = [src] + [d + "_srcs" for d in deps])
    native.cc_library(
        name = name,
        srcs = [base + ".pb.cc"],
        hdrs = [base + ".pb.h"],
        # The schema travels with the library, so tools/source_digest.bzl hashes it.
        data = [src],
        deps = deps + ["@system//:protobuf"],
    )

def embed_files(name, srcs, symbol):
    """A cc_library exposing files' contents, so binaries carry their data.

    Generates `const std::vector<std::pair<std::string, std::string>>& symbol()`
    returning (path relative to the workspace, contents) pairs. zplan and zrun
    are copied to machines without the source tree (DESIGN §6).
    """
    native.genrule(
        name = name + "_gen",
        srcs = srcs,
        outs = [name + ".cc"],
        cmd = """
{
  echo '#include <string>'
  echo '#include <utility>'
  echo '#include <vector>'
  echo 'namespace zplan {'
  echo 'const std::vector<std::pair<std::string, std::string>>& %s() {'
  echo '  static const auto* files = new std::vector<std::pair<std::string, std::string>>{'
  for f in $(SRCS); do
    printf '    {"%%s", R"zplanembed(' "$$f"
    cat "$$f"
    echo ')zplanembed"},'
  done
  echo '  };'
  echo '  return *files;'
  echo '}'
  echo '}  // namespace zplan'
} > $@
""" % symbol,
    )
    # data: the embedded files, so tools/source_digest.bzl hashes them.
    native.cc_library(name = name, srcs = [name + ".cc"], data = srcs)
