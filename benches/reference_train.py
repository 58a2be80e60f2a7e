"""The PyTorch reference for `rn50 train`: the same recipe written as torchvision's references and
pytorch/examples' main.py write it, to measure rn50's accuracy per epoch (and its wall-clock) against.

    reference_train.py DATA --config recipes/imagenette-5ep.toml --seed 1 --out runs/ref-s1 [flags]

DATA holds train/ and val/ ImageFolder trees. The recipe comes from the same TOML file `rn50 train --config`
reads (keys are rn50's long flag names) and the same flags override it (`--no-nesterov`, `--bn-wd`, ... turn off a
switch the file turns on, as in rn50); a key this reference does not implement
(Mixup, CutMix, AutoAugment, EMA, LARS, ...) is refused rather than silently ignored.

What it does, step for step as rn50:
  - torchvision.datasets.ImageFolder; transforms.v2: RandomResizedCrop(image-size, --scale (0.08-1), --ratio (3/4-4/3),
    antialias) + RandomHorizontalFlip for training; Resize(val-resize, antialias) + CenterCrop(val-crop) for
    evaluation; ImageNet mean/std. val-resize/val-crop default to rn50's: crop = image-size, resize = round(crop/0.875);
  - torchvision.models.<arch>(num_classes = the class folders), --zero-init-residual as torchvision's; rn50's
    names for timm's variants (resnet50d, resnetblur50, resnetblur50d, seresnext50d_32x4d, ...) as timm's ResNet
    with the same stem_type, avg_down, aa_layer, cardinality, base_width and SE (timm_resnet below),
    zero_init_last = --zero-init-residual; the suffix _mish
    (resnet50d_mish) makes every ReLU module a torch.nn.Mish (timm's act_layer="mish", fast.ai's xresnet's), and then
    _sa (resnet50d_mish_sa) adds fast.ai's SimpleSelfAttention where its xresnet has it (SimpleSelfAttention below);
    _maxblur before those (resnet50d_maxblur) puts the max-blur pool of fast.ai's 2020-10 Imagenette entry
    (MaxBlurPool2d below, kornia 0.4.1's) in the stem's max pool and ResNet-D's shortcut pools, _maxdown
    (resnet50d_maxdown) fast.ai's max pool (pool=MaxPool) in ResNet-D's shortcut pools;
  - torch.optim.SGD(momentum, nesterov, weight decay; --no-bn-wd: none on 1-D parameters, batch-norm and biases,
    as rn50 and torchvision's --norm-weight-decay 0 with --bias-weight-decay 0); --optimizer adamw or radam:
    torch.optim.AdamW or torch.optim.RAdam(decoupled_weight_decay=True), betas (--momentum, --beta2), eps
    --opt-eps, foreach; --lookahead: fast.ai's Lookahead around it (slow weights from the first step's, every
    --lookahead-k steps slow += --lookahead-alpha·(fast - slow), fast = slow): fast.ai's Ranger with radam;
  - the rate of each step from rn50's schedule (crates/rn50/src/train/schedule.rs): linear warmup from 0 over
    --warmup-epochs, then step/cosine/linear/flat-cos, or one-cycle (a cosine up from peak / --div-factor over
    --warmup-epochs, then one down; the momentum cycled from --momentum to --base-momentum and back), evaluated
    at t = epoch + (batch + 1) / batches per epoch;
    --lr, or --lr-base x global batch / --lr-base-size (default 0.1 per 256);
  - CrossEntropyLoss(label_smoothing); shuffled, drop_last batches; channels_last; autocast for bf16 and fp16
    (fp16 with torch.amp.GradScaler, rn50's default on a GPU; bf16 rn50's on a CPU with AMX or AVX512-BF16, as
    cpu_precision decides);
  - on CUDA (--device, default as rn50's: cuda when there is one) the settings rn50 applies there: cuDNN autotuning
    (cudnn.benchmark) and TF32; the loader pins its batches and they go to the GPU without blocking;
  - evaluation after every epoch: top-1, top-5 and the mean cross-entropy (no smoothing), as main.py's validate().

OUT/metrics.jsonl has one line per epoch in rn50's schema (rn50_report::schema::EpochMetrics: epoch, train_loss,
train_acc1, lr, images_per_sec, acc1, acc5, val_loss, val_images, seconds, train_seconds, resolution,
data_wait_share), so `rn50 report` tables and plots it beside rn50's runs; OUT/summary.json is an rn50
summary.json (TrainSummary) whose device names PyTorch.
"""
import argparse
import json
import math
import os
import sys
import time
import tomllib

