//! One `prepare` at a time per output folder.
//!
//! Two runs on one `--out` delete each other's partial classes (each redoes a class folder it
//! finds without a marker) and can leave a marker for a folder the other emptied. So `prepare`
//! holds an exclusive `flock` (std's `File::try_lock`) on `DIR/.rn50-prepare/lock` for the whole
//! run, and a second run refuses at once, naming the holder. The kernel drops the lock when the
//! process ends, however it ends, so a killed run never leaves a stale lock; the PID written
//! into the file is only for the message.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::path::Path;

use anyhow::{bail, Result};

use crate::output::{create_dir_all, io_error, Layout};

/// An exclusive `flock` on a file, held for as long as this lives (or the process does).
#[derive(Debug)]
pub struct PidLock {
    _file: File,
}

/// What [`try_lock_pid`] found.
pub enum Locked {
    Ours(PidLock),
    /// Another process holds it: "PID n", or "PID unknown" when it has not written its PID yet.
    HeldBy(String),
}

/// Takes an exclusive lock on `path` (created if missing) and writes this process's PID into it, for the
/// message another process that finds it held prints. Used for every folder one rn50 process at a time may
/// write: `prepare`'s `--out`, `train`'s run directory.
pub fn try_lock_pid(path: &Path) -> std::io::Result<Locked> {
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

/// Takes the lock on `layout.out`, or says who holds it.
pub fn lock_output(layout: &Layout) -> Result<PidLock> {
    create_dir_all(&layout.state())?;
    let path = layout.lock();
    match try_lock_pid(&path) {
        Ok(Locked::Ours(lock)) => Ok(lock),
        Ok(Locked::HeldBy(holder)) => bail!(
            "{}: another rn50 prepare ({holder}) is writing this folder; wait for it to finish (or \
             stop it), then run this again. Two runs on one --out would delete each other's work",
            layout.out.display(),
        ),
        Err(e) => Err(io_error(e, "locking", &path).context(
            "prepare locks its output folder so that two runs cannot overlap; this file \
             system does not support flock: use a local --out",
        )),
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

/// For `check`: the PID of the `prepare` writing `layout.out` right now, if one is. Never
/// creates or takes anything for longer than the test.
pub fn running_prepare(layout: &Layout) -> Option<String> {
    let path = layout.lock();
    let mut file = File::open(&path).ok()?;
    match file.try_lock_shared() {
        Err(TryLockError::WouldBlock) => Some(holder_pid(&mut file)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_is_refused_naming_the_holder_and_freed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path());
        assert_eq!(running_prepare(&layout), None);
        let held = lock_output(&layout).unwrap();
        // flock locks belong to the open file, so a second open in this process conflicts
        // exactly as another process's would.
        let err = lock_output(&layout).unwrap_err().to_string();
        let pid = format!("PID {}", std::process::id());
        assert!(
            err.contains(&pid) && err.contains("another rn50 prepare"),
            "{err}"
        );
        assert_eq!(running_prepare(&layout), Some(pid));
        drop(held);
        assert_eq!(running_prepare(&layout), None);
        lock_output(&layout).unwrap();
    }
}
