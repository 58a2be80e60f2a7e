//! A request to stop, from a user or a scheduler: the first SIGINT (Ctrl-C), SIGTERM or SIGUSR1 sets a flag
//! that the long-running commands check between units of work (train: a step; prepare: a class; pack: a shard),
//! so they keep what is done (a checkpoint, finished classes and shards), remove what is half done, say so, and
//! exit [`EXIT_STOPPED`]. A SIGINT after that ends the process at once, killed by SIGINT as without a handler
//! (the shell's 130): Ctrl-C twice is the way out of a stop that takes too long.
//!
//! A terminal's Ctrl-C reaches every process of its foreground process group; `rn50 launch` starts its workers
//! in a process group of their own (as torchrun starts its workers in a session of their own), so they get the
//! launcher's forwarded SIGINT once, never the terminal's as well.
use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// Exit code of a command that stopped on request after keeping its work (train: a checkpoint to `--resume`
/// from), so that a job script can requeue it and `rn50 launch` can tell it from a failure.
pub const EXIT_STOPPED: u8 = 3;

/// The signals taken as a request to stop.
pub const SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGUSR1];

/// The process's one flag, set by the first of [`SIGNALS`].
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// The first of [`SIGNALS`] that came (0: none yet).
static FIRST: AtomicI32 = AtomicI32::new(0);

/// Installs the handlers (once per process; later calls return the same flag) and returns the flag that the
/// first of [`SIGNALS`] sets. On the first SIGINT, `then` is logged (e.g. "saving a checkpoint after this
/// step"), with how to stop at once.
pub fn install(then: &'static str) -> io::Result<Arc<AtomicBool>> {
    static INSTALLING: Mutex<()> = Mutex::new(());
    let _once = crate::lock_unpoisoned(&INSTALLING);
    if let Some(flag) = FLAG.get() {
        return Ok(Arc::clone(flag));
    }
    let flag = Arc::new(AtomicBool::new(false));
    // Registered before the flag's own handler, so it acts only from the second signal on.
    signal_hook::flag::register_conditional_default(libc::SIGINT, Arc::clone(&flag))?;
    for sig in SIGNALS {
        let f = Arc::clone(&flag);
        let action = move || {
            let _ = FIRST.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
            f.store(true, Ordering::SeqCst);
        };
        // SAFETY: the action only touches atomics, which is async-signal-safe.
        unsafe { signal_hook::low_level::register(sig, action) }?;
    }
    // The log line comes from a thread: a signal handler may not take the log's lock.
    let mut ints = signal_hook::iterator::Signals::new([libc::SIGINT])?;
    std::thread::Builder::new()
        .name("stop-request".into())
        .spawn(move || {
            if ints.forever().next().is_some() {
                tracing::warn!("SIGINT: {then}; press Ctrl-C again to stop at once");
            }
        })?;
    Ok(Arc::clone(FLAG.get_or_init(|| flag)))
}

/// The first signal that asked to stop, by name ("SIGINT", "SIGTERM", "SIGUSR1"); None before any came.
pub fn requested_by() -> Option<&'static str> {
    match FIRST.load(Ordering::SeqCst) {
        libc::SIGINT => Some("SIGINT"),
        libc::SIGTERM => Some("SIGTERM"),
        libc::SIGUSR1 => Some("SIGUSR1"),
        _ => None,
    }
}

/// Whether a stop was requested (false when [`install`] was never called).
pub fn requested() -> bool {
    FLAG.get().is_some_and(|f| f.load(Ordering::SeqCst))
}

/// The error of a command that stopped on request with its work kept or cleaned up (what to do next in the
/// message): `rn50` prints it as a warning, not as an error, and exits [`EXIT_STOPPED`].
#[derive(Debug)]
pub struct Stopped(pub String);

impl Stopped {
    /// "stopped on request (SIGINT): {what}".
    pub fn new(what: impl std::fmt::Display) -> Self {
        Self(format!(
            "stopped on request ({}): {what}",
            requested_by().unwrap_or("signal")
        ))
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Stopped {}
