# OCI image of rn50 for Docker and Podman, and for enroot/pyxis (`enroot import dockerd://rn50`). Two stages: the
# build is the README's ("Containers") and scripts/rn50.def's, on Rust's Debian 12 image; the image that runs keeps only
# the binary and the run-time set of wheels (scripts/requirements-runtime.txt: the pinned torch wheel, libtorch with
# CUDA 13, cuDNN and NCCL) on NVIDIA's CUDA base image (the driver hooks; the host only needs the NVIDIA driver).
# crates/rn50/tests/containers.rs checks that these steps stay the README's, and runs hadolint on this file.
#
# Debian and Ubuntu packages are not pinned to versions (hadolint DL3008): the base images are pinned by tag, and
# their archives drop a package's older version once a security update replaces it, so a pinned version breaks the
# build within weeks while the unpinned one gets the fix. The two RUNs of the build stay apart (DL3059): they are
# the README's two steps, and the second (the `cuda` feature) then rebuilds on top of the first's cached layer.
#
#   docker build -t rn50 .
#   docker run --rm --gpus all --ipc=host rn50 bench
#   docker run --rm --gpus all --ipc=host -v /data:/data rn50 launch --nproc-per-node 8 -- train /data/imagenet --out /data/runs/r50
FROM rust:1.95-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends ca-certificates python3 python3-venv \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/rn50
COPY . .
# Debian packages from scripts/apt-packages.txt (as root), .venv with the pinned torch wheel, target/release/rn50.
# The wheel's libtorch has CUDA, so the binary has NCCL and the fused GPU batch norm (headers from the wheels).
RUN ./dev build

FROM nvidia/cuda:13.0.1-base-ubuntu24.04
# hadolint ignore=DL3008
RUN apt-get update -qq \
    && apt-get install -y -qq --no-install-recommends python3 python3-venv openssh-client \
    && rm -rf /var/lib/apt/lists/*
# The binary finds libtorch through the path it was built with (its RUNPATH): /opt/rn50/.venv/libtorch/lib.
COPY scripts/requirements-runtime.txt /opt/rn50/scripts/requirements-runtime.txt
RUN python3 -m venv /opt/rn50/.venv \
    && /opt/rn50/.venv/bin/pip install --no-cache-dir --disable-pip-version-check -r /opt/rn50/scripts/requirements-runtime.txt \
    && ln -sfn "$(/opt/rn50/.venv/bin/python -c 'import importlib.util, os; print(os.path.dirname(importlib.util.find_spec("torch").origin))')" /opt/rn50/.venv/libtorch
COPY --from=build /opt/rn50/target/release/rn50 /usr/local/bin/rn50
RUN rn50 --help >/dev/null
ENTRYPOINT ["rn50"]
CMD ["--help"]
