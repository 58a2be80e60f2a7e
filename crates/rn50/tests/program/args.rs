//! Every numeric flag of every subcommand has a range (issue 12, item 7): a value outside it, NaN or an infinity,
//! or flags that do not go together, end the `rn50` binary with exit 2 and a message naming the flag, before
//! anything is allocated or written. And the defaults are all inside their ranges, unchanged.
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use rn50::cli::{Command as Sub, Refused};

use crate::common::TinyTrain;

/// The command line the bad values of `train` go into: a tiny valid run (a regression then does little) into
/// `dir`/run.
fn train_base(dir: &Path) -> Vec<String> {
    TinyTrain::dummy(&dir.join("run"))
        .flags(
            "--width 8 --image-size 32 --val-crop 32 --val-resize 32 --batch-size 2 --epochs 1 \
             --max-steps-per-epoch 1 --workers 1",
        )
        .to_args()
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect()
}

/// The command lines the bad values of the other subcommands go into: small valid runs, with `{dir}` for the
/// test's empty folder. Everything after `--` stays last.
#[rustfmt::skip]
const BASES: &[(&str, &[&str])] = &[
    (
        "eval",
        &[
            "eval", "{dir}/data", "--weights", "{dir}/w.safetensors", "--device", "cpu", "--json",
            "{dir}/eval.json",
        ],
    ),
    (
        "bench",
        &[
            "bench", "--arch", "resnet18", "--batch-size", "2", "--image-size", "32", "--warmup", "0",
            "--steps", "1", "--threads", "1", "--device", "cpu", "--json", "{dir}/bench.json",
        ],
    ),
    (
        "bench-loader",
        &[
            "bench-loader", "--synthetic", "4", "--workers", "1", "-b", "2", "--steps", "1", "--warmup",
            "0", "--image-size", "32", "--json", "{dir}/loader.json",
        ],
    ),
    // The same without --image-size, for its alias --size.
    (
        "bench-loader at 224",
        &[
            "bench-loader", "--synthetic", "4", "--workers", "1", "-b", "2", "--steps", "1", "--warmup",
            "0", "--json", "{dir}/loader.json",
        ],
    ),
    ("pack", &["pack", "{dir}/data", "{dir}/shards"]),
    ("prepare", &["prepare", "--val-tar", "{dir}/ILSVRC2012_img_val.tar", "--out", "{dir}/imagenet"]),
    (
        "prepare verify",
        &["prepare", "verify", "{dir}/ILSVRC2012_img_val.tar", "--json", "{dir}/verify.json"],
    ),
    ("launch", &["launch", "--nproc-per-node", "1", "--", "--version"]),
    ("scaling", &["scaling", "--step-ms", "100", "--json", "{dir}/scaling.json"]),
    ("scaling img/s", &["scaling", "--json", "{dir}/scaling.json"]),
];

