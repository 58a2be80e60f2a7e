//! `rn50 scaling` (alias `rn50 predict`): data-parallel throughput and efficiency at N workers from one worker's step time and a ring
//! all-reduce cost model.
//!
//! The model (DDP-style bucketed gradient all-reduce, weak scaling: the per-worker batch stays fixed):
//! - gradients of `G` bytes go in `k = ceil(G / bucket)` buckets; all-reducing `b` bytes over a ring of N costs
//!   `2(N-1)/N · b / bandwidth + 2(N-1) · latency` (reduce-scatter then all-gather, 2(N-1) steps);
//! - buckets are reduced while backward still runs, during `overlap · backward_fraction · T1` of the step; what
//!   does not fit is exposed, and the last bucket (ready only when backward ends) always is:
//!   `exposed = max(T_comm − window, ring(last bucket))`;
//! - `T_N = T1 + exposed`, `img/s = N · batch / T_N`, efficiency `T_b / T_N` against the smallest N listed
//!   (for weak scaling time- and throughput-based efficiency are the same number);
//! - up to `gpus_per_node` workers talk over the intra-node link; beyond, the ring crosses nodes and runs at the
//!   slower of the two links, with the inter-node latency; a node's inter-node bandwidth is one network card's
//!   times `--nics-per-node` (NCCL spreads its rings over the cards);
//! - next to each prediction, the input it needs on each node: images read and decoded per second, and JPEG GB/s
//!   read (from the dataset's mean file size: `--jpeg-kb`, `--data`, or ImageNet-1k's), since at 64 GPUs the
//!   input is what breaks first;
//! - with a measured decode rate (`--loader-json`, a `rn50 bench-loader --json` result: img/s over its threads, per
//!   core) each row says how many cores a node needs to decode that input, and with `--cores-per-node` a node's
//!   input is bounded at their rate: rows that need more are capped there (`limit: decode`), their efficiency the
//!   bound's; without one, it says the decode rate is unmeasured;
//! - a step measured on a CPU under GPU nodes' link presets (NVLink, PCIe, InfiniBand) is warned of: the efficiency
//!   is then the link model's, not the measured machine's.
//!
//! - with `--global-batch` (strong scaling) the global batch stays fixed instead: each worker gets
//!   `global / N` images and its compute time is taken as proportional to that (optimistic: GPUs lose efficiency
//!   at small batches).
//!
//! What it leaves out, on purpose: storage reads (it says what the pipeline must read), evaluation, start-up,
//! stragglers, contention of NCCL kernels with compute. Measured efficiencies below the prediction point at those.

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::{Args, ValueEnum};
use rn50_args::finite_in;
use serde::Serialize;

use crate::schema::{bench_hardware_label, read_json, BenchResult};
use crate::table::{fmt_pct, fmt_rate, Align, Cell, Column, Table};

/// The parameters of `arch` with 1000 classes, by rn50's names (`-a`: torchvision's and timm's,
/// [`crate::arch::Arch`]); None for a name rn50 does not build.
pub fn param_count(arch: &str) -> Option<u64> {
    let arch: crate::arch::Arch = arch.parse().ok()?;
    Some(arch.param_count(1000))
}

/// Links with the all-reduce bus bandwidth a ring reaches on them and a per-step latency. Round figures from
/// the links' nominal rates (a ring gets ~90% of a NIC's line rate, ~77–80% of NVLink's per-direction rate, ~63%
/// of PCIe's), not measurements: pass --bandwidth-gbs/--latency-us for a measured link (nccl-tests' busbw).
///
/// Nominal rates, per GPU and direction: NVLink 4 (H100/H200 SXM) 450 GB/s, from the 900 GB/s bidirectional
/// (18 links × 50 GB/s) of NVIDIA's H100 and H200 datasheets; NVLink 3 (A100 SXM) 300 GB/s (600 bidirectional);
/// NVLink 2 (V100 SXM2) 150 GB/s; PCIe 5.0/4.0/3.0 x16 64/32/16 GB/s; InfiniBand NDR/HDR/EDR 400/200/100 Gb/s
/// per card = 50/25/12.5 GB/s (DGX H100 and HGX H100/H200 nodes have one 400 Gb/s ConnectX-7 card per GPU).
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    /// NVLink 4 through NVSwitch (DGX/HGX H100 and H200: 450 GB/s each way per GPU): 360 GB/s, 3 µs.
    Nvlink4,
    /// NVLink 3 through NVSwitch (DGX/HGX A100: 300 GB/s each way per GPU): 230 GB/s, 3 µs.
    #[value(alias = "nvlink")]
    Nvlink3,
    /// NVLink 2 (V100: DGX-1, IBM AC922): 75 GB/s, 5 µs.
    Nvlink2,
    /// PCIe 5.0 x16 (H100 PCIe/NVL, L40S): 40 GB/s, 5 µs.
    Pcie5,
    /// PCIe 4.0 x16: 20 GB/s, 5 µs.
    Pcie4,
    /// PCIe 3.0 x16: 10 GB/s, 5 µs.
    Pcie3,
    /// InfiniBand NDR 400 Gb/s (one ConnectX-7 per GPU on H100/H200 nodes): 45 GB/s, 5 µs.
    IbNdr400,
    /// InfiniBand HDR 200 Gb/s: 23 GB/s, 5 µs.
    IbHdr200,
    /// InfiniBand EDR 100 Gb/s: 11.5 GB/s, 5 µs.
    IbEdr100,
    /// 100 Gb Ethernet (RoCE): 11 GB/s, 10 µs.
    #[value(name = "100gbe")]
    #[serde(rename = "100gbe")]
    Eth100,
    /// 25 Gb Ethernet (TCP): 2.8 GB/s, 25 µs.
    #[value(name = "25gbe")]
    #[serde(rename = "25gbe")]
    Eth25,
    /// 10 Gb Ethernet (TCP): 1.1 GB/s, 30 µs.
    #[value(name = "10gbe")]
    #[serde(rename = "10gbe")]
    Eth10,
    /// Gloo over TCP loopback, ranks on one host: 3 GB/s, 20 µs.
    Loopback,
}

impl Link {
    /// (bandwidth GB/s, latency µs)
    pub fn figures(self) -> (f64, f64) {
        match self {
            Link::Nvlink4 => (360.0, 3.0),
            Link::Nvlink3 => (230.0, 3.0),
            Link::Nvlink2 => (75.0, 5.0),
            Link::Pcie5 => (40.0, 5.0),
            Link::Pcie4 => (20.0, 5.0),
            Link::Pcie3 => (10.0, 5.0),
            Link::IbNdr400 => (45.0, 5.0),
            Link::IbHdr200 => (23.0, 5.0),
            Link::IbEdr100 => (11.5, 5.0),
            Link::Eth100 => (11.0, 10.0),
            Link::Eth25 => (2.8, 25.0),
            Link::Eth10 => (1.1, 30.0),
            Link::Loopback => (3.0, 20.0),
        }
    }

