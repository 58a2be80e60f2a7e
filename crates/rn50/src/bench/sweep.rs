//! `rn50 bench --sweep`: every world size × batch size, each point repeated in fresh processes started by
//! `rn50 launch` (so 2 ranks on a 2-core node get one core each, as a real job would), reported as median
//! and spread with the scaling efficiency against the 1-rank point.
use std::path::Path;
use std::process::Command;

use anyhow::{bail, Context, Result};
use clap::{ArgAction, Args, ValueEnum};
use rn50_report::schema::{parse_json, BenchResult, SweepPoint, SweepResult};
use serde_json::Value;

use super::BenchArgs;

/// The sweep's own flags: what every point is measured with is all the others.
const SWEEP_ONLY: [&str; 5] = ["sweep", "world_sizes", "batch_sizes", "repeats", "launcher"];

/// The command line of one measurement: `rn50 bench` with every flag of `a` (whatever it is, so a new flag is
/// forwarded without being listed here) but the sweep's own, the batch size `batch` and the result file `json`.
/// The flags come from clap's definition of [`BenchArgs`], their values from its serialised form.
pub fn point_args(a: &BenchArgs, batch: Option<usize>, json: &Path) -> Result<Vec<String>> {
    let point = BenchArgs {
        batch_size: batch,
        json: Some(json.to_path_buf()),
        ..a.clone()
    };
    let Value::Object(values) = serde_json::to_value(&point)? else {
        bail!("bench flags did not serialise to an object");
    };
    let mut v = vec!["bench".to_string()];
    let cmd = BenchArgs::augment_args(clap::Command::new("bench"));
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        let Some(long) = arg.get_long() else {
            continue;
        };
        if SWEEP_ONLY.contains(&id) {
            continue;
        }
        let flag = format!("--{long}");
        match (values.get(id), arg.get_action()) {
            (Some(Value::Bool(on)), ArgAction::SetTrue) => {
                if *on {
                    v.push(flag);
                }
            }
            (Some(Value::Null), _) => {}
            (Some(Value::String(s)), _) => v.extend([flag, s.clone()]),
            (Some(Value::Number(n)), _) => v.extend([flag, n.to_string()]),
            (other, action) => {
                bail!("cannot forward --{long} ({action:?}, value {other:?}) to the sweep's points")
            }
        }
    }
    Ok(v)
}

/// How the ranks of one sweep point are started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
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

