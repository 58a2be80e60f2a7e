//! Replacing a file so that a crash at any moment leaves either the old file or the new one, complete.
//!
//! The one recipe, with the strongest guarantee: write a temporary file in the same folder (a rename is atomic
//! only within one file system), fsync it (else the rename can reach the disk before the data and a power cut
//! leaves an empty file under the final name), rename it over the final name, fsync the folder (else the rename
//! itself can be lost). The temporary file is `.NAME.tmpPID`: hidden, next to its target, and owned by a process
//! that [`remove_stale_temps`] can ask about once a writer has been killed (kill -9, node failure) and left it.
use std::ffi::OsStr;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Writes `contents` to `path` atomically and durably (see the module doc).
pub fn atomic_write(path: &Path, contents: &[u8]) -> io::Result<()> {
    atomic_write_with(path, |tmp| {
        let mut f = File::create(tmp)?;
        f.write_all(contents)?;
        f.sync_all()
    })
}

/// Runs `write` on a temporary path next to `path` (for writers that take a path, such as safetensors), then
/// [`persist`]s it as `path`. On any error the temporary file is removed and `path` is left as it was.
pub fn atomic_write_with<E: From<io::Error>>(
    path: &Path,
    write: impl FnOnce(&Path) -> Result<(), E>,
) -> Result<(), E> {
    let tmp = Partial::new(path)?;
    write(tmp.path())?;
    Ok(tmp.persist(path)?)
}

/// A writer's temporary file ([`temp_path`]), removed when dropped unless [`Partial::persist`] put it in place:
/// a writer that stops half way (a full disk, an error of its own, a panic) leaves nothing behind.
pub struct Partial {
    tmp: PathBuf,
    persisted: bool,
}

impl Partial {
    /// The temporary file of this process's write of `path` (not created here).
    pub fn new(path: &Path) -> io::Result<Self> {
        Ok(Self {
            tmp: temp_path(path)?,
            persisted: false,
        })
    }

    /// Where to write.
    pub fn path(&self) -> &Path {
        &self.tmp
    }

    /// [`persist`]s the file written as `path`.
    pub fn persist(mut self, path: &Path) -> io::Result<()> {
        persist(&self.tmp, path)?;
        self.persisted = true;
        Ok(())
    }
}

impl Drop for Partial {
    fn drop(&mut self) {
        if !self.persisted {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// Points the symbolic link `link` at `target`, replacing an existing link atomically: readers see the old
/// target or the new one, never no link.
pub fn atomic_symlink(target: &Path, link: &Path) -> io::Result<()> {
    let tmp = temp_path(link)?;
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp)?;
    std::fs::rename(&tmp, link)
        .and_then(|()| sync_dir(link))
        .inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
}

/// The last step of [`atomic_write_with`], for writers that stream into a temporary file of their own choosing
/// (it must be on the same file system as `path`): fsyncs `tmp`, renames it over `path`, fsyncs the folder.
pub fn persist(tmp: &Path, path: &Path) -> io::Result<()> {
    File::open(tmp)?.sync_all()?;
    std::fs::rename(tmp, path)?;
    sync_dir(path)
}

/// `.NAME.tmpPID` next to `path`: the temporary name of this process's atomic writes of `path`.
pub fn temp_path(path: &Path) -> io::Result<PathBuf> {
    let name = path.file_name().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a file path", path.display()),
        )
    })?;
    Ok(folder(path).join(format!(
        ".{}.tmp{}",
        name.to_string_lossy(),
        std::process::id()
    )))
}

/// Removes the temporary files in `dir` of writers that are no longer running (see [`is_stale_temp`]), so that
/// one writing there right now keeps its own. Best effort: what cannot be listed or removed is left.
pub fn remove_stale_temps(dir: &Path) {
    remove_stale_temps_of(dir, |_| true);
}

