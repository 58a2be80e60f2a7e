//! What every rn50 crate does one way, so that no crate grows its own variant:
//!
//! - [`atomic`]: replacing a file so that a crash leaves the old file or the new one, never half of one
//!   ([`atomic_write`], [`atomic_write_with`], [`atomic_symlink`]), and removing the temporary files of writers
//!   that were killed ([`remove_stale_temps`]);
//! - [`lock`]: one process at a time per folder ([`try_lock_pid`]: `flock` + the holder's PID for the message);
//! - [`progress`]: progress bars on stderr in one style, drawn only on a terminal ([`progress_bar`]);
//! - [`log`]: log lines on stderr with a UTC time stamp, the level and `[rank N]` ([`log::init`]; `RUST_LOG`);
//! - [`sync`]: mutexes whose data stays usable after a panic ([`lock_unpoisoned`], [`unpoisoned`]);
//! - [`stop`]: SIGINT/SIGTERM/SIGUSR1 as a request to stop, which commands check between units of work
//!   ([`stop::install`], [`stop::EXIT_STOPPED`]); a second SIGINT stops at once;
//! - [`stats`]: quantile (numpy's default interpolation), median and mean of measurements;
//! - `tmpfs` (feature `testing`): for tests, a real full disk (a small tmpfs mounted for the test's time);
//! - `testing` (feature `testing`): for tests, where the shared test data and the reference Python are, one lock
//!   for tests that run alone, and a Ctrl-C sent once the command under test got somewhere (`sigint_when`).
//!
//! The feature `testing` is off by default: no production code uses those two modules; the crates whose tests
//! do enable it in their dev-dependencies.
//!
//! Pure std, libc, signal-hook, indicatif and tracing: every crate of the workspace can depend on it.
pub mod atomic;
pub mod lock;
pub mod log;
pub mod progress;
pub mod stats;
pub mod stop;
pub mod sync;
#[cfg(feature = "testing")]
pub mod testing;
#[cfg(feature = "testing")]
pub mod tmpfs;

pub use atomic::{atomic_symlink, atomic_write, atomic_write_with, remove_stale_temps};
pub use lock::{lock_holder, try_lock_pid, Locked, PidLock};
pub use progress::{progress_bar, progress_target};
pub use sync::{lock_unpoisoned, unpoisoned};
