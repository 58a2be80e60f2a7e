"""Two sets of training runs side by side, epoch by epoch: top-1 as the mean and min..max over the runs (seeds),
the wall-clock to each epoch's end, and every run's final top-1 (all of them: no best-of).

    parity_table.py --rn50 RUN_DIR... --reference RUN_DIR...

Each RUN_DIR holds metrics.jsonl in rn50's schema (rn50 train and benches/reference_train.py both write it).
Prints Markdown. Each run's time to a top-1 target, and a plot of it: `rn50 report RUN_DIR... --target-accuracy P`.
"""
import argparse
import json
import os
import statistics


def load(run):
    with open(os.path.join(run, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def spread(values):
    if not values:
        return "—"
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ({min(values):.2f}..{max(values):.2f})"


def clock(records, epoch):
    return sum(r["seconds"] for r in records[: epoch + 1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rn50", nargs="+", required=True, help="rn50's run directories")
    p.add_argument("--reference", nargs="+", required=True, help="the reference's run directories")
    a = p.parse_args()
    sets = [[os.path.normpath(r) for r in s] for s in (a.rn50, a.reference)]
    names = ["rn50", "PyTorch"]
    runs = [{run: load(run) for run in s} for s in sets]
    epochs = max(len(m) for s in runs for m in s.values())

    print(f"| epoch | {names[0]} top-1 | {names[1]} top-1 | difference | {names[0]} s | {names[1]} s |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    for e in range(epochs):
        acc = [[m[e]["acc1"] for m in s.values() if len(m) > e] for s in runs]
        secs = [[clock(m, e) for m in s.values() if len(m) > e] for s in runs]
        diff = statistics.fmean(acc[0]) - statistics.fmean(acc[1]) if acc[0] and acc[1] else None
        print(
            f"| {e + 1} | {spread(acc[0])} | {spread(acc[1])} | "
            + (f"{diff:+.2f}" if diff is not None else "—")
            + "".join(f" | {statistics.fmean(t):.0f}" if t else " | —" for t in secs)
            + " |"
        )
    print()
    print("| run | epochs | final top-1 | final top-5 | wall-clock s | img/s (training) |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for s in runs:
        for run, m in s.items():
            img_s = statistics.fmean(r["images_per_sec"] for r in m)
            print(
                f"| {run} | {len(m)} | {m[-1]['acc1']:.2f} | {m[-1]['acc5']:.2f} | {clock(m, len(m) - 1):.0f} "
                f"| {img_s:.1f} |"
            )


if __name__ == "__main__":
    main()