/// (base, flags and values replacing or joining the base's, the flag the message must name).
#[rustfmt::skip]
const CASES: &[(&str, &[&str], &str)] = &[
    // The command lines.
    ("train", &["--label-smoothing", "2"], "--label-smoothing"),
    ("train", &["--ema", "nan"], "--ema"),
    ("train", &["--ema", "2"], "--ema"),
    ("train", &["--ema", "-1"], "--ema"),
    ("train", &["--momentum", "-1"], "--momentum"),
    ("train", &["--wd", "-1"], "--wd"),
    ("train", &["--label-smoothing", "-1"], "--label-smoothing"),
    ("train", &["--warmup-epochs", "nan"], "--warmup-epochs"),
    ("train", &["--image-size", "100000"], "--image-size"),
    ("bench-loader", &["-b", "1000000"], "--batch-size"),
    // train: every numeric flag.
    ("train", &["--width", "0"], "--width"),
    ("train", &["--width", "100000"], "--width"),
    ("train", &["--batch-size", "0"], "--batch-size"),
    ("train", &["--batch-size", "65537"], "--batch-size"),
    ("train", &["--accum-steps", "0"], "--accum-steps"),
    ("train", &["--epochs", "0"], "--epochs"),
    ("train", &["--lr", "0"], "--lr"),
    ("train", &["--lr", "inf"], "--lr"),
    ("train", &["--lr-base", "0"], "--lr-base"),
    ("train", &["--lr-base-size", "0"], "--lr-base-size"),
    ("train", &["--lr-milestones", "nan"], "--lr-milestones"),
    ("train", &["--momentum", "nan"], "--momentum"),
    ("train", &["--wd", "inf"], "--wd"),
    ("train", &["--lars-eta", "0"], "--lars-eta"),
    ("train", &["--optimizer", "adamw", "--beta2", "1"], "--beta2"),
    ("train", &["--optimizer", "radam", "--beta2", "-0.1"], "--beta2"),
    ("train", &["--optimizer", "adamw", "--opt-eps", "0"], "--opt-eps"),
    ("train", &["--lookahead", "--lookahead-k", "0"], "--lookahead-k"),
    ("train", &["--lookahead", "--lookahead-k", "1001"], "--lookahead-k"),
    ("train", &["--lookahead", "--lookahead-alpha", "0"], "--lookahead-alpha"),
    ("train", &["--lookahead", "--lookahead-alpha", "1.5"], "--lookahead-alpha"),
    // Flags of one optimizer given to another.
    ("train", &["--optimizer", "radam", "--nesterov"], "--nesterov"),
    ("train", &["--optimizer", "adamw", "--momentum", "1"], "--momentum"),
    ("train", &["--beta2", "0.99"], "--beta2"),
    ("train", &["--optimizer", "lars", "--opt-eps", "1e-6"], "--opt-eps"),
    ("train", &["--lookahead-k", "5"], "--lookahead-k"),
    ("train", &["--optimizer", "radam", "--mllog", "mllog.txt"], "--mllog"),
    ("train", &["--warmup-epochs", "-1"], "--warmup-epochs"),
    ("train", &["--workers", "0"], "--workers"),
    ("train", &["--image-size", "16"], "--image-size"),
    ("train", &["--pad", "100000"], "--pad"),
    ("train", &["--min-res", "16"], "--min-res"),
    ("train", &["--start-ramp", "-1"], "--start-ramp"),
    ("train", &["--end-ramp", "nan"], "--end-ramp"),
    ("train", &["--val-resize", "0"], "--val-resize"),
    ("train", &["--val-crop", "100000"], "--val-crop"),
    ("train", &["--max-steps-per-epoch", "0"], "--max-steps-per-epoch"),
    // Under its alias too, named by its name.
    ("train", &["--steps-per-epoch", "0"], "--max-steps-per-epoch"),
    ("train", &["--threads", "0"], "--threads"),
    ("train", &["--threads", "1025"], "--threads"),
    ("train", &["--fused-block-plans", "0"], "--fused-block-plans"),
    ("train", &["--fused-block-plans", "1001"], "--fused-block-plans"),
    ("train", &["--val-max-images", "0"], "--val-max-images"),
    ("train", &["--checkpoint-minutes", "nan"], "--checkpoint-minutes"),
    ("train", &["--checkpoint-minutes", "1e300"], "--checkpoint-minutes"),
    ("train", &["--keep-checkpoints", "0"], "--keep-checkpoints"),
    ("train", &["--bucket-cap-mb", "0"], "--bucket-cap-mb"),
    ("train", &["--print-freq", "0"], "--print-freq"),
    ("train", &["--ra-magnitude", "31"], "--ra-magnitude"),
    ("train", &["--random-erase", "1.5"], "--random-erase"),
    ("train", &["--random-erase", "nan"], "--random-erase"),
    ("train", &["--scale", "0,1"], "--scale"),
    ("train", &["--scale", "0.5,0.4"], "--scale"),
    ("train", &["--scale", "0.5"], "--scale"),
    ("train", &["--ratio", "0.5,200"], "--ratio"),
    ("train", &["--ratio", "2,1"], "--ratio"),
    ("train", &["--augment", "cifar", "--scale", "0.35,1"], "--scale"),
    ("train", &["--mixup-alpha", "-1"], "--mixup-alpha"),
    ("train", &["--cutmix-alpha", "inf"], "--cutmix-alpha"),
    // Beta(α, α) gives NaN from about 9e307 (issue 34: the run stopped later, its files written).
    ("train", &["--mixup-alpha", "1e308"], "--mixup-alpha"),
    ("train", &["--cutmix-alpha", "1000001"], "--cutmix-alpha"),
    ("train", &["--ra-reps", "0"], "--ra-reps"),
    ("train", &["--ra-reps", "17"], "--ra-reps"),
    ("train", &["--ema", "0.9", "--ema-steps", "0"], "--ema-steps"),
    // train: flags that must agree.
    ("train", &["--ema-steps", "32"], "--ema-steps"),
    ("train", &["--auto-augment", "ta_wide", "--ra-magnitude", "5"], "--ra-magnitude"),
    ("train", &["--auto-augment", "ta_wide"], "--dummy"),
    ("train", &["--random-erase", "0.1"], "--dummy"),
    ("train", &["--ra-reps", "2"], "--dummy"),
    ("train", &["--val-crop", "64"], "--val-crop"),
    ("train", &["--min-res", "64"], "--min-res"),
    ("train", &["--min-res", "32", "--start-ramp", "1", "--end-ramp", "0.5"], "--end-ramp"),
    ("train", &["--warmup-epochs", "1"], "--warmup-epochs"),
    ("train", &["--batch-size", "65536", "--image-size", "4096"], "--batch-size"),
    ("train", &["--batch-size", "1", "--image-size", "32"], "--batch-size"),
    ("train", &["-b", "1", "--image-size", "64", "--min-res", "32"], "--batch-size"),
    // eval
    ("eval", &["--batch-size", "0"], "--batch-size"),
    ("eval", &["--batch-size", "65537"], "--batch-size"),
    ("eval", &["--workers", "0"], "--workers"),
    ("eval", &["--val-resize", "100000"], "--val-resize"),
    ("eval", &["--resize", "100000"], "--val-resize"),
    ("eval", &["--val-crop", "0"], "--val-crop"),
    ("eval", &["--crop", "0"], "--val-crop"),
    ("eval", &["--val-resize", "256", "--val-crop", "300"], "--val-crop"),
    ("eval", &["--resize", "256", "--crop", "300"], "--val-crop"),
    ("eval", &["--print-freq", "0"], "--print-freq"),
    ("eval", &["--threads", "0"], "--threads"),
    ("eval", &["--threads", "1025"], "--threads"),
    ("eval", &["--fused-block-plans", "0"], "--fused-block-plans"),
    ("eval", &["--batch-size", "65536", "--val-resize", "4096", "--val-crop", "4096"], "--batch-size"),
    // bench
    ("bench", &["--batch-size", "0"], "--batch-size"),
    ("bench", &["--fused-block-plans", "0"], "--fused-block-plans"),
    ("bench", &["--batch-size", "65537"], "--batch-size"),
    ("bench", &["--width", "0"], "--width"),
    ("bench", &["--width", "513"], "--width"),
    ("bench", &["--image-size", "16"], "--image-size"),
    ("bench", &["--image-size", "100000"], "--image-size"),
    ("bench", &["--steps", "0"], "--steps"),
    ("bench", &["--threads", "0"], "--threads"),
    ("bench", &["--threads", "1025"], "--threads"),
    ("bench", &["--workers", "0"], "--workers"),
    ("bench", &["--synthetic-images", "0"], "--synthetic-images"),
    ("bench", &["--world-sizes", "1,0"], "--world-sizes"),
    ("bench", &["--batch-sizes", "0"], "--batch-sizes"),
    ("bench", &["--repeats", "0"], "--repeats"),
    ("bench", &["--profile-steps", "0"], "--profile-steps"),
    ("bench", &["--batch-size", "65536", "--image-size", "4096"], "--batch-size"),
    ("bench", &["--sweep", "--batch-sizes", "65536", "--image-size", "4096"], "--batch-sizes"),
    // bench-loader
    ("bench-loader", &["-b", "0"], "--batch-size"),
    ("bench-loader", &["--workers", "0"], "--workers"),
    ("bench-loader", &["--synthetic", "0"], "--synthetic"),
    ("bench-loader", &["--steps", "0"], "--steps"),
    ("bench-loader", &["--image-size", "0"], "--image-size"),
    ("bench-loader", &["--image-size", "100000"], "--image-size"),
    // Under its alias too, named by its name.
    ("bench-loader at 224", &["--size", "0"], "--image-size"),
    ("bench-loader", &["--val-resize", "100000"], "--val-resize"),
    ("bench-loader", &["--prefetch", "0"], "--prefetch"),
    ("bench-loader", &["--prefetch", "2049"], "--prefetch"),
    ("bench-loader", &["--ra-magnitude", "31"], "--ra-magnitude"),
    ("bench-loader", &["--random-erase", "-0.1"], "--random-erase"),
    ("bench-loader", &["--scale", "0.35,1.5"], "--scale"),
    ("bench-loader", &["--ratio", "4,3"], "--ratio"),
    ("bench-loader", &["--val", "--scale", "0.35,1"], "--scale"),
    ("bench-loader", &["--auto-augment", "ta_wide", "--ra-magnitude", "3"], "--ra-magnitude"),
    ("bench-loader", &["--val", "--image-size", "64", "--val-resize", "32"], "--image-size"),
    ("bench-loader", &["-b", "65536", "--image-size", "4096"], "--batch-size"),
    // pack, prepare
    ("pack", &["--max-side", "0"], "--max-side"),
    ("pack", &["--quality", "0"], "--quality"),
    ("pack", &["--shard-size", "0"], "--shard-size"),
    ("pack", &["--shard-size", "100000000"], "--shard-size"),
    ("pack", &["--workers", "0"], "--workers"),
    ("prepare", &["--jobs", "5000"], "--jobs"),
    ("prepare", &["--buffer-mib", "3"], "--buffer-mib"),
    ("prepare", &["--buffer-mib", "100000"], "--buffer-mib"),
    ("prepare verify", &["--jobs", "5000"], "--jobs"),
    // launch
    ("launch", &["--nproc-per-node", "0"], "--nproc-per-node"),
    ("launch", &["--nnodes", "0"], "--nnodes"),
    ("launch", &["--node-rank", "1"], "--node-rank"),
    ("launch", &["--timeout", "0"], "--timeout"),
    ("launch", &["--grace", "100000000"], "--grace"),
    // scaling
    ("scaling", &["--gpus", "1,0"], "--gpus"),
    ("scaling", &["--step-ms", "0"], "--step-ms"),
    ("scaling", &["--step-ms", "nan"], "--step-ms"),
    ("scaling img/s", &["--images-per-sec", "0"], "--images-per-sec"),
    ("scaling", &["--batch", "0"], "--batch"),
    ("scaling", &["--global-batch", "0"], "--global-batch"),
    ("scaling", &["--grad-bytes", "0"], "--grad-bytes"),
    ("scaling", &["--bytes-per-param", "0"], "--bytes-per-param"),
    ("scaling", &["--bucket-mb", "0"], "--bucket-mb"),
    ("scaling", &["--overlap", "2"], "--overlap"),
    ("scaling", &["--backward-fraction", "-0.5"], "--backward-fraction"),
    ("scaling", &["--gpus-per-node", "0"], "--gpus-per-node"),
    ("scaling", &["--bandwidth-gbs", "0"], "--bandwidth-gbs"),
    ("scaling", &["--latency-us", "-1"], "--latency-us"),
    ("scaling", &["--intra-bandwidth-gbs", "inf"], "--intra-bandwidth-gbs"),
    ("scaling", &["--intra-latency-us", "nan"], "--intra-latency-us"),
];

