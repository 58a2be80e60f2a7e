//! `rn50 bench --sweep`: every world size × batch size, each point repeated in fresh processes started by
//! `rn50 launch` (so 2 ranks on a 2-core node get one core each, as a real job would), reported as median
//! and spread with the scaling efficiency against the 1-rank point.
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use rn50_report::{SweepPoint, SweepResult};

use serde_json::Value;

use super::BenchArgs;

/// The flags of one measurement, as `rn50 bench` takes them.
fn point_args(a: &BenchArgs, batch: Option<i64>, json: &Path) -> Vec<String> {
    let mut v: Vec<String> = vec!["bench".into(), "-a".into(), a.arch.to_string()];
    let mut push = |k: &str, val: String| {
        v.push(k.into());
        v.push(val);
    };
    if let Some(b) = batch {
        push("-b", b.to_string());
    }
    if let Some(p) = a.precision {
        push("--precision", p.to_string());
    }
    if let Some(w) = a.warmup {
        push("--warmup", w.to_string());
    }
    if let Some(s) = a.steps {
        push("--steps", s.to_string());
    }
    if let Some(d) = a.data {
        push("--data", format!("{d:?}").to_lowercase());
    }
    if let Some(d) = &a.data_dir {
        push("--data-dir", d.display().to_string());
    }
    if let Some(j) = a.workers {
        push("-j", j.to_string());
    }
    push("--device", a.device.clone());
    push("--image-size", a.image_size.to_string());
    push("--synthetic-images", a.synthetic_images.to_string());
    push("--seed", a.seed.to_string());
    push("--json", json.display().to_string());
    if a.no_channels_last {
        v.push("--no-channels-last".into());
    }
    if a.no_fused_bn {
        v.push("--no-fused-bn".into());
    }
    v
}

/// How the ranks of one sweep point are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum SweepLauncher {
    /// `rn50 launch` on this node.
    Launch,
    /// `srun -n N` inside a SLURM allocation (the ranks find their place in SLURM's variables).
    Srun,
    /// `mpirun -np N` (Open MPI, MPICH, Intel MPI; PBS/UGE allocations).
    Mpirun,
}

/// The command line that starts `n` ranks of `bench` with `launcher`.
pub fn point_command(
    launcher: SweepLauncher,
    exe: &Path,
    n: usize,
    bench: &[String],
) -> Vec<String> {
    let exe = exe.display().to_string();
    let mut v: Vec<String> = match launcher {
        SweepLauncher::Launch => vec![
            exe,
            "launch".into(),
            "--nproc-per-node".into(),
            n.to_string(),
            "--".into(),
        ],
        SweepLauncher::Srun => vec![
            "srun".into(),
            "--ntasks".into(),
            n.to_string(),
            "--kill-on-bad-exit=1".into(),
            exe,
        ],
        SweepLauncher::Mpirun => vec!["mpirun".into(), "-np".into(), n.to_string(), exe],
    };
    v.extend(bench.iter().cloned());
    v
}