    /// The name on the command line (`nvlink4`, `ib-ndr400`, `100gbe`).
    pub fn name(self) -> String {
        self.to_possible_value()
            .map_or_else(|| format!("{self:?}"), |v| v.get_name().to_string())
    }

    /// A link of GPU nodes: NVLink and PCIe between the GPUs of a node, InfiniBand (GPUDirect RDMA) between
    /// nodes. Ranks on CPUs talk through memory on a host and over Ethernet or InfiniBand with the CPU in the
    /// way, at a cost these presets leave out.
    pub fn models_gpu_nodes(self) -> bool {
        matches!(
            self,
            Link::Nvlink4
                | Link::Nvlink3
                | Link::Nvlink2
                | Link::Pcie5
                | Link::Pcie4
                | Link::Pcie3
                | Link::IbNdr400
                | Link::IbHdr200
                | Link::IbEdr100
        )
    }
}

/// The node a measured GPU is usually found in, for the link defaults: DGX/HGX H100 and H200 (NVLink 4 through
/// NVSwitch, one InfiniBand NDR card per GPU), or H100 PCIe/NVL cards (PCIe 5.0 between them). None for other
/// devices: the defaults are then the A100-era `nvlink3` and `ib-hdr200` with one card per node.
pub fn node_links(hardware: &str) -> Option<NodeLinks> {
    let h = hardware.to_ascii_uppercase();
    if !(h.contains("H100") || h.contains("H200")) {
        return None;
    }
    let pcie = h.contains("PCIE") || h.split_whitespace().any(|w| w == "NVL");
    Some(NodeLinks {
        intra: if pcie { Link::Pcie5 } else { Link::Nvlink4 },
        inter: Link::IbNdr400,
        card_per_gpu: !pcie,
    })
}

/// See [`node_links`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NodeLinks {
    pub intra: Link,
    pub inter: Link,
    /// One network card per GPU: `--nics-per-node` defaults to `--gpus-per-node`.
    pub card_per_gpu: bool,
}

#[derive(Args, Clone, Debug)]
pub struct ScalingArgs {
    /// Worker counts to predict, 1 to 1000000 each; efficiency is against the first (smallest).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "1,2,4,8,16,32,64",
        value_name = "N,…",
        value_parser = clap::value_parser!(u64).range(1..=1_000_000)
    )]
    pub gpus: Vec<u64>,
    /// Measured single-worker step time in ms (forward, backward, optimizer; no communication), above 0.
    #[arg(long, value_name = "MS", value_parser = rn50_args::positive())]
    pub step_ms: Option<f64>,
    /// Measured single-worker img/s instead of --step-ms (step = batch / img/s), above 0.
    #[arg(long, value_name = "IMG_S", conflicts_with = "step_ms", value_parser = rn50_args::positive())]
    pub images_per_sec: Option<f64>,
    /// A `rn50 bench --json` result of one worker: its median step time, batch and arch.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["step_ms", "images_per_sec"])]
    pub bench: Option<PathBuf>,
    /// Batch per worker of the measurement (and of every N, unless --global-batch), at least 1.
    #[arg(short = 'b', long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..))]
    pub batch: u64,
    /// Strong scaling: keep this global batch (at least 1) at every N (per-worker batch global/N, compute time
    /// scaled in proportion). Without it the per-worker batch stays fixed (weak scaling, as the sites run).
    #[arg(long, value_name = "IMAGES", value_parser = clap::value_parser!(u64).range(1..))]
    pub global_batch: Option<u64>,
    /// Gradient size from the arch's parameter count: resnet18, resnet34, resnet50, resnet101, resnet152.
    #[arg(short = 'a', long, default_value = "resnet50")]
    pub arch: String,
    /// Gradient bytes, instead of the arch's (at least 1).
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    pub grad_bytes: Option<u64>,
    /// Bytes per gradient element on the wire, 1 to 8: 4 (fp32, DDP's default), 2 (fp16 compression hook).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=8))]
    pub bytes_per_param: u64,
    /// DDP bucket size in MiB (bucket_cap_mb), above 0.
    #[arg(long, default_value_t = 25.0, value_parser = rn50_args::positive())]
    pub bucket_mb: f64,
    /// Fraction of backward during which buckets' all-reduce runs hidden, 0 to 1 (0: none, 1: all of it).
    #[arg(long, default_value_t = 1.0, value_parser = finite_in(0.0..=1.0))]
    pub overlap: f64,
    /// Share of the step that is backward, 0 to 1 (about 2/3 for ResNets: backward ≈ 2 × forward).
    #[arg(long, default_value = "0.667", value_parser = finite_in(0.0..=1.0))]
    pub backward_fraction: f64,
    /// Workers per node, at least 1; beyond this the ring crosses the inter-node link.
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..))]
    pub gpus_per_node: u64,
    /// Inter-node link (of one network card). Default: ib-ndr400 when --bench measured an H100 or H200, else
    /// ib-hdr200.
    #[arg(long, value_enum)]
    pub interconnect: Option<Link>,
    /// Network cards per node, 1 to 64: NCCL spreads the inter-node rings over them, so a node's inter-node
    /// bandwidth is this many times one card's (up to the intra-node link's). Default: one per GPU
    /// (--gpus-per-node) when --bench measured an H100 or H200 SXM, as DGX/HGX H100 and H200 nodes have; else 1.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub nics_per_node: Option<u64>,
    /// Inter-node all-reduce bus bandwidth of one network card, GB/s (above 0), instead of the preset's.
    #[arg(long, value_name = "GB_S", value_parser = rn50_args::positive())]
    pub bandwidth_gbs: Option<f64>,
    /// Inter-node latency per ring step, µs (0 or more), instead of the preset's.
    #[arg(long, value_name = "US", value_parser = finite_in(0.0..))]
    pub latency_us: Option<f64>,
    /// Intra-node link. Default: nvlink4 when --bench measured an H100 or H200 SXM (pcie5 for PCIe and NVL
    /// cards), else nvlink3.
    #[arg(long, value_enum)]
    pub intra: Option<Link>,
    /// Intra-node all-reduce bus bandwidth, GB/s (above 0), instead of the preset's.
    #[arg(long, value_name = "GB_S", value_parser = rn50_args::positive())]
    pub intra_bandwidth_gbs: Option<f64>,
    /// Intra-node latency per ring step, µs (0 or more), instead of the preset's.
    #[arg(long, value_name = "US", value_parser = finite_in(0.0..))]
    pub intra_latency_us: Option<f64>,
    /// Mean size of the training JPEGs, KB (1000 bytes; above 0), for the input a node must read at the predicted
    /// speed. Default: ImageNet-1k's, about 110 KB (140 GB over 1,281,167 files).
    #[arg(long, value_name = "KB", conflicts_with = "data", value_parser = rn50_args::positive())]
    pub jpeg_kb: Option<f64>,
    /// A dataset (a folder of JPEGs, or `rn50 prepare`'s output with train/): the mean size of its training files
    /// instead of --jpeg-kb.
    #[arg(long, value_name = "DATA")]
    pub data: Option<PathBuf>,
    /// A `rn50 bench-loader --json` result: its img/s over its threads is the decode rate per core, from which each
    /// prediction says how many cores a node needs to decode its input.
    #[arg(long, value_name = "FILE")]
    pub loader_json: Option<PathBuf>,
    /// Cores of a node that decode, 1 to 4096 (leave out those the training processes need): with --loader-json,
    /// a node decodes at most this many times the measured rate per core, and predictions above that are capped
    /// at it.
    #[arg(long, value_name = "N", requires = "loader_json", value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub cores_per_node: Option<u64>,
    /// Write the inputs and predictions as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