import torch
import torchvision
from torchvision.transforms import v2

# rn50's flags this reference implements, with their defaults (rn50 train --help).
DEFAULTS = {
    "arch": "resnet50",
    "batch-size": 256,
    "epochs": 90,
    "lr": None,
    "lr-base": None,
    "lr-base-size": 256,
    "warmup-epochs": 0.0,
    "lr-schedule": "step",
    "lr-milestones": None,
    "lr-end": 0.0,
    "lr-decay-start": None,
    "div-factor": None,
    "base-momentum": None,
    "momentum": 0.9,
    "wd": 1e-4,
    "no-bn-wd": False,
    "nesterov": False,
    "optimizer": "sgd",
    "beta2": None,
    "opt-eps": None,
    "lookahead": False,
    "lookahead-k": None,
    "lookahead-alpha": None,
    "label-smoothing": 0.0,
    "zero-init-residual": False,
    "image-size": 224,
    "scale": [0.08, 1.0],
    "ratio": [3 / 4, 4 / 3],
    "val-resize": None,
    "val-crop": None,
    "precision": None,
    "device": "auto",
    "channels-last": True,
    "threads": None,
    "workers": 2,
    "seed": 0,
    "max-steps-per-epoch": None,
}
# Keys of rn50's recipe files that do not change what is trained: accepted and ignored.
IGNORED = {"print-freq", "out", "checkpoint-minutes", "keep-checkpoints", "data", "json"}
ALIASES = {"steps-per-epoch": "max-steps-per-epoch", "learning-rate": "lr", "weight-decay": "wd", "model": "arch"}


