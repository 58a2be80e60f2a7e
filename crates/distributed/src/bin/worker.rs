//! Worker for rn50-distributed's multi-process tests (and a quick check of a node's Gloo set-up):
//!
//! - `train`: a small conv+linear net (no batch norm, fp32) trained with DDP for a few SGD steps on data that
//!   depends only on the step, each rank taking its slice of the global batch; writes the final parameters;
//! - `sleep`: waits (exits 3 on SIGINT/SIGTERM/SIGUSR1 like rn50 train, or fails on purpose on one rank);
//! - `attempt`: prints RN50_RESTART_COUNT and exits at once, one rank with a chosen status on the first attempts
//!   (for `launch --max-restarts`);
//! - `out-of-step`: rank 0 asks for a stop while the others sum evaluation counts;
//! - `allreduce-bench`: the time of one all-reduce of a ResNet-50-sized gradient in DDP-like buckets;
//! - `sync-bn`: SyncBatchNorm on each rank's rows of a global batch against plain batch norm on the whole batch;
//! - `launch`: `rn50 launch` with this program as the worker.
//!
//! Training throughput with DDP is `rn50 bench` under `rn50 launch` (rn50's own model and step).
use anyhow::Context;
use clap::{Parser, Subcommand};
use rn50_distributed::{
    init_options_from_env, launch, Backend, BatchNormState, DdpOptions, DistContext, ProcessGroup,
    ReduceOp, WorldInfo,
};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use tch::nn::Module;
use tch::{nn, Device, Kind, Tensor};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    Train {
        #[arg(long, default_value_t = 5)]
        steps: usize,
        /// Per-rank batch; the global batch is batch × world size.
        #[arg(long, default_value_t = 4)]
        batch: i64,
        #[arg(long)]
        out: PathBuf,
        /// Pause after each step (so that a test can kill a rank mid-training).
        #[arg(long, default_value_t = 0)]
        sleep_ms: u64,
        /// Bucket cap in bytes (small values give several buckets for this tiny net).
        #[arg(long, default_value_t = 25 * 1024 * 1024)]
        bucket_bytes: usize,
    },
    Sleep {
        /// This rank exits with status 7 after a moment.
        #[arg(long)]
        fail_rank: Option<usize>,
        /// Once asked to stop, write RN50_TEST_UP_DIR/stopping-RANK and take this long to exit 3 (as a
        /// checkpoint takes), so that a test can send a second SIGINT meanwhile.
        #[arg(long, default_value_t = 0)]
        linger_ms: u64,
    },
    /// Prints the attempt (RN50_RESTART_COUNT) on stdout and stderr, then exits: 0, or on rank --fail-rank
    /// --code while fewer than --fail-attempts restarts were made.
    Attempt {
        #[arg(long)]
        fail_rank: Option<usize>,
        #[arg(long, default_value_t = 7)]
        code: i32,
        /// Attempts that fail (default: all).
        #[arg(long, default_value_t = usize::MAX)]
        fail_attempts: usize,
    },
    /// All-reduce time of a gradient-sized buffer in buckets, like DDP's (rank 0 prints the median).
    AllreduceBench {
        /// Total floats (ResNet-50: 25,557,032 parameters).
        #[arg(long, default_value_t = 25_557_032)]
        floats: i64,
        #[arg(long, default_value_t = 25.0)]
        bucket_mb: f64,
        #[arg(long, default_value_t = 10)]
        iters: usize,
    },
    /// Rank 0 asks whether any rank wants to stop while the others sum evaluation counts: the ranks out of step,
    /// as rn50 train's were when one rank's epoch ended earlier. Exits 3 if rank 0 took that for a stop request.
    OutOfStep,
    /// SyncBatchNorm forward and backward on each rank's rows of a global batch, compared with plain batch norm
    /// of the whole batch (computed on every rank); fails if outputs, gradients or running statistics differ.
    SyncBn {
        /// Rows of each rank, comma-separated (one entry per rank; 0 is an empty batch).
        #[arg(long, value_delimiter = ',')]
        rows: Vec<i64>,
        #[arg(long)]
        channels_last: bool,
    },
    Launch(launch::LaunchArgs),
}

