"""zplan's parameter count of every supported model_type at full size against
transformers' own: the model built on the meta device (no memory) from each
type's default config (transformers' config class defaults, e.g. LlamaConfig's
7B shape) and from the published configs under configs/hf/, counted as
model.parameters() does (a tied head once). The supported types are the ones
`zplan --help` lists, so a family added to planner/model_family.cc is checked
here without a word in this file; so are the vision-language types its help lists
(zplan count), built as image-text-to-text models. A type whose default config
builds what zplan refuses by name (granitemoehybrid's default is Mamba-2 layers
with experts; the Qwen vision-language defaults merge images into a width their
language model lacks) must be refused with exit 2 and have a published config
here, or for the Qwen ones the default made runnable, that is counted exactly.

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


def model_types(zplan, line):
    help_text = subprocess.run([zplan, "--help"], capture_output=True, text=True).stdout
    match = re.search(r"^%s[^:]*: (.+)$" % re.escape(line), help_text, re.M)
    if not match:
        sys.exit("zplan --help has no '%s' line" % line)
    return [t.strip() for t in match.group(1).split(",")]


# Parts a type's default config leaves out, switched on at full size:
# GraniteMoeSharedConfig's shared_intermediate_size is 0 (no shared_mlp), 1024 in its docstring.
DEFAULT_WITH = {"granitemoeshared": {"shared_intermediate_size": 1024}}


def transformers_count(config, vision_language):
    # ViT is an image classifier; the vision-language types image-text-to-text models; the others causal LMs.
    auto = (transformers.AutoModelForImageClassification if config.model_type == "vit"
            else transformers.AutoModelForImageTextToText if vision_language
            else transformers.AutoModelForCausalLM)
    with torch.device("meta"):
        model = auto.from_config(config)
    return sum(p.numel() for p in model.parameters())


def zplan_count(zplan, path):
    out = subprocess.run([zplan, "count", "--hf-config", path, "--format", "json"], capture_output=True, text=True)
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
        vision_language = set(model_types(zplan, "vision-language model_types"))
        for model_type in model_types(zplan, "supported model_types") + sorted(vision_language):
            path = os.path.join(tmp, model_type + ".json")
            config = transformers.AutoConfig.for_model(model_type)
            config.to_json_file(path)
            cases.append(("%s (transformers' default config)" % model_type, path))
            for key, value in DEFAULT_WITH.get(model_type, {}).items():
                setattr(config, key, value)
                path = os.path.join(tmp, "%s-%s.json" % (model_type, key))
                config.to_json_file(path)
                cases.append(("%s (default, %s %s)" % (model_type, key, value), path))
            vision = getattr(config, "vision_config", None)
            if vision is not None and getattr(vision, "out_hidden_size", None) not in (None, config.text_config.hidden_size):
                # The Qwen classes' defaults merge the image into a width their language model does not have (zplan
                # refuses them by name): the same with the merger's output made the language model's width.
                vision.out_hidden_size = config.text_config.hidden_size
                path = os.path.join(tmp, model_type + "-runnable.json")
                config.to_json_file(path)
                cases.append(("%s (default, out_hidden_size = hidden)" % model_type, path))
        cases += [(os.path.basename(p), p) for p in published]
        for name, path in cases:
            want = transformers_count(transformers.AutoConfig.from_pretrained(path),
                                      model_type_of(path) in vision_language)
            rows.append((name, model_type_of(path), want, zplan_count(zplan, path)))
    failed = 0
    print("%-44s %16s %16s" % ("config", "transformers", "zplan"))
    for name, model_type, want, got in rows:
        refused = isinstance(got, str) and got.startswith("zplan exit 2:") and "default config" in name
        runnable_checked = any(n.startswith(model_type + " (default, out_hidden_size") for n, _, _, _ in rows)
        ok = got == want or (refused and (model_type in published_types or runnable_checked))
        failed += not ok
        shown = ("refused by name; its published config is checked: " + got.splitlines()[0][:70]) if refused else got
        print("%-44s %16d %16s%s" % (name, want, shown, "" if ok else "   MISMATCH"))
    print("transformers %s, %d configs, %d differ" % (transformers.__version__, len(rows), failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
