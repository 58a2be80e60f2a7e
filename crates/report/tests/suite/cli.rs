//! The clap argument structs as rn50 will embed them, and the commands end to end.

use std::fs;
use std::path::{Path, PathBuf};

use clap::Parser;
use rn50_report::report::{self, ReportArgs};
use rn50_report::scaling::{model_from_args, prediction_table, Link, ScalingArgs};

#[derive(Parser)]
struct Report {
    #[command(flatten)]
    args: ReportArgs,
}

#[derive(Parser)]
struct Scaling {
    #[command(flatten)]
    args: ScalingArgs,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn report_args_defaults_and_required_runs() {
    let r = Report::try_parse_from(["report", "a.json", "runs/x"])
        .unwrap()
        .args;
    assert_eq!(r.runs, [PathBuf::from("a.json"), PathBuf::from("runs/x")]);
    assert_eq!(r.out, PathBuf::from("report"));
    assert_eq!(r.json, None);
    assert!(Report::try_parse_from(["report"]).is_err());
}

#[test]
fn scaling_args_parse_presets_and_lists() {
    let p = Scaling::try_parse_from([
        "scaling",
        "--images-per-sec",
        "889.7",
        "--gpus",
        "1,4,64",
        "--interconnect",
        "10gbe",
        "--intra",
        "nvlink2",
        "--gpus-per-node",
        "4",
    ])
    .unwrap()
    .args;
    assert_eq!(p.gpus, [1, 4, 64]);
    assert_eq!(p.interconnect, Some(Link::Eth10));
    assert_eq!(p.intra, Some(Link::Nvlink2));
    let m = model_from_args(&p).unwrap();
    assert_eq!(m.grad_bytes, 102_228_128);
    assert!((m.step_ms - 256.0 * 1000.0 / 889.7).abs() < 1e-9);
    assert_eq!((m.inter_gbs, m.inter_latency_us), (1.1, 30.0));
    assert_eq!(m.bucket_bytes, 26_214_400);
    // Without a measured device the defaults are the A100-era links; `nvlink` is still NVLink 3.
    let d = model_from_args(
        &Scaling::try_parse_from(["scaling", "--step-ms", "300"])
            .unwrap()
            .args,
    )
    .unwrap();
    assert_eq!(
        (d.intra_gbs, d.inter_gbs, d.nics_per_node),
        (230.0, 23.0, 1)
    );
    assert_eq!(
        (d.intra_preset, d.inter_preset),
        (Some(Link::Nvlink3), Some(Link::IbHdr200))
    );
    let old = Scaling::try_parse_from(["scaling", "--intra", "nvlink"])
        .unwrap()
        .args;
    assert_eq!(old.intra, Some(Link::Nvlink3));
    // Mutually exclusive speed inputs, unknown presets, missing speed, unknown arch.
    assert!(
        Scaling::try_parse_from(["scaling", "--step-ms", "1", "--images-per-sec", "2"]).is_err()
    );
    assert!(Scaling::try_parse_from(["scaling", "--interconnect", "carrier-pigeon"]).is_err());
    let none = Scaling::try_parse_from(["scaling"]).unwrap().args;
    assert!(model_from_args(&none)
        .unwrap_err()
        .to_string()
        .contains("--step-ms"));
    let bad = Scaling::try_parse_from(["scaling", "--step-ms", "100", "-a", "vgg16"])
        .unwrap()
        .args;
    assert!(model_from_args(&bad)
        .unwrap_err()
        .to_string()
        .contains("--grad-bytes"));
    // Numbers out of their range are clap's errors (exit 2), the flag named.
    let neg = Scaling::try_parse_from(["scaling", "--step-ms=-5"])
        .err()
        .unwrap();
    assert!(neg.to_string().contains("--step-ms"), "{neg}");
    assert!(Scaling::try_parse_from(["scaling", "--step-ms", "1", "--overlap", "1.5"]).is_err());
}

#[test]
fn scaling_from_a_bench_result() {
    let bench = fixtures().join("bench-fixture-a100-1gpu.json");
    let p = Scaling::try_parse_from(["scaling", "--bench", bench.to_str().unwrap()])
        .unwrap()
        .args;
    let m = model_from_args(&p).unwrap();
    assert_eq!(m.step_ms, 104.49);
    assert_eq!(m.batch, 256);
    // A multi-worker result is refused: the model starts from one worker.
    let eight = fixtures().join("bench-fixture-a100-8gpu.json");
    let p = Scaling::try_parse_from(["scaling", "--bench", eight.to_str().unwrap()])
        .unwrap()
        .args;
    assert!(model_from_args(&p)
        .unwrap_err()
        .to_string()
        .contains("8-worker"));
}

#[test]
fn scaling_kempner_table_golden() {
    // The docs' Kempner row: 889.7 img/s at batch 256, 4 A100 per node, IB HDR.
    let p = Scaling::try_parse_from([
        "scaling",
        "--images-per-sec",
        "889.7",
        "--gpus",
        "1,2,4,8,16,32,64",
        "--gpus-per-node",
        "4",
    ])
    .unwrap()
    .args;
    let ps = model_from_args(&p).unwrap().predict(&p.gpus);
    let text = prediction_table(&ps).to_text();
    let golden = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/scaling-kempner.txt");
    if std::env::var_os("RN50_UPDATE_GOLDEN").is_some() {
        fs::write(&golden, &text).unwrap();
    }
    assert_eq!(text, fs::read_to_string(&golden).unwrap());
    assert!(text.lines().last().unwrap().ends_with("99.1%"), "{text}");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let mut p = p;
    p.json = Some(json.clone());
    rn50_report::scaling::run(&p).unwrap();
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(json).unwrap()).unwrap();
    assert_eq!(v["predictions"].as_array().unwrap().len(), 7);
    assert_eq!(v["model"]["grad_bytes"], 102_228_128);
}

