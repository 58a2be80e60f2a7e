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

use anyhow::{bail, Result};

use crate::output::{create_dir_all, io_error, Layout};

/// Held for as long as it lives.
#[derive(Debug)]
pub struct OutputLock {
    _file: File,
}

/// Takes the lock on `layout.out`, or says who holds it.
pub fn lock_output(layout: &Layout) -> Result<OutputLock> {
    create_dir_all(&layout.state())?;
    let path = layout.lock();
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false) // the holder's PID is in it until the lock is ours
        .open(&path)
        .map_err(|e| io_error(e, "opening", &path))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => bail!(
            "{}: another rn50 prepare ({}) is writing this folder; wait for it to finish (or \
             stop it), then run this again. Two runs on one --out would delete each other's work",
            layout.out.display(),
            holder_pid(&mut file)
        ),
        Err(TryLockError::Error(e)) => {
            return Err(io_error(e, "locking", &path).context(
                "prepare locks its output folder so that two runs cannot overlap; this file \
                 system does not support flock: use a local --out",
            ))
        }
    }
    let pid = format!("{}\n", std::process::id());
    file.set_len(0)
        .and_then(|()| file.write_all(pid.as_bytes()))
        .map_err(|e| io_error(e, "writing", &path))?;
    Ok(OutputLock { _file: file })
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
