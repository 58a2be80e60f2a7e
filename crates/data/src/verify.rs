//! Size and MD5 checks against the table of official archives.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::thread::JoinHandle;

use anyhow::{anyhow, bail, Context, Result};
use crossbeam_channel::{bounded, Receiver, Sender};
use md5::{Digest, Md5};

use crate::progress::Progress;

/// The official ILSVRC2012 archives: `file<TAB>bytes<TAB>md5<TAB>sha256`.
const ARCHIVES_TSV: &str = include_str!("../assets/archives.tsv");

/// Expected size and MD5 of one archive.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expected {
    pub bytes: u64,
    pub md5: String,
}

/// Archives known by file name.
#[derive(Debug, Clone)]
pub struct ArchiveTable(BTreeMap<String, Expected>);

impl ArchiveTable {
    /// The built-in table of the official ILSVRC2012 archives.
    pub fn builtin() -> ArchiveTable {
        ArchiveTable::parse(ARCHIVES_TSV).expect("the built-in archives.tsv parses")
    }

    /// Reads a table in the same TSV layout (header line, then `file bytes md5 [sha256]`).
    pub fn from_file(path: &Path) -> Result<ArchiveTable> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading checksum table {}", path.display()))?;
        ArchiveTable::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    pub fn parse(text: &str) -> Result<ArchiveTable> {
        let mut map = BTreeMap::new();
        for (i, line) in text.lines().enumerate() {
            let cols: Vec<&str> = line.split('\t').collect();
            if line.trim().is_empty() || line.starts_with('#') || cols[0] == "file" {
                continue;
            }
            let (Some(bytes), Some(md5)) = (cols.get(1), cols.get(2)) else {
                bail!("line {}: expected file<TAB>bytes<TAB>md5", i + 1);
            };
            let bytes = bytes
                .parse()
                .with_context(|| format!("line {}: bad size {bytes:?}", i + 1))?;
            let md5 = md5.to_ascii_lowercase();
            if md5.len() != 32 || !md5.bytes().all(|b| b.is_ascii_hexdigit()) {
                bail!("line {}: bad MD5 {md5:?}", i + 1);
            }
            map.insert(cols[0].to_string(), Expected { bytes, md5 });
        }
        Ok(ArchiveTable(map))
    }

    /// The entry for an archive, looked up by its file name.
    pub fn lookup(&self, path: &Path) -> Result<&Expected> {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        self.0.get(&name).ok_or_else(|| {
            let known: Vec<&str> = self.0.keys().map(String::as_str).collect();
            anyhow!(
                "{}: cannot verify: {name:?} is not in the checksum table (known: {})",
                path.display(),
                known.join(", ")
            )
        })
    }

    /// Checks the file's size before anything is read, so a wrong file fails at once.
    pub fn check_size(&self, path: &Path) -> Result<&Expected> {
        let expected = self.lookup(path)?;
        let actual = std::fs::metadata(path)
            .with_context(|| format!("reading the size of {}", path.display()))?
            .len();
        if actual != expected.bytes {
            bail!(
                "{}: size mismatch: expected {} bytes, actual {actual} bytes",
                path.display(),
                expected.bytes
            );
        }
        Ok(expected)
    }
}

/// Compares a computed MD5 with the expected one.
pub fn check_md5(path: &Path, expected: &Expected, actual: &str) -> Result<()> {
    if actual != expected.md5 {
        bail!(
            "{}: MD5 mismatch: expected {}, actual {actual}",
            path.display(),
            expected.md5
        );
    }
    Ok(())
}

/// The result of verifying one file.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verified {
    pub file: PathBuf,
    pub bytes: u64,
    pub md5: String,
}

/// Verifies files (size, then MD5), hashing up to `threads` files at once. Every file is
/// checked; the error lists each one that failed.
pub fn verify_files(
    files: &[PathBuf],
    table: &ArchiveTable,
    threads: usize,
) -> Result<Vec<Verified>> {
    let progress = Progress::new();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results: Vec<std::sync::Mutex<Option<Result<Verified>>>> =
        files.iter().map(|_| Default::default()).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.clamp(1, files.len().max(1)) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(path) = files.get(i) else { break };
                let r = verify_one(path, table, &progress);
                *results[i].lock().unwrap() = Some(r);
            });
        }
    });
    let mut ok = Vec::new();
    let mut errors = Vec::new();
    for r in results {
        match r.into_inner().unwrap() {
            Some(Ok(v)) => ok.push(v),
            Some(Err(e)) => errors.push(format!("{e:#}")),
            None => errors.push("internal error: a file was not verified".into()),
        }
    }
    if !errors.is_empty() {
        bail!(
            "verification failed for {} of {} files:\n  {}",
            errors.len(),
            files.len(),
            errors.join("\n  ")
        );
    }
    Ok(ok)
}

