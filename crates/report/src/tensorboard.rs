//! TensorBoard scalars: event files that TensorBoard (and anything reading its format) shows as they are written.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use rn50_report::tensorboard::{EventWriter, FLUSH_EVERY};
//! let mut w = EventWriter::create("runs/r50/tensorboard".as_ref(), None, FLUSH_EVERY)?;
//! w.scalar("train/loss", 100, 2.31)?;
//! w.flush()?;
//! # Ok(())
//! # }
//! ```
//!
//! The tags rn50 writes ([`TAGS`]), all on one step axis, the optimizer steps taken (1 after the first step), as
//! PyTorch Lightning logs them and as a purge needs them (below): `train/loss` (the logged step's cross-entropy,
//! averaged over ranks), `train/acc1` (the logged step's top-1 over all ranks' images, percent: main.py's
//! `top1` meter of the batch), `train/lr` (the rate of the step) at every logged step; at each epoch's last step
//! `train/images_per_sec` (global, all ranks), `train/data_wait` (seconds per step waiting for the loader),
//! `io/read_gbps` (dataset reads, GB/s, from the /proc I/O monitor), and, when the epoch is evaluated,
//! `val/acc1`, `val/acc5` (percent) and `val/loss` (mean cross-entropy, without label smoothing), and with
//! `--ema` the same of the weights' average ([`EMA_TAGS`]: `val/ema_acc1`, `val/ema_acc5`, `val/ema_loss`).
//!
//! A resumed run writes a new file whose first event after the version is `SessionLog{status: START}` at the
//! first step it will log (`purge_step`), as PyTorch's `SummaryWriter(purge_step=…)` does: TensorBoard's
//! `EventAccumulator` then drops every event of the run's earlier files at that step or later, whatever its
//! tag or wall time, so the steps a killed run logged after its checkpoint are not shown twice. (TensorBoard's
//! Rust data server drops them per series instead, when a step comes again.) The files are read in name
//! order, which is their creation time.
//!
//! Events are buffered; a thread writes them to the file every `flush_every` (torch's `flush_secs`), and
//! [`flush`](EventWriter::flush) and dropping the writer write them at once.
//!
//! The format: one file `events.out.tfevents.<unix secs>.<host>.<pid>.<n>` (TensorBoard's own naming) of TFRecords (u64 length, masked CRC-32C
//! of the length, the data, masked CRC-32C of the data; little-endian), each an `Event` protobuf; the first is
//! `file_version: "brain.Event:2"` (with `source_metadata.writer: "rn50"`), then one `Event{wall_time, step, summary: Summary{value{tag, simple_value}}}`
//! per scalar. The messages are the few fields of tensorflow/core/util/event.proto and
//! tensorflow/core/framework/summary.proto that rn50 uses, declared with `prost`'s derive (no .proto compiler
//! at build time); CRC-32C comes from the `crc32c` crate. (`tensorboard-rs` is unmaintained.) The bytes are
//! checked against files TensorBoard's and PyTorch's own writers wrote (tests/suite/tensorboard.rs).
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use prost::Message;

/// The scalar tags rn50 writes (module documentation: what each one is).
pub const TAGS: [&str; 9] = [
    "train/loss",
    "train/acc1",
    "train/lr",
    "train/images_per_sec",
    "train/data_wait",
    "val/acc1",
    "val/acc5",
    "val/loss",
    "io/read_gbps",
];

/// The tags rn50 writes besides [`TAGS`] when training with `--ema`: the average's evaluation.
pub const EMA_TAGS: [&str; 3] = ["val/ema_acc1", "val/ema_acc5", "val/ema_loss"];

/// What the first record of every event file says (TensorBoard's `brain.Event:2`).
pub const FILE_VERSION: &str = "brain.Event:2";

/// The writer named in the first record's `source_metadata`.
pub const WRITER: &str = "rn50";

/// How long a written event may wait in the buffer: a live TensorBoard lags a minute at most (torch's
/// `SummaryWriter` waits up to 120 s).
pub const FLUSH_EVERY: Duration = Duration::from_secs(60);

/// Writes scalars to a new event file in a directory.
pub struct EventWriter {
    shared: Arc<Shared>,
    /// The thread that flushes every `flush_every`; joined on drop.
    flusher: Option<JoinHandle<()>>,
    path: PathBuf,
}

/// What the writer and its flushing thread share.
struct Shared {
    out: Mutex<Buffered>,
    /// Wakes the flushing thread when the writer closes.
    closing: Condvar,
}

