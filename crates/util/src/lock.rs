//! One process at a time per folder: an exclusive `flock` (std's `File::try_lock`) on a lock file in it, held
//! for the whole run, with the holder's PID written into the file for the message a second process prints. The
//! kernel drops the lock when the process ends, however it ends, so a killed run never leaves a stale lock; the
//! PID is only for the message. Used for every folder one rn50 process at a time may write: `prepare`'s `--out`,
//! `train`'s run directory.
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{self, Read, Write};
use std::path::Path;

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
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => return Ok(Locked::HeldBy(holder_pid(&mut file))),
        Err(TryLockError::Error(e)) => return Err(e),
    }
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.write_all(pid.as_bytes()))?;
    Ok(Locked::Ours(PidLock { _file: file }))
}

/// The holder of the lock on `path` ("PID n"), if a process holds it right now. Never creates the file, and
/// takes nothing for longer than the test.
pub fn lock_holder(path: &Path) -> Option<String> {
    let mut file = File::open(path).ok()?;
    match file.try_lock_shared() {
        Err(TryLockError::WouldBlock) => Some(holder_pid(&mut file)),
        _ => None,
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
}
