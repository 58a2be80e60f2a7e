"""Reference for tests/program/classify.rs: a torchvision ResNet-18 with seeded random weights, saved as safetensors with
torchvision's keys, and its top-5 classes (softmax probabilities) for each image under torchvision's own
evaluation transform (Resize(256), CenterCrop(224), ToTensor, Normalize with ImageNet's mean and std).

usage: classify_reference.py OUT_DIR IMAGE...   writes OUT_DIR/resnet18.safetensors and OUT_DIR/top5.json
"""
import json
import sys
from pathlib import Path

import torch
import torchvision
from PIL import Image
from safetensors.torch import save_file
from torchvision import transforms

out = Path(sys.argv[1])
torch.manual_seed(0)
m = torchvision.models.resnet18(num_classes=1000).eval()
save_file({k: v.contiguous() for k, v in m.state_dict().items()}, out / "resnet18.safetensors")
tf = transforms.Compose(
    [
        transforms.Resize(256),
        transforms.CenterCrop(224),
        transforms.ToTensor(),
        transforms.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225]),
    ]
)
result = {}
with torch.no_grad():
    for path in sys.argv[2:]:
        x = tf(Image.open(path).convert("RGB")).unsqueeze(0)
        p, i = m(x).softmax(-1)[0].topk(5)
        result[path] = {"index": i.tolist(), "prob": p.tolist()}
(out / "top5.json").write_text(json.dumps(result, indent=1))
