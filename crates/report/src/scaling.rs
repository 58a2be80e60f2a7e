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
//!   input is what breaks first.
//!
//! - with `--global-batch` (strong scaling) the global batch stays fixed instead: each worker gets
//!   `global / N` images and its compute time is taken as proportional to that (optimistic: GPUs lose efficiency
//!   at small batches).
//!
//! What it leaves out, on purpose: whether the input pipeline keeps up (it says what the pipeline must deliver),
//! evaluation, start-up, stragglers, contention of NCCL kernels with compute. Measured efficiencies below the
//! prediction point at those.

use std::path::PathBuf;

use anyhow::{bail, Context};
use rn50_args::finite_in;
use serde::Serialize;

use crate::schema::{read_json, BenchResult};
use crate::table::{fmt_pct, fmt_rate, Align, Cell, Column, Table};

/// torchvision's parameter counts.
pub fn param_count(arch: &str) -> Option<u64> {
    Some(match arch {
        "resnet18" => 11_689_512,
        "resnet34" => 21_797_672,
        "resnet50" => 25_557_032,
        "resnet101" => 44_549_160,
        "resnet152" => 60_192_808,
        _ => return None,
    })
}

/// Links with the all-reduce bus bandwidth a ring reaches on them and a per-step latency. Round figures from
/// the links' nominal rates (a ring gets ~90% of a NIC's line rate), not measurements: pass
/// --bandwidth-gbs/--latency-us for a measured link (nccl-tests' busbw).
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Link {
    /// NVLink 3 through NVSwitch (DGX/HGX A100): 230 GB/s, 3 µs.
    Nvlink,
    /// NVLink 2 (V100: DGX-1, IBM AC922): 75 GB/s, 5 µs.
    Nvlink2,
    /// PCIe 4.0 x16: 20 GB/s, 5 µs.
    Pcie4,
    /// PCIe 3.0 x16: 10 GB/s, 5 µs.
    Pcie3,
    /// InfiniBand NDR 400 Gb/s: 45 GB/s, 5 µs.
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
            Link::Nvlink => (230.0, 3.0),
            Link::Nvlink2 => (75.0, 5.0),
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
}

#[derive(clap::Args, Clone, Debug)]
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
    /// Inter-node link (of one network card).
    #[arg(long, value_enum, default_value = "ib-hdr200")]
    pub interconnect: Link,
    /// Network cards per node, 1 to 64: NCCL spreads the inter-node rings over them, so a node's inter-node
    /// bandwidth is this many times one card's (up to the intra-node link's).
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = clap::value_parser!(u64).range(1..=64))]
    pub nics_per_node: u64,
    /// Inter-node all-reduce bus bandwidth of one network card, GB/s (above 0), instead of the preset's.
    #[arg(long, value_name = "GB_S", value_parser = rn50_args::positive())]
    pub bandwidth_gbs: Option<f64>,
    /// Inter-node latency per ring step, µs (0 or more), instead of the preset's.
    #[arg(long, value_name = "US", value_parser = finite_in(0.0..))]
    pub latency_us: Option<f64>,
    /// Intra-node link.
    #[arg(long, value_enum, default_value = "nvlink")]
    pub intra: Link,
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
    pub step_ms: f64,
    pub images_per_sec: f64,
    /// The input that speed needs on each (full) node: images read and decoded per second, and JPEG bytes read
    /// per second (GB/s).
    pub node_images_per_sec: f64,
    pub node_read_gbs: f64,
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
        let step = compute + exposed;
        let images_per_sec = n as f64 * per_worker * 1000.0 / step;
        let node_images_per_sec =
            images_per_sec / n as f64 * n.min(self.gpus_per_node.max(1)) as f64;
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
            node_images_per_sec,
            node_read_gbs: node_images_per_sec * self.image_bytes / 1e9,
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
}

/// One worker's step time (ms), batch and arch from a `rn50 bench --json` result. The file's numbers did not come
/// through the command line's range checks, so they are checked here.
fn bench_speed(path: &std::path::Path) -> anyhow::Result<(f64, u64, String)> {
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
    Ok((step_ms, c.batch_size, c.arch.clone()))
}

/// Resolves the command line into a model. Its numbers are in range already (clap's value parsers); those of a
/// `--bench` file are checked by [`bench_speed`].
pub fn model_from_args(a: &ScalingArgs) -> anyhow::Result<ScalingModel> {
    let (step_ms, batch, arch) = if let Some(path) = &a.bench {
        bench_speed(path)?
    } else if let Some(ms) = a.step_ms {
        (ms, a.batch, a.arch.clone())
    } else if let Some(x) = a.images_per_sec {
        (a.batch as f64 * 1000.0 / x, a.batch, a.arch.clone())
    } else {
        bail!(
            "give the single-worker speed: --step-ms, --images-per-sec (with -b) or --bench FILE"
        );
    };
    let grad_bytes = match a.grad_bytes {
        Some(g) => g,
        None => param_count(&arch)
            .with_context(|| {
                format!("unknown arch {arch:?} (resnet18/34/50/101/152): give --grad-bytes")
            })?
            .saturating_mul(a.bytes_per_param),
    };
    let (bw, lat) = a.interconnect.figures();
    let (ibw, ilat) = a.intra.figures();
    Ok(ScalingModel {
        step_ms,
        batch,
        global_batch: a.global_batch,
        grad_bytes,
        bucket_bytes: (a.bucket_mb * 1024.0 * 1024.0) as u64,
        overlap: a.overlap,
        backward_fraction: a.backward_fraction,
        gpus_per_node: a.gpus_per_node,
        inter_gbs: a.bandwidth_gbs.unwrap_or(bw) * a.nics_per_node as f64,
        inter_latency_us: a.latency_us.unwrap_or(lat),
        intra_gbs: a.intra_bandwidth_gbs.unwrap_or(ibw),
        intra_latency_us: a.intra_latency_us.unwrap_or(ilat),
        image_bytes: match (&a.data, a.jpeg_kb) {
            (Some(data), _) => mean_file_bytes(data)?,
            (None, Some(kb)) => kb * 1000.0,
            (None, None) => IMAGENET_MEAN_JPEG_BYTES,
        },
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

pub fn prediction_table(ps: &[Prediction]) -> Table {
    let c = |title, key, align| Column { title, key, align };
    let num = |x: f64, d: String| Cell {
        display: d,
        raw: x.to_string(),
    };
    Table {
        columns: vec![
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
            c("speedup", "speedup", Align::Right),
            c("efficiency", "efficiency", Align::Right),
        ],
        rows: ps
            .iter()
            .map(|p| {
                vec![
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
                    num(p.speedup, format!("{:.2}x", p.speedup)),
                    num(p.efficiency, fmt_pct(p.efficiency)),
                ]
            })
            .collect(),
    }
}

#[derive(Serialize)]
struct PredictJson<'a> {
    model: &'a ScalingModel,
    predictions: &'a [Prediction],
}

/// `rn50 scaling`: the model's inputs, the prediction table, and `--json`.
pub fn run(args: &ScalingArgs) -> anyhow::Result<()> {
    let model = model_from_args(args)?;
    let ps = model.predict(&args.gpus);
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
    println!(
        "links: intra-node {} GB/s {} µs (≤ {} per node), inter-node {} GB/s {} µs ({} network card(s) per node)",
        model.intra_gbs,
        model.intra_latency_us,
        model.gpus_per_node,
        model.inter_gbs,
        model.inter_latency_us,
        args.nics_per_node
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
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&PredictJson {
            model: &model,
            predictions: &ps,
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
}
