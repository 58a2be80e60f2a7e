"""Reference for tests/program/export.rs: torchvision's ResNets against the TorchScript `rn50 export` wrote.

usage: export_reference.py weights ARCH OUT.safetensors
           a torchvision ARCH with seeded random weights and random BN running statistics (so that eval-mode BN
           matters), saved as safetensors with torchvision's keys
       export_reference.py compare ARCH WEIGHTS.safetensors MODEL.pt OUT.json [IMAGE...]
           torch.jit.load(MODEL.pt) and torchvision's ARCH with WEIGHTS on the same inputs: the images under
           torchvision's evaluation transform (one batch), and random batches of other sizes and shapes than the
           traced [1, 3, 224, 224]; for each input, the largest |logit| and the largest difference between the two
"""
import json
import sys
from pathlib import Path

import torch
import torchvision
from PIL import Image
from safetensors.torch import load_file, save_file
from torchvision import transforms


def torchvision_model(arch, num_classes=1000):
    """torchvision's ARCH; rn50's suffix _mish (resnet18_mish): timm's network of that depth with act_layer="mish",
    whose keys are torchvision's; a name torchvision lacks (seresnext50_32x4d): timm's; the suffix _sa, _maxblur or
    _maxdown: the reference trainer's network, whose self-attention and pools are fast.ai's."""
    import timm

    if arch.endswith("_sa") or "_maxblur" in arch or "_maxdown" in arch:
        sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benches"))
        from reference_train import build_model

        return build_model(arch, num_classes, False).eval()
    if arch.endswith("_mish"):
        return timm.create_model(arch.removesuffix("_mish"), num_classes=num_classes, act_layer="mish").eval()
    if not hasattr(torchvision.models, arch):
        return timm.create_model(arch, num_classes=num_classes).eval()
    return getattr(torchvision.models, arch)(num_classes=num_classes).eval()


def weights(arch, out):
    torch.manual_seed(0)
    m = torchvision_model(arch)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.2, 0.2)
                mod.running_var.uniform_(0.5, 2.0)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.2, 0.2)
            if isinstance(getattr(mod, "gamma", None), torch.nn.Parameter):
                mod.gamma.uniform_(1e-3, 2e-3)  # self-attention's scale, 0 at the start
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, out)


def compare(arch, weights_path, model_path, out, images):
    state = load_file(weights_path)
    m = torchvision_model(arch, num_classes=state["fc.bias"].shape[0])
    m.load_state_dict(state)
    exported = torch.jit.load(model_path)
    torch.manual_seed(1)
    inputs = {
        "random [3, 3, 160, 192]": torch.randn(3, 3, 160, 192),
        "random [1, 3, 224, 224]": torch.randn(1, 3, 224, 224),
    }
    if images:
        tf = transforms.Compose(
            [
                transforms.Resize(256),
                transforms.CenterCrop(224),
                transforms.ToTensor(),
                transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
            ]
        )
        photos = [tf(Image.open(p).convert("RGB")) for p in images]
        inputs[f"{len(photos)} photos"] = torch.stack(photos)
    result = {}
    with torch.no_grad():
        for name, x in inputs.items():
            want = m(x)
            got = exported(x)
            result[name] = {
                "batch": x.shape[0],
                "shape": list(got.shape),
                "max_abs": want.abs().max().item(),
                "max_diff": (got - want).abs().max().item(),
            }
    with open(out, "w") as f:
        json.dump(result, f, indent=1)


if sys.argv[1] == "weights":
    weights(sys.argv[2], sys.argv[3])
else:
    compare(sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
