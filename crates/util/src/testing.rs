//! For tests of the commands that stop on request ([`crate::stop`]), in the crates' own test binaries (which
//! already depend on rn50-util): no production code calls these, and they add no dependency.
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Sends this process one SIGINT (a user's Ctrl-C) from a thread as soon as `ready()` holds (looked at every
/// millisecond), e.g. once a command under test has finished its first unit of work. The thread panics with
/// `never` if `ready()` does not hold within 5 minutes: join it after the command returned.
pub fn sigint_when(
    ready: impl Fn() -> bool + Send + 'static,
    never: &'static str,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(300) {
            if ready() {
                // SAFETY: kill(2) on this process's own id, with a signal number; no memory is involved.
                let sent = unsafe { libc::kill(libc::getpid(), libc::SIGINT) };
                assert_eq!(sent, 0, "kill -INT: {}", std::io::Error::last_os_error());
                return;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        panic!("{never}");
    })
}
