//! `rn50 train --config FILE.toml` and the learning-rate flags (issue 14): the file's keys are the long flag names,
//! the command line wins over the file, an unknown key is a usage error naming it, the run directory's config.toml
//! gives the same flags back, every recipe in recipes/ parses, and `--lr` is the rate itself while `--lr-base` is
//! scaled with the global batch (the start line says which, and the rate).
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common;

use common::{rn50, rn50_in, rn50_parse_only, TinyTrain};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The resolved flags of `rn50 train ARGS…`, which must parse.
fn resolved(args: &[&str]) -> toml::Table {
    let mut all = vec!["train"];
    all.extend_from_slice(args);
    resolved_output(&all.join(" "), rn50_parse_only(&all))
}

/// The resolved flags of `t`, which must parse.
fn resolved_tiny(t: &TinyTrain) -> toml::Table {
    resolved_output(&format!("{:?}", t.to_args()), rn50_parse_only(&t.to_args()))
}

/// The resolved flags that `rn50 ARGS…` (parse-only) printed; it must have succeeded.
fn resolved_output(args: &str, out: Output) -> toml::Table {
    assert!(out.status.success(), "rn50 {args}: {}", text(&out.stderr));
    text(&out.stdout)
        .parse()
        .expect("train's resolved flags are TOML")
}

/// Runs `t` to the end (not parse-only) in the working directory `cwd`.
fn run_in(cwd: &Path, t: &TinyTrain) -> Output {
    t.command()
        .current_dir(cwd)
        .env_remove("RN50_PARSE_ONLY")
        .output()
        .expect("run rn50")
}

/// `rn50 train ARGS…` must be refused as a usage error (exit 2) whose message contains every one of `names`.
fn refused(args: &[&str], names: &[&str]) {
    let mut all = vec!["train"];
    all.extend_from_slice(args);
    let out = rn50_parse_only(&all);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "rn50 {}: {err}", all.join(" "));
    for n in names {
        assert!(
            err.contains(n),
            "rn50 {}: the message should name {n}: {err}",
            all.join(" ")
        );
    }
}

fn write(dir: &Path, name: &str, body: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    p.to_str().unwrap().to_string()
}

fn number(v: &toml::Value) -> Option<f64> {
    match v {
        toml::Value::Integer(i) => Some(*i as f64),
        toml::Value::Float(f) => Some(*f),
        _ => None,
    }
}

/// Same value, 90 and 90.0 alike.
fn same(a: &toml::Value, b: &toml::Value) -> bool {
    match (a, b) {
        (toml::Value::Array(x), toml::Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
        }
        _ => match (number(a), number(b)) {
            (Some(x), Some(y)) => x == y,
            _ => a == b,
        },
    }
}

#[test]
fn command_line_overrides_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "r.toml",
        "batch-size = 64\nepochs = 5\nno-bn-wd = true\nlr-milestones = [2, 4]\ndata = \"/from/file\"\n",
    );
    let r = resolved(&["--config", &file]);
    assert_eq!(r["batch-size"].as_integer(), Some(64));
    assert_eq!(r["epochs"].as_integer(), Some(5));
    assert_eq!(r["no-bn-wd"].as_bool(), Some(true));
    assert!(same(
        &r["lr-milestones"],
        &toml::Value::Array(vec![2.into(), 4.into()])
    ));
    assert_eq!(r["data"].as_str(), Some("/from/file"));

    // Before or after --config, with a short name or `=`: the command line wins; the rest stays the file's.
    for args in [
        vec!["-b", "32", "--config", &file, "/cli", "--lr-milestones=3"],
        vec![
            "--config",
            &file,
            "--batch-size=32",
            "--lr-milestones",
            "3",
            "/cli",
        ],
    ] {
        let r = resolved(&args);
        assert_eq!(r["batch-size"].as_integer(), Some(32), "{args:?}");
        assert!(
            same(&r["lr-milestones"], &toml::Value::Array(vec![3.into()])),
            "{args:?}"
        );
        assert_eq!(r["data"].as_str(), Some("/cli"), "{args:?}");
        assert_eq!(r["epochs"].as_integer(), Some(5), "{args:?}");
        assert_eq!(r["no-bn-wd"].as_bool(), Some(true), "{args:?}");
    }
}

