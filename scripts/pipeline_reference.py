#!/usr/bin/env python3
"""Reference outputs from Pillow / torchvision for the rn50-pipeline tests.

Each mode writes raw uint8 RGB files (OUT/<n>.rgb, HxWx3) plus OUT/manifest.json, which the
Rust tests compare against their own output. Called by crates/pipeline/tests/*.rs.

  decode OUT FILE...                 Image.open(f).convert("RGB")
  val OUT RESIZE CROP FILE...        Resize(RESIZE) + CenterCrop(CROP) on the PIL image
  resized_crop OUT SIZE JOBS.json    F.resized_crop(img, y, x, h, w, SIZE) (+ hflip) per job
  rrc_params OUT N SCALE0 SCALE1 RATIO0 RATIO1 W H [W H ...]
                                     RandomResizedCrop.get_params(scale, ratio) N times per image size
  imagefolder OUT ROOT               torchvision ImageFolder's classes and (path, label) samples
  autoaugment OUT JOBS.json          TrivialAugmentWide/RandAugment ops with fixed magnitudes on
                                     uint8 tensors (transforms.v2), every op of a job on its image
                                     (with "chain": true, one after the other: one output)
  autoaugment_tables OUT BINS...     the v2 policies' op order, signed flags and magnitude tables
  autoaugment_draws OUT POLICY N [M] the (op, magnitude) draws of N calls of TrivialAugmentWide()
                                     (POLICY ta_wide) or RandAugment(magnitude=M) (POLICY ra)
  random_erasing OUT N P SIZE...     the boxes of N calls of RandomErasing(P) on a SIZE x SIZE image
  ra_sampler OUT REPS WORLD LEN PERM... torchvision's RASampler index arithmetic on the permutation
                                     PERM of LEN samples, per rank
"""
import json
import os
import struct
import sys

# torchvision's affine ops (ShearX, ShearY, Rotate) build their sampling grid with a matmul, MKL's sgemm on the CPU.
# MKL takes its AVX-512 code path on Intel CPUs only, and that path rounds some grid points differently, enough to
# move a NEAREST sample across a pixel boundary (13 of 3,343 outputs on a Sapphire Rapids). Pinned to its AVX2 path,
# the one it runs on AMD CPUs, the reference is the same on both. Read when MKL starts, so before torch is imported.
os.environ.setdefault("MKL_CBWR", "AVX2")

from PIL import Image


def save(out, n, img):
    with open(os.path.join(out, f"{n}.rgb"), "wb") as f:
        f.write(img.tobytes())
    return {"width": img.width, "height": img.height}


