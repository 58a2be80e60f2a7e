"""A held-out slice of the training photos, for tuning a recipe without looking at val.

    imagenette_holdout.py DATA OUT [--every 10]

OUT/train/<class>/ gets the training photos of DATA/train/<class>/ but every N-th (sorted by name, so the split is
the same on every machine), OUT/val/<class>/ those every N-th: about a tenth of each class, the same share as
imagenette2's own val. Files are hard links (copies across file systems); DATA is not changed, and an OUT that
already holds files is refused. Tune on OUT; measure the chosen recipe on DATA's val once.
"""
import argparse
import os
import shutil
import sys


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data")
    p.add_argument("out")
    p.add_argument("--every", type=int, default=10, help="every N-th training photo is held out (2 to 1000)")
    a = p.parse_args()
    if not 2 <= a.every <= 1000:
        p.error("--every must be 2 to 1000")
    train = os.path.join(a.data, "train")
    if os.path.exists(a.out) and os.listdir(a.out):
        sys.exit(f"imagenette_holdout.py: {a.out} is not empty")
    held = kept = 0
    for cls in sorted(os.listdir(train)):
        src = os.path.join(train, cls)
        if not os.path.isdir(src) or os.path.islink(src):
            continue
        for split in ("train", "val"):
            os.makedirs(os.path.join(a.out, split, cls))
        names = sorted(n for n in os.listdir(src) if os.path.isfile(os.path.join(src, n)))
        for i, name in enumerate(names):
            split = "val" if i % a.every == a.every - 1 else "train"
            dst = os.path.join(a.out, split, cls, name)
            try:
                os.link(os.path.join(src, name), dst)
            except OSError:
                shutil.copy2(os.path.join(src, name), dst)
            held += split == "val"
            kept += split == "train"
    print(f"{a.out}: {kept} training photos, {held} held out")


if __name__ == "__main__":
    main()
