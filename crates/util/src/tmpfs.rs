//! A real full disk for tests: a tmpfs of a few MiB mounted on a folder for as long as a [`Tmpfs`] lives
//! (`mount -t tmpfs -o size=BYTES tmpfs DIR`; root only), unmounted when it is dropped, panicking test or not.
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A mounted tmpfs, unmounted on drop.
pub struct Tmpfs {
    dir: PathBuf,
}

impl Tmpfs {
    /// Mounts a tmpfs of `bytes` (rounded up to whole pages by the kernel) on the existing folder `dir`. An error
    /// when this process may not mount (not root).
    pub fn mount(dir: &Path, bytes: u64) -> io::Result<Self> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
            .arg(dir)
            .output()?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "mount -t tmpfs on {} (tests of a full disk need root): {}",
                dir.display(),
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        Ok(Self {
            dir: dir.to_path_buf(),
        })
    }

    /// Where it is mounted.
    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Lazily: a file a failed test left open must not keep the mount.
        let _ = Command::new("umount").arg("-l").arg(&self.dir).status();
    }
}