/// ImageNet-1k's training set: about 140 GB of JPEGs in 1,281,167 files.
pub const IMAGENET_MEAN_JPEG_BYTES: f64 = 140e9 / 1_281_167.0;

/// The scaling model's inputs, resolved (not a network: that is `rn50`'s `model::Model`): times in ms, sizes in
/// bytes, bandwidths in GB/s, latencies in µs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScalingModel {
    /// Measured one-worker step time at `batch`.
    pub step_ms: f64,
    pub batch: u64,
    /// Strong scaling: fixed global batch.
    pub global_batch: Option<u64>,
    pub grad_bytes: u64,
    pub bucket_bytes: u64,
    pub overlap: f64,
    pub backward_fraction: f64,
    pub gpus_per_node: u64,
    pub intra_gbs: f64,
    pub intra_latency_us: f64,
    /// A node's inter-node bandwidth: all its network cards together.
    pub inter_gbs: f64,
    pub inter_latency_us: f64,
    /// Mean bytes of a training image as stored (JPEG): what the input pipeline reads per image.
    pub image_bytes: f64,
    /// Where the step was measured, when a `--bench` file says: its device ("cpu", "cuda:0") and hardware (the
    /// GPU's name, or the CPU's model and threads).
    pub device: Option<String>,
    pub hardware: Option<String>,
    /// The presets the link figures come from; None where a bandwidth was given instead
    /// (`--intra-bandwidth-gbs`, `--bandwidth-gbs`).
    pub intra_preset: Option<Link>,
    pub inter_preset: Option<Link>,
    pub nics_per_node: u64,
    /// The loader's measured decode rate (`--loader-json`); None: unmeasured.
    pub decode: Option<DecodeRate>,
    /// Cores of a node that decode (`--cores-per-node`): with `decode`, a node's input is bounded by their rate.
    pub cores_per_node: Option<u64>,
}

/// A measured decode rate: what `rn50 bench-loader --json` says (rn50_pipeline's `LoaderBenchResult`).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DecodeRate {
    pub source: PathBuf,
    /// All threads together: images read, decoded and augmented per second.
    pub images_per_sec: f64,
    pub threads: u64,
    /// `images_per_sec / threads`.
    pub images_per_sec_per_core: f64,
    /// The loader's transform as it recorded it ("Train { size: 224, … }").
    pub transform: Option<String>,
}

/// The fields of a `rn50 bench-loader --json` file the decode bound reads; the others are ignored.
#[derive(serde::Deserialize)]
struct LoaderJson {
    images_per_sec: f64,
    threads: u64,
    #[serde(default)]
    transform: Option<String>,
}