/// The base command line of `base` ([`train_base`], else from [`BASES`]) in `dir`.
fn base_line(base: &str, dir: &Path) -> Vec<String> {
    if base == "train" {
        return train_base(dir);
    }
    let line = BASES.iter().find(|(n, _)| *n == base).unwrap().1;
    line.iter()
        .map(|a| a.replace("{dir}", dir.to_str().unwrap()))
        .collect()
}

/// The base command line with `bad` put in: a flag the base has gets the new value, others join before `--`.
fn command_line(mut args: Vec<String>, bad: &[&str]) -> Vec<String> {
    let tail = args
        .iter()
        .position(|a| a == "--")
        .map_or(Vec::new(), |i| args.split_off(i));
    let mut i = 0;
    while i < bad.len() {
        let flag = bad[i];
        let value = bad.get(i + 1).filter(|v| !v.starts_with("--"));
        match (args.iter().position(|a| a == flag), value) {
            (Some(at), Some(v)) => args[at + 1] = v.to_string(),
            (None, Some(v)) => args.extend([flag.to_string(), v.to_string()]),
            (_, None) => args.push(flag.to_string()),
        }
        i += if value.is_some() { 2 } else { 1 };
    }
    args.extend(tail);
    args
}

/// Runs the binary in `dir`, its address space capped: a value that slips through then fails to allocate instead
/// of bringing in the machine's OOM killer (`-b 1000000` did). One that slips through and runs on (`-b 1000000`
/// at a small size decodes for hours) is stopped after 5 minutes. Returns the exit code (None: killed) and
/// stderr.
fn run_capped(args: &[String], dir: &Path) -> (Option<i32>, String) {
    let logs = tempfile::tempdir().unwrap();
    let stderr_path = logs.path().join("stderr");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rn50"));
    cmd.args(args)
        .current_dir(dir)
        .env("RUST_BACKTRACE", "0")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&stderr_path).unwrap());
    // SAFETY: setrlimit is async-signal-safe; nothing else runs between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let cap = libc::rlimit {
                rlim_cur: 8 << 30,
                rlim_max: 8 << 30,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &cap) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("run rn50");
    let deadline = Instant::now() + Duration::from_secs(300);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            break child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (
        status.code(),
        std::fs::read_to_string(&stderr_path).unwrap_or_default(),
    )
}