#[test]
fn report_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rep");
    let json = dir.path().join("report.json");
    let f = fixtures();
    let args = Report::try_parse_from([
        "report".as_ref(),
        f.join("bench-fixture-a100-1gpu.json").as_os_str(),
        f.join("bench-fixture-a100-8gpu.json").as_os_str(),
        f.join("runs/fixture-r50-1gpu").as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--json".as_ref(),
        json.as_os_str(),
    ])
    .unwrap()
    .args;
    report::run(&args).unwrap();
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["throughput"].as_array().unwrap().len(), 2);
    assert_eq!(v["train"][0]["run"], "fixture-r50-1gpu");
    assert_eq!(v["files"].as_array().unwrap().len(), 7);
    assert!(out.join("throughput.png").is_file());
    // A bad input fails the command with the file named, before anything is written.
    let out2 = dir.path().join("rep2");
    let bad = Report::try_parse_from([
        "report".as_ref(),
        f.join("bad/malformed.json").as_os_str(),
        "--out".as_ref(),
        out2.as_os_str(),
    ])
    .unwrap()
    .args;
    let e = report::run(&bad).unwrap_err().to_string();
    assert!(e.contains("malformed.json:3:"), "{e}");
    assert!(!out2.exists());
}

#[test]
fn scaling_checks_the_numbers_of_a_bench_file() {
    // The command line's numbers are clap's to check; a bench file's are checked when it is read.
    let dir = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(fixtures().join("bench-fixture-a100-1gpu.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v["config"]["batch_size"] = 0.into();
    let bad = dir.path().join("zero-batch.json");
    fs::write(&bad, v.to_string()).unwrap();
    let p = Scaling::try_parse_from(["scaling", "--bench", bad.to_str().unwrap()])
        .unwrap()
        .args;
    let e = model_from_args(&p).unwrap_err().to_string();
    assert!(
        e.contains("zero-batch.json") && e.contains("batch_size"),
        "{e}"
    );
}

#[test]
fn scaling_nics_per_node_multiply_a_nodes_inter_node_bandwidth() {
    let parse = |nics: &str| {
        Scaling::try_parse_from(["scaling", "--step-ms", "300", "--nics-per-node", nics])
    };
    let m = model_from_args(&parse("4").unwrap().args).unwrap();
    assert_eq!(m.inter_gbs, 4.0 * 23.0, "4 IB HDR cards");
    let one = Scaling::try_parse_from(["scaling", "--step-ms", "300"])
        .unwrap()
        .args;
    assert_eq!(model_from_args(&one).unwrap().inter_gbs, 23.0);
    // At 64 GPUs over nodes of 8, four cards expose less of the all-reduce than one.
    let slow = model_from_args(&one).unwrap().predict_one(64);
    let fast = m.predict_one(64);
    assert!(fast.allreduce_ms < slow.allreduce_ms);
    for bad in ["0", "65"] {
        let e = parse(bad).err().unwrap().to_string();
        assert!(e.contains("--nics-per-node"), "{bad}: {e}");
    }
}

#[test]
fn scaling_says_what_input_each_node_needs() {
    let p = Scaling::try_parse_from([
        "scaling",
        "--images-per-sec",
        "1000",
        "--gpus",
        "1,4,16",
        "--gpus-per-node",
        "8",
        "--jpeg-kb",
        "100",
    ])
    .unwrap()
    .args;
    let ps = model_from_args(&p).unwrap().predict(&p.gpus);
    // One GPU: 1000 img/s of 100 KB JPEGs, 0.1 GB/s.
    assert!((ps[0].node_images_per_sec - 1000.0).abs() < 1e-9);
    assert!((ps[0].node_read_gbs - 0.1).abs() < 1e-12);
    // 4 GPUs fill half a node; 16 GPUs are 2 full nodes of 8: each reads and decodes 8 GPUs' worth.
    assert!((ps[1].node_images_per_sec - ps[1].images_per_sec).abs() < 1e-9);
    assert!((ps[2].node_images_per_sec - ps[2].images_per_sec / 2.0).abs() < 1e-9);
    assert!((ps[2].node_read_gbs - ps[2].node_images_per_sec * 100e3 / 1e9).abs() < 1e-12);
    let text = prediction_table(&ps).to_text();
    assert!(
        text.lines().next().unwrap().contains("JPEG GB/s/node"),
        "{text}"
    );
    // Without a size: ImageNet-1k's mean file.
    let none = Scaling::try_parse_from(["scaling", "--step-ms", "300"])
        .unwrap()
        .args;
    assert_eq!(
        model_from_args(&none).unwrap().image_bytes,
        rn50_report::scaling::IMAGENET_MEAN_JPEG_BYTES
    );
}

#[test]
fn scaling_takes_the_mean_file_size_of_a_dataset() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for (class, file, size) in [("n01", "a.JPEG", 1000), ("n02", "b.JPEG", 3000)] {
        fs::create_dir_all(data.join("train").join(class)).unwrap();
        fs::write(data.join("train").join(class).join(file), vec![0u8; size]).unwrap();
    }
    fs::write(data.join("train/n01/.partial"), vec![0u8; 99_999]).unwrap();
    fs::create_dir_all(data.join("val")).unwrap();
    fs::write(data.join("val/big.JPEG"), vec![0u8; 50_000]).unwrap();
    let d = data.to_str().unwrap();
    let p = Scaling::try_parse_from(["scaling", "--step-ms", "300", "--data", d])
        .unwrap()
        .args;
    assert_eq!(model_from_args(&p).unwrap().image_bytes, 2000.0);
    assert!(
        Scaling::try_parse_from(["scaling", "--step-ms", "1", "--data", d, "--jpeg-kb", "5"])
            .is_err()
    );
    let empty = dir.path().join("empty");
    fs::create_dir(&empty).unwrap();
    let p = Scaling::try_parse_from([
        "scaling",
        "--step-ms",
        "300",
        "--data",
        empty.to_str().unwrap(),
    ])
    .unwrap()
    .args;
    assert!(model_from_args(&p)
        .unwrap_err()
        .to_string()
        .contains("no files"));
}

/// The A100 fixture with its GPUs renamed: a one-worker result measured on `gpu`.
fn bench_on(dir: &Path, gpu: &str) -> PathBuf {
    let text = fs::read_to_string(fixtures().join("bench-fixture-a100-1gpu.json")).unwrap();
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    for d in v["machine"]["cuda_devices"].as_array_mut().unwrap() {
        d["name"] = gpu.into();
    }
    let path = dir.join(format!("bench-{}.json", gpu.replace(' ', "_")));
    fs::write(&path, v.to_string()).unwrap();
    path
}

#[test]
fn scaling_defaults_to_todays_links_for_an_h100_or_h200() {
    let dir = tempfile::tempdir().unwrap();
    let model = |bench: &Path, more: &[&str]| {
        let mut line = vec!["scaling", "--bench", bench.to_str().unwrap()];
        line.extend(more);
        model_from_args(&Scaling::try_parse_from(line).unwrap().args).unwrap()
    };
    for gpu in ["NVIDIA H100 80GB HBM3", "NVIDIA H200"] {
        let m = model(&bench_on(dir.path(), gpu), &[]);
        // NVLink 4 through NVSwitch; one InfiniBand NDR card (45 GB/s) per GPU, 8 per node.
        assert_eq!(m.intra_preset, Some(Link::Nvlink4), "{gpu}");
        assert_eq!(m.inter_preset, Some(Link::IbNdr400), "{gpu}");
        assert_eq!((m.intra_gbs, m.intra_latency_us), (360.0, 3.0), "{gpu}");
        assert_eq!((m.nics_per_node, m.inter_gbs), (8, 8.0 * 45.0), "{gpu}");
        assert_eq!(m.hardware.as_deref(), Some(gpu));
    }
    let h100 = bench_on(dir.path(), "NVIDIA H100 80GB HBM3");
    // Each default gives way to its flag.
    let m = model(
        &h100,
        &["--interconnect", "ib-hdr200", "--gpus-per-node", "4"],
    );
    assert_eq!((m.nics_per_node, m.inter_gbs), (4, 4.0 * 23.0));
    let m = model(&h100, &["--nics-per-node", "1", "--intra", "nvlink3"]);
    assert_eq!((m.intra_gbs, m.inter_gbs), (230.0, 45.0));
    // PCIe cards: PCIe 5.0 between them, one card per node.
    let m = model(&bench_on(dir.path(), "NVIDIA H100 PCIe"), &[]);
    assert_eq!((m.intra_preset, m.nics_per_node), (Some(Link::Pcie5), 1));
    // An A100 keeps the old defaults.
    let m = model(&fixtures().join("bench-fixture-a100-1gpu.json"), &[]);
    assert_eq!((m.intra_gbs, m.inter_gbs), (230.0, 23.0));
    for preset in [
        "nvlink4",
        "nvlink3",
        "nvlink2",
        "pcie5",
        "ib-ndr400",
        "100gbe",
        "loopback",
    ] {
        assert!(
            Scaling::try_parse_from(["scaling", "--intra", preset]).is_ok(),
            "{preset}"
        );
    }
}

/// `rn50 scaling --json` of a command line.
fn scaling_json(line: &[&str]) -> serde_json::Value {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("p.json");
    let mut p = Scaling::try_parse_from(line).unwrap().args;
    p.json = Some(json.clone());
    rn50_report::scaling::run(&p).unwrap();
    serde_json::from_str(&fs::read_to_string(json).unwrap()).unwrap()
}

#[test]
fn scaling_warns_of_a_cpu_step_under_gpu_links() {
    let cpu = fixtures().join("bench-fixture-cpu.json");
    let cpu = cpu.to_str().unwrap();
    let v = scaling_json(&["scaling", "--bench", cpu, "--gpus", "1,64"]);
    let w = v["warnings"].as_array().unwrap();
    assert_eq!(w.len(), 1, "{w:?}");
    let w = w[0].as_str().unwrap();
    assert!(w.contains("measured on a CPU"), "{w}");
    assert!(
        w.contains("nvlink3 and ib-hdr200") && w.contains("model GPU nodes"),
        "{w}"
    );
    assert_eq!(v["model"]["device"], "cpu");
    // Ranks on one host over loopback: the preset is the CPU's own, nothing to warn of.
    let v = scaling_json(&[
        "scaling",
        "--bench",
        cpu,
        "--gpus",
        "1,2",
        "--gpus-per-node",
        "2",
        "--intra",
        "loopback",
    ]);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{v}");
    // A GPU's step under the same presets as the first.
    let gpu = fixtures().join("bench-fixture-a100-1gpu.json");
    let v = scaling_json(&[
        "scaling",
        "--bench",
        gpu.to_str().unwrap(),
        "--gpus",
        "1,64",
    ]);
    assert_eq!(v["warnings"].as_array().unwrap().len(), 0, "{v}");
}

#[test]
fn scaling_says_the_cores_that_decode_a_nodes_input() {
    let loader = fixtures().join("loader-fixture.json");
    let loader = loader.to_str().unwrap();
    // The H100 node: 5,433 img/s per GPU, 8 per node, today's links.
    let line = [
        "scaling",
        "--images-per-sec",
        "5433",
        "--gpus",
        "1,8,64",
        "--intra",
        "nvlink4",
        "--interconnect",
        "ib-ndr400",
        "--nics-per-node",
        "8",
        "--loader-json",
        loader,
    ];
    let p = Scaling::try_parse_from(line).unwrap().args;
    let m = model_from_args(&p).unwrap();
    let d = m.decode.as_ref().unwrap();
    assert_eq!((d.threads, d.images_per_sec_per_core), (2, 483.0));
    let ps = m.predict(&p.gpus);
    // One worker: 5,433 img/s are 11.2 cores' decode at 483 img/s per core.
    assert!((ps[0].node_decode_cores.unwrap() - 5433.0 / 483.0).abs() < 1e-6);
    // 64 workers: 8 per node, each node decoding ~43,000 img/s, ~90 cores; nothing capped without the node's cores.
    let p64 = &ps[2];
    let cores = p64.node_images_per_sec / 483.0;
    assert!((p64.node_decode_cores.unwrap() - cores).abs() < 1e-9);
    assert!((85.0..=90.0).contains(&cores), "{cores}");
    assert_eq!(p64.images_per_sec, p64.step_images_per_sec);
    let notes = m.decode_notes(&ps);
    let want = format!(
        "needs about {} cores at the measured 483 img/s per core (966 img/s on 2 threads",
        cores.ceil()
    );
    assert!(notes[0].contains(&want), "{notes:?}");
    assert!(notes[1].contains("--cores-per-node"), "{notes:?}");
    let text = prediction_table(&ps).to_text();
    assert!(
        text.lines().next().unwrap().contains("decode cores/node"),
        "{text}"
    );
    // The JSON carries the same.
    let v = scaling_json(&line);
    assert_eq!(v["model"]["decode"]["images_per_sec_per_core"], 483.0);
    assert!(v["predictions"][2]["node_decode_cores"].as_f64().unwrap() > 85.0);
    assert!(v["notes"][0]
        .as_str()
        .unwrap()
        .contains("cores at the measured"));
}

#[test]
fn scaling_caps_the_prediction_at_a_nodes_decode_cores() {
    let loader = fixtures().join("loader-fixture.json");
    let mut line = vec![
        "scaling",
        "--images-per-sec",
        "5433",
        "--gpus",
        "1,4,8,64",
        "--loader-json",
        loader.to_str().unwrap(),
        "--cores-per-node",
        "64",
    ];
    let p = Scaling::try_parse_from(line.clone()).unwrap().args;
    let m = model_from_args(&p).unwrap();
    let bound = 64.0 * 483.0; // 30,912 img/s per node
    assert_eq!(m.node_decode_bound(), Some(bound));
    let ps = m.predict(&p.gpus);
    // 4 workers need ~21,700 img/s: under the bound. 8 need ~43,000: one node delivers 30,912.
    assert!(!ps[1].decode_bound && ps[1].images_per_sec == ps[1].step_images_per_sec);
    assert!(ps[2].decode_bound);
    assert!((ps[2].images_per_sec - bound).abs() < 1e-6);
    assert!((ps[3].images_per_sec - 8.0 * bound).abs() < 1e-6, "8 nodes");
    let eff = (8.0 * bound / 64.0) / ps[0].images_per_sec;
    assert!((ps[3].efficiency - eff).abs() < 1e-12);
    assert!(ps[3].efficiency < 0.72, "{}", ps[3].efficiency);
    let text = prediction_table(&ps).to_text();
    let rows: Vec<&str> = text.lines().collect();
    assert!(rows[0].contains("limit"), "{text}");
    assert!(
        rows[2].contains(" step ") && rows[3].contains(" decode "),
        "{text}"
    );
    assert!(m.decode_notes(&ps)[1].contains("at 8, 64 workers"));
    // Enough cores: nothing capped, and said so.
    *line.last_mut().unwrap() = "1000";
    let m = model_from_args(&Scaling::try_parse_from(line.clone()).unwrap().args).unwrap();
    let ps = m.predict(&p.gpus);
    assert!(ps.iter().all(|p| !p.decode_bound));
    assert!(m.decode_notes(&ps)[1].contains("enough at every N"));
    // The cores need a decode rate, and have a range.
    let e = Scaling::try_parse_from(["scaling", "--step-ms", "300", "--cores-per-node", "64"])
        .err()
        .unwrap();
    assert!(e.to_string().contains("--loader-json"), "{e}");
    for bad in ["0", "4097", "x"] {
        *line.last_mut().unwrap() = bad;
        let e = Scaling::try_parse_from(line.clone()).err().unwrap();
        assert!(e.to_string().contains("--cores-per-node"), "{bad}: {e}");
    }
}

#[test]
fn scaling_checks_the_numbers_of_a_loader_file() {
    let dir = tempfile::tempdir().unwrap();
    let text = fs::read_to_string(fixtures().join("loader-fixture.json")).unwrap();
    for (field, value, says) in [
        ("threads", serde_json::json!(0), "threads is 0"),
        ("images_per_sec", serde_json::json!(-1.0), "images_per_sec"),
    ] {
        let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
        v[field] = value;
        let bad = dir.path().join(format!("bad-{field}.json"));
        fs::write(&bad, v.to_string()).unwrap();
        let p = Scaling::try_parse_from([
            "scaling",
            "--step-ms",
            "300",
            "--loader-json",
            bad.to_str().unwrap(),
        ])
        .unwrap()
        .args;
        let e = model_from_args(&p).unwrap_err().to_string();
        assert!(
            e.contains(&format!("bad-{field}.json")) && e.contains(says),
            "{e}"
        );
    }
}

/// `rn50 report` over a full run and a smoke run (`--steps-per-epoch 20 --val-max-images 500`): report.md warns
/// before the training table and the smoke run's row says what it covers; train.csv and the JSON carry the numbers.
#[test]
fn report_says_which_runs_are_partial() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("rep");
    let json = dir.path().join("report.json");
    let f = fixtures().join("runs");
    let args = Report::try_parse_from([
        "report".as_ref(),
        f.join("fixture-r50-1gpu").as_os_str(),
        f.join("fixture-r50-smoke").as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
        "--json".as_ref(),
        json.as_os_str(),
    ])
    .unwrap()
    .args;
    report::run(&args).unwrap();
    let md = fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("**⚠ Partial runs: fixture-r50-smoke.**"),
        "{md}"
    );
    assert!(
        md.contains("| fixture-r50-smoke | ⚠ 20 of 5,005 steps/epoch, val 500 of 50,000 |"),
        "{md}"
    );
    let csv = fs::read_to_string(out.join("train.csv")).unwrap();
    assert!(
        csv.lines()
            .next()
            .unwrap()
            .ends_with(",steps_per_epoch,full_steps_per_epoch,val_images,val_images_total"),
        "{csv}"
    );
    assert!(csv.contains(",20,5005,500,50000\n"), "{csv}");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["train"][0]["partial"], false);
    assert_eq!(v["train"][1]["partial"], true);
    assert_eq!(v["train"][1]["full_steps_per_epoch"], 5005);
}

