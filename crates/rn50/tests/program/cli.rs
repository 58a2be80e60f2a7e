//! The `rn50` binary end to end: bench output and JSON, doctor, and clear errors on bad input.
use crate::common::{self, rn50_backtrace};

use std::process::{Command, Output};

use rn50_report::schema::{BenchResult, SweepResult};

/// Fails with a message on stderr, an exit code of 1, and no panic.
fn assert_clean_error(args: &[&str], needle: &str) {
    let out = rn50_backtrace(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should fail");
    assert!(
        !err.contains("panicked") && !err.contains("stack backtrace"),
        "{args:?} panicked:\n{err}"
    );
    assert!(
        err.contains(needle),
        "{args:?}: expected '{needle}' in:\n{err}"
    );
}

#[test]
fn bad_input_is_a_clear_error() {
    assert_clean_error(&["bench", "-a", "resnet51"], "unknown architecture");
    assert_clean_error(&["bench", "-b", "0"], "0 is not in 1..=65536");
    assert_clean_error(&["bench", "--device", "tpu"], "unknown device");
    assert_clean_error(
        &["bench", "--device", "cpu", "--precision", "fp16"],
        "fp16 is for CUDA",
    );
    let missing_gpu = if tch::Cuda::device_count() == 0 {
        "cuda"
    } else {
        "cuda:99"
    };
    assert_clean_error(&["bench", "--device", missing_gpu], "CUDA device");
}

#[test]
fn bench_writes_the_documented_json() {
    let dir = tempfile::tempdir().unwrap();
    for data in ["device", "host"] {
        let json = dir.path().join(format!("{data}.json"));
        // --cuda-graph (asked with one of the two): on the CPU the steps run eager, and the result says why.
        let graph = data == "host";
        let mut args = vec![
            "bench",
            "-a",
            "resnet18",
            "-b",
            "2",
            "--image-size",
            "64",
            "--warmup",
            "1",
            "--steps",
            "3",
            "--threads",
            "1",
            "--device",
            "cpu",
            "--data",
            data,
            "--json",
            json.to_str().unwrap(),
        ];
        if graph {
            args.push("--cuda-graph");
        }
        let out = rn50_backtrace(&args);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains("img/s (median)"), "{stdout}");
        // Read as the report reads it: the one bench record type.
        let r: BenchResult = rn50_report::schema::read_json(&json).unwrap();
        for (key, x) in [
            ("images_per_sec_p10", r.images_per_sec_p10),
            ("images_per_sec_p90", r.images_per_sec_p90),
            ("step_ms", r.step_ms),
            ("data_wait_ms", r.data_wait_ms),
            ("peak_rss_bytes", r.peak_rss_bytes.map(|b| b as f64)),
        ] {
            assert!(x.is_some_and(|x| x >= 0.0), "{key} in {r:?}");
        }
        assert!(r.images_per_sec > 0.0);
        assert!(r.images_per_sec_p10 <= r.images_per_sec_p90);
        assert_eq!(r.step_times_ms.len(), 3);
        assert_eq!(r.config.arch, "resnet18");
        assert_eq!(r.config.data.as_deref(), Some(data));
        assert_eq!(r.config.threads, Some(1));
        let m = r.machine.expect("the machine is recorded");
        assert!(m.cpu.and_then(|c| c.model).is_some_and(|s| !s.is_empty()));
        assert_eq!(
            m.torch_version.as_deref(),
            Some(rn50::shim::torch_version().as_str())
        );
        assert!(r.final_loss.unwrap().is_finite());
        assert_eq!(r.config.cuda_graph, None, "no graph runs on a CPU");
        if graph {
            let why = r
                .cuda_graph_declined
                .expect("--cuda-graph says why it ran eager");
            assert!(why.contains("the device is the CPU"), "{why}");
            assert!(
                stdout.contains(&format!("not used, eager: {why}")),
                "{stdout}"
            );
        } else {
            assert_eq!(r.cuda_graph_declined, None);
            assert!(!stdout.contains("CUDA graph"), "{stdout}");
        }
    }
}

