//! One process at a time per folder: an exclusive `flock` (std's `File::try_lock`) on a lock file in it, held
//! for the whole run, with the holder's PID written into the file for the message a second process prints. The
//! kernel drops the lock when the process ends, however it ends, so a killed run never leaves a stale lock; the
//! PID is only for the message. Used for every folder one rn50 process at a time may write: `prepare`'s `--out`,
//! `train`'s run directory.
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::Path;
use std::time::Duration;

/// How long a lock found held is tried again before it counts as another process's (25 tries 20 ms apart): a
/// process that spawns another (any `Command::spawn` of a multi-threaded program) shares its open files, and so its
/// locks, with the child until the child's exec closes them, so a lock its holder has just dropped can stay held
/// for that moment (microseconds; more on a loaded machine). Seen in the data suite: two `prepare` runs one after
/// the other in one test, the second refused as held by the test's own PID while another test spawned a process.
/// A real holder keeps it for its whole run, and the second process still refuses, half a second later.
const HELD_TRIES: u32 = 25;
const HELD_RETRY: Duration = Duration::from_millis(20);

/// An exclusive `flock` on a file, held for as long as this lives (or the process does).
#[derive(Debug)]
pub struct PidLock {
    _file: File,
}

/// What [`try_lock_pid`] found.
#[derive(Debug)]
pub enum Locked {
    Ours(PidLock),
    /// Another process holds it: "PID n", or "PID unknown" when it has not written its PID yet.
    HeldBy(String),
}

/// Takes an exclusive lock on `path` (created if missing) and writes this process's PID into it.
pub fn try_lock_pid(path: &Path) -> io::Result<Locked> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false) // the holder's PID is in it until the lock is ours
        .open(path)?;
    match until_free(|| file.try_lock()) {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Locked::HeldBy(holder_pid(&mut file))),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.write_all(pid.as_bytes()))?;
    Ok(Locked::Ours(PidLock { _file: file }))
}

/// The holder of the lock on `path` ("PID n"), if a process holds it right now (for half a second:
/// [`HELD_TRIES`]). Never creates the file, and takes nothing for longer than the test.
pub fn lock_holder(path: &Path) -> Option<String> {
    let mut file = File::open(path).ok()?;
    match until_free(|| file.try_lock_shared()) {
        Err(TryLockError::WouldBlock) => Some(holder_pid(&mut file)),
        _ => None,
    }
}

/// `try_lock` until it takes the lock, fails otherwise, or has found it held [`HELD_TRIES`] times.
fn until_free(try_lock: impl Fn() -> Result<(), TryLockError>) -> Result<(), TryLockError> {
    let mut tries = 1;
    loop {
        match try_lock() {
            Err(TryLockError::WouldBlock) if tries < HELD_TRIES => {
                tries += 1;
                std::thread::sleep(HELD_RETRY);
            }
            done => return done,
        }
    }
}

fn holder_pid(file: &mut File) -> String {
    let mut text = String::new();
    match file.read_to_string(&mut text) {
        Ok(_) if text.trim().parse::<u32>().is_ok() => format!("PID {}", text.trim()),
        // It has the lock but has not written its PID yet.
        _ => "PID unknown".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        assert_eq!(lock_holder(&path), None);
        let Locked::Ours(held) = try_lock_pid(&path).unwrap() else {
            panic!("a free lock is taken");
        };
        // flock locks belong to the open file, so a second open in this process conflicts exactly as another
        // process's would.
        let pid = format!("PID {}", std::process::id());
        assert!(matches!(try_lock_pid(&path).unwrap(), Locked::HeldBy(h) if h == pid));
        assert_eq!(lock_holder(&path), Some(pid));
        drop(held);
        assert_eq!(lock_holder(&path), None);
        assert!(matches!(try_lock_pid(&path).unwrap(), Locked::Ours(_)));
    }

    /// A child that shares the lock's open file (as a freshly spawned one does until its exec) keeps the lock
    /// after its holder drops it; the next taker waits the moment out instead of naming a holder that is gone.
    #[test]
    fn a_lock_a_spawned_child_shares_for_a_moment_is_taken_once_it_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("lock");
        let Locked::Ours(held) = try_lock_pid(&path).unwrap() else {
            panic!("a free lock is taken");
        };
        // The same open file as the child's stdin, for 50 ms.
        let shared = held._file.try_clone().unwrap();
        let mut child = std::process::Command::new("sleep")
            .arg("0.05")
            .stdin(shared)
            .spawn()
            .unwrap();
        drop(held);
        let got = try_lock_pid(&path).unwrap();
        assert!(child.wait().unwrap().success());
        assert!(matches!(got, Locked::Ours(_)), "{got:?}");
    }
}
