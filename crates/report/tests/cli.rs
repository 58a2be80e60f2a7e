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
    assert_eq!(p.interconnect, Link::Eth10);
    assert_eq!(p.intra, Link::Nvlink2);
    let m = model_from_args(&p).unwrap();
    assert_eq!(m.grad_bytes, 102_228_128);
    assert!((m.step_ms - 256.0 * 1000.0 / 889.7).abs() < 1e-9);
    assert_eq!((m.inter_gbs, m.inter_latency_us), (1.1, 30.0));
    assert_eq!(m.bucket_bytes, 26_214_400);
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
