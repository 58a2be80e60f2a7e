"""The workspace's dependencies that do not need PyTorch, as `-p NAME@VERSION` arguments for `cargo build`.

`./dev` builds them while pip installs PyTorch into .venv: pip keeps about one of the CI machine's two cores busy for
two and a half minutes, and the C libraries (libjpeg-turbo, zstd, bzip2), parquet, image, clap and the rest need
nothing from it. Everything else waits for .venv/libtorch: torch-sys and what depends on it (tch, the workspace's own
crates).

The packages are those `cargo tree` shows for the workspace's build on this machine: normal dependencies as cargo's
feature resolver activates them, without proc-macros and build-dependencies (built for the host, and built anyway as
dependencies of these), less the workspace's own and those that depend on torch-sys. A package picked out with `-p`
then gets the features the workspace's build gives it, so that build finds it built. (Not `cargo metadata`: its
graph holds every optional dependency any feature could turn on, and cargo 1.95 panics when `-p` names a package the
build does not activate as a normal dependency: "did not find features for ... NormalOrDev".)

    deps-without-torch.py      prints the arguments
"""
import subprocess


def tree(*extra):
    """`NAME vVERSION [(SOURCE)]` of each package of the workspace's normal dependency tree, for this machine (cargo
    tree's default target is the host's)."""
    out = subprocess.run(
        ["cargo", "tree", "--locked", "--workspace", "-e", "normal,no-proc-macro", "--prefix", "none", "-f", "{p}",
         *extra],
        capture_output=True, text=True, check=True,
    ).stdout
    return {line.removesuffix(" (*)") for line in out.splitlines() if line.strip()}


def main():
    packages = [p.split(" ") for p in sorted(tree() - tree("-i", "torch-sys"))]
    # Not a name held in two versions (bitflags 1 and 2, …): cargo would copy both libraries to the same file name in
    # target/release/ and warns that this "may become a hard error". They are built anyway, as dependencies.
    names = [name for name, *_ in packages]
    picked = [
        f"-p {name}@{version.removeprefix('v')}"
        for name, version, *source in packages
        if not source and names.count(name) == 1  # a source is a path: the workspace's own
    ]
    print(" ".join(picked))


if __name__ == "__main__":
    main()
