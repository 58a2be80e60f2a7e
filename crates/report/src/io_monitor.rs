//! The I/O monitor ([`IoMonitor`]): read bandwidth and IOPS of this process and of the block device holding
//! the dataset, from /proc, no root.
//!
//! - Process: `/proc/self/io` — `rchar` counts every byte read() returned (page-cache hits included),
//!   `read_bytes` what had to come from storage, `syscr` the read calls. Whole process, all threads.
//! - Device: `stat(path).st_dev` → major:minor → its line in `/proc/diskstats` (sectors are always 512 bytes
//!   there; reads completed are the IOPS). Partitions have their own lines. Filesystems with anonymous device
//!   numbers (btrfs, some overlays) are looked up through /proc/self/mountinfo's mount source; tmpfs, overlay
//!   without a block device, NFS and the like have none, and only the process counters are reported.

use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rn50_util::{lock_unpoisoned, unpoisoned};
use serde::{Deserialize, Serialize};

use crate::ReportError;

/// `/proc/PID/io`.
#[derive(Clone, Copy, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ProcIo {
    pub rchar: u64,
    pub wchar: u64,
    pub syscr: u64,
    pub syscw: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub cancelled_write_bytes: u64,
}

/// Parses `/proc/PID/io`; None unless rchar, syscr and read_bytes are all there.
pub fn parse_proc_io(text: &str) -> Option<ProcIo> {
    let mut io = ProcIo::default();
    let mut seen = 0;
    for line in text.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        let field = match k.trim() {
            "rchar" => {
                seen |= 1;
                &mut io.rchar
            }
            "syscr" => {
                seen |= 2;
                &mut io.syscr
            }
            "read_bytes" => {
                seen |= 4;
                &mut io.read_bytes
            }
            "wchar" => &mut io.wchar,
            "syscw" => &mut io.syscw,
            "write_bytes" => &mut io.write_bytes,
            "cancelled_write_bytes" => &mut io.cancelled_write_bytes,
            _ => continue,
        };
        *field = v;
    }
    (seen == 7).then_some(io)
}

/// One line of `/proc/diskstats` (the first 11 counters; later kernels add discard and flush fields).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct DiskStat {
    pub major: u32,
    pub minor: u32,
    pub name: String,
    pub reads: u64,
    pub reads_merged: u64,
    pub sectors_read: u64,
    pub read_ms: u64,
    pub writes: u64,
    pub writes_merged: u64,
    pub sectors_written: u64,
    pub write_ms: u64,
    pub in_flight: u64,
    /// Time the device had I/O in flight: its utilisation.
    pub io_ms: u64,
    pub weighted_io_ms: u64,
}

impl DiskStat {
    /// Sectors in /proc/diskstats are 512 bytes whatever the device's sector size.
    pub fn read_bytes(&self) -> u64 {
        self.sectors_read * 512
    }
    pub fn written_bytes(&self) -> u64 {
        self.sectors_written * 512
    }
}

pub fn parse_diskstats_line(line: &str) -> Option<DiskStat> {
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() < 14 {
        return None;
    }
    let n = |i: usize| f[i].parse::<u64>().ok();
    Some(DiskStat {
        major: f[0].parse().ok()?,
        minor: f[1].parse().ok()?,
        name: f[2].to_string(),
        reads: n(3)?,
        reads_merged: n(4)?,
        sectors_read: n(5)?,
        read_ms: n(6)?,
        writes: n(7)?,
        writes_merged: n(8)?,
        sectors_written: n(9)?,
        write_ms: n(10)?,
        in_flight: n(11)?,
        io_ms: n(12)?,
        weighted_io_ms: n(13)?,
    })
}

/// Every well-formed line of `/proc/diskstats`.
pub fn parse_diskstats(text: &str) -> Vec<DiskStat> {
    text.lines().filter_map(parse_diskstats_line).collect()
}

/// Linux's dev_t → (major, minor), glibc's encoding (gnu_dev_major/minor).
pub fn split_dev(dev: u64) -> (u32, u32) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major as u32, minor as u32)
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct BlockDevice {
    pub major: u32,
    pub minor: u32,
    /// diskstats' name: "vda", "nvme0n1p2", "dm-0", "sda1".
    pub name: String,
}

