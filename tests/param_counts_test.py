"""zplan's parameter count of every supported model_type at full size against
transformers' own: the model built on the meta device (no memory) from each
type's default config (transformers' config class defaults, e.g. LlamaConfig's
7B shape) and from the published configs under configs/hf/, counted as
model.parameters() does (a tied head once). The supported types are the ones
`zplan --help` lists, so a family added to planner/model_family.cc is checked
here without a word in this file. A type whose default config builds what zplan
refuses by name (granitemoehybrid's default is Mamba-2 layers with experts) must
be refused with exit 2 and have a published config here that is planned exactly.

Python drives transformers here (DESIGN: Python only where it drives a Python
framework). Usage: param_counts_test.py ZPLAN CONFIG.json...
"""
import json
import os
import re
import subprocess
import sys
import tempfile

import torch
import transformers


def supported_model_types(zplan):
    help_text = subprocess.run([zplan, "--help"], capture_output=True, text=True).stdout
    match = re.search(r"^supported model_types \(--hf-config\): (.+)$", help_text, re.M)
    if not match:
        sys.exit("zplan --help has no 'supported model_types' line")
    return [t.strip() for t in match.group(1).split(",")]


def transformers_count(config):
    # ViT is an image classifier; every other supported type a causal LM.
    auto = (transformers.AutoModelForImageClassification if config.model_type == "vit"
            else transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def zplan_count(zplan, path):
    # Counts do not depend on the sequence: a language model's is planned below any published sliding
    # window (Phi-3-mini's 2047, which zplan refuses to reach); a ViT's is fixed by its image.
    with open(path) as f:
        seq = [] if json.load(f).get("model_type") == "vit" else ["--seq", "1024"]
    out = subprocess.run([zplan, "--hf-config", path, "--gpu", "cpu", "--zero-stage", "0", "--format", "json"] + seq,
                         capture_output=True, text=True)
    if out.returncode != 0:
        return "zplan exit %d: %s" % (out.returncode, out.stderr.strip())
    return int(json.loads(out.stdout)["total_params"])


def model_type_of(path):
    with open(path) as f:
        return json.load(f).get("model_type")


def main(argv):
    zplan, published = argv[1], argv[2:]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        cases = []
        published_types = {model_type_of(p) for p in published}
        for model_type in supported_model_types(zplan):
            path = os.path.join(tmp, model_type + ".json")
            transformers.AutoConfig.for_model(model_type).to_json_file(path)
            cases.append(("%s (transformers' default config)" % model_type, path))
        cases += [(os.path.basename(p), p) for p in published]
        for name, path in cases:
            want = transformers_count(transformers.AutoConfig.from_pretrained(path))
            rows.append((name, model_type_of(path), want, zplan_count(zplan, path)))
    failed = 0
    print("%-44s %16s %16s" % ("config", "transformers", "zplan"))
    for name, model_type, want, got in rows:
        refused = isinstance(got, str) and got.startswith("zplan exit 2:") and "default config" in name
        ok = got == want or (refused and model_type in published_types)
        failed += not ok
        shown = ("refused by name; its published config is checked: " + got.splitlines()[0][:70]) if refused else got
        print("%-44s %16d %16s%s" % (name, want, shown, "" if ok else "   MISMATCH"))
    print("transformers %s, %d configs, %d differ" % (transformers.__version__, len(rows), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
