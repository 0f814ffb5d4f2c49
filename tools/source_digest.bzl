"""source_digest: the SHA-256 of every source file of this workspace that a
target is built from, so a recorded measurement can name what produced it.

The aspect walks deps, srcs and data and collects the source files (not
generated ones: their own sources are reached through the rule that makes
them) owned by this workspace. BUILD files are not files a rule can read:
a change of copts alone does not change the digest. External repositories (LibTorch, Abseil, protobuf) are not
hashed: their versions are recorded beside the digest.

Output `<name>.txt`: one line, `<sha256 hex> <file count>`.

Example:
  source_digest(name = "zrun_sources", targets = ["//executor:zrun"])
"""

_SourcesInfo = provider(fields = ["files"])

_EDGES = ["deps", "srcs", "hdrs", "data"]

def _sources_aspect_impl(target, ctx):
    direct = []
    for attr in ["srcs", "hdrs", "data"]:
        for f in getattr(ctx.rule.files, attr, []):
            if f.is_source and f.owner.workspace_name == "":
                direct.append(f)
    transitive = []
    for attr in _EDGES:
        for dep in getattr(ctx.rule.attr, attr, []):
            if type(dep) == "Target" and _SourcesInfo in dep:
                transitive.append(dep[_SourcesInfo].files)
    return [_SourcesInfo(files = depset(direct, transitive = transitive))]

_sources_aspect = aspect(implementation = _sources_aspect_impl, attr_aspects = _EDGES)

def _source_digest_impl(ctx):
    files = depset(
        [f for f in ctx.files.srcs if f.owner.workspace_name == ""],
        transitive = [t[_SourcesInfo].files for t in ctx.attr.targets],
    ).to_list()
    out = ctx.actions.declare_file(ctx.label.name + ".txt")
    listing = ctx.actions.declare_file(ctx.label.name + ".files")
    ctx.actions.write(listing, "\n".join(sorted([f.path for f in files])) + "\n")
    # Each file's digest beside its path, in path order, hashed again: a
    # renamed, added or changed file changes the digest.
    ctx.actions.run_shell(
        inputs = files + [listing],
        outputs = [out],
        command = "echo \"$(xargs -d '\\n' sha256sum < {listing} | sha256sum | cut -d' ' -f1) {count}\" > {out}".format(
            listing = listing.path,
            count = len(files),
            out = out.path,
        ),
        mnemonic = "SourceDigest",
        progress_message = "Hashing the sources of %s" % ctx.label,
    )
    return [DefaultInfo(files = depset([out]), runfiles = ctx.runfiles(files = [out]))]

source_digest = rule(
    implementation = _source_digest_impl,
    attrs = {
        "targets": attr.label_list(aspects = [_sources_aspect]),
        "srcs": attr.label_list(allow_files = True),
    },
)
