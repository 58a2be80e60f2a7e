"""The workspace's dependencies that do not need PyTorch, as `-p NAME@VERSION` arguments for cargo.

`./dev` builds them while pip installs PyTorch into .venv: pip keeps about one of the CI machine's two cores busy for
two and a half minutes, and the C libraries (libjpeg-turbo, zstd, bzip2), parquet, image, clap and the rest need
nothing from it. Everything else waits for .venv/libtorch: torch-sys and what depends on it (tch, the workspace's own
crates). A package picked out with `-p` gets the features the workspace gives it, so `cargo test --workspace` then
finds it built.

    deps-without-torch.py < `cargo metadata --format-version 1 --locked` output
"""
import json
import sys


def main():
    meta = json.load(sys.stdin)
    members = set(meta["workspace_members"])
    nodes = {n["id"]: n for n in meta["resolve"]["nodes"]}
    names = {p["id"]: (p["name"], p["version"]) for p in meta["packages"]}
    needs_torch = {}

    def torch(pid):
        if pid not in needs_torch:
            if names[pid][0] == "torch-sys":
                needs_torch[pid] = True
            else:
                needs_torch[pid] = any(torch(d["pkg"]) for d in nodes[pid]["deps"])
        return needs_torch[pid]

    picked = sorted(
        f"{names[pid][0]}@{names[pid][1]}" for pid in nodes if pid not in members and not torch(pid)
    )
    print(" ".join(f"-p {p}" for p in picked))


if __name__ == "__main__":
    main()