#[test]
fn lr_and_lr_base_exclude_each_other_and_the_command_line_picks() {
    refused(
        &["--dummy", "--lr", "0.4", "--lr-base", "0.1"],
        &["--lr", "--lr-base"],
    );
    let dir = tempfile::tempdir().unwrap();
    // Neither: --lr-base 0.1 per 256.
    let r = resolved(&["--dummy"]);
    assert!(
        (r.get("lr"), r["lr-base"].as_float()) == (None, Some(0.1)),
        "{r:?}"
    );
    assert_eq!(r["lr-base-size"].as_integer(), Some(256));
    // A file's --lr-base gives way to the command line's --lr, and the other way round.
    let base = write(
        dir.path(),
        "base.toml",
        "lr-base = 0.2\nlr-base-size = 512\n",
    );
    let r = resolved(&["--dummy", "--config", &base, "--lr", "0.4"]);
    assert_eq!((r["lr"].as_float(), r.get("lr-base")), (Some(0.4), None));
    let abs = write(dir.path(), "abs.toml", "lr = 0.4\n");
    let r = resolved(&["--dummy", "--config", &abs, "--lr-base", "0.3"]);
    assert_eq!((r.get("lr"), r["lr-base"].as_float()), (None, Some(0.3)));
    // Both in one file is the same conflict as on the command line.
    let both = write(dir.path(), "both.toml", "lr = 0.4\nlr-base = 0.1\n");
    refused(&["--dummy", "--config", &both], &["--lr", "--lr-base"]);
}

#[test]
fn bad_files_and_values_are_usage_errors() {
    let dir = tempfile::tempdir().unwrap();
    let unknown = write(dir.path(), "u.toml", "epochs = 3\nbatch-sise = 64\n");
    refused(
        &["--dummy", "--config", &unknown],
        &["batch-sise", "u.toml"],
    );
    // Values go through the flags' own ranges.
    let range = write(dir.path(), "r.toml", "label-smoothing = 2.0\n");
    refused(&["--dummy", "--config", &range], &["--label-smoothing"]);
    let switch = write(dir.path(), "s.toml", "no-bn-wd = 1\n");
    refused(&["--dummy", "--config", &switch], &["no-bn-wd"]);
    let missing = dir.path().join("missing.toml");
    refused(
        &["--dummy", "--config", missing.to_str().unwrap()],
        &["missing.toml"],
    );
    let syntax = write(dir.path(), "x.toml", "epochs = \n");
    refused(&["--dummy", "--config", &syntax], &["x.toml"]);
}