struct Buffered {
    file: BufWriter<File>,
    /// The first error of a flush by the thread, returned by the writer's next call.
    error: Option<std::io::Error>,
    closed: bool,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it (never an existing one), with its version record;
    /// with `purge_step`, then `SessionLog{START}` at that step, which makes TensorBoard drop the events of the
    /// directory's earlier files at that step or later (module documentation). A thread writes what is
    /// buffered to the file every `flush_every`.
    pub fn create(
        dir: &Path,
        purge_step: Option<i64>,
        flush_every: Duration,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // Writers of one process get a sequence number, as TensorBoard's own do: two in the same second differ.
        static SEQUENCE: AtomicU64 = AtomicU64::new(0);
        let now = unix_now();
        let name = format!(
            "events.out.tfevents.{:010}.{}.{}.{}",
            now as u64,
            hostname(),
            std::process::id(),
            SEQUENCE.fetch_add(1, Ordering::Relaxed)
        );
        let path = dir.join(name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let shared = Arc::new(Shared {
            out: Mutex::new(Buffered {
                file: BufWriter::new(file),
                error: None,
                closed: false,
            }),
            closing: Condvar::new(),
        });
        let flusher = {
            let shared = Arc::clone(&shared);
            std::thread::Builder::new()
                .name("tensorboard-flush".into())
                .spawn(move || shared.flush_every(flush_every))
                .context("starting the TensorBoard flush thread")?
        };
        let mut w = Self {
            shared,
            flusher: Some(flusher),
            path,
        };
        w.record(&file_version_event(now))?;
        if let Some(step) = purge_step {
            w.record(&session_start_event(step, now))?;
        }
        Ok(w)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `tag` = `value` at `step`, stamped with the current time. The value is stored as a 32-bit float
    /// (TensorBoard's `simple_value`). Buffered: in the file after [`flush`](Self::flush), or within the
    /// writer's `flush_every`.
    pub fn scalar(&mut self, tag: &str, step: i64, value: f64) -> anyhow::Result<()> {
        self.scalar_at(tag, step, value, unix_now())
    }

    /// [`scalar`](Self::scalar) with the wall time given (seconds since the Unix epoch).
    pub fn scalar_at(
        &mut self,
        tag: &str,
        step: i64,
        value: f64,
        wall_time: f64,
    ) -> anyhow::Result<()> {
        self.record(&scalar_event(tag, step, value as f32, wall_time))
    }

    /// Writes what is buffered to the file.
    pub fn flush(&mut self) -> anyhow::Result<()> {
        let mut out = self.out()?;
        out.file
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    fn record(&mut self, data: &[u8]) -> anyhow::Result<()> {
        let mut out = self.out()?;
        out.file
            .write_all(&tf_record(data))
            .with_context(|| format!("writing {}", self.path.display()))
    }

    /// The buffered file, once an error of the flushing thread, if any, is returned.
    fn out(&self) -> anyhow::Result<MutexGuard<'_, Buffered>> {
        let mut out = self.shared.lock();
        match out.error.take() {
            Some(e) => Err(e).with_context(|| format!("writing {}", self.path.display())),
            None => Ok(out),
        }
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Buffered> {
        rn50_util::lock_unpoisoned(&self.out)
    }

    /// The flushing thread: writes the buffer to the file every `every` until the writer closes.
    fn flush_every(&self, every: Duration) {
        let mut out = self.lock();
        loop {
            out =
                rn50_util::unpoisoned(self.closing.wait_timeout_while(out, every, |o| !o.closed)).0;
            if out.closed {
                return;
            }
            if let Err(e) = out.file.flush() {
                out.error.get_or_insert(e);
            }
        }
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        self.shared.lock().closed = true;
        self.shared.closing.notify_all();
        if let Some(t) = self.flusher.take() {
            let _ = t.join();
        }
        let _ = self.shared.lock().file.flush();
    }
}

fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// This machine's name for the file name (TensorBoard's convention), `localhost` when unknown.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().replace(['/', '\0'], "_"))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// CRC-32C (Castagnoli), what TFRecord framing uses.
pub fn crc32c(data: &[u8]) -> u32 {
    crc32c::crc32c(data)
}

/// TFRecord's masked CRC: rotated right by 15 bits plus a constant.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    crc32c(data).rotate_right(15).wrapping_add(0xa282_ead8)
}

/// One TFRecord: length, its masked CRC, the data, its masked CRC.
pub fn tf_record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut r = Vec::with_capacity(data.len() + 16);
    r.extend_from_slice(&len);
    r.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    r.extend_from_slice(data);
    r.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    r
}

/// The fields of TensorBoard's `Event` (tensorflow/core/util/event.proto) that rn50 writes. `file_version`,
/// `summary` and `session_log` are members of the proto's `oneof what`: at most one is set.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Event {
    #[prost(double, tag = "1")]
    pub wall_time: f64,
    #[prost(int64, tag = "2")]
    pub step: i64,
    #[prost(string, optional, tag = "3")]
    pub file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    pub summary: Option<Summary>,
    #[prost(message, optional, tag = "7")]
    pub session_log: Option<SessionLog>,
    #[prost(message, optional, tag = "10")]
    pub source_metadata: Option<SourceMetadata>,
}

/// `Summary` (tensorflow/core/framework/summary.proto): its values.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Summary {
    #[prost(message, repeated, tag = "1")]
    pub value: Vec<SummaryValue>,
}

/// `Summary.Value` with a scalar: `simple_value` is a member of the proto's `oneof value`, so it is written even
/// when it is 0.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SummaryValue {
    #[prost(string, tag = "1")]
    pub tag: String,
    #[prost(float, optional, tag = "2")]
    pub simple_value: Option<f32>,
}

