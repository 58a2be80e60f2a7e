#!/usr/bin/env python3
"""torchvision baseline for `--example bench_autoaugment`: the same ops on the same images.

RAW holds N images of SIZE x SIZE x 3 uint8 back to back (written by the example); OPS.json is
[[transform_id, magnitude], ...]. Each op is applied to each image as uint8 CHW tensors by the
policies' own `_apply_image_or_video_transform` (transforms.v2, NEAREST, fill 0) on one thread, as
a DataLoader worker runs it; then TrivialAugmentWide() itself (random ops, seeded). The best of
REPS passes is kept. Prints JSON: {op: microseconds per image}.
"""
import json
import sys
import time

import numpy as np
import torch
from torchvision.transforms import v2 as T


def main():
    raw, size, ops_file, reps = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    torch.set_num_threads(1)
    hwc = np.fromfile(raw, dtype=np.uint8).reshape(-1, size, size, 3)
    images = [torch.from_numpy(a).permute(2, 0, 1).contiguous() for a in hwc]
    with open(ops_file) as f:
        ops = json.load(f)
    policy = T.TrivialAugmentWide()
    apply = policy._apply_image_or_video_transform

    def best(fn):
        fn()  # warm-up
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return min(times) / len(images) * 1e6

    result = {}
    for name, magnitude in ops:
        result[name] = best(
            lambda: [apply(i, name, magnitude, interpolation=policy.interpolation, fill=policy._fill) for i in images]
        )
    torch.manual_seed(0)
    result["TrivialAugmentWide"] = best(lambda: [policy(i) for i in images])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