/// One mount of `/proc/self/mountinfo`: (mount point, major:minor, source).
fn parse_mountinfo_line(line: &str) -> Option<(String, (u32, u32), String)> {
    let (pre, post) = line.split_once(" - ")?;
    let pre: Vec<&str> = pre.split_whitespace().collect();
    let post: Vec<&str> = post.split_whitespace().collect();
    let (maj, min) = pre.get(2)?.split_once(':')?;
    // Mount points escape spaces and the like as octal (\040).
    let mount = unescape_octal(pre.get(4)?);
    Some((
        mount,
        (maj.parse().ok()?, min.parse().ok()?),
        post.get(1)?.to_string(),
    ))
}

fn unescape_octal(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0');
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Finds the block device of a file whose st_dev is `dev` and canonical path is `path`, given the texts of
/// /proc/diskstats and /proc/self/mountinfo, and a way to read a device node's st_rdev (for mount sources).
pub fn resolve_block_device(
    dev: (u32, u32),
    path: &Path,
    diskstats: &str,
    mountinfo: &str,
    rdev_of: impl Fn(&Path) -> Option<(u32, u32)>,
) -> Option<BlockDevice> {
    let stats = parse_diskstats(diskstats);
    let find = |d: (u32, u32)| {
        stats
            .iter()
            .find(|s| (s.major, s.minor) == d)
            .map(|s| BlockDevice {
                major: s.major,
                minor: s.minor,
                name: s.name.clone(),
            })
    };
    if let Some(b) = find(dev) {
        return Some(b);
    }
    // Anonymous st_dev (major 0: btrfs subvolumes, overlay, tmpfs): the longest mount point containing the
    // path names its source; a source that is a device node gives the block device.
    let mount = mountinfo
        .lines()
        .filter_map(parse_mountinfo_line)
        .filter(|(m, _, _)| path.starts_with(m))
        .max_by_key(|(m, _, _)| m.len())?;
    let (_, mdev, source) = mount;
    if let Some(b) = find(mdev) {
        return Some(b);
    }
    if source.starts_with("/dev/") {
        return rdev_of(Path::new(&source)).and_then(find);
    }
    None
}

/// The block device holding `path` on this machine, if it has one.
pub fn block_device_of(path: &Path) -> Result<Option<BlockDevice>, ReportError> {
    let io_err = |p: &Path| {
        let p = p.to_path_buf();
        move |e| ReportError::Io { path: p, source: e }
    };
    let meta = fs::metadata(path).map_err(io_err(path))?;
    let canonical = fs::canonicalize(path).map_err(io_err(path))?;
    let diskstats = fs::read_to_string("/proc/diskstats").unwrap_or_default();
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    Ok(resolve_block_device(
        split_dev(meta.dev()),
        &canonical,
        &diskstats,
        &mountinfo,
        |p| fs::metadata(p).ok().map(|m| split_dev(m.rdev())),
    ))
}

/// Counters at one moment.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IoSample {
    /// Seconds since the monitor started.
    pub t: f64,
    /// None where /proc/self/io is not readable (kernel without task I/O accounting).
    pub process: Option<ProcIo>,
    /// None where the path has no block device.
    pub disk: Option<DiskStat>,
}

/// Rates between two samples. GB are 10^9 bytes, as the sites quote them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct IoDelta {
    /// End of the interval, seconds since the monitor started.
    pub t: f64,
    pub seconds: f64,
    /// Bytes read() returned to the process (page-cache hits included).
    pub process_read_bytes: Option<u64>,
    pub process_read_gbs: Option<f64>,
    /// Of those, what the process had to fetch from storage.
    pub process_storage_read_gbs: Option<f64>,
    pub process_read_calls_per_s: Option<f64>,
    pub device: Option<String>,
    pub disk_read_bytes: Option<u64>,
    pub disk_read_gbs: Option<f64>,
    /// Reads completed per second.
    pub disk_read_iops: Option<f64>,
    pub disk_write_gbs: Option<f64>,
    pub disk_write_iops: Option<f64>,
    /// Share of the interval the device had I/O in flight.
    pub disk_busy: Option<f64>,
}

