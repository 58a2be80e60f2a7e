"""Reference outputs from torchvision and timm for rn50's parity tests.

For each case: a torchvision ResNet (or timm's ResNet-D and anti-aliased ones) with random weights (BN statistics and affine perturbed so they
matter), saved as safetensors *with* num_batches_tracked as torchvision writes it; logits in eval and train
mode; two SGD steps (momentum, weight decay, optional Nesterov / no decay on 1-D params, label smoothing),
with the losses and the final state_dict. Also the key/shape list of every depth, and of timm's variants.

usage: torchvision_step.py OUT_DIR THREADS (the bf16 case's: the test process's libtorch default)
"""
import json
import sys
from pathlib import Path

import timm
import torch
import torchvision
from safetensors.torch import save_file
from timm.layers import BlurPool2d
from timm.models.resnet import BasicBlock, Bottleneck, ResNet

CASES = [
    # name, arch, nesterov, no_bn_bias_decay, label_smoothing, channels_last, image side[, precision]
    ("r18_plain", "resnet18", False, False, 0.0, False, 64),
    ("r50_nesterov_nobnwd_ls", "resnet50", True, True, 0.1, False, 64),
    # channels_last changes oneDNN's kernels and so the rounding; compare like with like.
    ("r50_nesterov_nobnwd_ls_cl", "resnet50", True, True, 0.1, True, 64),
    # timm's ResNet-D with anti-aliasing: deep stem, average-pool shortcuts, blur after every strided conv. At
    # 72 px stages 3 and 4 get odd sides (9 and 5), where the shortcut's pool (ceil mode, padding not counted) and
    # the blur's reflection padding reach the edge.
    ("rblur50d_nesterov_nobnwd_ls_cl", "resnetblur50d", True, True, 0.1, True, 72),
    ("rblur18d_plain", "resnetblur18d", False, False, 0.0, False, 72),
    # Mish for every ReLU: timm's own act_layer="mish", on ResNet-D and on the plain ResNet-18.
    ("r50d_mish_nesterov_nobnwd_ls_cl", "resnet50d_mish", True, True, 0.1, True, 64),
    ("r18_mish_plain", "resnet18_mish", False, False, 0.0, False, 64),
    # ResNeXt's grouped 3x3 (torchvision's), and fast.ai's xse_resnext50 as timm builds it: ResNet-D with
    # squeeze-and-excitation and 32 groups of 4 channels; SE on basic blocks (timm's seresnet18).
    ("rx50_plain", "resnext50_32x4d", False, False, 0.0, False, 64),
    ("sx50d_nesterov_nobnwd_ls_cl", "seresnext50d_32x4d", True, True, 0.1, True, 64),
    ("sr18_plain", "seresnet18", False, False, 0.0, False, 64),
    # fast.ai's simple self-attention (the reference trainer's SimpleSelfAttention: torch's spectral_norm on a
    # Conv1d), its gamma made non-zero so that it counts, in a bottleneck after ResNet-D's and in a basic block.
    ("r50d_sa_nesterov_nobnwd_ls_cl", "resnet50d_sa", True, True, 0.1, True, 64),
    ("r18_sa_plain", "resnet18_sa", False, False, 0.0, False, 64),
    # fast.ai's 2020-10 max-blur pool (the reference trainer's MaxBlurPool2d, kornia 0.4.1's) in the stem and ResNet-D's
    # shortcuts, channels_last; in ResNet-18's stem alone, NCHW, at 70 px, where the stem's map (35) is odd.
    ("r50d_maxblur_nesterov_nobnwd_ls_cl", "resnet50d_maxblur", True, True, 0.1, True, 64),
    ("r18_maxblur_plain", "resnet18_maxblur", False, False, 0.0, False, 70),
    # fast.ai's pool=MaxPool: 2x2 max pools (ceil mode) in ResNet-D's shortcuts, at 72 px, where the last two
    # shortcuts' inputs (9 and 5) are odd.
    ("r50d_maxdown_nesterov_nobnwd_ls_cl", "resnet50d_maxdown", True, True, 0.1, True, 72),
    # bf16 autocast as the reference trainer runs it on the CPU (the loss of the logits as fp32), on the test's
    # threads: the same ops in the same dtypes in the same libtorch give the same bits (bf16 rounding would not).
    ("r50d_maxdown_nesterov_nobnwd_ls_cl_bf16", "resnet50d_maxdown", True, True, 0.1, True, 64, "bf16"),
]
# timm's names whose keys rn50's must be (resnetblur18d and seresnext50d_32x4d are not registered in timm: built as
# its resnetblur50d and seresnext26d_32x4d are).
TIMM = ["resnet18d", "resnet50c", "resnet50d", "resnetblur50", "resnetblur50d", "resnet101d", "resnetblur18d",
        "seresnet50", "seresnext50_32x4d", "resnext50d_32x4d", "seresnext50d_32x4d"]
