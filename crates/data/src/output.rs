//! The output tree, its completion markers, and file writing with clear errors.
//!
//! Markers live in `DIR/.rn50-prepare/`, outside `train/` and `val/`, so ImageFolder never
//! mistakes them for classes. A marker is written (atomically: temp file, fsync, rename) only after everything
//! it vouches for has been written and the folder re-read to match, so an interrupted run never
//! leaves a marker for a partial folder. The markers are also the archive's index: each lists
//! every file written, with its size and CRC-32, which is what `check` (and a re-run) compare
//! the disk with, and how `prepare` tells its own files from a user's.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// Paths of the output tree.
#[derive(Debug, Clone)]
pub struct Layout {
    pub out: PathBuf,
}

impl Layout {
    pub fn new(out: &Path) -> Layout {
        Layout {
            out: out.to_path_buf(),
        }
    }
    pub fn train(&self) -> PathBuf {
        self.out.join("train")
    }
    pub fn val(&self) -> PathBuf {
        self.out.join("val")
    }
    pub fn state(&self) -> PathBuf {
        self.out.join(".rn50-prepare")
    }
    pub fn class_markers(&self) -> PathBuf {
        self.state().join("train")
    }
    pub fn class_marker(&self, wnid: &str) -> PathBuf {
        self.class_markers().join(format!("{wnid}.json"))
    }
    pub fn train_done(&self) -> PathBuf {
        self.state().join("train.done.json")
    }
    pub fn val_done(&self) -> PathBuf {
        self.state().join("val.done.json")
    }
    /// Held (flock) by the running `prepare`; holds its PID.
    pub fn lock(&self) -> PathBuf {
        self.state().join("lock")
    }
    /// Exists while a class is being extracted: its folder, without a marker, is `prepare`'s
    /// partial work (redone), not a user's (refused without `--force`).
    pub fn class_started(&self, wnid: &str) -> PathBuf {
        self.class_markers().join(format!("{wnid}.started"))
    }
    /// The same for the val tree.
    pub fn val_started(&self) -> PathBuf {
        self.state().join("val.started")
    }
}

/// One file as written: its size and CRC-32.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct FileRecord {
    pub bytes: u64,
    pub crc32: u32,
}

impl FileRecord {
    pub fn of(data: &[u8]) -> FileRecord {
        FileRecord {
            bytes: data.len() as u64,
            crc32: crc32fast::hash(data),
        }
    }
}

/// File name → record, for one folder.
pub type Manifest = BTreeMap<String, FileRecord>;

/// A file that is not a plain RGB/grayscale JPEG, found while extracting.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OddRecord {
    /// Path relative to the output folder, e.g. `train/n01739381/n01739381_1309.JPEG`.
    pub file: String,
    pub kind: String,
    /// Re-encoded as an RGB JPEG (`--fix-odd-files`).
    pub fixed: bool,
}

/// Written when one training class folder is complete.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClassMarker {
    pub images: u64,
    pub bytes: u64,
    pub odd: Vec<OddRecord>,
    /// Every file written. Empty in markers of rn50 before the manifest (counts only).
    #[serde(default)]
    pub files: Manifest,
}

/// Written when a whole archive has been extracted.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ArchiveMarker {
    /// File name of the archive.
    pub archive: String,
    pub size: u64,
    /// Set when the archive was verified against the checksum table.
    pub md5: Option<String>,
    pub images: u64,
    /// Images per class.
    pub classes: BTreeMap<String, u64>,
    pub odd: Vec<OddRecord>,
    /// Val: every file written, by class (train keeps them in its class markers). Empty in
    /// markers of rn50 before the manifest.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub files: BTreeMap<String, Manifest>,
}

pub fn read_json<T: DeserializeOwned>(path: &Path) -> Result<Option<T>> {
    match std::fs::read(path) {
        Ok(bytes) => serde_json::from_slice(&bytes).map(Some).with_context(|| {
            format!(
                "reading marker {} (delete it to redo that part)",
                path.display()
            )
        }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_error(e, "reading", path)),
    }
}

/// Writes JSON atomically and durably ([`rn50_util::atomic_write`]).
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(value).context("serialising a marker")?;
    rn50_util::atomic_write(path, &bytes).map_err(|e| io_error(e, "writing", path))
}

/// Creates (or replaces) a file with the given contents.
pub fn write_file(path: &Path, data: &[u8]) -> Result<()> {
    let mut f = File::create(path).map_err(|e| io_error(e, "creating", path))?;
    f.write_all(data).map_err(|e| io_error(e, "writing", path))
}

/// Removes a file; one that is not there is fine.
pub fn remove_file_if_any(path: &Path) -> Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(io_error(e, "removing", path)),
        _ => Ok(()),
    }
}

pub fn create_dir_all(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path).map_err(|e| io_error(e, "creating folder", path))
}

/// Removes a folder left by an interrupted run (never follows a symlink: it removes the link).
pub fn remove_dir_all(path: &Path) -> Result<()> {
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_error(e, "inspecting", path)),
        Ok(m) if m.is_dir() => {
            std::fs::remove_dir_all(path).map_err(|e| io_error(e, "removing partial folder", path))
        }
        Ok(_) => std::fs::remove_file(path).map_err(|e| io_error(e, "removing", path)),
    }
}

/// Wraps an I/O error with the action and path; a full disk gets a message that says so.
pub fn io_error(e: io::Error, action: &str, path: &Path) -> anyhow::Error {
    let full = matches!(
        e.kind(),
        io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded
    );
    if full {
        anyhow!(
            "disk full while {action} {}: {e}; free some space and run the same command again \
             (completed classes are kept)",
            path.display()
        )
    } else {
        anyhow!("{action} {}: {e}", path.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disk_full_is_reported_as_such() {
        // /dev/full fails every write with ENOSPC, as a full disk does.
        let err = write_file(Path::new("/dev/full"), b"data")
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("disk full while writing /dev/full"),
            "{err}"
        );
        let other = write_file(Path::new("/nonexistent-dir/x"), b"data")
            .unwrap_err()
            .to_string();
        assert!(other.starts_with("creating /nonexistent-dir/x"), "{other}");
    }

    #[test]
    fn markers_round_trip_atomically() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.json");
        assert_eq!(read_json::<ClassMarker>(&path).unwrap(), None);
        let m = ClassMarker {
            images: 3,
            bytes: 10,
            odd: vec![],
            files: Manifest::from([("a.JPEG".to_string(), FileRecord::of(b"0123456789"))]),
        };
        write_json_atomic(&path, &m).unwrap();
        assert_eq!(read_json::<ClassMarker>(&path).unwrap(), Some(m));
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, vec!["m.json"]);
        // A marker from an rn50 before per-file records still reads (counts only).
        std::fs::write(&path, br#"{"images": 3, "bytes": 10, "odd": []}"#).unwrap();
        let old = read_json::<ClassMarker>(&path).unwrap().unwrap();
        assert_eq!((old.images, old.files.len()), (3, 0));
        std::fs::write(&path, b"{trunc").unwrap();
        let err = format!("{:#}", read_json::<ClassMarker>(&path).unwrap_err());
        assert!(err.contains("m.json"), "{err}");
    }
}
