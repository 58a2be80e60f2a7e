//! The C ABI of crates/shim/cpp/c10d.cpp, and the only helpers that touch its raw pointers.
//!
//! The conventions, the same as rn50's `shim.rs` (whose module doc has them in full): every entry point returns 0
//! on success and non-zero on failure with the C++ message kept per thread ([`last_error`]); [`check`] turns a
//! return code into `Err(message)`, which each wrapper maps to its error ([`crate::CommError`],
//! [`crate::StoreError`]); tensors go in as borrowed `at::Tensor*` handles ([`handles`]); buffers the shim
//! `malloc`s are copied and freed at once ([`take_bytes`]); opaque C++ objects (store, process group, work,
//! reducer) belong to one Rust value whose `Drop` calls their `*_free`.
use std::ffi::{c_char, c_int, c_void, CStr};
use torch_sys::C_tensor;

// The library these functions are in (linked into every binary that links this crate).
extern crate rn50_shim;

extern "C" {
    pub fn rn50d_last_error() -> *const c_char;
    pub fn rn50d_free(p: *mut c_void);
    pub fn rn50d_cuda_compiled() -> c_int;
    pub fn rn50d_set_log_level(level: c_int);

    pub fn rn50d_store_new(
        host: *const c_char,
        port: c_int,
        is_server: c_int,
        world: c_int,
        timeout_ms: i64,
        prefix: *const c_char,
        out: *mut *mut c_void,
    ) -> c_int;
    pub fn rn50d_store_clone(s: *mut c_void, out: *mut *mut c_void) -> c_int;
    pub fn rn50d_store_free(s: *mut c_void);
    pub fn rn50d_store_set_timeout(s: *mut c_void, timeout_ms: i64) -> c_int;
    pub fn rn50d_store_set(
        s: *mut c_void,
        key: *const c_char,
        data: *const u8,
        len: usize,
    ) -> c_int;
    pub fn rn50d_store_get(
        s: *mut c_void,
        key: *const c_char,
        data: *mut *mut u8,
        len: *mut usize,
    ) -> c_int;
    pub fn rn50d_store_add(s: *mut c_void, key: *const c_char, delta: i64, out: *mut i64) -> c_int;
    pub fn rn50d_store_check(s: *mut c_void, key: *const c_char, exists: *mut c_int) -> c_int;
    pub fn rn50d_store_wait(
        s: *mut c_void,
        keys: *const *const c_char,
        n: usize,
        timeout_ms: i64,
    ) -> c_int;

    #[allow(clippy::too_many_arguments)]
    pub fn rn50d_pg_new(
        store: *mut c_void,
        rank: c_int,
        world: c_int,
        backend: c_int,
        timeout_ms: i64,
        ifnames: *const c_char,
        hostname: *const c_char,
        device: c_int,
        out: *mut *mut c_void,
    ) -> c_int;
    pub fn rn50d_pg_free(g: *mut c_void);
    pub fn rn50d_allreduce(
        g: *mut c_void,
        ts: *const *mut C_tensor,
        n: usize,
        op: c_int,
        work: *mut *mut c_void,
    ) -> c_int;
    pub fn rn50d_broadcast(
        g: *mut c_void,
        ts: *const *mut C_tensor,
        n: usize,
        root: c_int,
        work: *mut *mut c_void,
    ) -> c_int;
    pub fn rn50d_allgather(
        g: *mut c_void,
        input: *mut C_tensor,
        outputs: *const *mut C_tensor,
        n: usize,
        work: *mut *mut c_void,
    ) -> c_int;
    pub fn rn50d_barrier(g: *mut c_void, work: *mut *mut c_void) -> c_int;
    pub fn rn50d_broadcast_coalesced(
        g: *mut c_void,
        ts: *const *mut C_tensor,
        n: usize,
        buffer_size: usize,
        root: c_int,
    ) -> c_int;
    pub fn rn50d_verify_params(g: *mut c_void, ts: *const *mut C_tensor, n: usize) -> c_int;
    pub fn rn50d_work_wait(w: *mut c_void, timeout_ms: i64) -> c_int;
    pub fn rn50d_work_is_completed(w: *mut c_void, done: *mut c_int) -> c_int;
    pub fn rn50d_work_free(w: *mut c_void);

    pub fn rn50d_reducer_new(
        g: *mut c_void,
        params: *const *mut C_tensor,
        n: usize,
        bucket_cap: i64,
        first_bucket_cap: i64,
        find_unused: c_int,
        out: *mut *mut c_void,
        nbuckets: *mut usize,
    ) -> c_int;
    pub fn rn50d_reducer_prepare_forward(r: *mut c_void, rebuilt: *mut c_int) -> c_int;
    pub fn rn50d_reducer_backward(
        r: *mut c_void,
        loss: *mut C_tensor,
        sync: c_int,
        backward_ns: *mut i64,
        wait_ns: *mut i64,
        first_bucket_ns: *mut i64,
        buckets: *mut i64,
    ) -> c_int;
    pub fn rn50d_reducer_free(r: *mut c_void);

    pub fn rn50d_allgather_autograd(
        g: *mut c_void,
        x: *mut C_tensor,
        out: *mut *mut C_tensor,
    ) -> c_int;
}

/// The shim's message for the last failed call on this thread.
pub fn last_error() -> String {
    // SAFETY: the shim returns a thread-local NUL-terminated string that lives until the next call.
    unsafe {
        let p = rn50d_last_error();
        if p.is_null() {
            return "unknown error".into();
        }
        CStr::from_ptr(p).to_string_lossy().into_owned()
    }
}

/// A buffer of `len` bytes the shim `malloc`ed, copied and freed.
///
/// # Safety
/// `data` is a buffer the shim allocated, of at least `len` bytes, not used again by the caller.
pub unsafe fn take_bytes(data: *mut u8, len: usize) -> Vec<u8> {
    if data.is_null() {
        return Vec::new();
    }
    let v = std::slice::from_raw_parts(data, len).to_vec();
    rn50d_free(data.cast());
    v
}

/// Turns a shim return code into a Result carrying the C++ message.
pub fn check(rc: c_int) -> Result<(), String> {
    if rc == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// tch tensors as the `at::Tensor*` handles the shim takes (collectives write into the tensors' storage in place,
/// never into the handles). The tensors must outlive the call.
pub fn handles(ts: &[&tch::Tensor]) -> Vec<*mut C_tensor> {
    ts.iter().map(|t| handle(t)).collect()
}

pub fn handle(t: &tch::Tensor) -> *mut C_tensor {
    t.as_ptr() as *mut C_tensor
}

/// Whether the shim was compiled with ProcessGroupNCCL (`cuda` feature).
pub fn cuda_compiled() -> bool {
    // SAFETY: no arguments, returns a constant.
    unsafe { rn50d_cuda_compiled() != 0 }
}
