//! The TensorBoard event writer against files TensorBoard's and PyTorch's own writers wrote (fixtures/tensorboard/,
//! from make_golden.py with the same scalars and wall times): the same records byte for byte, and the CRCs in
//! their files are the ones this crate computes.
use std::path::{Path, PathBuf};
use std::time::Duration;

use rn50_report::tensorboard::{
    masked_crc32c, read_scalars, EventWriter, FILE_VERSION, FLUSH_EVERY, WRITER,
};

/// (tag, step, value, wall time), as in make_golden.py.
const SCALARS: [(&str, i64, f64, f64); 4] = [
    ("train/loss", 0, 2.5, 1700000000.25),
    ("train/lr", 1, 0.1, 1700000001.5),
    ("train/images_per_sec", 1234567, 0.0, 1700000002.0),
    ("val/acc1", 3, 76.13, 1700000003.75),
];

/// The records of a TFRecord file, each one's two masked CRC-32Cs checked.
fn records(file: &[u8]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut rest = file;
    while !rest.is_empty() {
        assert!(rest.len() >= 16, "a truncated record");
        let (len_bytes, tail) = rest.split_at(8);
        let len = u64::from_le_bytes(len_bytes.try_into().unwrap()) as usize;
        let crc = |b: &[u8]| u32::from_le_bytes(b.try_into().unwrap());
        assert_eq!(crc(&tail[..4]), masked_crc32c(len_bytes), "length CRC");
        let data = &tail[4..4 + len];
        assert_eq!(
            crc(&tail[4 + len..8 + len]),
            masked_crc32c(data),
            "data CRC"
        );
        out.push(data.to_vec());
        rest = &tail[8 + len..];
    }
    out
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tensorboard")
        .join(name)
}

fn golden() -> Vec<Vec<u8>> {
    records(&std::fs::read(fixture("tensorboard-2.21.tfevents")).unwrap())
}

/// `Event.file_version` and `source_metadata.writer`, after the 9 bytes of `wall_time`.
fn version_fields(writer: &str) -> Vec<u8> {
    let mut v = vec![0x1a, FILE_VERSION.len() as u8];
    v.extend_from_slice(FILE_VERSION.as_bytes());
    v.extend_from_slice(&[0x52, writer.len() as u8 + 2, 0x0a, writer.len() as u8]);
    v.extend_from_slice(writer.as_bytes());
    v
}

#[test]
fn scalars_are_the_bytes_tensorboard_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path(), None, FLUSH_EVERY).unwrap();
    for (tag, step, value, wall) in SCALARS {
        w.scalar_at(tag, step, value, wall).unwrap();
    }
    w.flush().unwrap();
    let ours = records(&std::fs::read(w.path()).unwrap());
    let theirs = golden();
    assert_eq!(ours.len(), 1 + SCALARS.len());
    assert_eq!(theirs.len(), ours.len());
    // The version record: wall_time (field 1, fixed64) first, then the same fields with our writer's name.
    assert_eq!(theirs[0][0], 0x09);
    assert_eq!(
        theirs[0][9..],
        version_fields("tensorboard.summary.writer.event_file_writer")
    );
    assert_eq!(ours[0][0], 0x09);
    assert_eq!(ours[0][9..], version_fields(WRITER));
    for (i, (a, b)) in ours[1..].iter().zip(&theirs[1..]).enumerate() {
        assert_eq!(a, b, "scalar {:?}", SCALARS[i]);
    }
}

