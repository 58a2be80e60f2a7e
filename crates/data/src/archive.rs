//! Safe handling of tar members and of the archive file being read.
//!
//! Every member name is checked before anything is written: only regular files with relative
//! names made of plain components are accepted, and only their last component is ever used as
//! an output file name, so nothing can land outside the output folder.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::{bail, Context, Result};
use tar::EntryType;

use crate::verify::Md5Tee;

/// What a member of an archive turned out to be.
#[derive(Debug, PartialEq, Eq)]
pub enum Member {
    /// A regular file; the string is its final name component, safe to use as a file name.
    File(String),
    /// Something harmless that carries no data for us (a directory, a pax global header).
    Skip,
}

/// Classifies a member from its raw name and type, rejecting anything unsafe with an error that
/// names the member.
pub fn classify(raw_name: &[u8], kind: EntryType) -> Result<Member> {
    let shown = String::from_utf8_lossy(raw_name);
    let name = std::str::from_utf8(raw_name)
        .with_context(|| format!("member {shown:?}: name is not valid UTF-8"))?;
    if kind.is_pax_global_extensions() {
        return Ok(Member::Skip);
    }
    check_path(name)?;
    match kind {
        EntryType::Regular | EntryType::Continuous => {}
        EntryType::Directory => return Ok(Member::Skip),
        EntryType::Symlink => bail!("member {name:?} is a symbolic link: refused"),
        EntryType::Link => bail!("member {name:?} is a hard link: refused"),
        EntryType::Char | EntryType::Block => bail!("member {name:?} is a device file: refused"),
        EntryType::Fifo => bail!("member {name:?} is a FIFO: refused"),
        other => bail!("member {name:?} has unsupported tar entry type {other:?}: refused"),
    }
    let last = name
        .split('/')
        .rfind(|c| !c.is_empty() && *c != ".")
        .with_context(|| format!("member {name:?}: a file without a name"))?;
    Ok(Member::File(last.to_string()))
}

/// Rejects absolute names, `..` components and NUL bytes.
fn check_path(name: &str) -> Result<()> {
    if name.is_empty() {
        bail!("member with an empty name: refused");
    }
    if name.starts_with('/') {
        bail!("member {name:?} has an absolute path: refused");
    }
    if name.split('/').any(|c| c == "..") {
        bail!("member {name:?} contains '..': refused");
    }
    if name.contains('\0') {
        bail!("member {name:?} contains a NUL byte: refused");
    }
    Ok(())
}

/// True when `s` can be used as one folder or file name: non-empty, no separator, not `.`/`..`.
pub fn is_plain_component(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\0'])
}

/// An archive file opened for streaming: counts bytes, optionally hashes everything it reads
/// (so verifying costs no second pass), and turns the tar reader's skips into seeks when it is
/// not hashing.
pub struct Input {
    path: PathBuf,
    inner: BufReader<File>,
    len: u64,
    pos: u64,
    bytes_read: u64,
    hit_eof: bool,
    tee: Option<Md5Tee>,
    progress: Arc<AtomicU64>,
}

impl Input {
    pub fn open(path: &Path, hash: bool) -> Result<Input> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let len = file
            .metadata()
            .with_context(|| format!("reading the size of {}", path.display()))?
            .len();
        Ok(Input {
            path: path.to_path_buf(),
            inner: BufReader::with_capacity(1 << 20, file),
            len,
            pos: 0,
            bytes_read: 0,
            hit_eof: false,
            tee: hash.then(Md5Tee::spawn),
            progress: Arc::new(AtomicU64::new(0)),
        })
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Position in the file, shared so a progress bar can follow it.
    pub fn progress(&self) -> Arc<AtomicU64> {
        self.progress.clone()
    }

    /// True once a read came back empty: the tar reader met the end of the file where it wanted
    /// more, which a well-formed archive (ending in zero blocks) never does.
    pub fn hit_eof(&self) -> bool {
        self.hit_eof
    }

    /// Reads (and hashes) the rest of the file (the tar's zero padding), then returns the bytes
    /// read and the MD5 if hashing.
    pub fn finish(mut self) -> Result<(u64, Option<String>)> {
        {
            let mut buf = vec![0u8; 64 << 10];
            loop {
                let n = self
                    .read(&mut buf)
                    .with_context(|| format!("reading {}", self.path.display()))?;
                if n == 0 {
                    break;
                }
            }
        }
        let md5 = self.tee.take().map(Md5Tee::finish).transpose()?;
        Ok((self.bytes_read, md5))
    }
}

impl Read for Input {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.hit_eof = true;
        }
        if let Some(tee) = &mut self.tee {
            tee.update(&buf[..n]);
        }
        self.pos += n as u64;
        self.bytes_read += n as u64;
        self.progress.store(self.pos, Ordering::Relaxed);
        Ok(n)
    }
}

impl Seek for Input {
    /// Only forward relative seeks, which is all the tar reader asks for. When hashing, the
    /// skipped bytes are read (and hashed) instead.
    fn seek(&mut self, to: SeekFrom) -> io::Result<u64> {
        let SeekFrom::Current(delta) = to else {
            return Err(io::Error::other("only relative seeks are supported"));
        };
        let Ok(delta) = u64::try_from(delta) else {
            return Err(io::Error::other("backward seek not supported"));
        };
        if self.pos + delta > self.len {
            self.hit_eof = true;
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "archive ends inside a member (truncated file)",
            ));
        }
        if self.tee.is_some() {
            let mut left = delta;
            let mut buf = vec![0u8; left.min(1 << 20) as usize];
            while left > 0 {
                let want = left.min(buf.len() as u64) as usize;
                let n = self.read(&mut buf[..want])?;
                if n == 0 {
                    return Err(io::ErrorKind::UnexpectedEof.into());
                }
                left -= n as u64;
            }
        } else {
            self.inner.seek_relative(delta as i64)?;
            self.pos += delta;
            self.progress.store(self.pos, Ordering::Relaxed);
        }
        Ok(self.pos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_names_and_keeps_the_last_component() {
        let f = |n: &str| classify(n.as_bytes(), EntryType::Regular).unwrap();
        assert_eq!(
            f("n01440764_10026.JPEG"),
            Member::File("n01440764_10026.JPEG".into())
        );
        assert_eq!(f("./n01440764.tar"), Member::File("n01440764.tar".into()));
        assert_eq!(f("a/b/c.JPEG"), Member::File("c.JPEG".into()));
        assert_eq!(
            classify(b"dir/", EntryType::Directory).unwrap(),
            Member::Skip
        );
    }

    #[test]
    fn rejects_unsafe_members_naming_them() {
        let cases: &[(&str, EntryType, &str)] = &[
            ("/etc/passwd", EntryType::Regular, "absolute"),
            ("../x.JPEG", EntryType::Regular, "'..'"),
            ("a/../../x", EntryType::Regular, "'..'"),
            ("link.JPEG", EntryType::Symlink, "symbolic link"),
            ("hard.JPEG", EntryType::Link, "hard link"),
            ("null", EntryType::Char, "device"),
            ("sda", EntryType::Block, "device"),
            ("pipe", EntryType::Fifo, "FIFO"),
            ("../d", EntryType::Directory, "'..'"),
        ];
        for (name, kind, why) in cases {
            let err = classify(name.as_bytes(), *kind).unwrap_err().to_string();
            assert!(err.contains(name) && err.contains(why), "{name}: {err}");
        }
    }

    #[test]
    fn plain_components() {
        assert!(is_plain_component("n01440764"));
        for bad in ["", ".", "..", "a/b", "/a"] {
            assert!(!is_plain_component(bad), "{bad}");
        }
    }
}