def parse():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("--config", help="an rn50 recipe file (TOML, rn50's long flag names)")
    p.add_argument("--out", required=True, help="folder for metrics.jsonl and summary.json (must not hold a run)")
    p.add_argument("-a", "--arch")
    p.add_argument("-b", "--batch-size", type=int)
    p.add_argument("--epochs", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--lr-base", type=float)
    p.add_argument("--lr-base-size", type=int)
    p.add_argument("--warmup-epochs", type=float)
    p.add_argument("--lr-schedule", choices=["step", "cosine", "linear", "flat-cos", "one-cycle"])
    p.add_argument("--lr-milestones", type=lambda s: [float(x) for x in s.split(",")])
    p.add_argument("--lr-end", type=float)
    p.add_argument("--lr-decay-start", type=float)
    p.add_argument("--div-factor", type=float)
    p.add_argument("--base-momentum", type=float)
    p.add_argument("--momentum", type=float)
    p.add_argument("--wd", type=float)
    p.add_argument("--no-bn-wd", action="store_const", const=True)
    p.add_argument("--bn-wd", dest="no_bn_wd", action="store_const", const=False)
    p.add_argument("--nesterov", action="store_const", const=True)
    p.add_argument("--no-nesterov", dest="nesterov", action="store_const", const=False)
    p.add_argument("--optimizer", choices=["sgd", "adamw", "radam"])
    p.add_argument("--beta2", type=float)
    p.add_argument("--opt-eps", type=float)
    p.add_argument("--lookahead", action="store_const", const=True)
    p.add_argument("--no-lookahead", dest="lookahead", action="store_const", const=False)
    p.add_argument("--lookahead-k", type=int)
    p.add_argument("--lookahead-alpha", type=float)
    p.add_argument("--label-smoothing", type=float)
    p.add_argument("--zero-init-residual", action="store_const", const=True)
    p.add_argument("--no-zero-init-residual", dest="zero_init_residual", action="store_const", const=False)
    p.add_argument("--image-size", type=int)
    p.add_argument("--scale", nargs="+", type=min_max, help="RandomResizedCrop's area range: MIN,MAX or MIN MAX")
    p.add_argument("--ratio", nargs="+", type=min_max, help="RandomResizedCrop's aspect-ratio range, as --scale")
    p.add_argument("--val-resize", type=int)
    p.add_argument("--val-crop", type=int)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"],
                   help="default: rn50's (fp16 on CUDA; on the CPU cpu_precision's bf16 or fp32)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"])
    p.add_argument("--channels-last", action="store_const", const=True)
    p.add_argument("--no-channels-last", dest="channels_last", action="store_const", const=False)
    p.add_argument("--threads", type=int)
    p.add_argument("-j", "--workers", type=int)
    p.add_argument("--seed", type=int)
    p.add_argument("--max-steps-per-epoch", type=int)
    a = p.parse_args()

    recipe = dict(DEFAULTS)
    if a.config:
        with open(a.config, "rb") as f:
            for key, value in tomllib.load(f).items():
                key = ALIASES.get(key, key)
                if key in IGNORED:
                    continue
                if key not in DEFAULTS:
                    sys.exit(f"reference_train.py: {a.config}: `{key}` is not implemented by this reference")
                recipe[key] = value
    for key in DEFAULTS:
        value = getattr(a, key.replace("-", "_"))
        if value is not None:
            recipe[key] = value
    for key in ("scale", "ratio"):
        value = [float(x) for part in recipe[key] for x in (part if isinstance(part, list) else [part])]
        if len(value) != 2 or not 0 < value[0] <= value[1]:
            sys.exit(f"reference_train.py: --{key} takes MIN,MAX with 0 < MIN <= MAX, got {recipe[key]}")
        recipe[key] = value
    if recipe["lr"] is not None and recipe["lr-base"] is not None:
        sys.exit("reference_train.py: --lr and --lr-base together")
    if recipe["warmup-epochs"] >= recipe["epochs"]:
        w, e = recipe["warmup-epochs"], recipe["epochs"]
        sys.exit(f"reference_train.py: --warmup-epochs {w:g} must be below --epochs {e}")
    if recipe["val-crop"] is None:
        recipe["val-crop"] = recipe["image-size"]
    if recipe["val-resize"] is None:
        recipe["val-resize"] = round(recipe["val-crop"] / 0.875)
    if recipe["device"] == "auto":
        recipe["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    if recipe["precision"] is None and recipe["device"] == "cuda":
        recipe["precision"] = "fp16"  # the CPU's default needs the network: cpu_precision, in main
    if recipe["precision"] == "fp16" and recipe["device"] != "cuda":
        sys.exit("reference_train.py: fp16 needs --device cuda")
    return a, recipe


def cpu_precision(cpuinfo, onednn_cap, narrowest):
    """rn50's default precision on the CPU (Precision::resolve with CpuInfo::bf16_without_amx), from /proc/cpuinfo's
    text, ONEDNN_MAX_CPU_ISA (or DNNL_MAX_CPU_ISA) and the output channels of the network's narrowest convolution:
    bf16 autocast where the CPU has AMX or AVX512-BF16, except where oneDNN would train bf16 convolutions narrower
    than 16 channels with its AVX512-BF16 kernels rather than AMX's (they corrupt the heap: rn50 computes in fp32
    there); fp32 on other CPUs."""
    flags = next((v.split() for k, _, v in (line.partition(":") for line in cpuinfo.splitlines())
                  if k.strip() == "flags"), [])
    amx, avx512_bf16 = "amx_bf16" in flags, "avx512_bf16" in flags
    if not (amx or avx512_bf16):
        return "fp32"
    cap = (onednn_cap or "").strip().upper()
    if not avx512_bf16:
        without_amx = False
    elif cap in ("AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX10_1_512", "AVX10_2_512"):
        without_amx = True
    elif cap.startswith(("SSE", "AVX2")) or cap in ("AVX", "AVX512_CORE", "AVX512_CORE_VNNI"):
        without_amx = False
    else:  # unset, ALL/DEFAULT or an AMX level: oneDNN uses what the CPU has
        without_amx = not amx
    return "fp32" if without_amx and narrowest < 16 else "bf16"


def min_max(text):
    """One argument of --scale or --ratio: `MIN,MAX`, or one of the two numbers of `MIN MAX`."""
    return [float(x) for x in text.split(",")]


def cosine(start, end, progress):
    """Half a cosine from start (progress 0) to end (1), as torch.optim.lr_scheduler.OneCycleLR's _annealing_cos."""
    return end + 0.5 * (start - end) * (1.0 + math.cos(math.pi * progress))


def lr_at(r, peak, t):
    """rn50's LrSchedule::at: the rate of the step that ends at fractional epoch t."""
    w, epochs = r["warmup-epochs"], r["epochs"]
    kind = r["lr-schedule"]
    if t < w:
        if kind == "one-cycle":
            return cosine(peak / (r["div-factor"] or 25.0), peak, max(t / w, 0.0))
        return peak * max(t / w, 0.0)
    progress = min(max((t - w) / (epochs - w), 0.0), 1.0)
    if kind == "step":
        milestones = r["lr-milestones"] or [30.0 * k for k in range(1, 1000) if 30 * k < epochs]
        return peak * 0.1 ** sum(1 for m in milestones if t >= m)
    if kind in ("cosine", "one-cycle"):
        return cosine(peak, r["lr-end"], progress)
    if kind == "linear":
        return peak * (1.0 - progress)
    if kind == "flat-cos":
        start, end = r["lr-decay-start"], r["lr-end"]
        start = 0.75 * epochs if start is None else start
        return cosine(peak, end, min(max((t - start) / (epochs - start), 0.0), 1.0))
    raise ValueError(kind)


def momentum_at(r, t):
    """rn50's LrSchedule::momentum_at: one cycle's momentum for the step that ends at epoch t (else --momentum)."""
    top = r["momentum"]
    if r["lr-schedule"] != "one-cycle":
        return top
    base = 0.85 if r["base-momentum"] is None else r["base-momentum"]
    w, epochs = r["warmup-epochs"], r["epochs"]
    if t < w:
        return cosine(top, base, max(t / w, 0.0))
    return cosine(base, top, min(max((t - w) / (epochs - w), 0.0), 1.0))


def timm_resnet(arch, num_classes, zero_init_last):
    """timm's ResNet for rn50's name of a variant: [se]res(net|next)[blur]<depth>[c|d][_<groups>x<width>d]
    (crates/report/src/arch.rs): timm's stem_type, avg_down, aa_layer, cardinality, base_width and SE
    (block_args attn_layer="se")."""
    import re

    from timm.layers import BlurPool2d
    from timm.models.resnet import BasicBlock, Bottleneck, ResNet

    m = re.fullmatch(r"(se)?res(net|next)(blur)?(18|34|50|101|152)([cd]?)(?:_(\d+)x(\d+)d)?", arch)
    if not m or (m.group(2) == "next") != (m.group(6) is not None):
        sys.exit(f"reference_train.py: unknown architecture {arch}")
    se, blur, depth, variant = m.group(1), m.group(3), int(m.group(4)), m.group(5)
    groups, width = (int(m.group(6)), int(m.group(7))) if m.group(6) else (1, 64)
    layers = {18: [2, 2, 2, 2], 34: [3, 4, 6, 3], 50: [3, 4, 6, 3], 101: [3, 4, 23, 3], 152: [3, 8, 36, 3]}[depth]
    return ResNet(
        BasicBlock if depth < 50 else Bottleneck, layers, num_classes=num_classes, zero_init_last=zero_init_last,
        stem_width=32, stem_type="deep" if variant else "", avg_down=variant == "d",
        aa_layer=BlurPool2d if blur else None, cardinality=groups, base_width=width,
        block_args=dict(attn_layer="se") if se else None,
    )


class SimpleSelfAttention(torch.nn.Module):
    """fast.ai's SimpleSelfAttention(n_in, ks=1, sym=False) (fastai.layers, with its _conv1d_spect) as fast.ai writes
    it: x + gamma * bmm(bmm(x, x^T), conv(x)) over x seen as [N, C, H*W], conv a 1x1 Conv1d under
    torch.nn.utils.spectral_norm, gamma from 0. Two changes that leave the numbers as they are: reshape where fast.ai
    views (a channels_last input is not viewable), and the output in the input's memory format."""

    def __init__(self, n_in):
        super().__init__()
        conv = torch.nn.Conv1d(n_in, n_in, 1, bias=False)
        torch.nn.init.kaiming_normal_(conv.weight)
        self.conv = torch.nn.utils.spectral_norm(conv)
        self.gamma = torch.nn.Parameter(torch.tensor([0.0]))

    def forward(self, x):
        size = x.size()
        flat = x.reshape(*size[:2], -1)
        convx = self.conv(flat)
        xxt = torch.bmm(flat, flat.permute(0, 2, 1).contiguous())
        o = self.gamma * torch.bmm(xxt, convx) + flat
        channels_last = x.is_contiguous(memory_format=torch.channels_last)
        return o.view(*size).contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)


