"""Reference for tests/program/export.rs: docs/train.md's ONNX export, run as the docs give it, then onnxruntime against
torchvision.

usage: onnx_reference.py DOCS.md ARCH WEIGHTS.safetensors DIR OUT.json
    runs the ```python block of DOCS.md's ONNX paragraph as it is in DIR (which holds `rn50 export`'s model.pt;
    it writes model.onnx there), then feeds onnxruntime the input named "input" with batches of 3 and 5 random
    3x224x224 images and torchvision's ARCH with WEIGHTS the same batches; for each batch, the output's shape,
    the largest |logit| and the largest difference between the two
"""
import json
import os
import re
import sys

import onnxruntime
import torch
import torchvision
from safetensors.torch import load_file


def docs_block(docs):
    text = open(docs).read()
    section = text.split("To ONNX", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def main(docs, arch, weights, work, out):
    code = docs_block(docs)
    os.chdir(work)
    exec(compile(code, docs, "exec"), {})
    state = load_file(weights)
    m = getattr(torchvision.models, arch)(num_classes=state["fc.bias"].shape[0]).eval()
    m.load_state_dict(state)
    session = onnxruntime.InferenceSession("model.onnx", providers=["CPUExecutionProvider"])
    torch.manual_seed(2)
    result = {}
    for batch in (3, 5):
        x = torch.randn(batch, 3, 224, 224)
        got = torch.from_numpy(session.run(None, {"input": x.numpy()})[0])
        with torch.no_grad():
            want = m(x)
        result[f"batch {batch}"] = {
            "batch": batch,
            "shape": list(got.shape),
            "output": session.get_outputs()[0].name,
            "max_abs": want.abs().max().item(),
            "max_diff": (got - want).abs().max().item(),
        }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


main(*sys.argv[1:6])
