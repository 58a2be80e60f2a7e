//! The I/O monitor against this machine's real /proc files and against fixture copies with golden values.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rn50_report::io_monitor::{
    block_device_of, deltas, parse_diskstats, parse_diskstats_line, parse_proc_io,
    resolve_block_device, IoSample,
};
use rn50_report::{IoDelta, IoMonitor};

fn proc_fixture(name: &str) -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/proc")
        .join(name);
    fs::read_to_string(p).unwrap()
}

#[test]
fn fixture_proc_io_golden() {
    let io = parse_proc_io(&proc_fixture("io")).unwrap();
    assert_eq!(io.rchar, 48_210_774_921);
    assert_eq!(io.syscr, 1_203_391);
    assert_eq!(io.read_bytes, 47_112_523_776);
    assert_eq!(io.write_bytes, 20_480);
    assert_eq!(io.cancelled_write_bytes, 0);
    // Missing a required counter: no reading rather than zeros.
    assert_eq!(parse_proc_io("rchar: 1\nwchar: 2\n"), None);
    assert_eq!(parse_proc_io(""), None);
}

#[test]
fn fixture_diskstats_golden() {
    let all = parse_diskstats(&proc_fixture("diskstats"));
    // 8 device lines, the junk line skipped; dm-0 has the old 11-counter layout (14 fields).
    let names: Vec<&str> = all.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "loop0",
            "sda",
            "sda1",
            "nvme0n1",
            "nvme0n1p2",
            "dm-0",
            "vda"
        ]
    );
    let p = &all[4];
    assert_eq!((p.major, p.minor), (259, 2));
    assert_eq!(p.reads, 9_000_000);
    assert_eq!(p.read_bytes(), 1_450_000_000 * 512);
    assert_eq!(p.io_ms, 1_200_000);
    let vda = &all[6];
    assert_eq!(vda.reads, 2_993_096);
    assert_eq!(vda.sectors_read, 124_622_066);
    assert_eq!(vda.writes, 165_816);
    assert_eq!(parse_diskstats_line("   8 0 sda 1 2"), None);
}

#[test]
fn fixture_delta_is_hals_3_30_gbs_and_36_5k_iops() {
    let disk0 = parse_diskstats(&proc_fixture("diskstats"))
        .into_iter()
        .find(|d| d.name == "nvme0n1p2");
    let disk1 = parse_diskstats_line(proc_fixture("diskstats.later").trim());
    let a = IoSample {
        t: 10.0,
        process: parse_proc_io(&proc_fixture("io")),
        disk: disk0,
    };
    let b = IoSample {
        t: 12.0,
        process: parse_proc_io(&proc_fixture("io.later")),
        disk: disk1,
    };
    let d = b.delta(&a);
    let close = |x: Option<f64>, y: f64| assert!((x.unwrap() - y).abs() < 1e-9, "{x:?} != {y}");
    assert_eq!(d.seconds, 2.0);
    assert_eq!(d.device.as_deref(), Some("nvme0n1p2"));
    close(d.disk_read_gbs, 3.30);
    close(d.disk_read_iops, 36_500.0);
    close(d.disk_busy, 0.95);
    close(d.disk_write_iops, 5.0);
    close(d.disk_write_gbs, 81_920.0 / 2.0 / 1e9);
    close(d.process_read_gbs, 3.30);
    close(d.process_storage_read_gbs, 3.30);
    close(d.process_read_calls_per_s, 36_500.0);
    assert_eq!(d.process_read_bytes, Some(6_600_000_000));
    assert_eq!(
        d.summary_line(),
        "disk nvme0n1p2 3.30 GB/s 36.5K IOPS (95% busy); process 3.30 GB/s (3.30 from storage)"
    );
    // Backwards counters (device re-attached) are zero, not a wrap-around of 2^64.
    let back = a.delta(&b);
    assert_eq!(back.disk_read_bytes, Some(0));
    // io.jsonl round trip.
    let line = serde_json::to_string(&d).unwrap();
    assert_eq!(serde_json::from_str::<IoDelta>(&line).unwrap(), d);
    assert_eq!(deltas(&[a, b]).len(), 1);
}