/// [`remove_stale_temps`] of the files whose final name `of` accepts (NAME of `.NAME.tmpPID`): in a folder that
/// is the user's, only those of the files being written there.
pub fn remove_stale_temps_of(dir: &Path, of: impl Fn(&str) -> bool) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let name = e.file_name();
            let target = name.to_str().and_then(temp_target).map(|(t, _)| t);
            if target.is_some_and(&of) && is_stale_temp(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The NAME and PID of a temporary file's name, `.NAME.tmpPID` (or `.NAME.linkPID`, as rn50 before this crate
/// named the latest-checkpoint link's); None for other names.
fn temp_target(name: &str) -> Option<(&str, i32)> {
    let rest = name.strip_prefix('.')?;
    let (target, pid) = rest
        .rsplit_once(".tmp")
        .or_else(|| rest.rsplit_once(".link"))?;
    let digits = !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit());
    let pid = pid.parse::<i32>().ok().filter(|&p| digits && p > 0)?;
    Some((target, pid))
}

/// Whether `name` is a temporary file of an rn50 process that is gone: `.NAME.tmpPID`, or `.NAME.linkPID` as
/// rn50 before this crate named the latest-checkpoint link's.
pub fn is_stale_temp(name: &OsStr) -> bool {
    match name.to_str().and_then(temp_target) {
        Some((_, pid)) => {
            // SAFETY: signal 0 only asks whether the process exists (EPERM: it does, as another user's).
            let rc = unsafe { libc::kill(pid, 0) };
            rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH)
        }
        None => false,
    }
}

fn folder(path: &Path) -> &Path {
    path.parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
}

/// Makes a rename in `path`'s folder durable.
fn sync_dir(path: &Path) -> io::Result<()> {
    File::open(folder(path))?.sync_all()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The names in `dir`, in order.
    fn names(dir: &Path) -> BTreeSet<String> {
        let entries = std::fs::read_dir(dir).unwrap();
        entries
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    }

    #[test]
    fn writes_replace_whole_files_and_leave_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.json");
        atomic_write(&path, b"old").unwrap();
        atomic_write(&path, b"new").unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let err = atomic_write_with(&path, |tmp| {
            std::fs::write(tmp, b"half")?;
            Err(io::Error::other("disk on fire"))
        })
        .unwrap_err();
        assert_eq!(err.to_string(), "disk on fire");
        assert_eq!(
            std::fs::read(&path).unwrap(),
            b"new",
            "a failed write keeps the old file"
        );
        assert_eq!(names(dir.path()), BTreeSet::from(["a.json".to_string()]));
        assert!(atomic_write(Path::new("/nonexistent-dir/x"), b"x").is_err());
        assert!(
            atomic_write(Path::new("/"), b"x").is_err(),
            "not a file path"
        );
    }

    #[test]
    fn symlinks_are_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let link = dir.path().join("latest");
        for target in ["one", "two"] {
            std::fs::write(dir.path().join(target), target).unwrap();
            atomic_symlink(Path::new(target), &link).unwrap();
            assert_eq!(std::fs::read_to_string(&link).unwrap(), target);
        }
        assert_eq!(
            names(dir.path()),
            BTreeSet::from(["latest", "one", "two"].map(String::from))
        );
    }

    #[test]
    fn removes_temporary_files_of_dead_writers_only() {
        let dir = tempfile::tempdir().unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let ours = temp_path(&dir.path().join("b.json")).unwrap();
        let stale = [format!(".a.json.tmp{dead}"), format!(".latest.link{dead}")];
        let kept = [
            ".b.json.tmp".to_string() + &std::process::id().to_string(),
            ".notes.tmpfile".to_string(),
            "a.json".to_string(),
            format!("c.tmp{dead}"),
        ];
        for f in stale.iter().chain(&kept) {
            std::fs::write(dir.path().join(f), b"x").unwrap();
        }
        remove_stale_temps(dir.path());
        assert_eq!(names(dir.path()), BTreeSet::from(kept.clone()));
        assert_eq!(ours, dir.path().join(&kept[0]));
    }
}