/// How `rn50::cli::parse`, the binary's first step, refuses `args` (exit code and message), if it does.
fn refused_at_parse(args: &[String]) -> Option<(i32, String)> {
    let argv = std::iter::once("rn50")
        .chain(args.iter().map(String::as_str))
        .map(OsString::from)
        .collect();
    match rn50::cli::parse(argv) {
        Err(Refused::Clap(e)) => Some((e.exit_code(), e.render().to_string())),
        Err(Refused::Config(e)) => Some((2, format!("error: {e}"))),
        Ok(_) => None,
    }
}

/// What is wrong with one case, if anything. A command line that `rn50::cli::parse` refuses (clap: a value out of
/// its range) is refused by the binary's first step, before anything else runs, so with nothing written: that is
/// checked here, in this process (exit 2, the flag named), as a process would spend about 0.7 CPU-seconds starting
/// libtorch for it. The rest, refused later by the commands' own checks, run as processes: exit 2, the flag named,
/// nothing written. So does each base's first case (`by_process`), so that the binary's way from a parse error to
/// exit 2 with nothing written is tested by process too.
fn check_case(base: &str, bad: &[&str], needle: &str, by_process: bool) -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let args = command_line(base_line(base, dir.path()), bad);
    let (code, err) = match refused_at_parse(&args) {
        Some((code, err)) if !by_process => (Some(code), err),
        _ => run_capped(&args, dir.path()),
    };
    let mut problems = Vec::new();
    if code != Some(2) {
        problems.push(format!("exit {code:?}, not 2"));
    }
    if !err.contains(needle) {
        problems.push(format!("no '{needle}' in the message"));
    }
    if err.contains("panicked") {
        problems.push("a panic".into());
    }
    let written: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    if !written.is_empty() {
        problems.push(format!("wrote {written:?}"));
    }
    (!problems.is_empty()).then(|| {
        format!(
            "rn50 {}: {}\n    stderr: {}",
            args.join(" "),
            problems.join("; "),
            err.trim().lines().last().unwrap_or("")
        )
    })
}