def f64_bits(x):
    """A float as its IEEE bits, which JSON readers cannot round (serde_json's default parser can)."""
    return struct.unpack("<Q", struct.pack("<d", x))[0]


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
        scale, ratio = [float(x) for x in args[1:3]], [float(x) for x in args[3:5]]
        dims = [(int(w), int(h)) for w, h in zip(args[5::2], args[6::2])]
        for w, h in dims:
            stub = torch.empty((1, h, w), dtype=torch.uint8)
            boxes = []
            for _ in range(n):
                i, j, bh, bw = T.RandomResizedCrop.get_params(stub, scale, ratio)
                boxes.append([j, i, bw, bh])
            manifest.append({"width": w, "height": h, "boxes": boxes})
    elif mode == "imagefolder":
        from torchvision.datasets.folder import IMG_EXTENSIONS, find_classes, make_dataset

        classes, class_to_idx = find_classes(args[0])
        samples = make_dataset(args[0], class_to_idx, IMG_EXTENSIONS)
        manifest = {"classes": classes, "samples": samples}
    elif mode == "autoaugment":
        # JOBS.json: [{"file": raw HxWx3 uint8, "width": W, "height": H, "ops": [[transform_id,
        # magnitude], ...]}]; each op is applied to the job's image alone, by the policies' own
        # `_apply_image_or_video_transform` (their magnitude -> F.affine / F.adjust_* mapping) with
        # their defaults (NEAREST, fill None = 0). Outputs are numbered across jobs.
        import numpy as np
        import torch
        from torchvision.transforms import v2 as T

        torch.set_num_threads(1)  # torch's float32 sums depend on the thread count
        with open(args[0]) as f:
            jobs = json.load(f)
        policy = T.TrivialAugmentWide()
        n = 0
        for job in jobs:
            hwc = np.fromfile(job["file"], dtype=np.uint8).reshape(job["height"], job["width"], 3)
            image = torch.from_numpy(hwc).permute(2, 0, 1).contiguous()
            result = image
            for transform_id, magnitude in job["ops"]:
                result = policy._apply_image_or_video_transform(
                    result if job.get("chain") else image, transform_id, magnitude,
                    interpolation=policy.interpolation, fill=policy._fill
                )
                if not job.get("chain"):
                    result.permute(1, 2, 0).contiguous().numpy().tofile(os.path.join(out, f"{n}.rgb"))
                    n += 1
            if job.get("chain"):
                result.permute(1, 2, 0).contiguous().numpy().tofile(os.path.join(out, f"{n}.rgb"))
                n += 1
        manifest = {"outputs": n, "cpu_capability": torch.backends.cpu.get_cpu_capability()}
    elif mode == "autoaugment_tables":
        # BINS: "N:W:H" (num_magnitude_bins, image size) per table. Values as f64 bits.
        from torchvision.transforms import v2 as T

        manifest = {}
        for key, cls in (("ta_wide", T.TrivialAugmentWide), ("ra", T.RandAugment)):
            space = cls._AUGMENTATION_SPACE
            tables = []
            for spec in args:
                bins, w, h = (int(v) for v in spec.split(":"))
                values = {}
                for name, (fn, _) in space.items():
                    m = fn(bins, h, w)
                    values[name] = None if m is None else [f64_bits(float(v)) for v in m]
                tables.append({"bins": bins, "width": w, "height": h, "values": values})
            manifest[key] = {
                "order": list(space),
                "signed": {name: signed for name, (_, signed) in space.items()},
                "tables": tables,
            }
    elif mode == "autoaugment_draws":
        # The policy's forward with the op application replaced by a recorder: what it draws, not
        # what it does. [transform_id, f64 bits of |magnitude|, negative] per op, the sign apart
        # (-0.0 is negative); on a 224x224 image (RandAugment's translations scale with it).
        import math

        import torch
        from torchvision.transforms import v2 as T

        policy_name, n = args[0], int(args[1])
        torch.manual_seed(0)
        policy = T.TrivialAugmentWide() if policy_name == "ta_wide" else T.RandAugment(magnitude=int(args[2]))

        def record(image, transform_id, magnitude, interpolation, fill):
            manifest.append([transform_id, f64_bits(abs(magnitude)), math.copysign(1.0, magnitude) < 0])
            return image

        policy._apply_image_or_video_transform = record
        image = torch.zeros((3, 224, 224), dtype=torch.uint8)
        for _ in range(n):
            policy(image)
    elif mode == "random_erasing":
        # The transform's own forward (v1, as references/classification uses it, value=0 after
        # Normalize) with get_params wrapped to record its box: [top, left, h, w], or None when
        # the p draw said no or get_params found no box in 10 tries (it then returns the image as
        # the value, and erasing with it changes nothing).
        import torch
        from torchvision import transforms as T

        n, p, sizes = int(args[0]), float(args[1]), [int(v) for v in args[2:]]
        get_params = T.RandomErasing.get_params
        boxes = []

        def record(img, scale, ratio, value=None):
            i, j, h, w, v = get_params(img, scale=scale, ratio=ratio, value=value)
            boxes[-1] = None if v is img else [i, j, h, w]
            return i, j, h, w, v

        T.RandomErasing.get_params = staticmethod(record)
        manifest = {}
        torch.manual_seed(0)
        erasing = T.RandomErasing(p=p, value=0)
        for size in sizes:
            image = torch.zeros((3, size, size))
            start = len(boxes)
            for _ in range(n):
                boxes.append(None)
                erasing(image)
            manifest[str(size)] = boxes[start:]
    elif mode == "ra_sampler":
        # references/classification/sampler.py's RASampler.__iter__ (BSD-3-Clause), with the
        # permutation given instead of torch.randperm's.
        import math

        reps, world, length = int(args[0]), int(args[1]), int(args[2])
        perm = [int(v) for v in args[3:]]
        assert sorted(perm) == list(range(length))
        num_samples = int(math.ceil(length * float(reps) / world))
        total_size = num_samples * world
        num_selected_samples = int(math.floor(length // 256 * 256 / world))
        indices = [ele for ele in perm for i in range(reps)]
        indices += indices[: (total_size - len(indices))]
        manifest = []
        for rank in range(world):
            mine = indices[rank:total_size:world]
            assert len(mine) == num_samples
            manifest.append({"indices": mine, "num_selected_samples": num_selected_samples})
    else:
        sys.exit(f"unknown mode {mode}")
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f)


if __name__ == "__main__":
    main()
