"""Each test target's time, from the output of one `cargo test` run: cargo prints `Running tests/x.rs (...)`
(or `Doc-tests x`) before each target and libtest ends each with `test result: ... N passed; ...; finished in
12.34s`. Prints a Markdown table of every target, slowest first, with its crate, tests passed/failed/ignored
and seconds; `./dev test` prints it at the end of its run.

    test-times.py CARGO_TEST_OUTPUT.log [--artifacts BUILD.json]

BUILD.json, the output of `cargo test --no-run --message-format=json`, names each binary's crate (several crates
have a tests/interrupt.rs); without it the crate column is the binary's name.
"""
import argparse
import json
import re
import sys

# `     Running unittests src/lib.rs (target/release/deps/rn50_data-1234)` / `Running tests/kaggle.rs (...)`
RUNNING = re.compile(r"^\s*Running (?:unittests )?(\S+) \((\S+)\)")
DOCTESTS = re.compile(r"^\s*Doc-tests (\S+)")
RESULT = re.compile(
    r"^test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored; \d+ measured; \d+ filtered out; "
    r"finished in ([\d.]+)s"
)


def binary_name(binary):
    """`target/release/deps/rn50_data-0123abcd` -> `rn50_data-0123abcd`."""
    return binary.rsplit("/", 1)[-1]


def crates_of(artifacts_path):
    """Binary file name -> crate name, from cargo's JSON messages (`compiler-artifact` with an executable)."""
    crates = {}
    with open(artifacts_path) as f:
        for line in f:
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if msg.get("reason") == "compiler-artifact" and msg.get("executable"):
                # package_id: `path+file:///work/main/crates/data#rn50-data@0.1.0`, or `...crates/rn50#0.1.0` when
                # the package is named as its folder (older cargo: `rn50-data 0.1.0 (path+file://...)`)
                pid = msg["package_id"]
                if "#" in pid:
                    url, _, fragment = pid.partition("#")
                    name = fragment.split("@")[0] if "@" in fragment else url.rstrip("/").rsplit("/", 1)[-1]
                else:
                    name = pid.split(" ")[0]
                crates[binary_name(msg["executable"])] = name
    return crates


def parse(lines, crates):
    targets, current = [], None
    for line in lines:
        m = RUNNING.match(line)
        if m:
            path, binary = m.groups()
            name = binary_name(binary)
            current = {"target": path, "crate": crates.get(name, name.rsplit("-", 1)[0])}
            continue
        m = DOCTESTS.match(line)
        if m:
            current = {"target": "doc-tests", "crate": m.group(1)}
            continue
        m = RESULT.match(line)
        if m and current is not None:
            verdict, passed, failed, ignored, secs = m.groups()
            current.update(
                verdict=verdict, passed=int(passed), failed=int(failed), ignored=int(ignored), seconds=float(secs)
            )
            targets.append(current)
            current = None
    return targets


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("log")
    p.add_argument("--artifacts", help="cargo test --no-run --message-format=json's output")
    a = p.parse_args()
    crates = crates_of(a.artifacts) if a.artifacts else {}
    with open(a.log, errors="replace") as f:
        targets = parse(f, crates)
    if not targets:
        sys.exit(f"test-times.py: no `test result:` lines in {a.log}")
    total = sum(t["seconds"] for t in targets)
    print("| crate | target | passed | failed | ignored | seconds | share |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for t in sorted(targets, key=lambda t: -t["seconds"]):
        print(
            f"| {t['crate']} | {t['target']} | {t['passed']} | {t['failed']} | {t['ignored']} "
            f"| {t['seconds']:.1f} | {100 * t['seconds'] / total:.1f}% |"
        )
    passed = sum(t["passed"] for t in targets)
    print(f"| **{len(targets)} targets** | | **{passed}** | {sum(t['failed'] for t in targets)} "
          f"| {sum(t['ignored'] for t in targets)} | **{total:.0f}** | |")


if __name__ == "__main__":
    main()
