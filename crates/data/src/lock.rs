//! One `prepare` at a time per output folder.
//!
//! Two runs on one `--out` delete each other's partial classes (each redoes a class folder it
//! finds without a marker) and can leave a marker for a folder the other emptied. So `prepare`
//! holds [`rn50_util::lock`]'s PID lock on `DIR/.rn50-prepare/lock` for the whole run, and a
//! second run refuses at once, naming the holder.

use anyhow::{bail, Result};
use rn50_util::{lock_holder, remove_stale_temps, try_lock_pid, Locked, PidLock};

use crate::output::{create_dir_all, io_error, Layout};

/// Takes the lock on `layout.out`, or says who holds it.
pub fn lock_output(layout: &Layout) -> Result<PidLock> {
    create_dir_all(&layout.state())?;
    let path = layout.lock();
    match try_lock_pid(&path) {
        Ok(Locked::Ours(lock)) => {
            // Markers a killed run was writing: theirs, now that no other prepare can be writing here.
            remove_stale_temps(&layout.state());
            remove_stale_temps(&layout.class_markers());
            Ok(lock)
        }
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

/// For `check`: the PID of the `prepare` writing `layout.out` right now, if one is. Never
/// creates or takes anything for longer than the test.
pub fn running_prepare(layout: &Layout) -> Option<String> {
    lock_holder(&layout.lock())
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