pub fn run(args: &BenchArgs) -> Result<()> {
    if args.world_sizes.is_empty() {
        bail!("--world-sizes needs at least one size");
    }
    if args.compute.threads.is_some() {
        bail!("--sweep splits the CPUs between the ranks itself: leave out --threads");
    }
    if args.profile {
        bail!("--profile looks at one configuration: leave out --sweep");
    }
    let exe = std::env::current_exe().context("locating the rn50 binary")?;
    let tmp = std::env::temp_dir().join(format!("rn50-sweep-{}", std::process::id()));
    std::fs::create_dir_all(&tmp)?;
    let batches: Vec<Option<usize>> = if args.batch_sizes.is_empty() {
        vec![args.batch_size]
    } else {
        args.batch_sizes.iter().map(|&b| Some(b)).collect()
    };
    // Ctrl-C (or SIGTERM) ends the sweep with the points measured so far; a second one stops at once.
    rn50_util::stop::install("reporting the points measured so far")?;
    let mut points = Vec::new();
    let mut first: Option<BenchResult> = None;
    'sweep: for &batch in &batches {
        for &n in &args.world_sizes {
            let (mut ips, mut comm, mut last) = (Vec::new(), Vec::new(), None);
            for r in 0..args.repeats {
                if rn50_util::stop::requested() {
                    break 'sweep;
                }
                let json = tmp.join(format!("b{}-n{n}-r{r}.json", batch.unwrap_or(0)));
                tracing::info!(
                    "sweep: {n} rank(s), batch {} per rank, repeat {}/{}",
                    batch.map_or("default".into(), |b| b.to_string()),
                    r + 1,
                    args.repeats
                );
                let cmd = point_command(args.launcher, &exe, n, &point_args(args, batch, &json)?);
                let status = Command::new(&cmd[0])
                    .args(&cmd[1..])
                    .status()
                    .with_context(|| format!("starting {}", cmd[0]))?;
                // A terminal's Ctrl-C reached the point's processes too: it is not measured.
                if !status.success() && rn50_util::stop::requested() {
                    break 'sweep;
                }
                if !status.success() {
                    bail!("the {n}-rank bench failed ({status})");
                }
                let text = std::fs::read_to_string(&json)
                    .with_context(|| format!("reading {}", json.display()))?;
                let res: BenchResult = parse_json(&text, &json)?;
                ips.push(res.images_per_sec);
                comm.extend(res.allreduce_ms);
                last = Some(res);
            }
            let res = last.expect("at least one repeat");
            let allreduce =
                (!comm.is_empty()).then(|| comm.iter().sum::<f64>() / comm.len() as f64);
            points.push(SweepPoint {
                config: Some(res.config.clone()),
                ..SweepPoint::from_repeats(
                    n as u64,
                    res.config.batch_size,
                    res.config.lr,
                    ips,
                    allreduce,
                )
            });
            first.get_or_insert(res);
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    let Some(base) = first else {
        bail!(rn50_util::stop::Stopped::new("no point was measured"));
    };
    let measured = points.len();
    let c = base.config;
    let result = SweepResult {
        arch: c.arch,
        width: c.width,
        device: c.device,
        // Threads of the 1-rank point; each of N ranks had 1/N of them.
        threads: c.threads,
        precision: c.precision,
        image_size: c.image_size,
        data: c.data,
        launcher: Some(format!("{:?}", args.launcher).to_lowercase()),
        points,
        machine: base.machine,
        ..Default::default()
    };
    print!("{}", render(&result));
    if let Some(p) = &args.json {
        std::fs::write(p, serde_json::to_string_pretty(&result)?)
            .with_context(|| format!("writing {}", p.display()))?;
        tracing::info!(
            "wrote {} (tables and plots: rn50 report {})",
            p.display(),
            p.display()
        );
    }
    if rn50_util::stop::requested() {
        bail!(rn50_util::stop::Stopped::new(format!(
            "the sweep above has the {measured} point(s) measured before"
        )));
    }
    Ok(())
}

/// The sweep as a table, with efficiency X_N / (N·X_1) against the 1-rank point of the same batch.
pub fn render(r: &SweepResult) -> String {
    let mut s = format!(
        "rn50 bench --sweep: {} {}px {} on {}\n{:>5} {:>6} {:>7} {:>10} {:>17} {:>8} {:>10} {:>14}\n",
        rn50_report::schema::network_label(&r.arch, r.width),
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
    use clap::Parser;

    #[derive(Parser)]
    struct Bench {
        #[command(flatten)]
        args: BenchArgs,
    }

    fn parse(argv: &[&str]) -> BenchArgs {
        Bench::try_parse_from(argv).unwrap().args
    }

    /// Every flag of a point, the ones the first sweep did not forward (`--threads`, `--profile`,
    /// `--profile-steps`, `--channels-last`) included, reaches it as given: the point's command line parses back
    /// to the sweep's arguments with only the batch size, the result file and the sweep's own flags changed.
    #[test]
    fn points_get_every_flag_but_the_sweeps_own() {
        let sweep = parse(&[
            "bench",
            "--sweep",
            "--world-sizes",
            "1,4",
            "--batch-sizes",
            "8,16",
            "--repeats",
            "2",
            "--launcher",
            "srun",
            "-a",
            "resnet18",
            "-b",
            "4",
            "--precision",
            "bf16",
            "--no-channels-last",
            "--channels-last",
            "--no-fused-bn",
            "--device",
            "cpu",
            "--warmup",
            "0",
            "--steps",
            "3",
            "--threads",
            "2",
            "--data",
            "real",
            "--data-dir",
            "/data/imagenet",
            "-j",
            "5",
            "--synthetic-images",
            "64",
            "--image-size",
            "96",
            "--seed",
            "11",
            "--json",
            "/tmp/sweep.json",
            "--profile",
            "--profile-steps",
            "7",
            "--cuda-graph",
        ]);
        let json = Path::new("/tmp/point.json");
        let argv = point_args(&sweep, Some(16), json).unwrap();
        let point = parse(&argv.iter().map(String::as_str).collect::<Vec<_>>());
        let mut want = serde_json::to_value(BenchArgs {
            batch_size: Some(16),
            json: Some(json.into()),
            ..sweep
        })
        .unwrap();
        let mut got = serde_json::to_value(&point).unwrap();
        for k in SWEEP_ONLY {
            want.as_object_mut().unwrap().remove(k).unwrap();
            got.as_object_mut().unwrap().remove(k).unwrap();
        }
        assert_eq!(got, want, "{argv:?}");
        assert!(!point.sweep && point.compute.threads == Some(2) && point.profile_steps == 7);
        assert!(point.cuda_graph);
        assert!(point.compute.channels_last && !point.compute.no_channels_last);
        // Flags left at their defaults are not needed, but a point given them explicitly is the same point.
        let argv = point_args(&parse(&["bench", "--sweep"]), None, json).unwrap();
        assert!(!argv.contains(&"--sweep".to_string()), "{argv:?}");
        assert!(!argv.contains(&"--batch-size".to_string()), "{argv:?}");
    }

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