class MaxBlurPool2d(torch.nn.Module):
    """kornia 0.4.1's MaxBlurPool2d(3, ceil_mode=True), which fast.ai's 2020-10 Imagenette entry put in place of every
    max pool of its xresnet, as kornia 0.4.1 writes it: F.max_pool2d(3, stride 1, padding 1, ceil_mode), then pyrdown:
    filter2D with the 5x5 binomial kernel ([1, 4, 6, 4, 1] outer itself / 256, reflected borders: F.pad reflect, then
    a depthwise conv2d), then F.interpolate by scale_factor 0.5, bilinear, align_corners=False (the scale used as
    given, as since PyTorch 1.6: the notebook prints the warning that says so)."""

    def forward(self, x):
        x = torch.nn.functional.max_pool2d(x, 3, stride=1, padding=1, ceil_mode=True)
        taps = torch.tensor([1.0, 4.0, 6.0, 4.0, 1.0], dtype=x.dtype, device=x.device)
        kernel = (taps[:, None] * taps[None, :] / 256.0).expand(x.shape[1], 1, 5, 5)
        blurred = torch.nn.functional.conv2d(torch.nn.functional.pad(x, [2, 2, 2, 2], mode="reflect"), kernel,
                                             groups=x.shape[1])
        return torch.nn.functional.interpolate(blurred, scale_factor=0.5, mode="bilinear", align_corners=False)