/// `SessionLog` (event.proto): rn50 writes only its status, `START` on resuming.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SessionLog {
    #[prost(enumeration = "SessionStatus", tag = "1")]
    pub status: i32,
}

/// `SessionLog.SessionStatus`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, prost::Enumeration)]
#[repr(i32)]
pub enum SessionStatus {
    Unspecified = 0,
    Start = 1,
    Stop = 2,
    Checkpoint = 3,
}

/// `SourceMetadata`: which program wrote the file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct SourceMetadata {
    #[prost(string, tag = "1")]
    pub writer: String,
}

/// `Event{wall_time, file_version: "brain.Event:2", source_metadata{writer: "rn50"}}`.
fn file_version_event(wall_time: f64) -> Vec<u8> {
    Event {
        wall_time,
        file_version: Some(FILE_VERSION.into()),
        source_metadata: Some(SourceMetadata {
            writer: WRITER.into(),
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// `Event{wall_time, step, session_log{status: START}}`, what torch's `SummaryWriter(purge_step=step)` writes.
fn session_start_event(step: i64, wall_time: f64) -> Vec<u8> {
    Event {
        wall_time,
        step,
        session_log: Some(SessionLog {
            status: SessionStatus::Start as i32,
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// `Event{wall_time, step, summary{value{tag, simple_value}}}`.
fn scalar_event(tag: &str, step: i64, value: f32, wall_time: f64) -> Vec<u8> {
    Event {
        wall_time,
        step,
        summary: Some(Summary {
            value: vec![SummaryValue {
                tag: tag.into(),
                simple_value: Some(value),
            }],
        }),
        ..Default::default()
    }
    .encode_to_vec()
}

/// One scalar read back from an event file.
#[derive(Clone, Debug, PartialEq)]
pub struct Scalar {
    pub tag: String,
    pub step: i64,
    pub value: f32,
    pub wall_time: f64,
}

/// The events of a TFRecord event file, each record's two masked CRC-32Cs checked: an error names the first
/// damaged or truncated record.
pub fn read_events(path: &Path) -> anyhow::Result<Vec<Event>> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let mut events = Vec::new();
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let n = events.len();
        let bad = || anyhow::anyhow!("{}: record {n} is damaged or cut short", path.display());
        let (len_bytes, tail) = rest.split_at_checked(8).ok_or_else(bad)?;
        let len = usize::try_from(u64::from_le_bytes(len_bytes.try_into()?))?;
        let crc = |b: &[u8]| u32::from_le_bytes(b.try_into().expect("4 bytes"));
        let end = len
            .checked_add(8)
            .filter(|&e| e <= tail.len())
            .ok_or_else(bad)?;
        let data = &tail[4..4 + len];
        if crc(&tail[..4]) != masked_crc32c(len_bytes)
            || crc(&tail[4 + len..end]) != masked_crc32c(data)
        {
            return Err(bad());
        }
        events.push(Event::decode(data).map_err(|e| bad().context(e))?);
        rest = &tail[end..];
    }
    Ok(events)
}

/// Every scalar of an event file, in the order written.
pub fn read_scalars(path: &Path) -> anyhow::Result<Vec<Scalar>> {
    let mut out = Vec::new();
    for e in read_events(path)? {
        for v in e.summary.into_iter().flat_map(|s| s.value) {
            if let Some(value) = v.simple_value {
                out.push(Scalar {
                    tag: v.tag,
                    step: e.step,
                    value,
                    wall_time: e.wall_time,
                });
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_standard_check_values() {
        // The CRC catalogue's check value for CRC-32/ISCSI, and RFC 3720's 32 bytes of zeros and of 0xff.
        assert_eq!(crc32c(b"123456789"), 0xE306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8A91_36AA);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62A8_AB43);
        assert_eq!(crc32c(b""), 0);
    }

    #[test]
    fn events_read_back_as_written_and_damage_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path(), None, FLUSH_EVERY).unwrap();
        w.scalar_at("train/loss", -1, 2.5, 10.0).unwrap();
        w.scalar_at("val/acc1", 3, 0.0, 11.0).unwrap();
        w.flush().unwrap();
        let got = read_scalars(w.path()).unwrap();
        assert_eq!(
            got.iter()
                .map(|s| (s.tag.as_str(), s.step, s.value))
                .collect::<Vec<_>>(),
            [("train/loss", -1, 2.5), ("val/acc1", 3, 0.0)]
        );
        let mut bytes = std::fs::read(w.path()).unwrap();
        let n = bytes.len();
        bytes[n - 6] ^= 1;
        std::fs::write(w.path(), &bytes[..]).unwrap();
        let err = read_scalars(w.path()).unwrap_err().to_string();
        assert!(err.contains("record 2 is damaged"), "{err}");
        std::fs::write(w.path(), &bytes[..n - 3]).unwrap();
        assert!(read_scalars(w.path()).is_err());
    }
}
