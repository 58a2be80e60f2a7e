//! `rn50 bench --profile` end to end on CPU: the table, the JSON's per-kind rows, and clear errors.
use crate::common::rn50_backtrace;

#[test]
fn bench_profile_reports_time_per_kind_of_work() {
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("profile.json");
    let out = rn50_backtrace(&[
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
        "1",
        "--threads",
        "1",
        "--device",
        "cpu",
        "--precision",
        "fp32",
        "--profile",
        "--profile-steps",
        "2",
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    for want in [
        "img/s (median)",
        "profile: 2 extra steps",
        "convolution",
        "other",
        "total",
    ] {
        assert!(stdout.contains(want), "'{want}' missing from:\n{stdout}");
    }
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    // The profiled steps are extra: the measured ones are what img/s comes from.
    assert_eq!(v["step_times_ms"].as_array().unwrap().len(), 1);
    assert_eq!(v["config"]["profile_steps"], 2);
    let p = &v["profile"];
    assert_eq!(p["source"], "cpu_ops", "{p}");
    assert_eq!(p["steps"], 2);
    assert!(p["total_ms_per_step"].as_f64().unwrap() > 0.0, "{p}");
    assert!(p["wall_ms_per_step"].as_f64().unwrap() > 0.0, "{p}");
    let kinds = p["kinds"].as_array().unwrap();
    let names: Vec<&str> = kinds.iter().map(|k| k["kind"].as_str().unwrap()).collect();
    for want in [
        "convolution",
        "batch_norm",
        "elementwise",
        "optimizer",
        "cast",
        "copy",
        "communication",
        "other",
    ] {
        assert_eq!(
            names.iter().filter(|&&n| n == want).count(),
            1,
            "{want} in {names:?}"
        );
    }
    assert_eq!(names.last(), Some(&"other"), "other comes last: {names:?}");
    let share = |kind: &str| {
        kinds.iter().find(|k| k["kind"] == kind).unwrap()["share"]
            .as_f64()
            .unwrap()
    };
    assert!(share("convolution") > 0.0, "{p}");
    assert!(share("batch_norm") > 0.0, "{p}");
    assert!(share("optimizer") > 0.0, "{p}");
    // One process, no collectives.
    assert_eq!(share("communication"), 0.0, "{p}");
    let sum: f64 = kinds.iter().map(|k| k["share"].as_f64().unwrap()).sum();
    assert!((sum - 1.0).abs() < 1e-6, "shares sum to {sum}: {p}");
    let ms_sum: f64 = kinds
        .iter()
        .map(|k| k["ms_per_step"].as_f64().unwrap())
        .sum();
    let total = p["total_ms_per_step"].as_f64().unwrap();
    assert!((ms_sum - total).abs() < 1e-6 * total.max(1.0), "{p}");
    // The named "other" ops are part of "other".
    let other_top = p["other_top"].as_array().unwrap();
    assert!(other_top.len() <= 5, "{p}");
    let top_share: f64 = other_top.iter().map(|o| o["share"].as_f64().unwrap()).sum();
    assert!(top_share <= share("other") + 1e-9, "{p}");
    assert!(
        other_top
            .iter()
            .all(|o| o["name"].as_str().is_some_and(|s| !s.is_empty())),
        "{p}"
    );
    // The report's reader, the one bench record type, reads the same file, profile included.
    let r: rn50_report::BenchResult = rn50_report::schema::read_json(&json).unwrap();
    assert_eq!(r.config.profile_steps, Some(2));
    let profile = r.profile.expect("the profile is read back");
    assert_eq!(
        (profile.source, profile.steps, profile.kinds.len()),
        (rn50_report::schema::ProfileSource::CpuOps, 2, 8)
    );
}

#[test]
fn bench_profile_rejects_what_it_cannot_do() {
    for (args, needle) in [
        (
            &[
                "bench",
                "--profile",
                "--profile-steps",
                "0",
                "--device",
                "cpu",
            ][..],
            "invalid value '0' for '--profile-steps",
        ),
        (&["bench", "--sweep", "--profile"][..], "leave out --sweep"),
    ] {
        let out = rn50_backtrace(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} should fail");
        assert!(!err.contains("panicked"), "{args:?} panicked:\n{err}");
        assert!(
            err.contains(needle),
            "{args:?}: expected '{needle}' in:\n{err}"
        );
    }
}