#[test]
fn the_command_line_turns_off_a_switch_the_file_turns_on() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "r.toml",
        "nesterov = true\nno-bn-wd = true\nzero-init-residual = true\n",
    );
    let on = resolved(&["--dummy", "--config", &file]);
    for key in ["nesterov", "no-bn-wd", "zero-init-residual"] {
        assert_eq!(on[key].as_bool(), Some(true), "{key}");
    }
    // The last of a switch and its negation wins, wherever --config is; config.toml records the switch only.
    for (args, key, want) in [
        (vec!["--no-nesterov"], "nesterov", false),
        (vec!["--bn-wd"], "no-bn-wd", false),
        (vec!["--no-zero-init-residual"], "zero-init-residual", false),
        (vec!["--no-nesterov", "--nesterov"], "nesterov", true),
        (vec!["--nesterov", "--no-nesterov"], "nesterov", false),
    ] {
        for before in [false, true] {
            let mut all = vec!["--dummy"];
            if before {
                all.extend(&args);
                all.extend(["--config", &file]);
            } else {
                all.extend(["--config", &file]);
                all.extend(&args);
            }
            let r = resolved(&all);
            assert_eq!(r[key].as_bool(), Some(want), "{all:?}");
            assert!(
                !r.contains_key("no-nesterov") && !r.contains_key("bn-wd"),
                "{all:?}: a negation is no key of config.toml"
            );
            let other = if key == "nesterov" {
                "no-bn-wd"
            } else {
                "nesterov"
            };
            assert_eq!(
                r[other].as_bool(),
                Some(true),
                "{all:?}: the file's other switches stay"
            );
        }
    }
    // What it is for: a recipe with SGD's Nesterov, trained with Adam (which refuses Nesterov).
    let recipe =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../recipes/imagenette-5ep-sgd.toml");
    let recipe = recipe.to_str().unwrap();
    refused(
        &["--config", recipe, "/d", "--optimizer", "radam"],
        &["--nesterov"],
    );
    let r = resolved(&[
        "--config",
        recipe,
        "/d",
        "--optimizer",
        "radam",
        "--no-nesterov",
    ]);
    assert_eq!(r["optimizer"].as_str(), Some("radam"));
    assert_eq!(r["nesterov"].as_bool(), Some(false));

    // Every switch of `train --help` has its negation; --overwrite, decided on each command line, has none.
    let help = text(&rn50_parse_only(&["train", "--help"]).stdout);
    let switches: Vec<&str> = help
        .lines()
        .filter_map(|l| {
            let flag = l.trim().rsplit(", ").next()?.strip_prefix("--")?;
            flag.chars()
                .all(|c| c.is_ascii_lowercase() || c == '-')
                .then_some(flag)
        })
        .filter(|f| !["help", "version", "overwrite"].contains(f))
        .collect();
    assert!(
        switches.len() >= 10,
        "train --help's switches: {switches:?}"
    );
    for switch in switches {
        let negation = match switch.strip_prefix("no-") {
            Some(rest) => rest.to_string(),
            None => format!("no-{switch}"),
        };
        let out = rn50_parse_only(&["train", "/d", &format!("--{negation}")]);
        assert!(out.status.success(), "--{negation}: {}", text(&out.stderr));
    }
    refused(&["--dummy", "--no-overwrite"], &["--no-overwrite"]);
}

#[test]
fn lr_milestones_are_increasing_epochs_of_the_run() {
    for m in ["30,20", "0,10", "30,91", "-5"] {
        refused(&["--dummy", "--lr-milestones", m], &["--lr-milestones"]);
    }
    refused(
        &[
            "--dummy",
            "--lr-milestones",
            "30,60",
            "--lr-schedule",
            "cosine",
        ],
        &["--lr-milestones"],
    );
    let r = resolved(&["--dummy", "--lr-milestones", "30,60,90"]);
    assert!(same(
        &r["lr-milestones"],
        &toml::Value::Array(vec![30.into(), 60.into(), 90.into()])
    ));
}

#[test]
fn every_recipe_parses_to_its_own_values() {
    let recipes = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../recipes");
    let mut n = 0;
    for entry in std::fs::read_dir(&recipes).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        n += 1;
        let body = std::fs::read_to_string(&path).unwrap();
        assert!(
            body.lines()
                .take_while(|l| l.starts_with('#'))
                .any(|l| l.contains('%')),
            "{}: the header says the accuracy the recipe reaches",
            path.display()
        );
        let recipe: toml::Table = body.parse().unwrap();
        let r = resolved(&["--config", path.to_str().unwrap(), "/data/imagenet"]);
        for (key, want) in &recipe {
            assert!(
                same(&r[key], want),
                "{}: {key} = {} != {want}",
                path.display(),
                r[key]
            );
        }
    }
    assert!(n >= 5, "recipes/ has {n} recipes");
}

/// A tiny CPU run (one step of a narrow resnet18 on 32 px synthetic images) into `out`.
fn tiny(out: &Path) -> TinyTrain {
    TinyTrain::dummy(out).flags(
        "--width 8 --image-size 32 --val-crop 32 --val-resize 32 --batch-size 2 --epochs 1 \
         --steps-per-epoch 1 --workers 1",
    )
}

/// Trains [`tiny`] plus `extra` into `out`; the start line's learning-rate part, and the written config.toml.
fn tiny_run(out: &Path, extra: &[&str]) -> (String, String) {
    let t = tiny(out).args(extra);
    let o = run_in(Path::new("."), &t);
    let err = text(&o.stderr);
    assert!(o.status.success(), "rn50 {:?}: {err}", t.to_args());
    // The log line's message, after its time stamp and level.
    let start = err
        .lines()
        .find_map(|l| l.find("rn50 train:").map(|at| l[at..].to_string()))
        .expect("a start line");
    let config =
        std::fs::read_to_string(out.join("config.toml")).expect("config.toml in the run directory");
    (start, config)
}