/// The decode rate of a `rn50 bench-loader --json` file, its numbers checked (they did not come through the
/// command line's range checks).
pub fn read_decode_rate(path: &std::path::Path) -> anyhow::Result<DecodeRate> {
    let l: LoaderJson = read_json(path)?;
    if l.threads == 0 {
        bail!("{}: threads is 0", path.display());
    }
    if !(l.images_per_sec.is_finite() && l.images_per_sec > 0.0) {
        bail!(
            "{}: no positive decode rate (images_per_sec {})",
            path.display(),
            l.images_per_sec
        );
    }
    Ok(DecodeRate {
        source: path.to_path_buf(),
        images_per_sec: l.images_per_sec,
        threads: l.threads,
        images_per_sec_per_core: l.images_per_sec / l.threads as f64,
        transform: l.transform,
    })
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Prediction {
    pub workers: u64,
    /// Images per worker per step.
    pub batch_per_worker: f64,
    pub nodes: u64,
    /// "intra" or "inter".
    pub link: &'static str,
    pub bandwidth_gbs: f64,
    /// All buckets' all-reduce, whether hidden or not.
    pub allreduce_ms: f64,
    /// The part that adds to the step.
    pub exposed_ms: f64,
    /// With the decode bound: the time a step takes when the workers wait for their input.
    pub step_ms: f64,
    /// All workers together, at most what the nodes' decode cores deliver (`decode_bound`).
    pub images_per_sec: f64,
    /// What the step (compute and exposed all-reduce) alone sustains, before any decode bound.
    pub step_images_per_sec: f64,
    /// The input the step's speed (`step_images_per_sec`) needs on each (full) node: images read and decoded
    /// per second, and JPEG bytes read per second (GB/s).
    pub node_images_per_sec: f64,
    pub node_read_gbs: f64,
    /// Cores that decode `node_images_per_sec` at the measured rate per core (`--loader-json`); None: unmeasured.
    pub node_decode_cores: Option<f64>,
    /// Whether the decode cores of a node (`--cores-per-node`) deliver less than the step needs, so that
    /// `images_per_sec` is theirs.
    pub decode_bound: bool,
    pub speedup: f64,
    /// Against the smallest worker count predicted.
    pub efficiency: f64,
}

/// Ring all-reduce of `bytes` over `n` workers, ms: `2(n-1)/n · bytes/bw + 2(n-1) · latency`.
pub fn ring_allreduce_ms(n: u64, bytes: f64, gbs: f64, latency_us: f64) -> f64 {
    if n <= 1 {
        return 0.0;
    }
    let n = n as f64;
    let bytes_per_ms = gbs * 1e9 / 1e3;
    2.0 * (n - 1.0) / n * bytes / bytes_per_ms + 2.0 * (n - 1.0) * latency_us / 1e3
}

impl ScalingModel {
    /// Images a node's decode cores deliver per second, when both the rate per core and the cores are known.
    pub fn node_decode_bound(&self) -> Option<f64> {
        let d = self.decode.as_ref()?;
        Some(self.cores_per_node? as f64 * d.images_per_sec_per_core)
    }

    pub fn predict_one(&self, n: u64) -> Prediction {
        let n = n.max(1);
        let inter = n > self.gpus_per_node.max(1);
        let (gbs, lat) = if inter {
            (self.inter_gbs.min(self.intra_gbs), self.inter_latency_us)
        } else {
            (self.intra_gbs, self.intra_latency_us)
        };
        let bucket = self.bucket_bytes.max(1);
        let k = self.grad_bytes.div_ceil(bucket).max(1);
        let last = self.grad_bytes - (k - 1) * bucket;
        let full = ring_allreduce_ms(n, bucket as f64, gbs, lat);
        let total = (k - 1) as f64 * full + ring_allreduce_ms(n, last as f64, gbs, lat);
        let per_worker = match self.global_batch {
            Some(g) => g as f64 / n as f64,
            None => self.batch as f64,
        };
        let compute = self.step_ms * per_worker / self.batch as f64;
        let window = self.overlap.clamp(0.0, 1.0) * self.backward_fraction * compute;
        let exposed = (total - window).max(ring_allreduce_ms(n, last as f64, gbs, lat));
        let step_only = compute + exposed;
        let step_images_per_sec = n as f64 * per_worker * 1000.0 / step_only;
        let node_images_per_sec =
            step_images_per_sec / n as f64 * n.min(self.gpus_per_node.max(1)) as f64;
        // A node delivering less than its workers need slows each of them in proportion.
        let bound = self
            .node_decode_bound()
            .filter(|&b| node_images_per_sec > b);
        let (images_per_sec, step) = match bound {
            Some(b) => {
                let x = step_images_per_sec * b / node_images_per_sec;
                (x, n as f64 * per_worker * 1000.0 / x)
            }
            None => (step_images_per_sec, step_only),
        };
        Prediction {
            workers: n,
            batch_per_worker: per_worker,
            nodes: n.div_ceil(self.gpus_per_node.max(1)),
            link: if n == 1 {
                "none"
            } else if inter {
                "inter"
            } else {
                "intra"
            },
            bandwidth_gbs: gbs,
            allreduce_ms: total,
            exposed_ms: exposed,
            step_ms: step,
            images_per_sec,
            step_images_per_sec,
            node_images_per_sec,
            node_read_gbs: node_images_per_sec * self.image_bytes / 1e9,
            node_decode_cores: self
                .decode
                .as_ref()
                .map(|d| node_images_per_sec / d.images_per_sec_per_core),
            decode_bound: bound.is_some(),
            speedup: 0.0,
            efficiency: 0.0,
        }
    }

    /// Predictions for each N, speedup and efficiency against the smallest.
    pub fn predict(&self, ns: &[u64]) -> Vec<Prediction> {
        let mut ns: Vec<u64> = ns.iter().map(|&n| n.max(1)).collect();
        ns.sort_unstable();
        ns.dedup();
        let mut out: Vec<Prediction> = ns.iter().map(|&n| self.predict_one(n)).collect();
        if let Some(base) = out.first().cloned() {
            for p in &mut out {
                p.speedup = p.images_per_sec / base.images_per_sec;
                p.efficiency = crate::efficiency::throughput_efficiency_from(
                    base.workers,
                    base.images_per_sec,
                    p.workers,
                    p.images_per_sec,
                )
                .unwrap_or(f64::NAN);
            }
        }
        out
    }

    /// Whether the step was measured on a CPU, as the `--bench` file records it.
    pub fn measured_on_cpu(&self) -> bool {
        self.device.as_deref().is_some_and(|d| d.starts_with("cpu"))
    }

    /// What makes these predictions' numbers something other than what they look like: a CPU's step time under
    /// GPU nodes' links (the presets the predictions use), a loader measured with another transform than training's.
    pub fn warnings(&self, ps: &[Prediction]) -> Vec<String> {
        let mut out = Vec::new();
        let crosses = |link: &str| ps.iter().any(|p| p.link == link);
        let mut used: Vec<Link> = Vec::new();
        if crosses("intra") || crosses("inter") {
            used.extend(self.intra_preset);
        }
        if crosses("inter") {
            used.extend(self.inter_preset);
        }
        used.retain(|l| l.models_gpu_nodes());
        if self.measured_on_cpu() && !used.is_empty() {
            let names: Vec<String> = used.iter().map(|l| l.name()).collect();
            out.push(format!(
                "the step was measured on a CPU ({}); the {} preset{} model{} GPU nodes: the efficiency here is the \
                 link model's around a CPU's step time, not this machine's (ranks sharing its cores measure far lower). \
                 For CPU ranks on one host give --intra loopback, for a measured network --bandwidth-gbs and --latency-us",
                self.hardware.as_deref().unwrap_or("cpu"),
                names.join(" and "),
                if names.len() > 1 { "s" } else { "" },
                if names.len() > 1 { "" } else { "s" },
            ));
        }
        if let Some(d) = &self.decode {
            if let Some(t) = d.transform.as_deref().filter(|t| !t.starts_with("Train")) {
                out.push(format!(
                    "{}: the loader was measured with {t}, not the training transform; training's rate may differ",
                    d.source.display()
                ));
            }
        }
        out
    }

    /// The input each node must decode at the largest N, and what the measured decode rate (or its absence) makes
    /// of it: the bound the efficiency holds under.
    pub fn decode_notes(&self, ps: &[Prediction]) -> Vec<String> {
        let Some(p) = ps.last() else {
            return Vec::new();
        };
        let on_node = p.workers.min(self.gpus_per_node.max(1));
        let demand = format!(
            "at {} worker{} the step needs each node to decode {} img/s ({on_node} worker{} at {} img/s each)",
            p.workers,
            if p.workers == 1 { "" } else { "s" },
            fmt_rate(p.node_images_per_sec),
            if on_node == 1 { "" } else { "s" },
            fmt_rate(p.node_images_per_sec / on_node as f64),
        );
        let Some(d) = &self.decode else {
            return vec![format!(
                "decode: {demand}; the loader's rate is unmeasured, so these predictions assume it keeps up: give \
                 --loader-json FILE (`rn50 bench-loader --json`) for the cores that takes, and --cores-per-node to \
                 cap them where a node's cores fall short"
            )];
        };
        let mut out = vec![format!(
            "decode: {demand}: needs about {} cores at the measured {} img/s per core ({} img/s on {} thread{}, {})",
            whole_cores(p.node_decode_cores.unwrap_or(f64::NAN)),
            fmt_rate(d.images_per_sec_per_core),
            fmt_rate(d.images_per_sec),
            d.threads,
            if d.threads == 1 { "" } else { "s" },
            d.source.display()
        )];
        match (self.cores_per_node, self.node_decode_bound()) {
            (Some(cores), Some(bound)) => {
                let bound_at: Vec<String> = ps
                    .iter()
                    .filter(|p| p.decode_bound)
                    .map(|p| p.workers.to_string())
                    .collect();
                let peak = ps
                    .iter()
                    .max_by(|a, b| a.node_images_per_sec.total_cmp(&b.node_images_per_sec))
                    .unwrap_or(p);
                out.push(if !bound_at.is_empty() {
                    format!(
                        "decode bound: a node's {cores} cores decode {} img/s at that rate, less than the step needs at \
                         {} workers: there the img/s, step, speedup and efficiency are the decode bound's (limit: \
                         decode), not the step's",
                        fmt_rate(bound),
                        bound_at.join(", ")
                    )
                } else {
                    format!(
                        "decode bound: a node's {cores} cores decode {} img/s at that rate: enough at every N listed \
                         (at most {} of it used, at {} workers)",
                        fmt_rate(bound),
                        fmt_pct(peak.node_images_per_sec / bound),
                        peak.workers
                    )
                });
            }
            _ => out.push(
                "decode bound: unknown without the cores of a node that decode: give --cores-per-node to cap the \
                 predictions where they fall short"
                    .into(),
            ),
        }
        out
    }
}

/// What a `rn50 bench --json` result of one worker gives the model.
struct BenchSpeed {
    step_ms: f64,
    batch: u64,
    arch: String,
    device: Option<String>,
    hardware: String,
}

/// One worker's step time (ms), batch, arch and device from a `rn50 bench --json` result. The file's numbers did
/// not come through the command line's range checks, so they are checked here.
fn bench_speed(path: &std::path::Path) -> anyhow::Result<BenchSpeed> {
    let b: BenchResult = read_json(path)?;
    let c = &b.config;
    if c.world_size() != 1 {
        bail!(
            "{}: a {}-worker result; predict needs one worker's",
            path.display(),
            c.world_size()
        );
    }
    if c.batch_size == 0 {
        bail!("{}: batch_size is 0", path.display());
    }
    let step_ms = match b.step_ms {
        Some(ms) => ms,
        None => c.batch_size as f64 * 1000.0 / b.images_per_sec,
    };
    if !(step_ms.is_finite() && step_ms > 0.0) {
        bail!(
            "{}: no positive step time (step_ms {step_ms})",
            path.display()
        );
    }
    Ok(BenchSpeed {
        step_ms,
        batch: c.batch_size,
        arch: c.arch.clone(),
        device: c.device.clone(),
        hardware: bench_hardware_label(c, b.machine.as_ref()),
    })
}

/// Resolves the command line into a model. Its numbers are in range already (clap's value parsers); those of a
/// `--bench` or `--loader-json` file are checked by [`bench_speed`] and [`read_decode_rate`].
pub fn model_from_args(a: &ScalingArgs) -> anyhow::Result<ScalingModel> {
    let speed = if let Some(path) = &a.bench {
        bench_speed(path)?
    } else {
        let step_ms = if let Some(ms) = a.step_ms {
            ms
        } else if let Some(x) = a.images_per_sec {
            a.batch as f64 * 1000.0 / x
        } else {
            bail!(
                "give the single-worker speed: --step-ms, --images-per-sec (with -b) or --bench FILE"
            );
        };
        BenchSpeed {
            step_ms,
            batch: a.batch,
            arch: a.arch.clone(),
            device: None,
            hardware: String::new(),
        }
    };
    let arch = &speed.arch;
    let grad_bytes = match a.grad_bytes {
        Some(g) => g,
        None => param_count(arch)
            .with_context(|| {
                format!(
                    "unknown arch {arch:?} (resnet18/34/50/101/152, resnet50d, seresnext50d_32x4d...): \
                     give --grad-bytes"
                )
            })?
            .saturating_mul(a.bytes_per_param),
    };
    let node = node_links(&speed.hardware);
    let intra = a.intra.or(node.map(|n| n.intra)).unwrap_or(Link::Nvlink3);
    let inter = a
        .interconnect
        .or(node.map(|n| n.inter))
        .unwrap_or(Link::IbHdr200);
    let nics_per_node = a.nics_per_node.unwrap_or(match node {
        Some(n) if n.card_per_gpu => a.gpus_per_node.min(64),
        _ => 1,
    });
    let (bw, lat) = inter.figures();
    let (ibw, ilat) = intra.figures();
    Ok(ScalingModel {
        step_ms: speed.step_ms,
        batch: speed.batch,
        global_batch: a.global_batch,
        grad_bytes,
        bucket_bytes: (a.bucket_mb * 1024.0 * 1024.0) as u64,
        overlap: a.overlap,
        backward_fraction: a.backward_fraction,
        gpus_per_node: a.gpus_per_node,
        inter_gbs: a.bandwidth_gbs.unwrap_or(bw) * nics_per_node as f64,
        inter_latency_us: a.latency_us.unwrap_or(lat),
        intra_gbs: a.intra_bandwidth_gbs.unwrap_or(ibw),
        intra_latency_us: a.intra_latency_us.unwrap_or(ilat),
        image_bytes: match (&a.data, a.jpeg_kb) {
            (Some(data), _) => mean_file_bytes(data)?,
            (None, Some(kb)) => kb * 1000.0,
            (None, None) => IMAGENET_MEAN_JPEG_BYTES,
        },
        device: speed.device,
        hardware: (!speed.hardware.is_empty()).then_some(speed.hardware),
        intra_preset: a.intra_bandwidth_gbs.is_none().then_some(intra),
        inter_preset: a.bandwidth_gbs.is_none().then_some(inter),
        nics_per_node,
        decode: a.loader_json.as_deref().map(read_decode_rate).transpose()?,
        cores_per_node: a.cores_per_node,
    })
}

/// The mean size of the training files of a dataset: those under DATA/train when there is one (`rn50 prepare`'s
/// layout), else under DATA; hidden files left out.
pub fn mean_file_bytes(data: &std::path::Path) -> anyhow::Result<f64> {
    let train = data.join("train");
    let root = if train.is_dir() {
        train
    } else {
        data.to_path_buf()
    };
    let (mut files, mut bytes) = (0u64, 0u64);
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(&dir)
            .with_context(|| format!("--data: reading {}", dir.display()))?;
        for e in entries {
            let e = e.with_context(|| format!("--data: reading {}", dir.display()))?;
            if e.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let meta = e.metadata()?;
            if meta.is_dir() {
                dirs.push(e.path());
            } else if meta.is_file() {
                files += 1;
                bytes += meta.len();
            }
        }
    }
    if files == 0 {
        bail!("--data: no files under {}", root.display());
    }
    Ok(bytes as f64 / files as f64)
}

