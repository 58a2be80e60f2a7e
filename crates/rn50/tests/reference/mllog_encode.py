"""Reference for tests/program/mllog.rs: every `:::MLLOG` line of a log, read back and written again by mlperf_logging's
own encoder (mllog's `_encode_log`, what `mllogger.event/start/end` print: `json.dumps` of the six fields in
their order), must be the line rn50 wrote, byte for byte. The file must be ASCII (json.dumps escapes the rest).

usage: mllog_encode.py LOG   exits 1 naming each line that differs
"""
import json
import sys

from mlperf_logging.mllog import mllog

PREFIX = ":::MLLOG "
differ = 0
with open(sys.argv[1], encoding="ascii") as f:
    lines = f.read().splitlines()
if not lines:
    sys.exit(f"{sys.argv[1]}: no lines")
for n, line in enumerate(lines, 1):
    if not line.startswith(PREFIX):
        sys.exit(f"line {n} is not an MLLOG line: {line}")
    d = json.loads(line[len(PREFIX):])
    again = mllog._encode_log(
        d["namespace"], d["time_ms"], d["event_type"], d["key"], d["value"], d["metadata"]
    )
    if again != line:
        differ += 1
        print(f"line {n}:\n  rn50:  {line}\n  mllog: {again}", file=sys.stderr)
sys.exit(1 if differ else 0)
