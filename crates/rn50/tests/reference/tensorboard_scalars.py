"""Reference for tests/program/tensorboard.rs: a run's scalars as TensorBoard shows them, read by TensorBoard's own
EventAccumulator (the pip package `tensorboard`): every event file of the folder in name order, orphaned events
purged as TensorBoard purges them (a SessionLog START drops the earlier events at its step or later), and every
point kept (no reservoir sampling).

usage: tensorboard_scalars.py LOGDIR OUT.json   writes {tag: [[step, value], ...]} in TensorBoard's order
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

acc = EventAccumulator(sys.argv[1], size_guidance={SCALARS: 0})
acc.Reload()
series = {tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()[SCALARS]}
with open(sys.argv[2], "w") as f:
    json.dump(series, f, indent=1)
