//! c10d's TCPStore: the key-value server on rank 0 that every rank reaches at MASTER_ADDR:MASTER_PORT. Used for
//! rendezvous, Gloo/NCCL connection set-up, heartbeats and small metadata.
use crate::ffi;
use std::ffi::{c_void, CString};
use std::time::Duration;

/// A failed store operation (the c10d message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

impl From<StoreError> for String {
    fn from(e: StoreError) -> String {
        e.0
    }
}

impl From<String> for StoreError {
    fn from(s: String) -> StoreError {
        StoreError(s)
    }
}

/// A client connection to the job's TCPStore (rank 0 also runs the server inside it).
pub struct Store {
    raw: *mut c_void,
}

// SAFETY: c10d's TCPStore serialises the operations on one client connection with its own lock.
unsafe impl Send for Store {}
unsafe impl Sync for Store {}

fn check(rc: std::ffi::c_int) -> Result<(), StoreError> {
    ffi::check(rc).map_err(StoreError)
}

fn key(k: &str) -> Result<CString, StoreError> {
    CString::new(k).map_err(|_| StoreError(format!("store key {k:?} contains a NUL byte")))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

impl Store {
    /// Connects to (or, with `is_server`, starts) the store at host:port, retrying until `timeout`. Every key is
    /// prefixed with `prefix` (may be empty).
    pub fn connect(
        host: &str,
        port: u16,
        is_server: bool,
        world_size: usize,
        timeout: Duration,
        prefix: &str,
    ) -> Result<Store, StoreError> {
        let h = CString::new(host).map_err(|_| format!("host {host:?} contains a NUL byte"))?;
        let p =
            CString::new(prefix).map_err(|_| format!("prefix {prefix:?} contains a NUL byte"))?;
        let world = i32::try_from(world_size).map_err(|_| "world size too large".to_string())?;
        let mut raw = std::ptr::null_mut();
        // SAFETY: valid C strings and out-pointer; the shim catches every C++ exception.
        check(unsafe {
            ffi::rn50d_store_new(
                h.as_ptr(),
                port.into(),
                is_server.into(),
                world,
                ms(timeout),
                p.as_ptr(),
                &mut raw,
            )
        })?;
        Ok(Store { raw })
    }

    /// A second, independent connection to the same server (used by the heartbeat thread).
    pub fn try_clone(&self) -> Result<Store, StoreError> {
        let mut raw = std::ptr::null_mut();
        // SAFETY: self.raw is a live store handle.
        check(unsafe { ffi::rn50d_store_clone(self.raw, &mut raw) })?;
        Ok(Store { raw })
    }

    /// How long get/wait block, and how long a lost connection is retried.
    pub fn set_timeout(&self, timeout: Duration) -> Result<(), StoreError> {
        // SAFETY: live handle.
        check(unsafe { ffi::rn50d_store_set_timeout(self.raw, ms(timeout)) })
    }

    pub fn set(&self, k: &str, value: &[u8]) -> Result<(), StoreError> {
        let k = key(k)?;
        // SAFETY: live handle, valid key, value pointer/length from a slice.
        check(unsafe { ffi::rn50d_store_set(self.raw, k.as_ptr(), value.as_ptr(), value.len()) })
    }

    /// The value of `k`, waiting for it to be set (up to the store's timeout).
    pub fn get(&self, k: &str) -> Result<Vec<u8>, StoreError> {
        let k = key(k)?;
        let mut data = std::ptr::null_mut();
        let mut len = 0usize;
        // SAFETY: live handle, valid key and out-pointers. On success `data` is a malloc'ed buffer of `len` bytes.
        unsafe {
            check(ffi::rn50d_store_get(
                self.raw,
                k.as_ptr(),
                &mut data,
                &mut len,
            ))?;
            let v = std::slice::from_raw_parts(data, len).to_vec();
            ffi::rn50d_free(data.cast());
            Ok(v)
        }
    }

    /// Atomically adds `delta` to the integer at `k` (created as 0) and returns the new value.
    pub fn add(&self, k: &str, delta: i64) -> Result<i64, StoreError> {
        let k = key(k)?;
        let mut out = 0;
        // SAFETY: live handle, valid key and out-pointer.
        check(unsafe { ffi::rn50d_store_add(self.raw, k.as_ptr(), delta, &mut out) })?;
        Ok(out)
    }

    /// Whether `k` is set, without waiting.
    pub fn check(&self, k: &str) -> Result<bool, StoreError> {
        let k = key(k)?;
        let mut exists = 0;
        // SAFETY: live handle, valid key and out-pointer.
        check(unsafe { ffi::rn50d_store_check(self.raw, k.as_ptr(), &mut exists) })?;
        Ok(exists != 0)
    }

    /// Waits until every key is set, failing after `timeout`.
    pub fn wait(&self, keys: &[String], timeout: Duration) -> Result<(), StoreError> {
        let ks = keys.iter().map(|k| key(k)).collect::<Result<Vec<_>, _>>()?;
        let ptrs: Vec<_> = ks.iter().map(|k| k.as_ptr()).collect();
        // SAFETY: live handle; `ptrs` points into `ks`, alive for the call.
        check(unsafe { ffi::rn50d_store_wait(self.raw, ptrs.as_ptr(), ptrs.len(), ms(timeout)) })
    }

    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        // SAFETY: the handle came from the shim and is freed once.
        unsafe { ffi::rn50d_store_free(self.raw) }
    }
}