fn verify_one(path: &Path, table: &ArchiveTable, progress: &Progress) -> Result<Verified> {
    let expected = table.check_size(path)?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let bar = progress.bytes_bar(&format!("md5 {name}"), expected.bytes);
    let mut file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut hasher = Md5::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut total = 0u64;
    loop {
        let n = file
            .read(&mut buf)
            .with_context(|| format!("reading {}", path.display()))?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        total += n as u64;
        bar.set_position(total);
    }
    bar.finish_and_clear();
    let md5 = hex(&hasher.finalize());
    check_md5(path, expected, &md5)?;
    Ok(Verified {
        file: path.to_path_buf(),
        bytes: total,
        md5,
    })
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hashes a byte stream on its own thread, so MD5 (about one core's worth at disk speed) does
/// not slow the thread that reads the archive. Bytes are batched to keep channel traffic low.
pub struct Md5Tee {
    batch: Vec<u8>,
    tx: Option<Sender<Vec<u8>>>,
    recycle: Receiver<Vec<u8>>,
    thread: Option<JoinHandle<String>>,
}

const TEE_BATCH: usize = 4 << 20;

impl Md5Tee {
    pub fn spawn() -> Md5Tee {
        let (tx, rx) = bounded::<Vec<u8>>(4);
        let (back_tx, back_rx) = bounded::<Vec<u8>>(8);
        let thread = std::thread::spawn(move || {
            let mut hasher = Md5::new();
            for batch in rx {
                hasher.update(&batch);
                let _ = back_tx.try_send(batch);
            }
            hex(&hasher.finalize())
        });
        Md5Tee {
            batch: Vec::with_capacity(TEE_BATCH),
            tx: Some(tx),
            recycle: back_rx,
            thread: Some(thread),
        }
    }

    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let take = data.len().min(TEE_BATCH - self.batch.len());
            self.batch.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.batch.len() == TEE_BATCH {
                self.flush();
            }
        }
    }

    fn flush(&mut self) {
        let mut next = self.recycle.try_recv().unwrap_or_default();
        next.clear();
        next.reserve(TEE_BATCH);
        let full = std::mem::replace(&mut self.batch, next);
        if let Some(tx) = &self.tx {
            // The hashing thread only stops when the sender is dropped, so this cannot fail
            // unless it panicked, which `finish` reports.
            let _ = tx.send(full);
        }
    }

    pub fn finish(mut self) -> Result<String> {
        if !self.batch.is_empty() {
            self.flush();
        }
        drop(self.tx.take());
        self.thread
            .take()
            .expect("finish is called once")
            .join()
            .map_err(|_| anyhow!("the MD5 thread panicked"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_table_has_the_official_archives() {
        let t = ArchiveTable::builtin();
        let train = t.lookup(Path::new("/x/ILSVRC2012_img_train.tar")).unwrap();
        assert_eq!(train.bytes, 147_897_477_120);
        assert_eq!(train.md5, "1d675b47d978889d74fa0da5fadfb00e");
        let val = t.lookup(Path::new("ILSVRC2012_img_val.tar")).unwrap();
        assert_eq!(val.bytes, 6_744_924_160);
        let err = t.lookup(Path::new("other.tar")).unwrap_err().to_string();
        assert!(err.contains("other.tar") && err.contains("ILSVRC2012_img_val.tar"));
    }

    #[test]
    fn tee_matches_a_direct_hash_across_batch_boundaries() {
        let data: Vec<u8> = (0..(TEE_BATCH * 2 + 12345))
            .map(|i| (i * 7) as u8)
            .collect();
        let mut tee = Md5Tee::spawn();
        for piece in data.chunks(777_777) {
            tee.update(piece);
        }
        assert_eq!(tee.finish().unwrap(), hex(&Md5::digest(&data)));
        assert_eq!(
            Md5Tee::spawn().finish().unwrap(),
            "d41d8cd98f00b204e9800998ecf8427e"
        );
    }
}
