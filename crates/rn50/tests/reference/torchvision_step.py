"""Reference outputs from torchvision for rn50's parity tests.

For each case: a torchvision ResNet with random weights (BN statistics and affine perturbed so they
matter), saved as safetensors *with* num_batches_tracked as torchvision writes it; logits in eval and train
mode; two SGD steps (momentum, weight decay, optional Nesterov / no decay on 1-D params, label smoothing),
with the losses and the final state_dict. Also the key/shape list of every depth.

usage: torchvision_step.py OUT_DIR
"""
import json
import sys
from pathlib import Path

import torch
import torchvision
from safetensors.torch import save_file

CASES = [
    # name, arch, nesterov, no_bn_bias_decay, label_smoothing, channels_last
    ("r18_plain", "resnet18", False, False, 0.0, False),
    ("r50_nesterov_nobnwd_ls", "resnet50", True, True, 0.1, False),
    # channels_last changes oneDNN's kernels and so the rounding; compare like with like.
    ("r50_nesterov_nobnwd_ls_cl", "resnet50", True, True, 0.1, True),
]
N, S, LR, MOMENTUM, WD = 4, 64, 0.01, 0.9, 1e-4


def case(out: Path, name, arch, nesterov, no_bn_bias_decay, label_smoothing, channels_last):
    torch.manual_seed(0)
    m = torchvision.models.__dict__[arch](num_classes=1000)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, out / f"{name}.weights.safetensors")

    xs = [torch.randn(N, 3, S, S) for _ in range(2)]
    ys = [torch.randint(0, 1000, (N,)) for _ in range(2)]
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    m.eval()
    with torch.no_grad():
        logits_eval = m(xs[0])
    m.train()
    if no_bn_bias_decay:
        decay = [p for p in m.parameters() if p.ndim > 1]
        no_decay = [p for p in m.parameters() if p.ndim <= 1]
        groups = [{"params": decay, "weight_decay": WD}, {"params": no_decay, "weight_decay": 0.0}]
    else:
        groups = [{"params": list(m.parameters()), "weight_decay": WD}]
    opt = torch.optim.SGD(groups, lr=LR, momentum=MOMENTUM, nesterov=nesterov)
    loss_fn = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    losses = []
    for i, (x, y) in enumerate(zip(xs, ys)):
        opt.zero_grad()
        logits = m(x)
        if i == 0:
            logits_train = logits.detach().clone()
        loss = loss_fn(logits, y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tensors = {
        "x0": xs[0].contiguous(), "x1": xs[1].contiguous(), "y0": ys[0], "y1": ys[1],
        "logits_eval": logits_eval, "logits_train": logits_train, "losses": torch.tensor(losses),
    }
    tensors.update({f"final.{k}": v.contiguous() for k, v in m.state_dict().items()})
    save_file(tensors, out / f"{name}.ref.safetensors")
    return {"arch": arch, "nesterov": nesterov, "no_bn_bias_decay": no_bn_bias_decay,
            "label_smoothing": label_smoothing, "channels_last": channels_last, "lr": LR, "momentum": MOMENTUM, "weight_decay": WD}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    meta = {"cases": {c[0]: case(out, *c) for c in CASES}, "keys": {}}
    for arch in ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152"]:
        m = torchvision.models.__dict__[arch]()
        meta["keys"][arch] = {k: list(v.shape) for k, v in m.state_dict().items()}
    (out / "meta.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main()