def add_max_blur_pool(model):
    """fast.ai's 2020-10 Imagenette entry: its xresnet with pool=MaxPool (each strided shortcut a 2x2 max pool then
    the 1x1 conv, where timm's ResNet-D has an average pool), every nn.MaxPool2d then replaced by MaxBlurPool2d: here
    the stem's max pool and ResNet-D's shortcut pools (downsample.0) become MaxBlurPool2d."""
    model.maxpool = MaxBlurPool2d()
    for layer in (model.layer2, model.layer3, model.layer4):
        downsample = layer[0].downsample
        if downsample is not None and isinstance(downsample[0], torch.nn.AvgPool2d):
            downsample[0] = MaxBlurPool2d()


def add_max_pool_shortcuts(model):
    """fast.ai's xresnet with pool=MaxPool (its 2020-01 Imagenette runs' pools, and the 2020-10 entry's before it
    blurred them): each of ResNet-D's strided shortcut pools (downsample.0) nn.MaxPool2d(2, ceil_mode=True), where
    timm's is an average pool."""
    for layer in (model.layer2, model.layer3, model.layer4):
        downsample = layer[0].downsample
        if downsample is None or not isinstance(downsample[0], torch.nn.AvgPool2d):
            sys.exit("reference_train.py: _maxdown replaces ResNet-D's shortcut pools: give a ResNet-D (resnet50d)")
        downsample[0] = torch.nn.MaxPool2d(2, ceil_mode=True)


def add_self_attention(model):
    """fast.ai's xresnet with sa=True has one SimpleSelfAttention, in the first stage's last block, on the last batch
    norm's output (after squeeze-and-excitation) before the shortcut's add: the same place here, as `layer1.N.sa`
    run by a forward hook on that block's bn3 (bn2 in a basic block) or its se."""
    block = model.layer1[-1]
    last_bn = block.bn3 if hasattr(block, "bn3") else block.bn2
    block.sa = SimpleSelfAttention(last_bn.num_features)
    target = getattr(block, "se", None) or last_bn
    target.register_forward_hook(lambda _module, _inputs, out: block.sa(out))


