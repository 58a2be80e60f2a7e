#!/usr/bin/env python3
"""Reference outputs from Pillow / torchvision for the rn50-pipeline tests.

Each mode writes raw uint8 RGB files (OUT/<n>.rgb, HxWx3) plus OUT/manifest.json, which the
Rust tests compare against their own output. Called by crates/pipeline/tests/*.rs.

  decode OUT FILE...                 Image.open(f).convert("RGB")
  val OUT RESIZE CROP FILE...        Resize(RESIZE) + CenterCrop(CROP) on the PIL image
  resized_crop OUT SIZE JOBS.json    F.resized_crop(img, y, x, h, w, SIZE) (+ hflip) per job
  rrc_params OUT N W H [W H ...]     RandomResizedCrop.get_params N times per image size
  imagefolder OUT ROOT               torchvision ImageFolder's classes and (path, label) samples
"""
import json
import os
import sys

from PIL import Image


def save(out, n, img):
    with open(os.path.join(out, f"{n}.rgb"), "wb") as f:
        f.write(img.tobytes())
    return {"width": img.width, "height": img.height}


def load_rgb(path):
    with Image.open(path) as im:
        return im.convert("RGB")


def main():
    mode, out = sys.argv[1], sys.argv[2]
    args = sys.argv[3:]
    os.makedirs(out, exist_ok=True)
    manifest = []
    if mode == "decode":
        for n, path in enumerate(args):
            try:
                manifest.append({"file": path, "ok": True, **save(out, n, load_rgb(path))})
            except Exception as e:  # noqa: BLE001 - record any failure for the test to check
                manifest.append({"file": path, "ok": False, "error": repr(e)})
    elif mode == "val":
        from torchvision import transforms as T

        resize, crop, files = int(args[0]), int(args[1]), args[2:]
        tf = T.Compose([T.Resize(resize), T.CenterCrop(crop)])
        for n, path in enumerate(files):
            manifest.append({"file": path, "ok": True, **save(out, n, tf(load_rgb(path)))})
    elif mode == "resized_crop":
        from torchvision.transforms import functional as F
        from torchvision.transforms import InterpolationMode

        size = int(args[0])
        with open(args[1]) as f:
            jobs = json.load(f)
        for n, job in enumerate(jobs):
            img = F.resized_crop(
                load_rgb(job["file"]), job["y"], job["x"], job["h"], job["w"], [size, size],
                InterpolationMode.BILINEAR, antialias=True,
            )
            if job["flip"]:
                img = F.hflip(img)
            manifest.append({"file": job["file"], "ok": True, **save(out, n, img)})
    elif mode == "rrc_params":
        import torch
        from torchvision import transforms as T

        torch.manual_seed(0)
        n = int(args[0])
        dims = [(int(w), int(h)) for w, h in zip(args[1::2], args[2::2])]
        for w, h in dims:
            stub = torch.empty((1, h, w), dtype=torch.uint8)
            boxes = []
            for _ in range(n):
                i, j, bh, bw = T.RandomResizedCrop.get_params(stub, [0.08, 1.0], [3 / 4, 4 / 3])
                boxes.append([j, i, bw, bh])
            manifest.append({"width": w, "height": h, "boxes": boxes})
    elif mode == "imagefolder":
        from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

        classes, class_to_idx = find_classes(args[0])
        samples = make_dataset(args[0], class_to_idx, IMG_EXTENSIONS)
        manifest = {"classes": classes, "samples": samples}
    else:
        sys.exit(f"unknown mode {mode}")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


if __name__ == "__main__":
    main()
