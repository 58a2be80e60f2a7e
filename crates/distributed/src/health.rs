//! Liveness of the other ranks, for error messages: every rank bumps a counter in the store at a fixed interval
//! from a background thread. When a collective fails, the failing rank compares the counters over a few intervals:
//! a rank whose counter stopped is the one that died (or hangs); if the store itself cannot be reached (or does not
//! answer), rank 0, which serves it, is gone (or frozen). Counters rather than timestamps, so no clock agreement
//! between nodes is needed.
use crate::store::{Store, StoreError};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

fn hb_key(rank: usize) -> String {
    format!("rn50/hb/{rank}")
}

fn failing_key(rank: usize) -> String {
    format!("rn50/failing/{rank}")
}

pub(crate) struct Heartbeat {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    interval: Duration,
}

impl Heartbeat {
    /// Starts the heartbeat thread on its own connection to the store.
    pub fn start(store: &Store, rank: usize, interval: Duration) -> Result<Heartbeat, String> {
        let conn = store.try_clone()?;
        conn.set_timeout(interval.saturating_mul(4).max(Duration::from_secs(1)))?;
        conn.add(&hb_key(rank), 1)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("rn50-heartbeat".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    // A failed bump means the store (rank 0) is gone: stop quietly; the next collective or store
                    // operation reports it.
                    if conn.add(&hb_key(rank), 1).is_err() {
                        break;
                    }
                    std::thread::sleep(interval);
                }
            })
            .map_err(|e| format!("cannot start the heartbeat thread: {e}"))?;
        Ok(Heartbeat {
            stop,
            thread: Some(thread),
            interval,
        })
    }

    pub fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }

    /// Which other ranks look dead, as a sentence for an error message. Takes a few heartbeat intervals.
    pub fn diagnose(&self, store: &Store, rank: usize, world: usize, master: &str) -> String {
        let unreachable =
            |e: StoreError| format!("rank 0 (the store server at {master}) is unreachable: {e}");
        // The job is failing anyway: a short timeout for the store from now on (a new connection inherits it). Each
        // operation ends within it plus store::MARGIN, also when rank 0 is frozen rather than gone.
        let short = self.interval.saturating_mul(4).max(Duration::from_secs(1));
        let _ = store.set_timeout(short);
        let conn = match store.try_clone() {
            Ok(c) => c,
            Err(e) => return unreachable(e),
        };
        if let Err(e) = conn.set(&failing_key(rank), b"1") {
            return unreachable(e);
        }
        let read = |conn: &Store| -> Result<Vec<i64>, StoreError> {
            (0..world).map(|r| conn.add(&hb_key(r), 0)).collect()
        };
        let before = match read(&conn) {
            Ok(v) => v,
            Err(e) => return unreachable(e),
        };
        let window = self.interval.saturating_mul(3);
        std::thread::sleep(window);
        let after = match read(&conn) {
            Ok(v) => v,
            Err(e) => return unreachable(e),
        };
        let mut lost = Vec::new();
        let mut failed = Vec::new();
        for r in (0..world).filter(|&r| r != rank) {
            if conn.check(&failing_key(r)).unwrap_or(false) {
                failed.push(r);
            } else if after[r] == before[r] {
                lost.push(r);
            }
        }
        let mut parts = Vec::new();
        if !lost.is_empty() {
            parts.push(format!(
                "{} stopped responding (no heartbeat for {:.1} s: killed, crashed or hung)",
                ranks(&lost),
                window.as_secs_f64()
            ));
        }
        if !failed.is_empty() {
            parts.push(format!("{} reported a failure too", ranks(&failed)));
        }
        if parts.is_empty() {
            "every other rank is still alive (heartbeats advancing): one is probably stuck outside collectives or \
             out of step (in a different collective)"
                .into()
        } else {
            parts.join("; ")
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop();
    }
}

/// "rank 2" / "ranks 1, 3".
pub(crate) fn ranks(rs: &[usize]) -> String {
    let list: Vec<String> = rs.iter().map(|r| r.to_string()).collect();
    if rs.len() == 1 {
        format!("rank {}", list[0])
    } else {
        format!("ranks {}", list.join(", "))
    }
}
