//! TensorBoard scalars: event files that TensorBoard (and anything reading its format) shows as they are written.
//!
//! ```no_run
//! # fn main() -> anyhow::Result<()> {
//! use rn50_report::tensorboard::EventWriter;
//! let mut w = EventWriter::create("runs/r50/tensorboard".as_ref())?;
//! w.scalar("train/loss", 100, 2.31)?;
//! w.flush()?;
//! # Ok(())
//! # }
//! ```
//!
//! The tags rn50 writes ([`TAGS`]), with the step being the optimizer step for `train/*` and `io/*` and the epoch
//! for `val/*`: `train/loss` (mean cross-entropy over the logged steps), `train/lr` (the rate of the step),
//! `train/images_per_sec` (global, all ranks), `train/data_wait` (seconds per step waiting for the loader),
//! `val/acc1` and `val/acc5` (percent), `io/read_gbps` (dataset reads, GB/s, from the /proc I/O monitor).
//!
//! The format: one file `events.out.tfevents.<unix secs>.<host>.<pid>.<n>` (TensorBoard's own naming) of TFRecords (u64 length, masked CRC-32C
//! of the length, the data, masked CRC-32C of the data; little-endian), each an `Event` protobuf; the first is
//! `file_version: "brain.Event:2"` (with `source_metadata.writer: "rn50"`), then one `Event{wall_time, step, summary: Summary{value{tag, simple_value}}}`
//! per scalar. The protobuf fields are encoded here by hand (a few fields; tensorflow/core/util/event.proto,
//! tensorflow/core/framework/summary.proto; CRC-32C comes from the `crc32c` crate): `tensorboard-rs`
//! is unmaintained, and a protobuf crate with code generation would be more code than the encoder. The bytes are
//! checked against a file TensorBoard's own writer wrote (tests/tensorboard.rs).
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;

/// The scalar tags rn50 writes (module documentation: what each one is).
pub const TAGS: [&str; 7] = [
    "train/loss",
    "train/lr",
    "train/images_per_sec",
    "train/data_wait",
    "val/acc1",
    "val/acc5",
    "io/read_gbps",
];

/// What the first record of every event file says (TensorBoard's `brain.Event:2`).
pub const FILE_VERSION: &str = "brain.Event:2";

/// The writer named in the first record's `source_metadata`.
pub const WRITER: &str = "rn50";

/// Writes scalars to a new event file in a directory.
pub struct EventWriter {
    out: BufWriter<File>,
    path: PathBuf,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it (never an existing one), with its version record.
    pub fn create(dir: &Path) -> anyhow::Result<Self> {
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
        let mut w = Self {
            out: BufWriter::new(file),
            path,
        };
        w.record(&file_version_event(now))?;
        Ok(w)
    }

    /// The event file being written.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends `tag` = `value` at `step`, stamped with the current time. The value is stored as a 32-bit float
    /// (TensorBoard's `simple_value`). Buffered: call [`flush`](Self::flush) for readers to see it.
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
        self.out
            .flush()
            .with_context(|| format!("writing {}", self.path.display()))
    }

    fn record(&mut self, data: &[u8]) -> anyhow::Result<()> {
        self.out
            .write_all(&tf_record(data))
            .with_context(|| format!("writing {}", self.path.display()))
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        let _ = self.out.flush();
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

// Protobuf wire types.
const VARINT: u8 = 0;
const FIXED64: u8 = 1;
const LEN: u8 = 2;
const FIXED32: u8 = 5;

fn key(out: &mut Vec<u8>, field: u8, wire: u8) {
    out.push(field << 3 | wire);
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u8, data: &[u8]) {
    key(out, field, LEN);
    varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

/// `Event{wall_time = 1, step = 2}` as proto3 writes them: fields at their default value are left out.
fn event_header(wall_time: f64, step: i64) -> Vec<u8> {
    let mut e = Vec::new();
    if wall_time != 0.0 {
        key(&mut e, 1, FIXED64);
        e.extend_from_slice(&wall_time.to_le_bytes());
    }
    if step != 0 {
        key(&mut e, 2, VARINT);
        varint(&mut e, step as u64); // int64: negative numbers are ten-byte two's complement varints
    }
    e
}

/// `Event{wall_time, file_version = 3, source_metadata = 10: SourceMetadata{writer = 1: "rn50"}}`.
fn file_version_event(wall_time: f64) -> Vec<u8> {
    let mut e = event_header(wall_time, 0);
    bytes_field(&mut e, 3, FILE_VERSION.as_bytes());
    let mut source = Vec::new();
    bytes_field(&mut source, 1, WRITER.as_bytes());
    bytes_field(&mut e, 10, &source);
    e
}

/// `Event{wall_time, step, summary = 5: Summary{value = 1: Value{tag = 1, simple_value = 2}}}`.
fn scalar_event(tag: &str, step: i64, value: f32, wall_time: f64) -> Vec<u8> {
    let mut v = Vec::new();
    bytes_field(&mut v, 1, tag.as_bytes());
    key(&mut v, 2, FIXED32);
    v.extend_from_slice(&value.to_le_bytes());
    let mut summary = Vec::new();
    bytes_field(&mut summary, 1, &v);
    let mut e = event_header(wall_time, step);
    bytes_field(&mut e, 5, &summary);
    e
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
    fn varints_and_negative_steps() {
        let mut v = Vec::new();
        varint(&mut v, 300);
        assert_eq!(v, [0xac, 0x02]);
        let e = event_header(0.0, -1);
        assert_eq!(e.len(), 1 + 10);
        assert_eq!(
            e[1..],
            [0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]
        );
    }
}