#[test]
fn doctor_reports_json_checks() {
    let out = rn50_backtrace(&["doctor", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let checks = v["checks"].as_array().unwrap();
    let names: Vec<&str> = checks.iter().map(|c| c["name"].as_str().unwrap()).collect();
    for want in ["libtorch", "cpu", "cpu bf16", "gpus", "gloo", "launcher"] {
        assert!(names.contains(&want), "{want} missing from {names:?}");
    }
    assert!(checks
        .iter()
        .all(|c| ["OK", "WARN", "FAIL"].contains(&c["status"].as_str().unwrap())));
}

/// The binary the default build makes has rn50's CUDA code whenever the libtorch it links has CUDA (the pinned
/// wheel has): doctor finds the CUDA libtorch and says OK for rn50's own CUDA code and for the fused block's
/// cuDNN graphs, on CPU and GPU nodes alike.
#[test]
fn the_default_build_has_cuda_when_libtorch_has_it() {
    let out = rn50_backtrace(&["doctor", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let check = |name: &str| {
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
    };
    let libtorch_cuda = check("libtorch cuda").expect("doctor has a libtorch cuda check");
    let has_cuda = libtorch_cuda["detail"]
        .as_str()
        .unwrap()
        .starts_with("built with CUDA");
    if !has_cuda {
        // CI builds against the pinned CUDA wheel: a libtorch without CUDA there is a broken set-up, not a pass.
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must build against the pinned CUDA wheel (./dev setup), but this libtorch has no CUDA: {libtorch_cuda}"
        );
        // Elsewhere (a user's CPU libtorch) the other half of the rule holds: no CUDA code was compiled.
        assert!(
            !rn50::shim::cuda_compiled(),
            "CUDA code compiled against a libtorch without CUDA"
        );
        return;
    }
    let ours = check("rn50 cuda").expect("doctor checks rn50's CUDA code when libtorch has CUDA");
    assert_eq!(ours["status"], "OK", "{ours}");
    assert!(rn50::shim::cuda_compiled());
    // ./dev setup installs the cuDNN frontend's headers, so the fused block's graphs are built in too.
    let block = check("rn50 fused block").expect("doctor checks the fused block's cuDNN graphs");
    assert_eq!(block["status"], "OK", "{block}");
    assert!(rn50::shim::block_graphs_compiled());
}

/// `mpirun` inside a SLURM allocation: doctor names what training would use (Open MPI's variables, as
/// `WorldInfo` reads them), not the allocation's SLURM variables every rank inherits.
#[test]
fn doctor_under_mpirun_inside_slurm_says_open_mpi() {
    let out = Command::new(env!("CARGO_BIN_EXE_rn50"))
        .args(["doctor", "--json"])
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .envs([
            ("SLURM_JOB_ID", "4242"),
            ("SLURM_PROCID", "0"),
            ("SLURM_NTASKS", "8"),
            ("SLURM_LOCALID", "0"),
            ("SLURM_NODELIST", "node[01-02]"),
            ("OMPI_COMM_WORLD_RANK", "5"),
            ("OMPI_COMM_WORLD_SIZE", "8"),
            ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ("OMPI_COMM_WORLD_LOCAL_SIZE", "4"),
            ("MASTER_PORT", "23456"),
        ])
        .output()
        .expect("run rn50");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let launcher = v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "launcher")
        .expect("a launcher check");
    assert_eq!(
        launcher["detail"],
        "Open MPI: rank 5 of 8, local rank 1 of 4, rendezvous node01:23456"
    );
}

/// `bench --sweep` runs each point with the sweep's flags (through `rn50 launch`) and records what each point
/// resolved: flags the sweep has no special handling for arrive, read back through the schema's types.
#[test]
fn sweep_points_run_with_every_flag() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("sweep.json");
    let out = rn50_backtrace(&[
        "bench",
        "--sweep",
        "--world-sizes",
        "1",
        "--batch-sizes",
        "2,3",
        "--repeats",
        "1",
        "-a",
        "resnet18",
        "--image-size",
        "32",
        "--warmup",
        "0",
        "--steps",
        "2",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--no-channels-last",
        "--data",
        "host",
        "--seed",
        "9",
        "--json",
        json.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: SweepResult = rn50_report::schema::read_json(&json).unwrap();
    assert_eq!(r.points.len(), 2);
    for (p, batch) in r.points.iter().zip([2, 3]) {
        let c = p
            .config
            .as_ref()
            .expect("each point records its configuration");
        assert_eq!(
            (p.world_size, p.batch_size, c.batch_size),
            (1, batch, batch)
        );
        assert_eq!(c.arch, "resnet18");
        assert_eq!(
            (c.image_size, c.warmup, c.steps),
            (Some(32), Some(0), Some(2))
        );
        assert_eq!(c.precision.as_deref(), Some("fp32"));
        assert_eq!(c.channels_last, Some(false));
        assert_eq!(c.data.as_deref(), Some("host"));
        assert_eq!(c.seed, Some(9));
        assert!(p.median > 0.0);
    }
    assert_eq!(r.precision.as_deref(), Some("fp32"));
}

/// `rn50 scaling` is the scaling model; `predict`, its old name, is a visible alias that does the same.
#[test]
fn predict_is_an_alias_of_scaling() {
    let args = ["--step-ms", "100", "--gpus", "1,8"];
    let scaling = rn50_backtrace(&[&["scaling"], &args[..]].concat());
    let predict = rn50_backtrace(&[&["predict"], &args[..]].concat());
    assert!(
        scaling.status.success(),
        "{}",
        String::from_utf8_lossy(&scaling.stderr)
    );
    assert!(String::from_utf8_lossy(&scaling.stdout).contains("one worker: 100.0 ms/step"));
    assert_eq!(scaling.stdout, predict.stdout);
    let help = String::from_utf8(rn50_backtrace(&["--help"]).stdout).unwrap();
    let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
    let (_, entry) = flat
        .split_once(" scaling ")
        .unwrap_or_else(|| panic!("{help}"));
    assert!(
        entry
            .split(" doctor ")
            .next()
            .unwrap()
            .ends_with("[alias: predict]"),
        "{help}"
    );
}

/// The distributed time settings in the environment have ranges like flags: exit 2 and the variable named, before
/// a run directory is made (RN50_DIST_HEARTBEAT=1e20 panicked; -5 and abc were ignored).
#[test]
fn bad_distributed_time_settings_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    for (k, v) in [
        ("RN50_DIST_HEARTBEAT", "1e20"),
        ("RN50_DIST_TIMEOUT", "1e20"),
        ("RN50_DIST_TIMEOUT", "-5"),
        ("RN50_DIST_HEARTBEAT", "abc"),
    ] {
        let r = Command::new(env!("CARGO_BIN_EXE_rn50"))
            .args([
                "train", "--dummy", "-a", "resnet18", "--device", "cpu", "--out",
            ])
            .arg(&out)
            .envs([
                ("RANK", "0"),
                ("WORLD_SIZE", "2"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "1"),
                (k, v),
            ])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{k}={v}:\n{err}");
        assert!(err.contains(&format!("{k}={v}: expected seconds")), "{err}");
        assert!(!err.contains("panicked"), "{err}");
        assert!(!out.exists(), "{k}={v}: the run directory was made");
    }
}

/// Runs `rn50 args` in `cwd` under an address-space limit of `gib` GiB (`ulimit -v`).
fn rn50_limited(args: &[&str], cwd: &std::path::Path, gib: u64) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rn50"));
    cmd.args(args).current_dir(cwd);
    let limit = libc::rlimit {
        rlim_cur: gib << 30,
        rlim_max: gib << 30,
    };
    // SAFETY: setrlimit is async-signal-safe; the child only calls it before exec.
    unsafe {
        cmd.pre_exec(move || {
            if libc::setrlimit(libc::RLIMIT_AS, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.output().expect("run rn50")
}

/// Out of memory (`ulimit -v 6G`) is an error naming the batch size, never a panic (bench, train: exit 101 on
/// tch's unwrap) or an abort (eval, bench-loader: exit 134 on a 9 GiB batch buffer); a train that ran out at
/// its first step leaves no run behind, so the corrected command starts without --overwrite (issue 25), and cuts
/// the --mllog it appended to back to what a job script wrote there, so the corrected command may log its run
/// in it (issue 26: a log that holds a run is refused).
#[test]
fn out_of_memory_is_an_error_that_names_the_batch_size() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = dir.path();
    for split in ["train", "val"] {
        let class = cwd.join("data").join(split).join("n01440764");
        std::fs::create_dir_all(&class).unwrap();
        let photo = common::shared_photos()[0].clone();
        std::fs::copy(&photo, class.join("a.JPEG")).unwrap();
    }
    let small = "--dummy -a resnet18 --width 8 -b 2 --image-size 64 --epochs 1 --steps-per-epoch 1 --device cpu";
    let train = |extra: &str| -> Vec<String> {
        format!("train {small} --out run {extra}")
            .split_whitespace()
            .map(String::from)
            .collect()
    };
    let weights = rn50_limited(
        &[
            "train",
            "data",
            "-a",
            "resnet18",
            "--width",
            "8",
            "-b",
            "1",
            "--image-size",
            "64",
            "--epochs",
            "1",
            "--device",
            "cpu",
            "--out",
            "w",
        ],
        cwd,
        64,
    );
    assert!(
        weights.status.success(),
        "{}",
        String::from_utf8_lossy(&weights.stderr)
    );
    let cases: [(&[&str], &str); 4] = [
        (
            &[
                "bench", "-a", "resnet18", "-b", "4096", "--steps", "1", "--device", "cpu",
            ],
            "--batch-size 4096",
        ),
        (
            &[
                "eval",
                "data",
                "--weights",
                "w/final.safetensors",
                "-a",
                "resnet18",
                "-b",
                "65536",
                // The weights record the 73 -> 64 they were trained at, whose batch of 65536 fits: 224 does not.
                "--val-resize",
                "256",
                "--val-crop",
                "224",
                "--device",
                "cpu",
            ],
            "batch of 65536 images",
        ),
        (
            &["bench-loader", "data/train", "-b", "65536"],
            "batch of 65536 images",
        ),
        (
            &[
                "train",
                "--dummy",
                "-a",
                "resnet18",
                "-b",
                "512",
                "--epochs",
                "1",
                "--steps-per-epoch",
                "1",
                "--device",
                "cpu",
                "--out",
                "run",
                "--mllog",
                "mllog.txt",
            ],
            "--batch-size 512",
        ),
    ];
    let script_line = ":::MLLOG {\"namespace\": \"\", \"time_ms\": 1, \"event_type\": \"POINT_IN_TIME\", \"key\": \
                       \"cache_clear\", \"value\": true, \"metadata\": {}}\n";
    std::fs::write(cwd.join("mllog.txt"), script_line).unwrap();
    for (args, needle) in cases {
        let out = rn50_limited(args, cwd, 6);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}:\n{err}");
        assert!(
            (err.contains("out of memory") || err.contains("no memory")) && err.contains(needle),
            "{args:?}: expected '{needle}' in:\n{err}"
        );
        assert!(
            !err.contains("panicked") && !err.contains("frame #"),
            "{args:?}:\n{err}"
        );
    }
    let left: Vec<_> = std::fs::read_dir(cwd.join("run"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n != ".rn50-train.lock")
        .collect();
    assert!(left.is_empty(), "the failed run left {left:?}");
    assert_eq!(
        std::fs::read_to_string(cwd.join("mllog.txt")).unwrap(),
        script_line
    );
    let again = rn50_limited(
        &train("--mllog mllog.txt")
            .iter()
            .map(String::as_str)
            .collect::<Vec<_>>(),
        cwd,
        64,
    );
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
}