#[test]
fn each_writer_gets_its_own_file_with_tensorboards_name() {
    let dir = tempfile::tempdir().unwrap();
    let sub = dir.path().join("run/tensorboard");
    let mut a = EventWriter::create(&sub, None, FLUSH_EVERY).unwrap();
    let b = EventWriter::create(&sub, None, FLUSH_EVERY).unwrap();
    assert_ne!(a.path(), b.path());
    let name = a.path().file_name().unwrap().to_str().unwrap().to_string();
    let fields: Vec<&str> = name.split('.').collect();
    assert_eq!(fields[..3], ["events", "out", "tfevents"], "{name}");
    assert_eq!(fields[3].len(), 10, "{name}");
    assert!(fields[3].parse::<u64>().unwrap() > 1_700_000_000, "{name}");
    assert!(fields.last().unwrap().parse::<u32>().is_ok(), "{name}");
    // Written through once flushed, the time stamped now.
    a.scalar("val/acc5", 7, 93.5).unwrap();
    a.flush().unwrap();
    let recs = records(&std::fs::read(a.path()).unwrap());
    assert_eq!(recs.len(), 2);
    let wall = f64::from_le_bytes(recs[1][1..9].try_into().unwrap());
    assert!(wall >= fields[3].parse::<f64>().unwrap(), "{wall}");
    assert_eq!(recs[1][9..11], [0x10, 7]);
}

/// The reader reads the file TensorBoard's own writer wrote: every scalar, with its step and wall time.
#[test]
fn tensorboards_own_file_reads_back() {
    let got = read_scalars(&fixture("tensorboard-2.21.tfevents")).unwrap();
    let want: Vec<_> = SCALARS
        .iter()
        .map(|&(tag, step, value, wall)| (tag.to_string(), step, value as f32, wall))
        .collect();
    let got: Vec<_> = got
        .into_iter()
        .map(|s| (s.tag, s.step, s.value, s.wall_time))
        .collect();
    assert_eq!(got, want);
}

/// A resumed run's file starts as PyTorch's `SummaryWriter(purge_step=200)` starts its: after the version,
/// `SessionLog{START}` at step 200 (the same bytes after the wall time), then the scalars, byte for byte. (Torch
/// writes the version a second time, at step 200, before it: TensorBoard reads the version from the first.)
#[test]
fn a_purge_step_starts_the_file_as_torchs_summary_writer_does() {
    let theirs = records(&std::fs::read(fixture("torch-2.13-purge.tfevents")).unwrap());
    // make_golden.py's purge step and the scalar after it.
    let (tag, step, value, wall) = ("train/loss", 201, 1.25, 1700000010.5);
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path(), Some(200), FLUSH_EVERY).unwrap();
    w.scalar_at(tag, step, value, wall).unwrap();
    w.flush().unwrap();
    let ours = records(&std::fs::read(w.path()).unwrap());
    assert_eq!(theirs.len(), 4);
    assert_eq!(ours.len(), 3);
    assert_eq!(ours[0][9..], version_fields(WRITER));
    // Field 1 (wall time, 8 bytes), then step 200 (field 2) and session_log{status: START} (field 7).
    let start = [0x10, 0xc8, 0x01, 0x3a, 0x02, 0x08, 0x01];
    assert_eq!(theirs[2][0], 0x09);
    assert_eq!(theirs[2][9..], start);
    assert_eq!(ours[1][0], 0x09);
    assert_eq!(ours[1][9..], start);
    assert_eq!(ours[2], theirs[3]);
}

/// What is written reaches the file within the writer's flush interval, without a call to flush (a live
/// TensorBoard shows it); dropping the writer writes the rest.
#[test]
fn events_reach_the_file_without_a_flush() {
    let dir = tempfile::tempdir().unwrap();
    let mut w = EventWriter::create(dir.path(), None, Duration::from_millis(20)).unwrap();
    w.scalar("train/loss", 1, 2.5).unwrap();
    let path = w.path().to_path_buf();
    let seen = || read_scalars(&path).is_ok_and(|s| s.len() == 1);
    // Polled until it is there; the bound only ends a test that would otherwise wait forever.
    let give_up = std::time::Instant::now() + Duration::from_secs(120);
    while !seen() {
        assert!(
            std::time::Instant::now() < give_up,
            "the event never reached the file"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // The default interval is far longer than this test: only the drop writes this one.
    let mut w = EventWriter::create(dir.path(), None, FLUSH_EVERY).unwrap();
    w.scalar("train/loss", 2, 1.5).unwrap();
    let path = w.path().to_path_buf();
    assert_eq!(read_scalars(&path).unwrap().len(), 0, "buffered");
    drop(w);
    assert_eq!(read_scalars(&path).unwrap().len(), 1);
}
