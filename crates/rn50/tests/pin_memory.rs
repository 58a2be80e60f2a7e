//! Pinning host batches for the GPU without libtorch's deprecation warnings. The first H100 run printed two
//! warnings for every batch ("The argument 'device' of Tensor.pin_memory() is deprecated", and the same for
//! `is_pinned()`) because tch's `pin_memory(device)` always passes a device. libtorch warns before it looks for a
//! GPU, so the difference shows on a CPU-only machine too. Alone in its test binary: it redirects this process's
//! stderr while it runs.
use std::io::Read;
use std::os::fd::AsRawFd;

use tch::{Device, Kind, Tensor};

/// What `f` makes libtorch write to stderr (file descriptor 2).
fn stderr_of<T>(f: impl FnOnce() -> T) -> (T, String) {
    let mut file = tempfile::tempfile().unwrap();
    // SAFETY: plain descriptor juggling; fd 2 is restored before returning.
    let saved = unsafe { libc::dup(2) };
    assert!(saved >= 0);
    assert!(unsafe { libc::dup2(file.as_raw_fd(), 2) } >= 0);
    let out = f();
    assert!(unsafe { libc::dup2(saved, 2) } >= 0);
    unsafe { libc::close(saved) };
    let mut text = String::new();
    use std::io::Seek;
    file.rewind().unwrap();
    file.read_to_string(&mut text).unwrap();
    (out, text)
}

#[test]
fn pinning_passes_no_device_and_prints_no_warning() {
    let t = Tensor::zeros([2, 8, 8, 3], (Kind::Uint8, Device::Cpu));
    let (ours, ours_err) = stderr_of(|| rn50::shim::pin_memory(&t));
    // The call rn50 made before: the same pinning through tch, which passes the device.
    let (_, tch_err) = stderr_of(|| t.f_pin_memory(Device::Cuda(0)));
    assert!(
        tch_err.contains("deprecated"),
        "the control call should show libtorch's warning on stderr; got {tch_err:?}"
    );
    assert!(!ours_err.contains("deprecated"), "{ours_err}");
    match ours {
        Ok(p) => {
            assert!(tch::Cuda::is_available(), "pinned without a GPU?");
            assert_eq!(p.size(), t.size());
        }
        Err(e) => {
            assert!(
                !tch::Cuda::is_available(),
                "pinning failed on a GPU machine: {e:#}"
            );
            eprintln!("no GPU here: pinning itself is not possible, checked only that no warning is printed ({e})");
        }
    }
}
