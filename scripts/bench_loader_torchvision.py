#!/usr/bin/env python3
"""torchvision baseline for `rn50 bench-loader`: the same measurement with a DataLoader.

--format wds reads WebDataset shards (DATA: a brace pattern) with webdataset's own pipeline
(WebDataset(DATA).decode("pil").to_tuple("jpg;jpeg;png;webp", "cls"), repeated); --format parquet reads
Hugging Face parquet files (DATA: a glob) with datasets' own loader (load_dataset("parquet"), which
converts them to its Arrow cache first, untimed, then with_format and a DataLoader). The default,
imagefolder, is torchvision's ImageFolder.

ImageFolder + PIL decode + the same transforms (RandomResizedCrop + RandomHorizontalFlip, or
Resize + CenterCrop with --val) + PILToTensor (uint8, as ours: normalization belongs on the
device), N worker processes, the same batch size, warm-up and timed steps. Prints one line and
optionally writes JSON with the same keys as `rn50 bench-loader --json`.

--auto-augment ta_wide|ra, --ra-magnitude N and --random-erase P add the recipe's training
augmentations with the same meaning as ours, in references/classification's order and backend:
TrivialAugmentWide() / RandAugment(magnitude=N) on the PIL image (torchvision's default PIL
backend; NEAREST interpolation, the classes' default and ours), PILToTensor, then RandomErasing(P)
on the uint8 tensor (the recipe erases after Normalize; both loaders leave normalization to the
device, so the work is the same: ours draws the box, the device zeroes it).
"""
import argparse
import json
import time

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms as T


def probability(text):
    v = float(text)
    if not 0.0 <= v <= 1.0:  # NaN fails too
        raise argparse.ArgumentTypeError(f"must be a finite number in [0, 1], got {text}")
    return v


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("data")
    p.add_argument("-j", "--workers", type=int, default=2)
    p.add_argument("-b", "--batch-size", type=int, default=256)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--val", action="store_true")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--val-resize", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--auto-augment", choices=["ta_wide", "ra"])
    p.add_argument("--ra-magnitude", type=int, default=9, choices=range(31), metavar="0..30")
    p.add_argument("--random-erase", type=probability, default=0.0, metavar="P")
    p.add_argument("--json")
    p.add_argument("--format", choices=["imagefolder", "wds", "parquet"], default="imagefolder")
    a = p.parse_args()
    if a.val and (a.auto_augment or a.random_erase > 0):
        p.error("--auto-augment and --random-erase are training augmentations: not with --val")

    if a.val:
        tf = T.Compose([T.Resize(a.val_resize), T.CenterCrop(a.size), T.PILToTensor()])
    else:
        steps = [T.RandomResizedCrop(a.size), T.RandomHorizontalFlip()]
        nearest = T.InterpolationMode.NEAREST
        if a.auto_augment == "ta_wide":
            steps.append(T.TrivialAugmentWide(interpolation=nearest))
        elif a.auto_augment == "ra":
            steps.append(T.RandAugment(magnitude=a.ra_magnitude, interpolation=nearest))
        steps.append(T.PILToTensor())
        if a.random_erase > 0:
            steps.append(T.RandomErasing(p=a.random_erase, value=0))
        tf = T.Compose(steps)
    needed = (a.steps + a.warmup) * a.batch_size
    torch.manual_seed(a.seed)
    if a.format == "wds":
        import webdataset as wds

        # webdataset's own shuffling buffer, as its users train; repeated so that no epoch drains.
        ds = (wds.WebDataset(a.data, shardshuffle=False, repeat=True).shuffle(0 if a.val else 1000)
              .decode("pil").to_tuple("jpg;jpeg;png;webp", "cls").map_tuple(tf, lambda c: c))
        loader = wds.WebLoader(ds, batch_size=a.batch_size, num_workers=a.workers,
                               persistent_workers=a.workers > 0)
    else:
        if a.format == "parquet":
            import datasets as hf

            hub = hf.load_dataset("parquet", data_files=a.data, split="train")

            def apply(batch):
                return {"image": [tf(im.convert("RGB")) for im in batch["image"]], "label": batch["label"]}

            ds = hub.with_transform(apply)
            ds = [ds] * max(1, -(-needed // len(ds)))
            ds = torch.utils.data.ConcatDataset(ds)

            def collate(rows):
                return torch.stack([r["image"] for r in rows]), torch.tensor([r["label"] for r in rows])
        else:
            ds = datasets.ImageFolder(a.data, tf)
            # As rn50 bench-loader: repeat a small set so one epoch covers the run (no epoch drains).
            ds = torch.utils.data.ConcatDataset([ds] * max(1, -(-needed // len(ds))))
            collate = None
        loader = DataLoader(
            ds, batch_size=a.batch_size, shuffle=not a.val, drop_last=not a.val,
            num_workers=a.workers, persistent_workers=a.workers > 0, collate_fn=collate,
        )
    done, images, start = 0, 0, time.perf_counter()
    while done < a.warmup + a.steps:
        for x, _ in loader:
            done += 1
            if done == a.warmup:
                start = time.perf_counter()
            elif done > a.warmup:
                images += x.shape[0]
            if done >= a.warmup + a.steps:
                break
    seconds = time.perf_counter() - start
    ips = images / seconds
    r = {
        "dataset": a.data, "threads": a.workers, "batch_size": a.batch_size, "steps": a.steps,
        "warmup": a.warmup, "images": images, "seconds": seconds, "images_per_sec": ips,
        "images_per_sec_per_core": ips / max(a.workers, 1), "bad_images": 0,
    }
    print(f"torchvision ({a.format}): {ips:.1f} images/s, {ips / max(a.workers, 1):.1f} images/s per core "
          f"({a.workers} workers)")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(r, f, indent=2)


if __name__ == "__main__":
    main()