TORCHVISION = ["resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d"]


def model(arch):
    """torchvision's network of that name, else timm's; rn50's suffix _mish: timm's with act_layer="mish" (timm's
    plain ResNets have torchvision's keys); _sa, _maxblur and _maxdown: the reference trainer's network, whose
    self-attention and pools are fast.ai's."""
    if arch.endswith("_sa") or "_maxblur" in arch or "_maxdown" in arch:
        sys.path.insert(0, str(Path(__file__).resolve().parents[4] / "benches"))
        from reference_train import build_model

        return build_model(arch, 1000, False)
    if arch.endswith("_mish"):
        return timm.create_model(arch.removesuffix("_mish"), num_classes=1000, act_layer="mish")
    if arch in torchvision.models.__dict__:
        return torchvision.models.__dict__[arch](num_classes=1000)
    if arch == "resnetblur18d":
        return ResNet(BasicBlock, [2, 2, 2, 2], aa_layer=BlurPool2d, stem_width=32, stem_type="deep", avg_down=True)
    if arch == "seresnext50d_32x4d":
        return ResNet(Bottleneck, [3, 4, 6, 3], cardinality=32, base_width=4, stem_width=32, stem_type="deep",
                      avg_down=True, block_args=dict(attn_layer="se"))
    return timm.create_model(arch, num_classes=1000)
N, LR, MOMENTUM, WD = 4, 0.01, 0.9, 1e-4


def case(out: Path, name, arch, nesterov, no_bn_bias_decay, label_smoothing, channels_last, S, precision="fp32"):
    before = torch.get_num_threads()
    if precision == "bf16":
        torch.set_num_threads(int(sys.argv[2]))
    torch.manual_seed(0)
    m = model(arch)
    with torch.no_grad():
        for mod in m.modules():
            if isinstance(mod, torch.nn.BatchNorm2d):
                mod.running_mean.uniform_(-0.1, 0.1)
                mod.running_var.uniform_(0.5, 1.5)
                mod.weight.uniform_(0.5, 1.5)
                mod.bias.uniform_(-0.1, 0.1)
            if isinstance(getattr(mod, "gamma", None), torch.nn.Parameter):
                # Self-attention's scale starts at 0; at about 1e-3 its term is of the order of its input.
                mod.gamma.uniform_(1e-3, 2e-3)
    save_file({k: v.contiguous() for k, v in m.state_dict().items()}, out / f"{name}.weights.safetensors")

    xs = [torch.randn(N, 3, S, S) for _ in range(2)]
    ys = [torch.randint(0, 1000, (N,)) for _ in range(2)]
    if channels_last:
        m = m.to(memory_format=torch.channels_last)
        xs = [x.contiguous(memory_format=torch.channels_last) for x in xs]
    amp = torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16")
    m.eval()
    with torch.no_grad(), amp:
        logits_eval = m(xs[0]).float()
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
        with amp:
            logits = m(x).float()
            loss = loss_fn(logits, y)
        if i == 0:
            logits_train = logits.detach().clone()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    tensors = {
        "x0": xs[0].contiguous(), "x1": xs[1].contiguous(), "y0": ys[0], "y1": ys[1],
        "logits_eval": logits_eval, "logits_train": logits_train, "losses": torch.tensor(losses),
    }
    tensors.update({f"final.{k}": v.contiguous() for k, v in m.state_dict().items()})
    save_file(tensors, out / f"{name}.ref.safetensors")
    threads = torch.get_num_threads()
    torch.set_num_threads(before)
    return {"arch": arch, "nesterov": nesterov, "no_bn_bias_decay": no_bn_bias_decay,
            "label_smoothing": label_smoothing, "channels_last": channels_last, "lr": LR, "momentum": MOMENTUM, "weight_decay": WD,
            "precision": precision, "threads": threads, "torch": torch.__version__.split("+")[0]}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.set_num_threads(2)
    meta = {"cases": {c[0]: case(out, *c) for c in CASES}, "keys": {}}
    for arch in TORCHVISION:
        m = torchvision.models.__dict__[arch]()
        meta["keys"][arch] = {k: list(v.shape) for k, v in m.state_dict().items()}
    for arch in TIMM:
        meta["keys"][arch] = {k: list(v.shape) for k, v in model(arch).state_dict().items()}
    (out / "meta.json").write_text(json.dumps(meta))


if __name__ == "__main__":
    main()