def build_model(arch, num_classes, zero_init_residual):
    """The network of rn50's name `arch`: torchvision's ResNets and ResNeXts, timm's variants (timm_resnet); with
    the suffix _mish every nn.ReLU module but squeeze-and-excitation's replaced by an nn.Mish (torchvision's
    bottleneck calls its one `relu` three times: all three become Mish; timm's ResNet has one per place); with the
    suffix _sa, last, fast.ai's self-attention (add_self_attention); with _maxblur before those, fast.ai's max-blur
    pool (add_max_blur_pool), with _maxdown its max-pool shortcuts (add_max_pool_shortcuts)."""
    with_sa = arch.endswith("_sa")
    arch = arch.removesuffix("_sa")
    pool = arch.removesuffix("_mish").rpartition("_")[2]
    pool = pool if pool in ("maxblur", "maxdown") else None
    arch = arch.replace(f"_{pool}", "") if pool else arch
    base = arch.removesuffix("_mish")
    if base in ("resnet18", "resnet34", "resnet50", "resnet101", "resnet152", "resnext50_32x4d", "resnext101_32x8d",
                "resnext101_64x4d"):
        model = torchvision.models.__dict__[base](num_classes=num_classes, zero_init_residual=zero_init_residual)
    else:
        model = timm_resnet(base, num_classes, zero_init_residual)
    if base != arch:
        from timm.layers.squeeze_excite import SEModule

        # timm's act_layer leaves squeeze-and-excitation's ReLU (rn50 too).
        for parent in model.modules():
            if isinstance(parent, SEModule):
                continue
            for name, child in parent.named_children():
                if isinstance(child, torch.nn.ReLU):
                    setattr(parent, name, torch.nn.Mish())
    if pool == "maxblur":
        add_max_blur_pool(model)
    elif pool == "maxdown":
        add_max_pool_shortcuts(model)
    if with_sa:
        add_self_attention(model)
    return model


def optimizer(r, groups, peak):
    """rn50's --optimizer: torch.optim's, with --momentum as Adam's β1 and its weight decay decoupled."""
    if r["optimizer"] not in ("sgd", "adamw", "radam"):
        sys.exit(f"reference_train.py: --optimizer {r['optimizer']} is not implemented by this reference")
    if r["optimizer"] == "sgd":
        return torch.optim.SGD(groups, lr=peak, momentum=r["momentum"], nesterov=r["nesterov"])
    if r["nesterov"]:
        sys.exit("reference_train.py: --nesterov is SGD's")
    betas = (r["momentum"], 0.999 if r["beta2"] is None else r["beta2"])
    eps = 1e-8 if r["opt-eps"] is None else r["opt-eps"]
    if r["optimizer"] == "adamw":
        return torch.optim.AdamW(groups, lr=peak, betas=betas, eps=eps, foreach=True)
    return torch.optim.RAdam(groups, lr=peak, betas=betas, eps=eps, decoupled_weight_decay=True, foreach=True)


class Lookahead:
    """fast.ai's Lookahead (timm's too, but for when the slow weights start): the slow weights are the ones before
    the first step; every k steps taken (an fp16 step skipped on overflow is not one) slow += α·(fast - slow) and
    fast = slow."""

    def __init__(self, model, r):
        self.params = list(model.parameters())
        self.slow = [p.detach().clone() for p in self.params]
        self.k = r["lookahead-k"] or 6
        self.alpha = 0.5 if r["lookahead-alpha"] is None else r["lookahead-alpha"]
        self.steps = 0

    @torch.no_grad()
    def after_step(self, stepped):
        self.steps += stepped
        if stepped and self.steps % self.k == 0:
            for slow, fast in zip(self.slow, self.params):
                slow.add_(fast - slow, alpha=self.alpha)
                fast.copy_(slow)