/// A run directory with these epochs' top-1 (None: not evaluated) and seconds, and a summary.json when the run
/// was trained with `--target-accuracy`.
fn run_with(
    dir: &Path,
    name: &str,
    epochs: &[(Option<f64>, f64)],
    trained_target: Option<f64>,
) -> PathBuf {
    let run = dir.join(name);
    fs::create_dir_all(&run).unwrap();
    let lines: Vec<String> = epochs
        .iter()
        .enumerate()
        .map(|(i, (acc1, seconds))| {
            serde_json::json!({"epoch": i, "train_loss": 1.0, "acc1": acc1, "seconds": seconds})
                .to_string()
        })
        .collect();
    fs::write(run.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    if let Some(t) = trained_target {
        let mut s = rn50_report::schema::TrainSummary {
            arch: "resnet50".into(),
            ..Default::default()
        };
        let metrics = rn50_report::schema::read_train_run(&run).unwrap().epochs;
        s.fill_from_metrics(&metrics);
        s.fill_target(&metrics, Some(t));
        rn50_report::run_report::write_summary(&run, &s).unwrap();
    }
    run
}

/// `--target-accuracy`: for each run and each target (the flag's, and one a run was trained with), the epochs and the
/// wall-clock to the first evaluation at or above it, as a table, CSV, JSON and a plot; "not reached" otherwise.
#[test]
fn report_times_each_run_to_each_target() {
    let dir = tempfile::tempdir().unwrap();
    // a: epoch 2 not evaluated; the first evaluation at or above 75 is epoch 3's (1-based), after 10+11+12 s.
    let a = run_with(
        dir.path(),
        "a",
        &[
            (Some(50.0), 10.0),
            (None, 11.0),
            (Some(76.0), 12.0),
            (Some(80.0), 13.0),
        ],
        None,
    );
    // b was trained with --target-accuracy 60: that target is timed too, for every run.
    let b = run_with(
        dir.path(),
        "b",
        &[(Some(61.0), 20.0), (Some(74.9), 20.0)],
        Some(60.0),
    );
    let out = dir.path().join("rep");
    let json = dir.path().join("report.json");
    let parse = |extra: &[&str]| {
        let mut line: Vec<&std::ffi::OsStr> = vec![
            "report".as_ref(),
            a.as_os_str(),
            b.as_os_str(),
            "--out".as_ref(),
            out.as_os_str(),
        ];
        line.extend(extra.iter().map(std::ffi::OsStr::new));
        Report::try_parse_from(line)
    };
    let mut args = parse(&["--target-accuracy", "90,75", "--target-accuracy", "75"])
        .unwrap()
        .args;
    assert_eq!(args.target_accuracy, [90.0, 75.0, 75.0]);
    args.json = Some(json.clone());
    report::run(&args).unwrap();

    let md = fs::read_to_string(out.join("report.md")).unwrap();
    let section = &md[md.find("## Time to accuracy").expect(&md)..];
    for row in [
        "| a | 60 | 3 | 33 | 0:00:33 | 80.00 |",
        "| a | 75 | 3 | 33 | 0:00:33 | 80.00 |",
        "| a | 90 | not reached | not reached | not reached | 80.00 |",
        "| b | 60 | 1 | 20 | 0:00:20 | 74.90 |",
        "| b | 75 | not reached | not reached | not reached | 74.90 |",
    ] {
        assert!(section.contains(row), "{row} not in:\n{section}");
    }
    assert_eq!(
        section.matches("\n| a |").count(),
        3,
        "each target once: {section}"
    );
    let csv = fs::read_to_string(out.join("time_to_accuracy.csv")).unwrap();
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(lines[0], "run,target_acc1,epochs,seconds,hms,best_acc1");
    assert_eq!(lines[2], "a,75,3,33,0:00:33,80");
    assert_eq!(lines[3], "a,90,,,,80");
    let v: serde_json::Value = serde_json::from_str(&fs::read_to_string(&json).unwrap()).unwrap();
    let t = v["time_to_accuracy"].as_array().unwrap();
    assert_eq!(t.len(), 6);
    assert_eq!(
        t[1],
        serde_json::json!({"run": "a", "target_acc1": 75.0, "epochs": 3, "seconds": 33.0, "best_acc1": 80.0})
    );
    assert_eq!(t[5]["epochs"], serde_json::Value::Null);
    let files: Vec<&str> = v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap())
        .collect();
    assert!(
        files.iter().any(|f| f.ends_with("time_to_accuracy.png")),
        "{files:?}"
    );
    assert!(out.join("time_to_accuracy.png").is_file());

    // Without --target-accuracy and without a trained target, none of it.
    let out2 = dir.path().join("rep2");
    let plain = Report::try_parse_from([
        "report".as_ref(),
        a.as_os_str(),
        "--out".as_ref(),
        out2.as_os_str(),
    ])
    .unwrap()
    .args;
    report::run(&plain).unwrap();
    assert!(!fs::read_to_string(out2.join("report.md"))
        .unwrap()
        .contains("Time to accuracy"));
    assert!(
        !out2.join("time_to_accuracy.csv").exists() && !out2.join("time_to_accuracy.png").exists()
    );

    // A target outside (0, 100] is refused when the command line is read.
    for bad in ["0", "100.5", "-3", "nan", "inf", "75,x"] {
        assert!(
            parse(&["--target-accuracy", bad]).is_err(),
            "--target-accuracy {bad} accepted"
        );
    }
    assert!(parse(&["--target-accuracy", "100"]).is_ok());
}