#[test]
fn out_of_range_flags_exit_2_before_anything_is_written() {
    // Each base's first case by process, whatever refuses it ([`check_case`]).
    let mut seen = std::collections::HashSet::new();
    let cases: Vec<_> = CASES
        .iter()
        .map(|&(base, bad, needle)| (base, bad, needle, seen.insert(base)))
        .collect();
    // Four at a time: a case may be a process.
    let failures: Vec<String> = std::thread::scope(|s| {
        let chunks: Vec<_> = cases.chunks(cases.len().div_ceil(4)).collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .filter_map(|&(base, bad, needle, by_process)| {
                            check_case(base, bad, needle, by_process)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    assert!(
        failures.is_empty(),
        "{} of {} bad command lines were not refused with exit 2 before writing:\n{}",
        failures.len(),
        CASES.len(),
        failures.join("\n")
    );
}

/// `rn50 ARGS…` parsed as the binary parses it.
fn parse(args: &[&str]) -> Sub {
    let argv = std::iter::once("rn50")
        .chain(args.iter().copied())
        .map(OsString::from)
        .collect();
    match rn50::cli::parse(argv) {
        Ok(cli) => cli.command,
        Err(Refused::Clap(e)) => panic!("rn50 {}: {e}", args.join(" ")),
        Err(Refused::Config(e)) => panic!("rn50 {}: {e}", args.join(" ")),
    }
}

/// Defaults go through the same value parsers as typed values: each must be inside its range, and none changed.
#[test]
fn every_default_parses_and_is_unchanged() {
    let Sub::Train(t) = parse(&["train", "--dummy"]) else {
        unreachable!()
    };
    assert_eq!(
        (
            t.width,
            t.batch_size,
            t.accum_steps,
            t.epochs,
            t.image_size,
            t.pad
        ),
        (64, 256, 1, 90, 224, 4)
    );
    assert_eq!(
        (t.lr, t.momentum, t.wd, t.lars_eta, t.warmup_epochs),
        (None, 0.9, 1e-4, 0.001, 0.0)
    );
    assert_eq!(
        (t.lr_base, t.lr_base_size, t.lr_milestones),
        (0.1, 256, None)
    );
    assert_eq!(
        (t.label_smoothing, t.ema, t.workers, t.min_res),
        (0.0, None, None, None)
    );
    assert_eq!(
        (
            t.augmentation.auto_augment,
            t.augmentation.ra_magnitude,
            t.augmentation.random_erase,
            t.ra_reps,
            t.ema_steps
        ),
        (None, 9, 0.0, 1, 1)
    );
    assert_eq!((t.mixup_alpha, t.cutmix_alpha), (0.0, 0.0));
    assert_eq!(
        (t.start_ramp, t.end_ramp, t.val_resize, t.val_crop),
        (0.0, None, None, None)
    );
    assert_eq!(
        (t.steps_per_epoch, t.seed, t.checkpoint_minutes),
        (None, 0, 30.0)
    );
    assert_eq!(
        (t.keep_checkpoints, t.bucket_cap_mb, t.print_freq),
        (2, 25.0, 10)
    );
    assert_eq!(t.compute.threads, None, "libtorch's own unless given");

    let Sub::Eval(e) = parse(&["eval", "data", "--weights", "w"]) else {
        unreachable!()
    };
    assert_eq!(
        (
            e.batch_size,
            e.workers,
            e.sizes.val_resize,
            e.sizes.val_crop,
            e.print_freq
        ),
        // The sizes default to what the weights record, else 256 -> 224 (tests/program/eval.rs).
        (64, None, None, None, 10)
    );

    let Sub::Bench(b) = parse(&["bench"]) else {
        unreachable!()
    };
    assert_eq!(
        (
            b.batch_size,
            b.warmup,
            b.steps,
            b.compute.threads,
            b.workers
        ),
        (None, None, None, None, None)
    );
    assert_eq!(
        (
            b.synthetic_images,
            b.world_sizes.clone(),
            b.batch_sizes.len()
        ),
        (512, vec![1, 2], 0)
    );
    assert_eq!(
        (b.repeats, b.image_size, b.seed, b.profile_steps),
        (3, 224, 0, 5)
    );

    let Sub::BenchLoader(l) = parse(&["bench-loader", "data"]) else {
        unreachable!()
    };
    let cpus = std::thread::available_parallelism().unwrap().get();
    assert_eq!(
        (l.synthetic, l.workers, l.batch_size, l.steps, l.warmup),
        (None, cpus, 256, 20, 2)
    );
    assert_eq!(
        (l.image_size, l.val_resize, l.prefetch, l.seed),
        (224, 256, None, 0)
    );

    let Sub::Pack(p) = parse(&["pack", "data", "out"]) else {
        unreachable!()
    };
    assert_eq!(
        (p.max_side, p.quality, p.shard_size, p.workers),
        (None, 90, 1024, cpus)
    );

    let Sub::Prepare(r) = parse(&["prepare", "--val-tar", "v.tar", "--out", "out"]) else {
        unreachable!()
    };
    assert_eq!((r.extract.jobs, r.extract.buffer_mib), (None, None));

    let Sub::Launch(n) = parse(&["launch", "--nproc-per-node", "2", "--", "train"]) else {
        unreachable!()
    };
    assert_eq!(
        (n.nproc_per_node, n.nnodes, n.node_rank, n.timeout, n.grace),
        (2, 1, 0, None, 30)
    );

    let Sub::Scaling(d) = parse(&["scaling"]) else {
        unreachable!()
    };
    assert_eq!(d.gpus, vec![1, 2, 4, 8, 16, 32, 64]);
    assert_eq!(
        (d.batch, d.global_batch, d.grad_bytes, d.bytes_per_param),
        (256, None, None, 4)
    );
    assert_eq!(
        (d.bucket_mb, d.overlap, d.backward_fraction, d.gpus_per_node),
        (25.0, 1.0, 0.667, 8)
    );
    assert_eq!(
        (d.step_ms, d.images_per_sec, d.bandwidth_gbs, d.latency_us),
        (None, None, None, None)
    );
    assert_eq!((d.intra_bandwidth_gbs, d.intra_latency_us), (None, None));
}