/// Whole cores that decode `k` cores' worth (`k` rounded up, a rounding error in `k` left out).
fn whole_cores(k: f64) -> f64 {
    (k - 1e-9).ceil()
}

/// The predictions as a table. With a measured decode rate it adds the cores a node needs to decode its input
/// (`decode cores/node`), and where a node's decode cores bound a prediction, what limits each row (`limit`:
/// `step` or `decode`).
pub fn prediction_table(ps: &[Prediction]) -> Table {
    let c = |title, key, align| Column { title, key, align };
    let num = |x: f64, d: String| Cell {
        display: d,
        raw: x.to_string(),
    };
    let cores = ps.iter().any(|p| p.node_decode_cores.is_some());
    let limit = ps.iter().any(|p| p.decode_bound);
    let mut columns = vec![
        c("workers", "workers", Align::Right),
        c("nodes", "nodes", Align::Right),
        c("link", "link", Align::Left),
        c("batch/worker", "batch_per_worker", Align::Right),
        c("GB/s", "bandwidth_gbs", Align::Right),
        c("all-reduce ms", "allreduce_ms", Align::Right),
        c("exposed ms", "exposed_ms", Align::Right),
        c("step ms", "step_ms", Align::Right),
        c("img/s", "images_per_sec", Align::Right),
        c("decode img/s/node", "node_images_per_sec", Align::Right),
        c("JPEG GB/s/node", "node_read_gbs", Align::Right),
    ];
    if cores {
        columns.push(c("decode cores/node", "node_decode_cores", Align::Right));
    }
    if limit {
        columns.push(c("limit", "limit", Align::Left));
    }
    columns.push(c("speedup", "speedup", Align::Right));
    columns.push(c("efficiency", "efficiency", Align::Right));
    Table {
        columns,
        rows: ps
            .iter()
            .map(|p| {
                let mut row = vec![
                    num(p.workers as f64, p.workers.to_string()),
                    num(p.nodes as f64, p.nodes.to_string()),
                    Cell::text(p.link),
                    num(
                        p.batch_per_worker,
                        format!("{}", (p.batch_per_worker * 10.0).round() / 10.0),
                    ),
                    num(p.bandwidth_gbs, format!("{}", p.bandwidth_gbs)),
                    num(p.allreduce_ms, format!("{:.2}", p.allreduce_ms)),
                    num(p.exposed_ms, format!("{:.2}", p.exposed_ms)),
                    num(p.step_ms, format!("{:.1}", p.step_ms)),
                    num(p.images_per_sec, fmt_rate(p.images_per_sec)),
                    num(p.node_images_per_sec, fmt_rate(p.node_images_per_sec)),
                    num(p.node_read_gbs, format!("{:.2}", p.node_read_gbs)),
                ];
                if cores {
                    row.push(match p.node_decode_cores {
                        Some(k) => num(k, format!("{}", whole_cores(k))),
                        None => Cell::text("—"),
                    });
                }
                if limit {
                    row.push(Cell::text(if p.decode_bound { "decode" } else { "step" }));
                }
                row.push(num(p.speedup, format!("{:.2}x", p.speedup)));
                row.push(num(p.efficiency, fmt_pct(p.efficiency)));
                row
            })
            .collect(),
    }
}

