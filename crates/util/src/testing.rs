//! Helpers for the crates' own test binaries (built with the `testing` feature, which their dev-dependencies
//! enable): no production code calls these, and they add no dependency.
//!
//! - where the shared test data is ([`shared_data`], its ImageNet photos [`shared_photos`]) and the Python that
//!   reference scripts run under ([`python`]);
//! - [`serial`]: tests that start many processes, one at a time;
//! - for tests of the commands that stop on request ([`crate::stop`]), a Ctrl-C sent once the command under test
//!   got somewhere ([`sigint_when`]).
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The repository's root (this crate is `crates/util` in it).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shared test data (real photos, archives): `RN50_SHARED_DATA`, else `<repo>/../shared/data`. Panics,
/// saying so, if it has no `jpeg/` folder.
pub fn shared_data() -> PathBuf {
    let p = std::env::var_os("RN50_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/data"));
    assert!(
        p.join("jpeg").is_dir(),
        "shared test data not found at {} (set RN50_SHARED_DATA)",
        p.display()
    );
    p
}

/// The 220 shared ImageNet sample photos (`jpeg/imagenet/<wnid>.JPEG`, one per class), sorted by path (so by
/// WordNet id).
pub fn shared_photos() -> Vec<PathBuf> {
    let dir = shared_data().join("jpeg/imagenet");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    assert!(
        v.len() >= 200,
        "expected the 220 shared ImageNet photos in {}",
        dir.display()
    );
    v
}

/// The Python with torch and torchvision that reference scripts run under: `RN50_PYTHON`, else the repo's
/// `.venv` (what `./dev setup` makes).
pub fn python() -> PathBuf {
    std::env::var_os("RN50_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"))
}

/// Holds the test binary's one lock: tests that take it run one at a time (multi-process tests: on a 2-core
/// machine, several jobs at once only make each slow enough to time out). A test that panicked while holding it
/// does not poison it for the others.
pub fn serial() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    crate::lock_unpoisoned(&LOCK)
}

/// Sends this process one SIGINT (a user's Ctrl-C) from a thread as soon as `ready()` holds (looked at every
/// millisecond), e.g. once a command under test has finished its first unit of work. The thread panics with
/// `never` if `ready()` does not hold within 5 minutes: join it after the command returned.
pub fn sigint_when(
    ready: impl Fn() -> bool + Send + 'static,
    never: &'static str,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(300) {
            if ready() {
                // SAFETY: kill(2) on this process's own id, with a signal number; no memory is involved.
                let sent = unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                assert_eq!(sent, 0, "kill -INT: {}", std::io::Error::last_os_error());
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{never}");
    })
}