pub fn command(args: &BenchArgs) -> Result<()> {
    if args.world_sizes.is_empty() {
        bail!("--world-sizes needs at least one size");
    }
    if args.threads.is_some() {
        bail!("--sweep splits the CPUs between the ranks itself: leave out --threads");
    }
    if args.profile {
        bail!("--profile looks at one configuration: leave out --sweep");
    }
    let exe = std::env::current_exe().context("locating the rn50 binary")?;
    let tmp = std::env::temp_dir().join(format!("rn50-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let batches: Vec<Option<i64>> = if args.batch_sizes.is_empty() {
        vec![args.batch_size]
    } else {
        args.batch_sizes.iter().map(|&b| Some(b)).collect()
    };
    let mut points = Vec::new();
    let mut first: Option<Value> = None;
    for &batch in &batches {
        for &n in &args.world_sizes {
            let (mut ips, mut comm, mut last) = (Vec::new(), Vec::new(), None);
            for r in 0..args.repeats {
                let json = tmp.join(format!("b{}-n{n}-r{r}.json", batch.unwrap_or(0)));
                eprintln!(
                    "sweep: {n} rank(s), batch {} per rank, repeat {}/{}",
                    batch.map_or("default".into(), |b| b.to_string()),
                    r + 1,
                    args.repeats
                );
                let cmd = point_command(args.launcher, &exe, n, &point_args(args, batch, &json));
                let status = Command::new(&cmd[0])
                    .args(&cmd[1..])
                    .status()
                    .with_context(|| format!("starting {}", cmd[0]))?;
                if !status.success() {
                    bail!("the {n}-rank bench failed ({status})");
                }
                let text = std::fs::read_to_string(&json)
                    .with_context(|| format!("reading {}", json.display()))?;
                let res: Value = serde_json::from_str(&text)
                    .with_context(|| format!("parsing {}", json.display()))?;
                ips.push(res["images_per_sec"].as_f64().unwrap_or(f64::NAN));
                comm.extend(res["allreduce_ms"].as_f64());
                last = Some(res);
            }
            let res = last.expect("at least one repeat");
            let allreduce =
                (!comm.is_empty()).then(|| comm.iter().sum::<f64>() / comm.len() as f64);
            points.push(SweepPoint::from_repeats(
                n as u64,
                res["config"]["batch_size"].as_u64().unwrap_or(0),
                res["config"]["lr"].as_f64(),
                ips,
                allreduce,
            ));
            first.get_or_insert(res);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let base = first.expect("at least one point");
    let c = &base["config"];
    let text = |v: &Value| v.as_str().map(str::to_string);
    let result = SweepResult {
        arch: text(&c["arch"]).unwrap_or_default(),
        device: text(&c["device"]),
        // Threads of the 1-rank point; each of N ranks had 1/N of them.
        threads: c["threads"].as_u64(),
        precision: text(&c["precision"]),
        image_size: c["image_size"].as_u64(),
        data: text(&c["data"]),
        launcher: Some(format!("{:?}", args.launcher).to_lowercase()),
        points,
        machine: serde_json::from_value(base["machine"].clone()).ok(),
        ..Default::default()
    };
    print!("{}", render(&result));
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", p.display()))?;
        eprintln!(
            "wrote {} (tables and plots: rn50 report {})",
            p.display(),
            p.display()
        );
    }
    Ok(())
}

/// The sweep as a table, with efficiency X_N / (N·X_1) against the 1-rank point of the same batch.
pub fn render(r: &SweepResult) -> String {
    let mut s = format!(
        "rn50 bench --sweep: {} {}px {} on {}\n{:>5} {:>6} {:>7} {:>10} {:>17} {:>8} {:>10} {:>14}\n",
        r.arch,
        r.image_size.unwrap_or(0),
        r.precision.as_deref().unwrap_or(""),
        r.device.as_deref().unwrap_or(""),
        "ranks",
        "batch",
        "global",
        "img/s",
        "min..max",
        "vs 1",
        "efficiency",
        "all-reduce ms"
    );
    for p in &r.points {
        let one = r
            .points
            .iter()
            .find(|q| q.world_size == 1 && q.batch_size == p.batch_size);
        let (speedup, eff) = match one {
            Some(o) if o.median > 0.0 => (
                format!("{:.2}x", p.median / o.median),
                format!(
                    "{:.1}%",
                    100.0 * p.median / (p.world_size as f64 * o.median)
                ),
            ),
            _ => ("-".into(), "-".into()),
        };
        s += &format!(
            "{:>5} {:>6} {:>7} {:>10.2} {:>17} {:>8} {:>10} {:>14}\n",
            p.world_size,
            p.batch_size,
            p.global_batch,
            p.median,
            format!("{:.2}..{:.2}", p.min, p.max),
            speedup,
            eff,
            p.allreduce_ms.map_or("-".into(), |m| format!("{m:.1}"))
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_launcher_starts_n_ranks_of_the_same_bench() {
        let exe = Path::new("/opt/rn50");
        let bench = vec!["bench".to_string(), "-b".into(), "32".into()];
        assert_eq!(
            point_command(SweepLauncher::Launch, exe, 2, &bench).join(" "),
            "/opt/rn50 launch --nproc-per-node 2 -- bench -b 32"
        );
        assert_eq!(
            point_command(SweepLauncher::Srun, exe, 8, &bench).join(" "),
            "srun --ntasks 8 --kill-on-bad-exit=1 /opt/rn50 bench -b 32"
        );
        assert_eq!(
            point_command(SweepLauncher::Mpirun, exe, 4, &bench).join(" "),
            "mpirun -np 4 /opt/rn50 bench -b 32"
        );
    }
}