#[derive(Serialize)]
struct PredictJson<'a> {
    model: &'a ScalingModel,
    predictions: &'a [Prediction],
    /// What makes the numbers other than they look ([`ScalingModel::warnings`]); also on stderr.
    warnings: &'a [String],
    /// The decode demand and its bound ([`ScalingModel::decode_notes`]), as printed under the table.
    notes: &'a [String],
}

/// A link's figures and where they come from, for the header.
fn link_text(preset: Option<Link>, gbs: f64, latency_us: f64) -> String {
    match preset {
        Some(l) => format!("{} {gbs} GB/s {latency_us} µs", l.name()),
        None => format!("{gbs} GB/s {latency_us} µs"),
    }
}

/// `rn50 scaling`: the model's inputs, the prediction table, and `--json`.
pub fn run(args: &ScalingArgs) -> anyhow::Result<()> {
    let model = model_from_args(args)?;
    let ps = model.predict(&args.gpus);
    let warnings = model.warnings(&ps);
    let notes = model.decode_notes(&ps);
    for w in &warnings {
        eprintln!("warning: {w}");
    }
    if let (Some(device), Some(hw)) = (&model.device, &model.hardware) {
        println!("measured on: {hw} ({device})");
    }
    println!(
        "one worker: {:.1} ms/step at batch {} ({} img/s); gradients {:.1} MB in {} bucket(s) of {:.1} MiB; \
         overlap {:.0}% of backward ({:.0}% of the step)",
        model.step_ms,
        model.batch,
        fmt_rate(model.batch as f64 * 1000.0 / model.step_ms),
        model.grad_bytes as f64 / 1e6,
        model.grad_bytes.div_ceil(model.bucket_bytes.max(1)),
        model.bucket_bytes as f64 / 1048576.0,
        model.overlap * 100.0,
        model.backward_fraction * 100.0
    );
    let defaults = match &model.hardware {
        Some(hw)
            if node_links(hw).is_some()
                && (args.intra.is_none()
                    || args.interconnect.is_none()
                    || args.nics_per_node.is_none()) =>
        {
            format!("; defaults for {hw} nodes")
        }
        _ => String::new(),
    };
    let per_card = model.inter_gbs / model.nics_per_node.max(1) as f64;
    let inter = match (model.nics_per_node, model.inter_preset) {
        (1, preset) => link_text(preset, model.inter_gbs, model.inter_latency_us),
        (k, Some(l)) => format!(
            "{k} × {} {per_card} GB/s = {} GB/s {} µs",
            l.name(),
            model.inter_gbs,
            model.inter_latency_us
        ),
        (k, None) => format!(
            "{k} × {per_card} GB/s = {} GB/s {} µs",
            model.inter_gbs, model.inter_latency_us
        ),
    };
    println!(
        "links: intra-node {} (≤ {} per node), inter-node {inter} (network cards per node: {}){defaults}",
        link_text(model.intra_preset, model.intra_gbs, model.intra_latency_us),
        model.gpus_per_node,
        model.nics_per_node,
    );
    println!(
        "input: {:.1} KB per training image (JPEG as stored){}",
        model.image_bytes / 1000.0,
        match (&args.data, args.jpeg_kb) {
            (Some(d), _) => format!(", the mean of {}", d.display()),
            (None, Some(_)) => String::new(),
            (None, None) => ", ImageNet-1k's mean (--jpeg-kb or --data for another dataset)".into(),
        }
    );
    if let Some(g) = model.global_batch {
        println!("strong scaling: global batch {g} at every N, compute time in proportion to the per-worker batch");
    }
    println!();
    print!("{}", prediction_table(&ps).to_text());
    if !notes.is_empty() {
        println!();
    }
    for n in &notes {
        println!("{n}");
    }
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&PredictJson {
            model: &model,
            predictions: &ps,
            warnings: &warnings,
            notes: &notes,
        })?;
        text.push('\n');
        crate::run_report::write_atomic(path, text.as_bytes())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> ScalingModel {
        ScalingModel {
            step_ms: 300.0,
            batch: 256,
            global_batch: None,
            grad_bytes: 102_228_128, // ResNet-50, fp32
            bucket_bytes: 25 * 1024 * 1024,
            overlap: 1.0,
            backward_fraction: 2.0 / 3.0,
            gpus_per_node: 8,
            intra_gbs: 230.0,
            intra_latency_us: 3.0,
            inter_gbs: 23.0,
            inter_latency_us: 5.0,
            image_bytes: 110e3,
            device: None,
            hardware: None,
            intra_preset: Some(Link::Nvlink3),
            inter_preset: Some(Link::IbHdr200),
            nics_per_node: 1,
            decode: None,
            cores_per_node: None,
        }
    }

    fn close(a: f64, b: f64) {
        assert!((a - b).abs() < 1e-9 * b.abs().max(1.0), "{a} != {b}");
    }

    #[test]
    fn ring_cost_by_hand() {
        // 2 workers, 100 MB over 10 GB/s: 2·1/2 · 1e8 / 1e7 B/ms = 10 ms, plus 2·1·10 µs = 0.02 ms.
        close(ring_allreduce_ms(2, 1e8, 10.0, 10.0), 10.02);
        // 4 workers: 2·3/4 = 1.5 → 15 ms + 6·10 µs.
        close(ring_allreduce_ms(4, 1e8, 10.0, 10.0), 15.06);
        close(ring_allreduce_ms(1, 1e8, 10.0, 10.0), 0.0);
    }

    #[test]
    fn resnet50_gradient_bytes() {
        assert_eq!(param_count("resnet50").unwrap() * 4, 102_228_128);
        assert_eq!(param_count("resnet9"), None);
        // timm's own counts (timm 1.0.31: sum of resnet50d's and resnetblur18d's parameters).
        assert_eq!(param_count("resnet50d"), Some(25_576_264));
        assert_eq!(param_count("resnetblur18d"), Some(11_708_744));
        assert_eq!(param_count("resnetblur50"), param_count("resnet50"));
        for bad in ["resnet50e", "resnetblur", "resnet50dd", "blur50"] {
            assert_eq!(param_count(bad), None, "{bad}");
        }
    }

    #[test]
    fn no_overlap_exposes_everything() {
        // 64 workers over 23 GB/s: 4 buckets (3 × 26,214,400 B + 23,584,928 B).
        let m = ScalingModel {
            overlap: 0.0,
            ..model()
        };
        let p = m.predict_one(64);
        let bw = 23e6; // bytes per ms
        let f = 2.0 * 63.0 / 64.0;
        let by_hand = f * 102_228_128.0 / bw + 4.0 * 2.0 * 63.0 * 0.005;
        close(p.allreduce_ms, by_hand); // 8.749… + 2.52 = 11.2696…
        close(p.exposed_ms, by_hand);
        close(p.step_ms, 300.0 + by_hand);
        close(p.images_per_sec, 64.0 * 256.0 * 1000.0 / (300.0 + by_hand));
        assert_eq!(p.nodes, 8);
        assert_eq!(p.link, "inter");
    }

    #[test]
    fn full_overlap_leaves_the_last_bucket() {
        // Backward 200 ms hides all but the last bucket (23,584,928 B) at 8 workers on NVLink.
        let p = model().predict_one(8);
        let last = 2.0 * 7.0 / 8.0 * 23_584_928.0 / 230e6 + 2.0 * 7.0 * 0.003;
        close(p.exposed_ms, last); // 0.1795 + 0.042 ms
        assert_eq!(p.link, "intra");
        assert_eq!(p.nodes, 1);
    }

    #[test]
    fn partial_window() {
        // Slow link: 10 GbE at 16 workers, 4 per node; backward window 0.5 · 2/3 · 300 = 100 ms.
        let m = ScalingModel {
            overlap: 0.5,
            gpus_per_node: 4,
            inter_gbs: 1.1,
            inter_latency_us: 30.0,
            ..model()
        };
        let p = m.predict_one(16);
        let total = 2.0 * 15.0 / 16.0 * 102_228_128.0 / 1.1e6 + 4.0 * 2.0 * 15.0 * 0.03;
        close(p.allreduce_ms, total); // 174.25… + 3.6
        close(p.exposed_ms, total - 100.0);
        // Efficiency against one worker: 300 / (300 + exposed).
        let ps = m.predict(&[1, 16]);
        close(ps[1].efficiency, 300.0 / (300.0 + total - 100.0));
    }

    #[test]
    fn strong_scaling_shrinks_the_compute() {
        // Global batch 512 at 64 workers: 8 images each, compute 300 · 8/256 = 9.375 ms, backward window
        // 6.25 ms, all-reduce as in no_overlap_exposes_everything (independent of the batch).
        let m = ScalingModel {
            global_batch: Some(512),
            ..model()
        };
        let p = m.predict_one(64);
        let total = 2.0 * 63.0 / 64.0 * 102_228_128.0 / 23e6 + 4.0 * 2.0 * 63.0 * 0.005;
        close(p.batch_per_worker, 8.0);
        close(p.exposed_ms, total - 6.25);
        close(p.step_ms, 9.375 + total - 6.25);
        close(p.images_per_sec, 512.0 * 1000.0 / p.step_ms);
        let ps = m.predict(&[2, 64]);
        // 2 workers: 256 each, 300 ms compute, last bucket exposed on NVLink.
        close(
            ps[1].efficiency,
            ps[1].images_per_sec / 64.0 / (ps[0].images_per_sec / 2.0),
        );
    }

    #[test]
    fn efficiency_against_first_listed() {
        let ps = model().predict(&[64, 2, 2]);
        assert_eq!(ps.len(), 2);
        assert_eq!(ps[0].workers, 2);
        close(ps[0].efficiency, 1.0);
        close(ps[1].efficiency, ps[0].step_ms / ps[1].step_ms);
    }

    #[test]
    fn presets_of_todays_nodes() {
        // NVLink 4: 450 GB/s each way per GPU (900 GB/s bidirectional), 80% of it for a ring; NDR: 400 Gb/s per card.
        assert_eq!(Link::Nvlink4.figures(), (360.0, 3.0));
        assert_eq!(Link::Nvlink3.figures(), (230.0, 3.0));
        assert_eq!(Link::IbNdr400.figures(), (45.0, 5.0));
        assert_eq!(Link::Pcie5.figures(), (40.0, 5.0));
        assert_eq!(Link::Nvlink4.name(), "nvlink4");
        assert_eq!(Link::IbNdr400.name(), "ib-ndr400");
        assert_eq!(Link::Eth100.name(), "100gbe");
        assert!(Link::Nvlink4.models_gpu_nodes() && Link::IbHdr200.models_gpu_nodes());
        assert!(!Link::Loopback.models_gpu_nodes() && !Link::Eth10.models_gpu_nodes());
        let sxm = node_links("NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(
            (sxm.intra, sxm.inter, sxm.card_per_gpu),
            (Link::Nvlink4, Link::IbNdr400, true)
        );
        assert_eq!(node_links("NVIDIA H200").unwrap(), sxm);
        for pcie in ["NVIDIA H100 PCIe", "NVIDIA H100 NVL"] {
            let n = node_links(pcie).unwrap();
            assert_eq!((n.intra, n.card_per_gpu), (Link::Pcie5, false), "{pcie}");
        }
        assert_eq!(node_links("NVIDIA A100-SXM4-40GB"), None);
        assert_eq!(node_links("Intel(R) Xeon(R) Processor (2 threads)"), None);
    }

    fn decode(per_core: f64) -> DecodeRate {
        DecodeRate {
            source: "loader.json".into(),
            images_per_sec: 2.0 * per_core,
            threads: 2,
            images_per_sec_per_core: per_core,
            transform: Some("Train { size: 224 }".into()),
        }
    }

    #[test]
    fn decode_cores_and_their_bound() {
        // 50 ms steps at 256: 5,120 img/s per worker; 500 img/s per core; 64 cores decode 32,000 img/s per node.
        let m = ScalingModel {
            step_ms: 50.0,
            decode: Some(decode(500.0)),
            cores_per_node: Some(64),
            ..model()
        };
        close(m.node_decode_bound().unwrap(), 32_000.0);
        let ps = m.predict(&[1, 4, 8, 16]);
        // 1 and 4 workers need 5,120 and ~20,480 img/s: under the bound.
        assert!(!ps[0].decode_bound && !ps[1].decode_bound);
        close(ps[0].node_decode_cores.unwrap(), 5120.0 / 500.0);
        close(ps[1].images_per_sec, ps[1].step_images_per_sec);
        // 8 workers need ~40,960 img/s of one node: capped at its 32,000, each step waiting for its input.
        let p8 = &ps[2];
        assert!(p8.decode_bound);
        assert!(p8.step_images_per_sec > 32_000.0);
        close(p8.images_per_sec, 32_000.0);
        close(p8.step_ms, 8.0 * 256.0 * 1000.0 / 32_000.0);
        close(
            p8.node_decode_cores.unwrap(),
            p8.node_images_per_sec / 500.0,
        );
        // Two full nodes: twice the bound; efficiency is the bound's, not the step's.
        close(ps[3].images_per_sec, 64_000.0);
        close(ps[3].efficiency, 64_000.0 / 16.0 / ps[0].images_per_sec);
        let notes = m.decode_notes(&ps);
        let cores = (ps[3].node_images_per_sec / 500.0).ceil();
        assert!((75.0..=82.0).contains(&cores), "{cores}");
        assert!(
            notes[0].contains(&format!(
                "needs about {cores} cores at the measured 500 img/s per core"
            )),
            "{notes:?}"
        );
        assert!(notes[1].contains("at 8, 16 workers"), "{notes:?}");
        let text = prediction_table(&ps).to_text();
        let header = text.lines().next().unwrap();
        assert!(
            header.contains("decode cores/node") && header.contains("limit"),
            "{text}"
        );
        assert!(text.lines().nth(3).unwrap().contains("decode"), "{text}");
        // Without the cores: the cores needed, nothing capped, and the bound said to be unknown.
        let m = ScalingModel {
            cores_per_node: None,
            ..m
        };
        let ps = m.predict(&[1, 16]);
        assert!(ps
            .iter()
            .all(|p| !p.decode_bound && p.images_per_sec == p.step_images_per_sec));
        assert!(m.decode_notes(&ps)[1].contains("--cores-per-node"));
        assert!(!prediction_table(&ps).to_text().contains("limit"));
    }

    #[test]
    fn unmeasured_decode_is_said() {
        let ps = model().predict(&[1, 64]);
        assert_eq!(ps[1].node_decode_cores, None);
        let notes = model().decode_notes(&ps);
        assert_eq!(notes.len(), 1);
        assert!(
            notes[0].contains("each node to decode") && notes[0].contains("unmeasured"),
            "{notes:?}"
        );
    }

    #[test]
    fn cpu_step_under_gpu_links_is_warned() {
        let cpu = ScalingModel {
            device: Some("cpu".into()),
            hardware: Some("Xeon (2 threads)".into()),
            ..model()
        };
        let w = cpu.warnings(&cpu.predict(&[1, 64]));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("measured on a CPU") && w[0].contains("nvlink3 and ib-hdr200"),
            "{w:?}"
        );
        // Within a node only the intra-node preset counts; one worker uses no link.
        let w = cpu.warnings(&cpu.predict(&[1, 2]));
        assert!(
            w[0].contains("the nvlink3 preset models GPU nodes"),
            "{w:?}"
        );
        assert!(cpu.warnings(&cpu.predict(&[1])).is_empty());
        // Loopback between ranks on one host, a measured network: nothing to warn of.
        let loopback = ScalingModel {
            intra_preset: Some(Link::Loopback),
            inter_preset: None,
            ..cpu.clone()
        };
        assert!(loopback.warnings(&loopback.predict(&[1, 2, 64])).is_empty());
        // A GPU's step under the same presets.
        let gpu = ScalingModel {
            device: Some("cuda:0".into()),
            ..cpu
        };
        assert!(gpu.warnings(&gpu.predict(&[1, 64])).is_empty());
        // A loader measured with the evaluation transform.
        let val = ScalingModel {
            decode: Some(DecodeRate {
                transform: Some("Val { resize: 256, crop: 224 }".into()),
                ..decode(500.0)
            }),
            ..gpu
        };
        let w = val.warnings(&val.predict(&[1]));
        assert!(w[0].contains("not the training transform"), "{w:?}");
    }
}