impl IoSample {
    /// Rates from `earlier` to `self`. Counters that went backwards (device re-attached) count as zero.
    pub fn delta(&self, earlier: &IoSample) -> IoDelta {
        let secs = self.t - earlier.t;
        let rate = |d: u64| (secs > 0.0).then(|| d as f64 / secs);
        let mut out = IoDelta {
            t: self.t,
            seconds: secs,
            ..IoDelta::default()
        };
        if let (Some(a), Some(b)) = (&earlier.process, &self.process) {
            let rchar = b.rchar.saturating_sub(a.rchar);
            out.process_read_bytes = Some(rchar);
            out.process_read_gbs = rate(rchar).map(|r| r / 1e9);
            out.process_storage_read_gbs =
                rate(b.read_bytes.saturating_sub(a.read_bytes)).map(|r| r / 1e9);
            out.process_read_calls_per_s = rate(b.syscr.saturating_sub(a.syscr));
        }
        if let (Some(a), Some(b)) = (&earlier.disk, &self.disk) {
            if (a.major, a.minor) == (b.major, b.minor) {
                let bytes = b.read_bytes().saturating_sub(a.read_bytes());
                out.device = Some(b.name.clone());
                out.disk_read_bytes = Some(bytes);
                out.disk_read_gbs = rate(bytes).map(|r| r / 1e9);
                out.disk_read_iops = rate(b.reads.saturating_sub(a.reads));
                out.disk_write_gbs =
                    rate(b.written_bytes().saturating_sub(a.written_bytes())).map(|r| r / 1e9);
                out.disk_write_iops = rate(b.writes.saturating_sub(a.writes));
                out.disk_busy =
                    rate(b.io_ms.saturating_sub(a.io_ms)).map(|r| (r / 1000.0).min(1.0));
            }
        }
        out
    }
}

impl IoDelta {
    /// "disk vda 3.30 GB/s 36.5K IOPS (82% busy); process 3.41 GB/s (0.12 from storage)".
    pub fn summary_line(&self) -> String {
        let mut parts = vec![];
        if let (Some(dev), Some(gbs), Some(iops)) =
            (&self.device, self.disk_read_gbs, self.disk_read_iops)
        {
            let busy = self
                .disk_busy
                .map(|b| format!(" ({:.0}% busy)", b * 100.0))
                .unwrap_or_default();
            parts.push(format!(
                "disk {dev} {gbs:.2} GB/s {} IOPS{busy}",
                fmt_iops(iops)
            ));
        }
        if let Some(gbs) = self.process_read_gbs {
            let storage = self.process_storage_read_gbs.unwrap_or(0.0);
            parts.push(format!("process {gbs:.2} GB/s ({storage:.2} from storage)"));
        }
        if parts.is_empty() {
            "no I/O counters".into()
        } else {
            parts.join("; ")
        }
    }
}

