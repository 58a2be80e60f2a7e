"""Reference for tests/mix.rs: torchvision.transforms.v2's MixUp and CutMix, functional.erase and
CrossEntropyLoss(label_smoothing) on the batch rn50 wrote, with the parameters rn50 chose; and the parameter
distributions MixUp and CutMix draw from.

usage: mix_reference.py apply DIR   reads DIR/input.safetensors (x: a normalised [N, 3, H, W] batch, labels, logits)
                                    and DIR/cases.json; writes DIR/out.safetensors: per case i, x_i (the mixed
                                    batch), t_i (the targets), loss_i (cross-entropy of logits against t_i with
                                    label smoothing 0.1); and erased (x with the cases' erase boxes set to 0)
       mix_reference.py draws DIR N  writes DIR/draws.json: N draws each of MixUp's λ (alpha 0.2 and 1.0) and of
                                    CutMix's λ (after the box) and box sides on 176x176 and 13x11 images (alpha 1.0)
"""
import json
import sys
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torchvision.transforms import v2
from torchvision.transforms.v2 import functional as F


def apply(d: Path):
    t = load_file(d / "input.safetensors")
    cases = json.loads((d / "cases.json").read_text())
    x, labels, logits = t["x"], t["labels"], t["logits"]
    classes = logits.shape[1]
    out = {}
    loss = torch.nn.CrossEntropyLoss(label_smoothing=0.1)
    for i, c in enumerate(cases["mix"]):
        if c["kind"] == "mixup":
            m = v2.MixUp(alpha=1.0, num_classes=classes)
            params = {"lam": c["lam"]}
        else:
            m = v2.CutMix(alpha=1.0, num_classes=classes)
            params = {"box": tuple(c["box"]), "lam_adjusted": c["lam"]}
        m.make_params = lambda flat_inputs, params=params: params
        xi, ti = m(x.clone(), labels)
        out[f"x_{i}"] = xi.contiguous()
        out[f"t_{i}"] = ti.contiguous()
        out[f"loss_{i}"] = loss(logits, ti).reshape(1)
    erased = x.clone()
    for image, top, left, h, w in cases["erase"]:
        erased[image] = F.erase(erased[image], top, left, h, w, torch.tensor(0.0))
    out["erased"] = erased.contiguous()
    save_file(out, d / "out.safetensors")


def draws(d: Path, n: int):
    torch.manual_seed(0)
    r = {}
    for alpha in (0.2, 1.0):
        m = v2.MixUp(alpha=alpha, num_classes=10)
        r[f"mixup_lam_{alpha}"] = [m.make_params([])["lam"] for _ in range(n)]
    for h, w in ((176, 176), (13, 11)):
        m = v2.CutMix(alpha=1.0, num_classes=10)
        img = torch.zeros(1, 3, h, w)
        lams, widths, heights = [], [], []
        for _ in range(n):
            p = m.make_params([img])
            x1, y1, x2, y2 = p["box"]
            lams.append(p["lam_adjusted"])
            widths.append(x2 - x1)
            heights.append(y2 - y1)
        r[f"cutmix_{h}x{w}"] = {"lam": lams, "width": widths, "height": heights}
    (d / "draws.json").write_text(json.dumps(r))


if __name__ == "__main__":
    mode, d = sys.argv[1], Path(sys.argv[2])
    if mode == "apply":
        apply(d)
    elif mode == "draws":
        draws(d, int(sys.argv[3]))
    else:
        sys.exit(f"unknown mode {mode}")