#[test]
fn fixture_device_resolution() {
    let ds = proc_fixture("diskstats");
    let mi = proc_fixture("mountinfo");
    let none = |_: &Path| None;
    let name = |dev, path: &str, rdev: &dyn Fn(&Path) -> Option<(u32, u32)>| {
        resolve_block_device(dev, Path::new(path), &ds, &mi, rdev).map(|b| b.name)
    };
    // Direct: a partition's st_dev is in diskstats.
    assert_eq!(
        name((8, 1), "/data/train/n01440764/x.JPEG", &none).as_deref(),
        Some("sda1")
    );
    assert_eq!(name((254, 0), "/work/main", &none).as_deref(), Some("vda"));
    assert_eq!(name((253, 0), "/mnt/lvm/x", &none).as_deref(), Some("dm-0"));
    // btrfs: anonymous 0:45, found through the mount's source device node.
    let nvme = |p: &Path| (p == Path::new("/dev/nvme0n1p2")).then_some((259, 2));
    assert_eq!(
        name((0, 45), "/mnt/imagenet/train", &nvme).as_deref(),
        Some("nvme0n1p2")
    );
    assert_eq!(name((0, 45), "/mnt/imagenet/train", &none), None);
    // tmpfs and overlay (mount point with an escaped space): no block device.
    assert_eq!(name((0, 23), "/dev/shm/x", &none), None);
    assert_eq!(name((0, 46), "/mnt/my scratch/data", &none), None);
}

#[test]
fn real_proc_files_parse() {
    // This process's counters, before and after reading a file we wrote.
    let before = parse_proc_io(&fs::read_to_string("/proc/self/io").unwrap()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("data.bin");
    fs::write(&f, vec![7u8; 1 << 20]).unwrap();
    let mut buf = vec![];
    fs::File::open(&f).unwrap().read_to_end(&mut buf).unwrap();
    let after = parse_proc_io(&fs::read_to_string("/proc/self/io").unwrap()).unwrap();
    assert!(
        after.rchar >= before.rchar + (1 << 20),
        "{before:?} → {after:?}"
    );
    assert!(after.syscr > before.syscr);
    // Every line of the real /proc/diskstats parses (the kernel's 14-, 18- or 20-field layouts).
    let text = fs::read_to_string("/proc/diskstats").unwrap();
    let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(parse_diskstats(&text).len(), lines, "{text}");
}

#[test]
fn real_block_devices() {
    // Whatever holds the crate's directory is either a real block device listed in diskstats, or none.
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if let Some(dev) = block_device_of(&here).unwrap() {
        let text = fs::read_to_string("/proc/diskstats").unwrap();
        assert!(parse_diskstats(&text)
            .iter()
            .any(|d| d.name == dev.name && (d.major, d.minor) == (dev.major, dev.minor)));
    }
    // /proc is a pseudo filesystem: no block device, and no error.
    assert_eq!(block_device_of(Path::new("/proc")).unwrap(), None);
    if Path::new("/dev/shm").is_dir() {
        assert_eq!(block_device_of(Path::new("/dev/shm")).unwrap(), None);
    }
    assert!(block_device_of(Path::new("/no/such/path")).is_err());
}

#[test]
fn monitor_samples_and_logs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data.bin");
    fs::write(&data, vec![1u8; 4 << 20]).unwrap();
    let log = dir.path().join("io.jsonl");
    let mon = IoMonitor::start_logging(dir.path(), Duration::from_millis(20), &log).unwrap();
    let s0 = mon.snapshot();
    let mut buf = vec![];
    fs::File::open(&data)
        .unwrap()
        .read_to_end(&mut buf)
        .unwrap();
    std::thread::sleep(Duration::from_millis(120));
    let d = mon.snapshot().delta(&s0);
    assert!(d.seconds > 0.1);
    assert!(d.process_read_bytes.unwrap() >= 4 << 20, "{d:?}");
    assert!(d.process_read_gbs.unwrap() > 0.0);
    if mon.device().is_some() {
        assert!(d.disk_read_iops.is_some());
    }
    let total = mon.total().unwrap();
    assert!(total.process_read_bytes.unwrap() >= 4 << 20);
    let series_path = dir.path().join("series.jsonl");
    mon.write_jsonl(&series_path).unwrap();
    let samples = mon.stop();
    assert!(samples.len() >= 3, "{}", samples.len());
    assert!(samples.windows(2).all(|w| w[1].t >= w[0].t));
    // The live log and the written series hold one JSON delta per line.
    for p in [&log, &series_path] {
        let text = fs::read_to_string(p).unwrap();
        assert!(text.lines().count() >= 2, "{}", p.display());
        for l in text.lines() {
            serde_json::from_str::<IoDelta>(l).unwrap();
        }
    }
}