/// 36500 → "36.5K".
pub fn fmt_iops(x: f64) -> String {
    if x >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if x >= 1e3 {
        format!("{:.1}K", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// Reads the counters of the process and of `device` now.
fn read_counters(device: Option<&BlockDevice>) -> (Option<ProcIo>, Option<DiskStat>) {
    let process = fs::read_to_string("/proc/self/io")
        .ok()
        .and_then(|t| parse_proc_io(&t));
    let disk = device.and_then(|d| {
        let text = fs::read_to_string("/proc/diskstats").ok()?;
        text.lines()
            .filter_map(parse_diskstats_line)
            .find(|s| (s.major, s.minor) == (d.major, d.minor))
    });
    (process, disk)
}

struct Shared {
    stop: Mutex<bool>,
    wake: Condvar,
    samples: Mutex<Vec<IoSample>>,
}

/// Samples the counters on a thread every `interval` into a time series; `snapshot` reads them at any moment
/// for per-epoch figures. Stops when dropped.
pub struct IoMonitor {
    device: Option<BlockDevice>,
    started: Instant,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl IoMonitor {
    /// Starts sampling for the dataset at `path` (a file or directory on the device to watch).
    pub fn start(path: &Path, interval: Duration) -> Result<IoMonitor, ReportError> {
        Self::start_inner(path, interval, None)
    }

    /// As `start`, and appends each interval's rates to `log` as JSON lines (io.jsonl) as they come, so a
    /// killed run keeps its series.
    pub fn start_logging(
        path: &Path,
        interval: Duration,
        log: &Path,
    ) -> Result<IoMonitor, ReportError> {
        let file = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|e| ReportError::Io {
                path: log.to_path_buf(),
                source: e,
            })?;
        Self::start_inner(path, interval, Some((file, log.to_path_buf())))
    }

    fn start_inner(
        path: &Path,
        interval: Duration,
        mut log: Option<(fs::File, PathBuf)>,
    ) -> Result<IoMonitor, ReportError> {
        let device = block_device_of(path)?;
        let started = Instant::now();
        let shared = Arc::new(Shared {
            stop: Mutex::new(false),
            wake: Condvar::new(),
            samples: Mutex::new(vec![]),
        });
        let first = sample(started, device.as_ref());
        lock_unpoisoned(&shared.samples).push(first);
        let interval = interval.max(Duration::from_millis(10));
        let (sh, dev) = (Arc::clone(&shared), device.clone());
        let thread = std::thread::Builder::new()
            .name("io-monitor".into())
            .spawn(move || loop {
                let stop = lock_unpoisoned(&sh.stop);
                let (stop, _) = unpoisoned(sh.wake.wait_timeout_while(stop, interval, |s| !*s));
                let stopping = *stop;
                drop(stop);
                let s = sample(started, dev.as_ref());
                let mut samples = lock_unpoisoned(&sh.samples);
                if let (Some((file, _)), Some(prev)) = (log.as_mut(), samples.last()) {
                    if let Ok(line) = serde_json::to_string(&s.delta(prev)) {
                        // A full disk must not stop training: the in-memory series stays complete.
                        let _ = writeln!(file, "{line}");
                    }
                }
                samples.push(s);
                drop(samples);
                if stopping {
                    break;
                }
            })
            .map_err(|e| ReportError::Io {
                path: path.to_path_buf(),
                source: e,
            })?;
        Ok(IoMonitor {
            device,
            started,
            shared,
            thread: Some(thread),
        })
    }

    /// The block device watched, None when the path has none (tmpfs, overlay, network filesystems).
    pub fn device(&self) -> Option<&BlockDevice> {
        self.device.as_ref()
    }

    /// The counters now (not added to the series). Two snapshots' `delta` gives an epoch's figures.
    pub fn snapshot(&self) -> IoSample {
        sample(self.started, self.device.as_ref())
    }

    /// The samples so far, the first taken at start.
    pub fn samples(&self) -> Vec<IoSample> {
        lock_unpoisoned(&self.shared.samples).clone()
    }

    /// Rates between consecutive samples: the io.jsonl time series.
    pub fn series(&self) -> Vec<IoDelta> {
        deltas(&self.samples())
    }

    /// Rates over everything sampled so far.
    pub fn total(&self) -> Option<IoDelta> {
        let s = self.samples();
        Some(s.last()?.delta(s.first()?))
    }

    /// Writes the series as JSON lines.
    pub fn write_jsonl(&self, path: &Path) -> Result<(), ReportError> {
        let mut text = String::new();
        for d in self.series() {
            text.push_str(&serde_json::to_string(&d).unwrap_or_default());
            text.push('\n');
        }
        crate::run_report::write_atomic(path, text.as_bytes())
    }

    /// Stops the thread after a last sample and returns all samples.
    pub fn stop(mut self) -> Vec<IoSample> {
        self.halt();
        self.samples()
    }

    fn halt(&mut self) {
        *lock_unpoisoned(&self.shared.stop) = true;
        self.shared.wake.notify_all();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for IoMonitor {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Rates between consecutive samples.
pub fn deltas(samples: &[IoSample]) -> Vec<IoDelta> {
    samples.windows(2).map(|w| w[1].delta(&w[0])).collect()
}

fn sample(started: Instant, device: Option<&BlockDevice>) -> IoSample {
    let (process, disk) = read_counters(device);
    IoSample {
        t: started.elapsed().as_secs_f64(),
        process,
        disk,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dev_numbers() {
        // 254:0 (virtio vda) is 0xfe00 in st_dev; 259:65538 exercises the high bits of a large minor.
        assert_eq!(split_dev(0xfe00), (254, 0));
        assert_eq!(split_dev(0x0801), (8, 1));
        let dev: u64 = (259 & 0xfff) << 8 | (65538 & 0xff) | ((65538u64 & !0xff) << 12);
        assert_eq!(split_dev(dev), (259, 65538));
    }

    #[test]
    fn mountinfo_octal_escapes() {
        assert_eq!(unescape_octal("/mnt/my\\040data"), "/mnt/my data");
        assert_eq!(unescape_octal("/plain"), "/plain");
        assert_eq!(unescape_octal("/trailing\\04"), "/trailing\\04");
    }

    #[test]
    fn iops_format() {
        assert_eq!(fmt_iops(36_500.0), "36.5K");
        assert_eq!(fmt_iops(950.0), "950");
        assert_eq!(fmt_iops(2_500_000.0), "2.50M");
    }
}