fn net(vs: &nn::Path) -> impl Module {
    nn::seq()
        .add(nn::conv2d(
            vs / "conv",
            3,
            6,
            3,
            nn::ConvConfig {
                padding: 1,
                ..Default::default()
            },
        ))
        .add_fn(|x| x.relu())
        .add(nn::conv2d(
            vs / "conv2",
            6,
            4,
            3,
            nn::ConvConfig {
                padding: 1,
                stride: 2,
                ..Default::default()
            },
        ))
        .add_fn(|x| x.relu().flatten(1, -1))
        .add(nn::linear(vs / "fc", 4 * 4 * 4, 10, Default::default()))
}

fn write_params(path: &std::path::Path, params: &[Tensor]) -> anyhow::Result<()> {
    let mut bytes = Vec::new();
    for p in params {
        let v = Vec::<f32>::try_from(&p.detach().to_kind(Kind::Float).flatten(0, -1))?;
        v.iter()
            .for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
    }
    std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

fn train(
    steps: usize,
    batch: i64,
    out: PathBuf,
    sleep_ms: u64,
    bucket_bytes: usize,
) -> anyhow::Result<()> {
    tch::set_num_threads(1);
    // A world of one trains without any process group: the reference the DDP runs are compared with.
    let dist = DistContext::init(Device::Cpu)?;
    let (rank, size) = (dist.rank(), dist.world_size());
    // Different initial weights on every rank: only DDP's broadcast makes them equal.
    tch::manual_seed(100 + rank as i64);
    let vs = nn::VarStore::new(Device::Cpu);
    let model = net(&vs.root());
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let params: Vec<Tensor> = named.into_iter().map(|(_, t)| t).collect();
    let opts = DdpOptions {
        bucket_cap_bytes: bucket_bytes,
        first_bucket_cap_bytes: bucket_bytes.min(1 << 20),
        ..Default::default()
    };
    write_params(&out.join(format!("local-init-rank{rank}.bin")), &params)?;
    let mut sync = dist.gradient_sync(&params, &[], &opts)?;
    write_params(&out.join(format!("init-rank{rank}.bin")), &params)?;
    let lr = 0.1;
    let mut wait_ms = 0.0;
    for step in 0..steps {
        // The global batch depends on the step only; rank r takes rows [r*b, (r+1)*b).
        tch::manual_seed(10_000 + step as i64);
        let global = batch * size as i64;
        let x = Tensor::randn([global, 3, 8, 8], (Kind::Float, Device::Cpu));
        let y = Tensor::randint(10, [global], (Kind::Int64, Device::Cpu));
        let (x, y) = (
            x.narrow(0, rank as i64 * batch, batch),
            y.narrow(0, rank as i64 * batch, batch),
        );
        let loss = model.forward(&x).cross_entropy_for_logits(&y);
        let comm = sync.backward(&loss)?;
        wait_ms += comm.allreduce_wait_ms;
        // Plain SGD, in place.
        tch::no_grad(|| -> anyhow::Result<()> {
            for p in &params {
                let mut g = p.grad();
                let _ = p.shallow_clone().f_sub_(&(&g * lr))?;
                let _ = g.f_zero_()?;
            }
            Ok(())
        })?;
        // A metric reduced like the trainer does (mean loss over ranks).
        let mut m = [loss.double_value(&[])];
        dist.sum_f64(&mut m, "loss")?;
        std::fs::write(out.join(format!("step-rank{rank}")), (step + 1).to_string())?;
        if rank == 0 {
            println!(
                "step {step} mean loss {:.6} buckets {} first bucket at {:.3} ms, wait {:.3} ms",
                m[0] / size as f64,
                comm.buckets,
                comm.first_bucket_ms,
                comm.allreduce_wait_ms
            );
        }
        if sleep_ms > 0 {
            std::thread::sleep(Duration::from_millis(sleep_ms));
        }
    }
    write_params(&out.join(format!("params-rank{rank}.bin")), &params)?;
    if let Some(pg) = dist.group() {
        check_collectives(pg)?;
    }
    let _ = std::io::stdout().flush();
    eprintln!("rank {rank}: all-reduce wait {wait_ms:.3} ms total");
    drop(sync);
    dist.finish()?;
    Ok(())
}

/// The other collectives give what they should on every rank.
fn check_collectives(pg: &ProcessGroup) -> anyhow::Result<()> {
    let (rank, size) = (pg.rank(), pg.world_size());
    let all = pg.allgather(
        &Tensor::from_slice(&[rank as f32, 10.0 * rank as f32]),
        "ranks",
    )?;
    for (r, t) in all.iter().enumerate() {
        let v = Vec::<f32>::try_from(t)?;
        anyhow::ensure!(
            v == [r as f32, 10.0 * r as f32],
            "all-gather: slot {r} holds {v:?}"
        );
    }
    let last = size - 1;
    let t = Tensor::from_slice(&[rank as f64; 3]);
    pg.broadcast(&[&t], last, "test tensor")?;
    anyhow::ensure!(
        Vec::<f64>::try_from(&t)? == [last as f64; 3],
        "broadcast from rank {last}: {t}"
    );
    anyhow::ensure!(
        pg.any_rank(rank == last, "flag")?,
        "any_rank missed rank {last}'s flag"
    );
    anyhow::ensure!(
        !pg.any_rank(false, "flag")?,
        "any_rank saw a flag nobody set"
    );
    let mut m = [1.0, rank as f64];
    pg.allreduce_f64(&mut m, ReduceOp::Sum, "counts")?;
    anyhow::ensure!(
        m == [size as f64, (size * (size - 1) / 2) as f64],
        "all-reduce sum: {m:?}"
    );
    let t = Tensor::from_slice(&[1.0f32; 4]);
    let work = pg.allreduce_async(&[&t], ReduceOp::Sum, "async test")?;
    work.wait(Some(Duration::from_secs(60)))?;
    anyhow::ensure!(
        Vec::<f32>::try_from(&t)? == [size as f32; 4],
        "async all-reduce: {t}"
    );
    // Store: rank 0 publishes, everyone reads; a counter every rank bumps.
    let store = pg.store();
    if rank == 0 {
        store.set("test/greeting", b"hello")?;
    }
    anyhow::ensure!(store.get("test/greeting")? == b"hello", "store get");
    store.add("test/count", 1)?;
    pg.barrier("test")?;
    anyhow::ensure!(store.add("test/count", 0)? == size as i64, "store add");
    anyhow::ensure!(!store.check("test/missing")?, "store check");
    Ok(())
}

fn sleep(fail_rank: Option<usize>, linger_ms: u64) -> anyhow::Result<i32> {
    let world = WorldInfo::from_env()?;
    // As rn50 train: SIGINT, SIGTERM or SIGUSR1 asks to stop (exit 3), a second SIGINT stops at once.
    let stop = rn50_util::stop::install("exiting 3")?;
    let up_dir = std::env::var_os("RN50_TEST_UP_DIR").map(PathBuf::from);
    if let Some(dir) = &up_dir {
        std::fs::write(dir.join(format!("up-{}", world.rank)), b"")?;
    }
    println!(
        "rank {} of {} up (local {}, OMP_NUM_THREADS={})",
        world.rank,
        world.world_size,
        world.local_rank,
        std::env::var("OMP_NUM_THREADS").unwrap_or_default()
    );
    let _ = std::io::stdout().flush();
    for _ in 0..6000 {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            println!("rank {}: stop requested, exiting 3", world.rank);
            if linger_ms > 0 {
                let _ = std::io::stdout().flush();
                if let Some(dir) = &up_dir {
                    std::fs::write(dir.join(format!("stopping-{}", world.rank)), b"")?;
                }
                std::thread::sleep(Duration::from_millis(linger_ms));
            }
            return Ok(3);
        }
        if fail_rank == Some(world.rank) {
            std::thread::sleep(Duration::from_millis(300));
            eprintln!("rank {}: failing on purpose", world.rank);
            return Ok(7);
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(0)
}

fn attempt(fail_rank: Option<usize>, code: i32, fail_attempts: usize) -> anyhow::Result<i32> {
    let world = WorldInfo::from_env()?;
    let restarts: usize = std::env::var("RN50_RESTART_COUNT")
        .context("RN50_RESTART_COUNT not set")?
        .parse()?;
    println!("rank {} stdout: RN50_RESTART_COUNT={restarts}", world.rank);
    eprintln!("rank {} stderr: RN50_RESTART_COUNT={restarts}", world.rank);
    Ok(
        if fail_rank == Some(world.rank) && restarts < fail_attempts {
            code
        } else {
            0
        },
    )
}

fn out_of_step() -> anyhow::Result<i32> {
    let dist = DistContext::init(Device::Cpu)?;
    if dist.is_main() {
        let stop = dist.any_rank(false, "checking for a stop signal")?;
        println!("rank 0: stop requested on some rank: {stop}");
        return Ok(if stop { 3 } else { 0 });
    }
    let mut counts = [3.0, 5.0, 6.0, 0.0];
    dist.sum_f64(&mut counts, "summing evaluation counts")?;
    Ok(0)
}

fn allreduce_bench(floats: i64, bucket_mb: f64, iters: usize) -> anyhow::Result<()> {
    let world = WorldInfo::from_env()?;
    let pg = ProcessGroup::init(&world, &init_options_from_env(Backend::Gloo)?)?;
    let per = ((bucket_mb * 1024.0 * 1024.0 / 4.0) as i64).max(1);
    let buckets: Vec<Tensor> = (0..floats)
        .step_by(per as usize)
        .map(|start| Tensor::ones([per.min(floats - start)], (Kind::Float, Device::Cpu)))
        .collect();
    let mut times = Vec::new();
    for i in 0..iters + 2 {
        let t0 = std::time::Instant::now();
        let works = buckets
            .iter()
            .map(|b| pg.allreduce_async(&[b], ReduceOp::Sum, "bucket"))
            .collect::<Result<Vec<_>, _>>()?;
        for w in works {
            w.wait(None)?;
        }
        if i >= 2 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    if world.rank == 0 {
        println!(
            "all-reduce of {floats} floats ({:.1} MB) in {} buckets over {} ranks: median {:.1} ms (min {:.1}, max {:.1})",
            floats as f64 * 4.0 / 1e6,
            buckets.len(),
            world.world_size,
            times[times.len() / 2],
            times[0],
            times[times.len() - 1]
        );
    }
    pg.finish()?;
    Ok(())
}

/// Largest absolute difference between two tensors, as f64.
fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    match a.numel() {
        0 => 0.0,
        _ => (a - b).abs().max().double_value(&[]),
    }
}

fn sync_bn(rows: Vec<i64>, channels_last: bool) -> anyhow::Result<()> {
    tch::set_num_threads(1);
    let world = WorldInfo::from_env()?;
    anyhow::ensure!(
        rows.len() == world.world_size,
        "--rows needs one entry per rank"
    );
    let pg = ProcessGroup::init(&world, &init_options_from_env(Backend::Gloo)?)?;
    let rank = world.rank;
    let (c, momentum, eps) = (6, 0.1, 1e-5);
    // The global batch, the upstream gradient and the layer, the same on every rank.
    tch::manual_seed(7);
    let total: i64 = rows.iter().sum();
    // NHWC memory, NCHW shape (torch.channels_last).
    let layout = |t: Tensor| match channels_last {
        true => t.permute([0, 2, 3, 1]).contiguous().permute([0, 3, 1, 2]),
        false => t,
    };
    let x = layout(Tensor::randn([total, c, 5, 7], (Kind::Float, Device::Cpu)) * 2.0 + 0.5);
    let dy = Tensor::randn([total, c, 5, 7], (Kind::Float, Device::Cpu));
    let weight = Tensor::rand([c], (Kind::Float, Device::Cpu)) + 0.5;
    let bias = Tensor::randn([c], (Kind::Float, Device::Cpu));
    let stats = || {
        (
            Tensor::full([c], 0.2, (Kind::Float, Device::Cpu)),
            Tensor::full([c], 1.5, (Kind::Float, Device::Cpu)),
        )
    };
    let leaf = |t: &Tensor| t.detach().copy().set_requires_grad(true);

    // Reference: one process, the whole batch.
    let (xr, wr, br) = (leaf(&x), leaf(&weight), leaf(&bias));
    let (rm_ref, rv_ref) = stats();
    let y_ref = Tensor::batch_norm(
        &xr,
        Some(&wr),
        Some(&br),
        Some(&rm_ref),
        Some(&rv_ref),
        true,
        momentum,
        eps,
        false,
    );
    (&y_ref * &dy).sum(Kind::Float).backward();

    // This rank's rows through SyncBatchNorm.
    let start: i64 = rows[..rank].iter().sum();
    let n = rows[rank];
    let (xs, ws, bs) = (
        leaf(&layout(x.narrow(0, start, n).copy())),
        leaf(&weight),
        leaf(&bias),
    );
    let (rm, rv) = stats();
    let state = BatchNormState {
        weight: &ws,
        bias: &bs,
        running_mean: &rm,
        running_var: &rv,
        momentum,
        eps,
    };
    let y = pg.sync_batch_norm(&xs, &state)?;
    anyhow::ensure!(
        !channels_last || n == 0 || y.stride()[1] == 1,
        "the output is not channels_last like the input"
    );
    (&y * dy.narrow(0, start, n)).sum(Kind::Float).backward();
    // The weight and bias gradients are each rank's part: summed over ranks they are the whole batch's.
    let (gw, gb) = (ws.grad(), bs.grad());
    // (One tensor per call: a list is summed together, as copies of one tensor on several devices.)
    pg.allreduce(&[&gw], ReduceOp::Sum, "BN weight gradient")?;
    pg.allreduce(&[&gb], ReduceOp::Sum, "BN bias gradient")?;
    let diffs = [
        ("output", max_diff(&y, &y_ref.narrow(0, start, n))),
        (
            "input gradient",
            max_diff(&xs.grad(), &xr.grad().narrow(0, start, n)),
        ),
        ("weight gradient", max_diff(&gw, &wr.grad())),
        ("bias gradient", max_diff(&gb, &br.grad())),
        ("running mean", max_diff(&rm, &rm_ref)),
        ("running var", max_diff(&rv, &rv_ref)),
    ];
    for (what, d) in diffs {
        // fp32 rounding of values of order 1-10 summed over up to a few hundred elements.
        anyhow::ensure!(
            d < 1e-4,
            "rank {rank}: SyncBatchNorm {what} differs by {d:e}"
        );
    }
    println!("rank {rank}: SyncBatchNorm matches batch norm of the whole batch: {diffs:?}");
    pg.finish()?;
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    rn50_util::log::init(None);
    let code = match cli.cmd {
        Cmd::Train {
            steps,
            batch,
            out,
            sleep_ms,
            bucket_bytes,
        } => train(steps, batch, out, sleep_ms, bucket_bytes).map(|()| 0),
        Cmd::Sleep {
            fail_rank,
            linger_ms,
        } => sleep(fail_rank, linger_ms),
        Cmd::Attempt {
            fail_rank,
            code,
            fail_attempts,
        } => attempt(fail_rank, code, fail_attempts),
        Cmd::AllreduceBench {
            floats,
            bucket_mb,
            iters,
        } => allreduce_bench(floats, bucket_mb, iters).map(|()| 0),
        Cmd::OutOfStep => out_of_step(),
        Cmd::SyncBn {
            rows,
            channels_last,
        } => sync_bn(rows, channels_last).map(|()| 0),
        Cmd::Launch(args) => {
            return exit_code(
                std::env::current_exe()
                    .context("current_exe")
                    .and_then(|exe| launch::run(&args, &exe)),
            )
        }
    };
    exit_code(code.map(|c| ExitCode::from(c as u8)))
}

fn exit_code(code: anyhow::Result<ExitCode>) -> ExitCode {
    code.unwrap_or_else(|e| {
        eprintln!("error: {e:#}");
        ExitCode::FAILURE
    })
}
