"""The PyTorch eager equivalent of `rn50 bench`, step for step: the same uint8 NHWC batch normalised on
the device, forward under autocast, cross-entropy, backward, SGD(momentum 0.9, wd 1e-4, foreach),
optimizer.zero_grad(). Prints one JSON line with the same statistics as `rn50 bench --json`. `--arch` takes rn50's
names: torchvision's networks, and timm's for its variants (`resnet50d`, `seresnext50d_32x4d`, ..., built as
benches/reference_train.py builds them; those need timm).

usage: pytorch_train_bench.py --arch resnet50 --batch-size 32 --precision bf16 --channels-last \
       --threads 2 --warmup 3 --steps 20 [--data device|host] [--device cpu] [--compile]

--compile runs the model through torch.compile (Inductor, default mode), the fastest stock PyTorch step on a GPU.
"""
import argparse
import json
import statistics
import time

import torch

from reference_train import build_model


def quantile(v, q):
    v = sorted(v)
    pos = q * (len(v) - 1)
    lo, hi = int(pos), min(int(pos) + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (pos - lo)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--arch", default="resnet50")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="bf16")
    p.add_argument("--channels-last", action="store_true")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--data", choices=["device", "host"], default="device")
    p.add_argument("--device", default="cpu")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--compile", action="store_true")
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    fmt = torch.channels_last if a.channels_last else torch.contiguous_format
    model = build_model(a.arch, 1000, False).to(dev, memory_format=fmt).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.1 * a.batch_size / 256, momentum=0.9, weight_decay=1e-4)
    if a.compile:
        model = torch.compile(model)
    loss_fn = torch.nn.CrossEntropyLoss()
    mean = torch.tensor([0.485, 0.456, 0.406], device=dev).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225], device=dev).view(1, 3, 1, 1) * 255
    b, s = a.batch_size, a.image_size
    images = torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8, device=dev)
    labels = torch.randint(0, 1000, (b,), device=dev)
    amp = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(a.precision)
    scaler = torch.amp.GradScaler(dev.type, enabled=a.precision == "fp16")

    times, waits = [], []
    for i in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        if a.data == "host":
            host = torch.randint(0, 256, (b, s, s, 3), dtype=torch.uint8)
            if dev.type == "cuda":
                host = host.pin_memory()
            images = host.to(dev, non_blocking=True)
        t1 = time.perf_counter()
        x = images.permute(0, 3, 1, 2).float().sub_(mean).div_(std).contiguous(memory_format=fmt)
        opt.zero_grad()
        with torch.autocast(dev.type, dtype=amp, enabled=amp is not None):
            loss = loss_fn(model(x), labels)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i >= a.warmup:
            times.append((t2 - t0) * 1e3)
            waits.append((t1 - t0) * 1e3)
    ips = [b / (t / 1e3) for t in times]
    print(json.dumps({
        "impl": "pytorch", "torch_version": torch.__version__,
        "images_per_sec": statistics.median(ips),
        "images_per_sec_p10": quantile(ips, 0.1), "images_per_sec_p90": quantile(ips, 0.9),
        "step_ms": statistics.median(times), "data_wait_ms": statistics.mean(waits),
        "final_loss": loss.item(), "config": vars(a),
    }))


if __name__ == "__main__":
    main()
