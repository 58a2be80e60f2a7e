//! What a hostile but realistic user did to `prepare` (issue 12): two runs on one `--out` at
//! once, a tree damaged after (or by) a run, and user files in `--out`. Each test does the real
//! thing: separate processes, truncated archives, zeroed and empty images on disk.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use common::*;
use rn50_data::cli::{run, PrepareArgs};
use rn50_data::prepare;
use rn50_data::{check, Expect};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: PrepareArgs,
}

fn cli(args: &[&str]) -> anyhow::Result<()> {
    let c = Cli::try_parse_from(std::iter::once("prepare").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    run(&c.cmd)
}

fn p(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

/// Arguments for the child process, one a line.
const CHILD_ARGS: &str = "RN50_TEST_PREPARE_ARGS";

/// Not a test of its own: with `RN50_TEST_PREPARE_ARGS` set, this test binary is
/// `rn50 prepare ARGS` in a process of its own (exit status 0 or 1, error on stderr), so two
/// of them can run at once. Ignored, so that a normal run does not count it as a passing test:
/// `Child::spawn` runs it with `--ignored`. A no-op without the child's environment.
#[test]
#[ignore = "a child process of second_prepare_on_the_same_out_refuses_naming_the_first"]
fn prepare_as_a_child_process() {
    let Ok(args) = std::env::var(CHILD_ARGS) else {
        return;
    };
    let args: Vec<&str> = args.lines().collect();
    let code = match cli(&args) {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            1
        }
    };
    std::process::exit(code);
}

/// A child `prepare` process; stopped ones are continued and killed when the test ends.
struct Child(std::process::Child);

impl Child {
    fn spawn(args: &[&str]) -> Child {
        let exe = std::env::current_exe().unwrap();
        Child(
            Command::new(exe)
                .args(["--exact", "safety::prepare_as_a_child_process", "--ignored"])
                .args(["--nocapture", "-q"])
                .args(["--test-threads", "1"])
                .env(CHILD_ARGS, args.join("\n"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.0.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig} {}", self.0.id());
    }

    /// Waits until every thread of the process is stopped (state `T` in /proc): `kill -STOP` returns before
    /// the signal has reached threads that are running on another CPU, which may still write a file or two.
    fn wait_stopped(&self) {
        let tasks = format!("/proc/{}/task", self.0.id());
        let start = Instant::now();
        loop {
            let stopped = std::fs::read_dir(&tasks).unwrap().all(|t| {
                let stat =
                    std::fs::read_to_string(t.unwrap().path().join("stat")).unwrap_or_default();
                // The state follows the command name, which is in parentheses.
                stat.rsplit_once(") ")
                    .is_some_and(|(_, rest)| rest.starts_with('T'))
            });
            if stopped {
                return;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "{} did not stop",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Waits at most `limit`; returns the exit code and stderr.
    fn wait(mut self, limit: Duration) -> (i32, String) {
        let start = Instant::now();
        while self.0.try_wait().unwrap().is_none() {
            assert!(
                start.elapsed() < limit,
                "prepare (PID {}) still running after {limit:?}",
                self.0.id()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut err = String::new();
        use std::io::Read;
        self.0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (self.0.wait().unwrap().code().unwrap_or(-1), err)
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = Command::new("kill")
                .args(["-CONT", &self.0.id().to_string()])
                .status();
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

/// A train tar big enough (10,000 small real JPEGs in 50 classes) that extracting it takes
/// a while, so a second run can be started during it.
fn big_train_tar(dir: &Path) -> (PathBuf, u64) {
    let photo = std::fs::read(shared_data().join("jpeg/imagenet/n03825788.JPEG")).unwrap();
    let mut outer = Vec::new();
    for c in 0..50 {
        let wnid = format!("n{:08}", 1_000_000 + c);
        let members: Vec<(String, Vec<u8>)> = (0..200)
            .map(|i| (format!("{wnid}_{i}.JPEG"), photo.clone()))
            .collect();
        outer.push((format!("{wnid}.tar"), tar_of(&members)));
    }
    let path = dir.join("ILSVRC2012_img_train.tar");
    std::fs::write(&path, tar_of(&outer)).unwrap();
    (path, 50 * 200)
}

/// Every path under `root`, relative, sorted.
fn paths(root: &Path) -> Vec<String> {
    all_paths(root)
        .iter()
        .map(|q| p(q.strip_prefix(root).unwrap()))
        .collect()
}

// Item 5: two `prepare` on one --out at once.

#[test]
fn second_prepare_on_the_same_out_refuses_naming_the_first() {
    let dir = tempfile::tempdir().unwrap();
    let (tar, images) = big_train_tar(dir.path());
    let out = dir.path().join("out");
    let args = ["--train-tar", &p(&tar), "--out", &p(&out), "-j", "1"];
    let first = Child::spawn(&args);
    // Freeze the first run once it is extracting, so the second surely overlaps it.
    let start = Instant::now();
    while !out.join("train").is_dir() {
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the first prepare never started extracting"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    first.signal("-STOP");
    first.wait_stopped();
    let before = paths(&out);

    let (code, err) = Child::spawn(&args).wait(Duration::from_secs(60));
    assert_eq!(code, 1, "the second prepare must refuse: {err}");
    assert!(
        err.contains(&format!("PID {}", first.0.id())) && err.contains("another rn50 prepare"),
        "{err}"
    );
    assert_eq!(paths(&out), before, "the refused run changed the tree");

    first.signal("-CONT");
    let (code, err) = first.wait(Duration::from_secs(120));
    assert_eq!(code, 0, "the first prepare must finish: {err}");
    let r = check(&out, Expect::Auto).unwrap();
    assert!(r.ok(), "{:?}", r.problems);
    assert_eq!((r.train_images, r.train_classes), (images, 50));
    // The lock went with the process: a third run is let in (and has nothing to do).
    let s = prepare(&options(Some(&tar), None, &out)).unwrap();
    assert_eq!((s.train_images, s.bytes_read), (images, 0));
}

#[test]
fn rerun_redoes_marked_classes_and_val_whose_files_are_gone() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let opts = options(Some(&fx.train_tar), Some(&fx.val_tar), &out);
    prepare(&opts).unwrap();
    // What a run that another one overlapped leaves: marked classes missing files or holding
    // short ones, and a val tree missing one.
    let of = |prefix: &str| -> Vec<String> {
        fx.expected
            .keys()
            .filter(|k| k.starts_with(prefix))
            .cloned()
            .collect()
    };
    let c1 = of(&format!("train/{}/", fx.classes[1]));
    std::fs::remove_file(out.join(&c1[0])).unwrap();
    std::fs::remove_file(out.join(&c1[1])).unwrap();
    let c3 = of(&format!("train/{}/", fx.classes[3]));
    std::fs::write(out.join(&c3[0]), b"").unwrap();
    std::fs::remove_file(out.join(&of("val/")[5])).unwrap();

    let s = prepare(&opts).unwrap();
    assert_same_tree(&read_tree(&out), &fx.expected);
    assert_eq!((s.train_classes_extracted, s.train_classes_skipped), (2, 4));
    assert_eq!(s.val_images, 24);
    assert!(check(&out, Expect::Auto).unwrap().ok());
}

// Item 6: `check` compares the tree with what the archive held.

fn problems(out: &Path, deep: bool) -> Vec<String> {
    let json = out.with_extension("check.json");
    let mut args = vec!["check".to_string(), p(out), "--json".into(), p(&json)];
    if deep {
        args.push("--deep".into());
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let status = cli(&args);
    let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let problems: Vec<String> = r["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    assert_eq!(status.is_ok(), problems.is_empty(), "{problems:?}");
    problems
}

#[test]
fn check_fails_after_a_prepare_that_stopped_and_says_how_to_finish() {
    let fx = build();
    let out = fx.dir.path().join("out");
    // A train tar cut inside its fifth class (an interrupted download): prepare fails after
    // completing four classes.
    let full = std::fs::read(&fx.train_tar).unwrap();
    let at = full
        .windows(fx.classes[4].len() + 4)
        .position(|w| w == format!("{}.tar", fx.classes[4]).as_bytes())
        .unwrap();
    let cut = fx.dir.path().join("cut/ILSVRC2012_img_train.tar");
    std::fs::create_dir_all(cut.parent().unwrap()).unwrap();
    std::fs::write(&cut, &full[..at + 2000]).unwrap();
    assert!(prepare(&options(Some(&cut), None, &out)).is_err());

    let found = problems(&out, false);
    assert!(
        found
            .iter()
            .any(|m| m.starts_with("train:") && m.contains("run the same prepare command again")),
        "{found:?}"
    );
    // The advice works.
    prepare(&options(Some(&fx.train_tar), None, &out)).unwrap();
    assert_eq!(problems(&out, true), Vec::<String>::new());
}

#[test]
fn check_finds_empty_and_zeroed_images_and_its_advice_fixes_them() {
    let fx = build();
    let out = fx.dir.path().join("out");
    prepare(&options(Some(&fx.train_tar), Some(&fx.val_tar), &out)).unwrap();
    let train: Vec<&String> = fx
        .expected
        .keys()
        .filter(|k| k.starts_with("train/"))
        .collect();
    let val: Vec<&String> = fx
        .expected
        .keys()
        .filter(|k| k.starts_with("val/"))
        .collect();
    // A 0-byte train image and a 0-byte val image (a full disk, a crash before writeback),
    // and a train image zeroed in place (same size).
    std::fs::write(out.join(train[0]), b"").unwrap();
    std::fs::write(out.join(val[3]), b"").unwrap();
    let zeroed = train.last().unwrap();
    std::fs::write(out.join(zeroed), vec![0u8; fx.expected[*zeroed].len()]).unwrap();

    let name = |rel: &str| rel.rsplit('/').next().unwrap().to_string();
    let found = problems(&out, false);
    for rel in [train[0], val[3]] {
        assert!(
            found
                .iter()
                .any(|m| m.contains(&name(rel)) && m.contains("0 bytes")),
            "{rel}: {found:?}"
        );
    }
    assert!(
        !found.iter().any(|m| m.contains(&name(zeroed))),
        "same size: only --deep reads contents"
    );
    let deep = problems(&out, true);
    let zeroed_line = deep
        .iter()
        .find(|m| m.contains(&name(zeroed)))
        .unwrap_or_else(|| panic!("--deep must find the zeroed image: {deep:?}"));
    assert!(zeroed_line.contains("delete"), "{zeroed_line}");

    // The advice: run prepare again for the empty ones; delete the class folder of the zeroed
    // one first (same size: a re-run alone cannot see it).
    let class = zeroed.rsplit_once('/').unwrap().0;
    std::fs::remove_dir_all(out.join(class)).unwrap();
    prepare(&options(Some(&fx.train_tar), Some(&fx.val_tar), &out)).unwrap();
    assert_same_tree(&read_tree(&out), &fx.expected);
    assert_eq!(problems(&out, true), Vec::<String>::new());
}

#[test]
fn check_names_the_fix_for_a_foreign_class_folder_and_it_works() {
    let fx = build();
    let out = fx.dir.path().join("out");
    let (train, val) = (p(&fx.train_tar), p(&fx.val_tar));
    let args = ["--train-tar", &train, "--val-tar", &val, "--out", &p(&out)];
    cli(&args).unwrap();
    let foreign = out.join("train/my_class");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("x.JPEG"), photo_bytes()).unwrap();
    std::fs::write(out.join("val/README.txt"), b"notes").unwrap();

    let found = problems(&out, false);
    let line = found
        .iter()
        .find(|m| m.contains("train/my_class"))
        .unwrap_or_else(|| panic!("{found:?}"));
    assert!(line.contains("--force"), "{line}");
    // A plain re-run does not fix it (and must not delete it)...
    assert!(cli(&args).is_err());
    assert!(foreign.join("x.JPEG").exists());
    // ...the named fix does.
    let mut forced = args.to_vec();
    forced.push("--force");
    cli(&forced).unwrap();
    assert!(!foreign.exists());
    assert_same_tree(&read_tree(&out), &fx.expected);
    assert_eq!(problems(&out, true), Vec::<String>::new());
}

fn photo_bytes() -> Vec<u8> {
    std::fs::read(&photos()[0]).unwrap()
}

// Weak spot: user files in --out.

#[test]
fn prepare_refuses_an_out_holding_user_files_unless_forced() {
    let fx = build();
    let out = fx.dir.path().join("out");
    // A hand-made tree: one of the archive's classes (which prepare would redo) holding the
    // user's own image, and a val/ of the user's.
    let mine = out.join("train").join(&fx.classes[2]).join("mine.JPEG");
    std::fs::create_dir_all(mine.parent().unwrap()).unwrap();
    std::fs::write(&mine, photo_bytes()).unwrap();
    let notes = out.join("val/notes.txt");
    std::fs::create_dir_all(notes.parent().unwrap()).unwrap();
    std::fs::write(&notes, b"my notes").unwrap();
    let before = paths(&out);

    let (train, val) = (p(&fx.train_tar), p(&fx.val_tar));
    let args = ["--train-tar", &train, "--val-tar", &val, "--out", &p(&out)];
    let err = format!("{:#}", cli(&args).unwrap_err());
    assert!(
        err.contains("mine.JPEG") && err.contains("notes.txt") && err.contains("--force"),
        "{err}"
    );
    assert_eq!(std::fs::read(&mine).unwrap(), photo_bytes());
    assert_eq!(std::fs::read(&notes).unwrap(), b"my notes");
    assert!(
        paths(&out)
            .iter()
            .all(|q| before.contains(q) || q.starts_with(".rn50-prepare")),
        "the refused run wrote into train/ or val/: {:?}",
        paths(&out)
    );

    // Files next to train/ and val/ are never touched: no refusal for them.
    let out2 = fx.dir.path().join("out2");
    std::fs::create_dir_all(&out2).unwrap();
    std::fs::write(out2.join("README"), b"mine").unwrap();
    cli(&["--train-tar", &train, "--out", &p(&out2)]).unwrap();
    assert_eq!(std::fs::read(out2.join("README")).unwrap(), b"mine");

    let mut forced = args.to_vec();
    forced.push("--force");
    cli(&forced).unwrap();
    assert!(!mine.exists() && !notes.exists());
    assert_same_tree(&read_tree(&out), &fx.expected);
}