def transforms(r):
    """The training transform (RandomResizedCrop with the recipe's scale and ratio, flip) and the evaluation one."""
    normalize = [v2.ToDtype(torch.float32, scale=True), v2.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])]
    crop = v2.RandomResizedCrop(r["image-size"], scale=r["scale"], ratio=r["ratio"], antialias=True)
    train = v2.Compose([v2.PILToTensor(), crop, v2.RandomHorizontalFlip()] + normalize)
    resize = v2.Resize(r["val-resize"], antialias=True)
    val = v2.Compose([v2.PILToTensor(), resize, v2.CenterCrop(r["val-crop"])] + normalize)
    return train, val


def evaluate(model, loader, fmt, dev, amp):
    model.eval()
    n = hit1 = hit5 = 0
    loss_sum = 0.0
    with torch.no_grad(), torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
        for images, labels in loader:
            images, labels = to_device(images, labels, dev, fmt)
            out = model(images).float()
            loss_sum += torch.nn.functional.cross_entropy(out, labels, reduction="sum").item()
            top5 = out.topk(min(5, out.shape[1]), 1).indices
            hit1 += (top5[:, 0] == labels).sum().item()
            hit5 += (top5 == labels[:, None]).any(1).sum().item()
            n += len(labels)
    return 100.0 * hit1 / n, 100.0 * hit5 / n, loss_sum / n, n


def to_device(images, labels, dev, fmt):
    return images.to(dev, non_blocking=True).contiguous(memory_format=fmt), labels.to(dev, non_blocking=True)