#[test]
fn start_line_shows_the_effective_rate_and_config_toml_runs_the_same_again() {
    let dir = tempfile::tempdir().unwrap();
    let (start, config) = tiny_run(
        &dir.path().join("a"),
        &["--lr-base", "0.2", "--lr-base-size", "4"],
    );
    assert!(start.contains("lr 0.2 x 2/4 = 0.1 (--lr-base)"), "{start}");
    let (start, _) = tiny_run(&dir.path().join("b"), &["--lr", "0.05"]);
    assert!(start.contains("lr 0.05 (--lr)"), "{start}");
    let (start, _) = tiny_run(&dir.path().join("c"), &[]);
    assert!(
        start.contains("lr 0.1 x 2/256 = 0.0007813 (--lr-base)"),
        "{start}"
    );

    // config.toml is what the command line resolves to, and read back with --config it resolves the same.
    let out_a = dir.path().join("a");
    let mut direct = resolved_tiny(&tiny(&out_a).flags("--lr-base 0.2 --lr-base-size 4"));
    let mut written: toml::Table = config.parse().unwrap();
    // What config.toml adds: the precision and memory format the machine chose, and the [run] table. Width 8 on
    // a CPU resolves to NCHW (oneDNN's channels_last crashes below 16 channels).
    let run = written.remove("run").expect("a [run] table");
    assert!(written.contains_key("precision") && !direct.contains_key("precision"));
    direct.insert("precision".into(), written["precision"].clone());
    assert_eq!(
        (&direct["channels-last"], &direct["no-channels-last"]),
        (&false.into(), &false.into()),
        "neither given"
    );
    assert_eq!(
        (&written["channels-last"], &written["no-channels-last"]),
        (&false.into(), &true.into()),
        "resolved: NCHW"
    );
    for key in ["channels-last", "no-channels-last"] {
        direct.insert(key.into(), written[key].clone());
    }
    assert_eq!(written, direct);
    let saved = write(dir.path(), "again.toml", &config);
    assert_eq!(resolved(&["--config", &saved]), written);
    written.insert("run".into(), run);
    // A run started from it writes the same config.toml.
    let c = dir.path().join("c2");
    let o = rn50(&["train", "--config", &saved, "--out", c.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let again: toml::Table = std::fs::read_to_string(c.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(again, written);
}

/// Issue 25: every string flag is written to config.toml as a TOML string, however it looks, and reads back as
/// the same text: `--device 1` is `device = "1"` (not 1), DATA `0042` is `data = "<cwd>/0042"` (not a number,
/// which `--config` would refuse), `--init-weights 1e5` stays `1e5` (not 100000); an integer beyond i64 is a
/// string too.
#[test]
fn number_like_strings_stay_strings_through_config_toml() {
    let dir = tempfile::tempdir().unwrap();
    let cwd = std::env::current_dir().unwrap();
    let args = [
        "--init-weights",
        "1e5",
        "--device",
        "1",
        "--seed",
        "18446744073709551615",
        "0042",
    ];
    let r = resolved(&args);
    let absolute = |name: &str| cwd.join(name).to_str().unwrap().to_string();
    for (key, want) in [
        ("init-weights", absolute("1e5")),
        ("device", "1".into()),
        ("data", absolute("0042")),
        ("seed", "18446744073709551615".into()),
    ] {
        assert_eq!(r[key].as_str(), Some(want.as_str()), "{key}: {r:?}");
    }
    // Numbers stay numbers.
    assert_eq!(r["batch-size"].as_integer(), Some(256));
    assert_eq!(r["momentum"].as_float(), Some(0.9));
    let saved = write(dir.path(), "c.toml", &toml::to_string(&r).unwrap());
    assert_eq!(resolved(&["--config", &saved]), r);
}

/// Issue 25: a file's string that looks like a flag stays a value: DATA `--nesterov` is a folder of that name,
/// not the switch, and a flag's value `--overwrite` is that flag's value. Such a DATA given after `--` on the
/// command line round-trips through config.toml.
#[test]
fn a_string_that_looks_like_a_flag_stays_a_value() {
    let dir = tempfile::tempdir().unwrap();
    let file = write(
        dir.path(),
        "f.toml",
        "data = \"/--nesterov\"\ndevice = \"--overwrite\"\ninit-weights = \"/-b\"\n",
    );
    for extra in [&[][..], &["--"][..]] {
        let mut args = vec!["--config", &file];
        args.extend_from_slice(extra);
        let r = resolved(&args);
        assert_eq!(r["data"].as_str(), Some("/--nesterov"), "{args:?}: {r:?}");
        assert_eq!(r["nesterov"].as_bool(), Some(false), "{args:?}: {r:?}");
        assert_eq!(r["device"].as_str(), Some("--overwrite"), "{args:?}: {r:?}");
        assert_eq!(r["init-weights"].as_str(), Some("/-b"), "{args:?}: {r:?}");
        assert_eq!(r["batch-size"].as_integer(), Some(256), "{args:?}: {r:?}");
    }
    // The command line's DATA still wins.
    let r = resolved(&["--config", &file, "/cli"]);
    assert_eq!(r["data"].as_str(), Some("/cli"));
    let r = resolved(&["--", "/-j"]);
    assert_eq!(r["data"].as_str(), Some("/-j"));
    let saved = write(dir.path(), "c.toml", &toml::to_string(&r).unwrap());
    assert_eq!(resolved(&["--config", &saved]), r);
}

/// Issue 25: `--overwrite` (replace a used run directory) is decided on the command line each time: a file that
/// sets it is refused, naming the file and the key, whatever the command line says.
#[test]
fn overwrite_in_a_file_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for value in ["true", "false"] {
        let file = write(dir.path(), "o.toml", &format!("overwrite = {value}\n"));
        for extra in [&[][..], &["--overwrite"][..]] {
            let mut args = vec!["--dummy", "--config", &file];
            args.extend_from_slice(extra);
            refused(&args, &["o.toml", "`overwrite`", "command line"]);
        }
    }
}

/// Issue 26: a run's config.toml is portable. It leaves out `out` (so `rn50 train --config RUN/config.toml` alone
/// starts a new run in runs/train instead of being refused) and `--mllog` with its MLPerf flags (a log holds one
/// run, and would refuse the re-run), its paths are absolute (it runs from any
/// directory), it records what `--device auto` and the default precision resolved to, and in `[run]` the
/// processes, global batch, device and libtorch. Re-run with another global batch, it warns naming what differs;
/// given to a machine without the recorded device (a GPU run's file on this CPU machine), it is refused before
/// anything is written, naming the device.
#[test]
fn config_toml_is_portable_and_says_what_differs() {
    let dir = tempfile::tempdir().unwrap();
    let (here, elsewhere) = (dir.path().join("here"), dir.path().join("elsewhere"));
    std::fs::create_dir_all(&here).unwrap();
    std::fs::create_dir_all(&elsewhere).unwrap();
    // `--device auto` after TinyTrain's `--device cpu`: train takes a flag's last value.
    let t = tiny(Path::new("run")).flags("--mllog mlperf.log --submission-org us --device auto");
    let o = run_in(&here, &t);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let saved = here.join("run/config.toml");
    let config: toml::Table = std::fs::read_to_string(&saved).unwrap().parse().unwrap();
    for left_out in ["out", "mllog", "submission-org"] {
        assert!(!config.contains_key(left_out), "{left_out}: {config:?}");
    }
    assert_eq!(config["device"].as_str(), Some("cpu"), "auto resolved");
    let precision = config["precision"]
        .as_str()
        .expect("the resolved precision");
    assert!(["fp32", "bf16"].contains(&precision), "{precision}");
    let memory_format = (
        config["channels-last"].as_bool(),
        config["no-channels-last"].as_bool(),
    );
    assert_eq!(memory_format, (Some(false), Some(true)), "resolved NCHW");
    let run = config["run"].as_table().expect("[run]");
    assert_eq!(run["processes"].as_integer(), Some(1));
    assert_eq!(run["global-batch"].as_integer(), Some(2));
    assert!(
        run["device"].as_str().unwrap().starts_with("cpu ("),
        "{run:?}"
    );
    assert!(!run["libtorch"].as_str().unwrap().is_empty());

    // The file alone, from another directory: a new run in runs/train there, with the same config.toml.
    let saved = saved.to_str().unwrap();
    let o = rn50_in(&elsewhere, &["train", "--config", saved]);
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(!err.contains("other settings"), "nothing differs: {err}");
    let again: toml::Table = std::fs::read_to_string(elsewhere.join("runs/train/config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(again, config);

    // Another global batch: the run goes on, and says so.
    let o = rn50_in(
        &elsewhere,
        &["train", "--config", saved, "--out", "b4", "-b", "4"],
    );
    let err = text(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("global batch 2 → 4"), "{err}");

    // A GPU run's config.toml on this CPU-only machine: refused, naming the device; nothing written.
    let mut gpu = config.clone();
    gpu.insert("device".into(), "cuda".into());
    gpu.insert("precision".into(), "fp16".into());
    let gpu_file = write(dir.path(), "gpu.toml", &toml::to_string(&gpu).unwrap());
    let o = rn50_in(
        &elsewhere,
        &["train", "--config", &gpu_file, "--out", "gpu"],
    );
    let err = text(&o.stderr);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--device cuda") && err.contains("no CUDA device"),
        "{err}"
    );
    assert!(!elsewhere.join("gpu").exists(), "nothing written");
}

/// Issue 44, item 6: `--max-steps-per-epoch` is the flag's name, `--steps-per-epoch` its alias. A config.toml
/// written before the rename (`steps-per-epoch = N`) still runs: the key is read as the flag it is an alias of,
/// and the resolved flags (the new config.toml) name it `max-steps-per-epoch`. A file that gives it under both
/// names is the same flag twice, the later one winning as on the command line.
#[test]
fn steps_per_epoch_is_an_alias_in_config_files_too() {
    let dir = tempfile::tempdir().unwrap();
    let old = write(
        dir.path(),
        "old.toml",
        "dummy = true\nsteps-per-epoch = 3\n",
    );
    let new = write(
        dir.path(),
        "new.toml",
        "dummy = true\nmax-steps-per-epoch = 3\n",
    );
    let from_old = resolved(&["--config", &old]);
    assert_eq!(from_old["max-steps-per-epoch"].as_integer(), Some(3));
    assert!(!from_old.contains_key("steps-per-epoch"), "{from_old:?}");
    assert_eq!(from_old, resolved(&["--config", &new]));
    assert_eq!(from_old, resolved(&["--dummy", "--steps-per-epoch", "3"]));
    // The command line overrides the file under either name.
    let over = resolved(&["--config", &old, "--max-steps-per-epoch", "5"]);
    assert_eq!(over["max-steps-per-epoch"].as_integer(), Some(5));
    // And an old file trains: one epoch of its 2 steps, its config.toml naming the flag by its new name.
    let old_run = write(
        dir.path(),
        "old-run.toml",
        "dummy = true\narch = \"resnet18\"\ndevice = \"cpu\"\nwidth = 8\nimage-size = 32\n\
         batch-size = 2\nepochs = 1\nsteps-per-epoch = 2\nworkers = 1\n",
    );
    let run = dir.path().join("run");
    let o = rn50(&[
        "train",
        "--config",
        &old_run,
        "--out",
        run.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let summary: serde_json::Value =
        serde_json::from_slice(&std::fs::read(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps_per_epoch"], 2, "{summary}");
    let written: toml::Table = std::fs::read_to_string(run.join("config.toml"))
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(written["max-steps-per-epoch"].as_integer(), Some(2));
    assert!(!written.contains_key("steps-per-epoch"));
}

/// Issue 26: main.py's and timm's flags. Where the meaning is rn50's, the flag is an alias and resolves to the
/// same flags as rn50's own spelling; the rest are refused (exit 2) naming rn50's way, instead of clap's near-miss
/// tip (`--pretrained` → "a similar argument exists: '--print-freq'"). `--help` says that -b is per process.
#[test]
fn main_py_and_timm_flags_are_aliases_or_refused_with_rn50s_way() {
    let with = |flags: &[&str]| {
        let mut args = vec!["/data/imagenet"];
        args.extend_from_slice(flags);
        resolved(&args)
    };
    for (theirs, ours) in [
        ("--learning-rate 0.2", "--lr 0.2"),
        ("--model resnet18", "--arch resnet18"),
        ("--sched cosine", "--lr-schedule cosine"),
        ("--smoothing 0.1", "--label-smoothing 0.1"),
        ("--grad-accum-steps 2", "--accum-steps 2"),
        (
            "--sched cosine --min-lr 0.001",
            "--lr-schedule cosine --lr-end 0.001",
        ),
        ("--model-ema", "--ema 0.9998"),
        ("--model-ema --model-ema-decay 0.99", "--ema 0.99"),
        ("--model-ema-decay 0.99", "--ema 0.99"),
        ("--log-interval 5", "--print-freq 5"),
        ("--checkpoint-hist 4", "--keep-checkpoints 4"),
        ("--weight-decay 5e-5", "--wd 5e-5"),
        // timm's mixup/cutmix alphas and RepeatAugSampler; torchvision reference's sizes, warmup and EMA period.
        (
            "--mixup 0.2 --cutmix 1.0",
            "--mixup-alpha 0.2 --cutmix-alpha 1.0",
        ),
        ("--aug-repeats 4", "--ra-reps 4"),
        ("--train-crop-size 176", "--image-size 176"),
        (
            "--val-resize-size 232 --val-crop-size 224",
            "--val-resize 232 --val-crop 224",
        ),
        ("--lr-warmup-epochs 5", "--warmup-epochs 5"),
        (
            "--ema 0.999 --model-ema-steps 32",
            "--ema 0.999 --ema-steps 32",
        ),
    ] {
        let (a, b): (Vec<&str>, Vec<&str>) = (
            theirs.split_whitespace().collect(),
            ours.split_whitespace().collect(),
        );
        assert_eq!(with(&a), with(&b), "{theirs} vs {ours}");
    }
    // --output is --out (left out of the resolved flags, so seen through the run's start).
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("o");
    // After TinyTrain's `--out`, which it overrides (train takes a flag's last value).
    let not_out = dir.path().join("not-o");
    let o = run_in(
        Path::new("."),
        &tiny(&not_out).args(["--output".as_ref(), out.as_os_str()]),
    );
    assert!(o.status.success(), "{}", text(&o.stderr));
    assert!(out.join("config.toml").exists());
    assert!(!not_out.exists());

    for (flag, rn50_way) in [
        (&["--pretrained"][..], "--init-weights"),
        (&["--initial-checkpoint", "w.pth"], "--init-weights"),
        (&["--gpu", "0"], "--device cuda:N"),
        (&["--dist-url", "tcp://a:1"], "rn50 launch"),
        (&["--world-size", "2"], "rn50 launch"),
        (&["--rank", "0"], "torchrun"),
        (&["--multiprocessing-distributed"], "rn50 launch"),
        (&["--amp"], "--precision"),
        (&["--opt", "sgd"], "--optimizer"),
        (&["--start-epoch", "3"], "--resume"),
        (&["--decay-milestones", "30", "60"], "--lr-milestones"),
        (&["--aa", "rand-m9-mstd0.5"], "--auto-augment ta_wide"),
        (&["--reprob", "0.25"], "--random-erase P"),
        (&["--ra-sampler"], "--ra-reps N"),
        (&["--norm-weight-decay", "0"], "--no-bn-wd"),
        // timm's --img-size sizes training and evaluation alike: two flags in rn50 (issue 38, item 5).
        (&["--img-size", "160"], "--val-resize N/0.875 --val-crop N"),
    ] {
        let mut args = vec!["--dummy"];
        args.extend_from_slice(flag);
        refused(&args, &[flag[0], rn50_way, "main.py or timm"]);
        let err = text(&rn50_parse_only(&[&["train"][..], &args].concat()).stderr);
        assert!(!err.contains("similar argument"), "{flag:?}: {err}");
    }
    // In a config file too.
    let file = write(dir.path(), "f.toml", "gpu = 0\n");
    refused(
        &["--dummy", "--config", &file],
        &["--gpu", "--device cuda:N"],
    );

    let help = text(&rn50(&["train", "--help"]).stdout);
    let help = help.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        help.contains("Batch size per process (per GPU)")
            && help.contains("main.py's -b is per node"),
        "{help}"
    );
}
