"""A small copy of Imagenette for a machine that takes only so many bytes (a device session's 64 MiB): train/ with
each photo's shorter side resized to SIDE, val/ with rn50's evaluation transform already applied (shorter side
round(CROP / 0.875), centre crop CROP), both re-encoded as baseline JPEG at the given qualities. Evaluate the copy
with `--val-resize CROP --val-crop CROP`, which then leaves its val photos as they are.

    imagenette_small.py SRC DST [--side 144] [--crop 128] [--train-quality 70] [--val-quality 75]

SRC holds train/<wnid>/ and val/<wnid>/; DST must not exist. Resizing is PIL's antialiased bilinear, as
torchvision's Resize on PIL images.
"""
import argparse
import os
import sys

from PIL import Image


def shorter_side_to(im, side):
    w, h = im.size
    k = side / min(w, h)
    return im.resize((max(1, round(w * k)), max(1, round(h * k))), Image.Resampling.BILINEAR, reducing_gap=None)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--side", type=int, default=144)
    p.add_argument("--crop", type=int, default=128)
    p.add_argument("--train-quality", type=int, default=70)
    p.add_argument("--val-quality", type=int, default=75)
    a = p.parse_args()
    if os.path.exists(a.dst):
        sys.exit(f"imagenette_small.py: {a.dst} exists")
    total = count = 0
    for split in ("train", "val"):
        for root, _, files in os.walk(os.path.join(a.src, split)):
            for name in sorted(files):
                path = os.path.join(root, name)
                out = os.path.join(a.dst, os.path.relpath(path, a.src))
                os.makedirs(os.path.dirname(out), exist_ok=True)
                im = Image.open(path).convert("RGB")
                if split == "train":
                    im, quality = shorter_side_to(im, a.side), a.train_quality
                else:
                    im = shorter_side_to(im, round(a.crop / 0.875))
                    left, top = (im.width - a.crop) // 2, (im.height - a.crop) // 2
                    im, quality = im.crop((left, top, left + a.crop, top + a.crop)), a.val_quality
                im.save(out, "JPEG", quality=quality, optimize=True)
                total += os.path.getsize(out)
                count += 1
    print(f"{count} photos, {total / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