def main():
    a, r = parse()
    os.makedirs(a.out, exist_ok=True)
    metrics_path = os.path.join(a.out, "metrics.jsonl")
    if os.path.exists(metrics_path):
        sys.exit(f"reference_train.py: {metrics_path} exists: choose another --out")
    if r["threads"]:
        torch.set_num_threads(r["threads"])
    torch.manual_seed(r["seed"])
    fmt = torch.channels_last if r["channels-last"] else torch.contiguous_format
    dev = torch.device(r["device"])
    if dev.type == "cuda":
        torch.backends.cudnn.benchmark = True
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    scaler = torch.amp.GradScaler("cuda", enabled=r["precision"] == "fp16")

    train_tf, val_tf = transforms(r)
    train_set = torchvision.datasets.ImageFolder(os.path.join(a.data, "train"), train_tf)
    val_set = torchvision.datasets.ImageFolder(os.path.join(a.data, "val"), val_tf)
    if train_set.classes != val_set.classes:
        sys.exit("reference_train.py: train/ and val/ have different classes")
    b = r["batch-size"]
    g = torch.Generator().manual_seed(r["seed"])
    train_loader = torch.utils.data.DataLoader(
        train_set, b, shuffle=True, drop_last=True, num_workers=r["workers"], generator=g, persistent_workers=True,
        pin_memory=dev.type == "cuda",
    )
    val_loader = torch.utils.data.DataLoader(
        val_set, b, num_workers=r["workers"], persistent_workers=True, pin_memory=dev.type == "cuda"
    )

    model = build_model(r["arch"], len(train_set.classes), r["zero-init-residual"]).to(dev, memory_format=fmt)
    if r["precision"] is None:
        try:
            with open("/proc/cpuinfo") as f:
                cpuinfo = f.read()
        except OSError:  # not Linux: rn50 reads no flags there either, and computes in fp32
            cpuinfo = ""
        cap = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA")
        narrowest = min(m.out_channels for m in model.modules() if isinstance(m, torch.nn.Conv2d))
        r["precision"] = cpu_precision(cpuinfo, cap, narrowest)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(r["precision"])
    decay, no_decay = [], []
    for p in model.parameters():
        (no_decay if r["no-bn-wd"] and p.ndim <= 1 else decay).append(p)
    groups = [{"params": decay, "weight_decay": r["wd"]}]
    if no_decay:
        groups.append({"params": no_decay, "weight_decay": 0.0})
    peak = r["lr"] if r["lr"] is not None else (r["lr-base"] or 0.1) * b / r["lr-base-size"]
    opt = optimizer(r, groups, peak)
    lookahead = Lookahead(model, r) if r["lookahead"] else None
    criterion = torch.nn.CrossEntropyLoss(label_smoothing=r["label-smoothing"])
    steps = len(train_loader)
    if r["max-steps-per-epoch"]:
        steps = min(steps, r["max-steps-per-epoch"])

    print(f"reference: {r['arch']} on {a.data} ({len(train_set)} train / {len(val_set)} val, "
          f"{len(train_set.classes)} classes), batch {b}, peak lr {peak:g}, {r['precision']}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for epoch in range(r["epochs"]):
        model.train()
        t0 = time.perf_counter()
        wait = loss_sum = 0.0
        hits = images_seen = logged = 0
        last_lr = peak
        it = iter(train_loader)
        for i in range(steps):
            w0 = time.perf_counter()
            images, labels = next(it)
            wait += time.perf_counter() - w0
            images, labels = to_device(images, labels, dev, fmt)
            t = epoch + (i + 1) / steps
            last_lr, momentum = lr_at(r, peak, t), momentum_at(r, t)
            for group in opt.param_groups:
                group["lr"] = last_lr
                if r["optimizer"] == "sgd":
                    group["momentum"] = momentum
                else:
                    group["betas"] = (momentum, group["betas"][1])
            with torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
                out = model(images)
                loss = criterion(out.float(), labels)
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(opt)
            if lookahead:
                # GradScaler halves its scale exactly when it skipped the step for an overflow.
                before = scaler.get_scale()
                scaler.update()
                lookahead.after_step(scaler.get_scale() >= before)
            else:
                scaler.update()
            loss_sum += loss.detach()
            logged += 1
            hits += (out.argmax(1) == labels).sum()
            images_seen += len(labels)
        del it
        # Summed on the device without a host sync per step; one here, so the epoch's clock is the device's too.
        loss_sum, hits = float(loss_sum), int(hits)
        train_seconds = time.perf_counter() - t0
        acc1, acc5, val_loss, val_n = evaluate(model, val_loader, fmt, dev, amp)
        record = {
            "epoch": epoch,
            "train_loss": loss_sum / logged,
            "train_acc1": 100.0 * hits / images_seen,
            "lr": last_lr,
            "images_per_sec": images_seen / train_seconds,
            "acc1": acc1,
            "acc5": acc5,
            "val_loss": val_loss,
            "val_images": val_n,
            "seconds": time.perf_counter() - t0,
            "train_seconds": train_seconds,
            "resolution": r["image-size"],
            "data_wait_share": wait / train_seconds,
            "bad_images": 0,
            "disk_read_gbs": None,
            "disk_read_iops": None,
            "process_read_gbs": None,
        }
        with open(metrics_path, "a") as f:
            f.write(json.dumps(record) + "\n")
        print(f"epoch {epoch}: loss {record['train_loss']:.4f} Acc@1 {acc1:.2f} Acc@5 {acc5:.2f} "
              f"{record['images_per_sec']:.1f} img/s {record['seconds']:.0f} s", flush=True)
    records = [json.loads(line) for line in open(metrics_path)]
    # rn50's TrainSummary fields (rn50_report::schema), so `rn50 report` lists the reference beside rn50's runs.
    summary = {
        "arch": r["arch"],
        "device": f"PyTorch {torch.__version__} eager, "
        + (torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"),
        "world_size": 1,
        "batch_size": b,
        "global_batch": b,
        "lr": peak,
        "lr_base": None if r["lr"] is not None else r["lr-base"] or 0.1,
        "lr_base_size": None if r["lr"] is not None else r["lr-base-size"],
        "epochs": len(records),
        "wall_clock_s": sum(e["seconds"] for e in records),
        "acc1": records[-1]["acc1"],
        "acc5": records[-1]["acc5"],
        "best_acc1": max(e["acc1"] for e in records),
        "images_per_sec": sum(e["images_per_sec"] for e in records) / len(records),
        "precision": r["precision"],
        "dataset": a.data,
        "steps_per_epoch": steps,
        "full_steps_per_epoch": len(train_loader),
        "val_images_total": len(val_set),
    }
    with open(os.path.join(a.out, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)


if __name__ == "__main__":
    main()
