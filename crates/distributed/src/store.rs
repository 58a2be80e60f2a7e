//! c10d's TCPStore: the key-value server on rank 0 that every rank reaches at MASTER_ADDR:MASTER_PORT. Used for
//! rendezvous, Gloo/NCCL connection set-up, heartbeats and small metadata.
//!
//! Every operation ends within the store's timeout plus [`MARGIN`]. c10d bounds only its waits for a key: the
//! reply to any request (the connection's ping, `add`, `check`, cancelling a timed-out wait) is read from a socket
//! without a timeout, so a server that accepts connections but never answers (a SIGSTOPped rank 0, another
//! program holding the port) would block the caller for ever. Each operation therefore runs on a thread of its
//! own that the caller stops waiting for at the deadline; a thread left blocked keeps the connection alive (it is
//! never freed under it) and dies with the process, which is failing anyway.
use crate::ffi;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

/// How much longer than the store's own timeout an operation may take before it counts as unanswered.
pub const MARGIN: Duration = Duration::from_secs(2);

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

/// The shim's handle, freed when the last user lets go of it.
struct Handle(*mut c_void);

// SAFETY: c10d's TCPStore serialises the operations on one client connection with its own lock.
unsafe impl Send for Handle {}
unsafe impl Sync for Handle {}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: the handle came from the shim and is freed once, after every operation on it has returned.
        unsafe { ffi::rn50d_store_free(self.0) }
    }
}

/// A client connection to the job's TCPStore (rank 0 also runs the server inside it).
pub struct Store {
    handle: Arc<Handle>,
    /// host:port, for messages.
    addr: String,
    /// The store's timeout in milliseconds (what c10d waits for a key; see [`Store::set_timeout`]).
    timeout_ms: AtomicU64,
}

fn check(rc: std::ffi::c_int) -> Result<(), StoreError> {
    ffi::check(rc).map_err(StoreError)
}

fn key(k: &str) -> Result<CString, StoreError> {
    CString::new(k).map_err(|_| StoreError(format!("store key {k:?} contains a NUL byte")))
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX).max(1)
}

/// Runs `f` on a thread of its own and waits for it `limit` at most; None when it did not finish in time (the
/// thread is left to finish or block on its own).
pub(crate) fn within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<Option<T>, String> {
    let (tx, rx) = mpsc::sync_channel(1);
    std::thread::Builder::new()
        .name("rn50-store-op".into())
        .spawn(move || {
            let _ = tx.send(f());
        })
        .map_err(|e| format!("cannot start a thread for a store operation: {e}"))?;
    match rx.recv_timeout(limit) {
        Ok(v) => Ok(Some(v)),
        Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            Err("a store operation's thread ended without a result (panicked)".into())
        }
    }
}

/// Whether something accepts TCP connections at host:port (within `timeout`).
pub(crate) fn accepts_connections(host: &str, port: u16, timeout: Duration) -> bool {
    use std::net::{TcpStream, ToSocketAddrs};
    (host, port)
        .to_socket_addrs()
        .map(|addrs| {
            addrs
                .into_iter()
                .any(|a| TcpStream::connect_timeout(&a, timeout).is_ok())
        })
        .unwrap_or(false)
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
        let addr = format!("{host}:{port}");
        let handle = Store::bounded(&addr, "connecting", timeout, move || {
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
            Ok(Handle(raw))
        })?;
        Ok(Store {
            handle: Arc::new(handle),
            addr,
            timeout_ms: AtomicU64::new(ms(timeout) as u64),
        })
    }

    /// Runs `f`, giving up after `wait` + [`MARGIN`].
    fn bounded<T: Send + 'static>(
        addr: &str,
        what: &str,
        wait: Duration,
        f: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let limit = wait + MARGIN;
        within(limit, f)?.unwrap_or_else(|| {
            Err(StoreError(format!(
                "{what}: the store at {addr} did not answer within {:.1} s",
                limit.as_secs_f64()
            )))
        })
    }

    /// `f` on this connection, bounded by `wait` (default: the store's timeout) plus [`MARGIN`].
    fn op<T: Send + 'static>(
        &self,
        what: &str,
        wait: Option<Duration>,
        f: impl FnOnce(*mut c_void) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let h = Arc::clone(&self.handle);
        Store::bounded(
            &self.addr,
            what,
            wait.unwrap_or(self.timeout()),
            move || {
                // The whole Arc moves into the thread: the connection outlives an operation abandoned at its
                // deadline.
                let h = h;
                f(h.0)
            },
        )
    }

    /// The store's timeout: how long get/wait wait for a key, and how long any operation may take (plus
    /// [`MARGIN`]).
    pub fn timeout(&self) -> Duration {
        Duration::from_millis(self.timeout_ms.load(Ordering::Relaxed))
    }

    /// A second, independent connection to the same server (used by the heartbeat thread).
    pub fn try_clone(&self) -> Result<Store, StoreError> {
        let handle = self.op("connecting", None, |raw| {
            let mut out = std::ptr::null_mut();
            // SAFETY: raw is a live store handle (kept alive by the operation).
            check(unsafe { ffi::rn50d_store_clone(raw, &mut out) })?;
            Ok(Handle(out))
        })?;
        Ok(Store {
            handle: Arc::new(handle),
            addr: self.addr.clone(),
            timeout_ms: AtomicU64::new(self.timeout_ms.load(Ordering::Relaxed)),
        })
    }

    /// How long get/wait block, how long a lost connection is retried, and (plus [`MARGIN`]) how long any
    /// operation may take.
    pub fn set_timeout(&self, timeout: Duration) -> Result<(), StoreError> {
        // SAFETY: live handle. Only sets a field on the C++ side: nothing to wait for.
        check(unsafe { ffi::rn50d_store_set_timeout(self.handle.0, ms(timeout)) })?;
        self.timeout_ms.store(ms(timeout) as u64, Ordering::Relaxed);
        Ok(())
    }

    pub fn set(&self, k: &str, value: &[u8]) -> Result<(), StoreError> {
        let k = key(k)?;
        let value = value.to_vec();
        self.op("set", None, move |raw| {
            // SAFETY: live handle, valid key, value pointer/length from a vector.
            check(unsafe { ffi::rn50d_store_set(raw, k.as_ptr(), value.as_ptr(), value.len()) })
        })
    }

    /// The value of `k`, waiting for it to be set (up to the store's timeout).
    pub fn get(&self, k: &str) -> Result<Vec<u8>, StoreError> {
        let k = key(k)?;
        self.op("get", None, move |raw| {
            let mut data = std::ptr::null_mut();
            let mut len = 0usize;
            // SAFETY: live handle, valid key and out-pointers. On success `data` is a malloc'ed buffer of `len`
            // bytes.
            unsafe {
                check(ffi::rn50d_store_get(raw, k.as_ptr(), &mut data, &mut len))?;
                Ok(ffi::take_bytes(data, len))
            }
        })
    }

    /// Atomically adds `delta` to the integer at `k` (created as 0) and returns the new value.
    pub fn add(&self, k: &str, delta: i64) -> Result<i64, StoreError> {
        let k = key(k)?;
        self.op("add", None, move |raw| {
            let mut out = 0;
            // SAFETY: live handle, valid key and out-pointer.
            check(unsafe { ffi::rn50d_store_add(raw, k.as_ptr(), delta, &mut out) })?;
            Ok(out)
        })
    }

    /// Whether `k` is set, without waiting.
    pub fn check(&self, k: &str) -> Result<bool, StoreError> {
        let k = key(k)?;
        self.op("check", None, move |raw| {
            let mut exists = 0;
            // SAFETY: live handle, valid key and out-pointer.
            check(unsafe { ffi::rn50d_store_check(raw, k.as_ptr(), &mut exists) })?;
            Ok(exists != 0)
        })
    }

    /// Waits until every key is set, failing after `timeout`.
    pub fn wait(&self, keys: &[String], timeout: Duration) -> Result<(), StoreError> {
        let ks = keys.iter().map(|k| key(k)).collect::<Result<Vec<_>, _>>()?;
        self.op("wait", Some(timeout), move |raw| {
            let ptrs: Vec<_> = ks.iter().map(|k| k.as_ptr()).collect();
            // SAFETY: live handle; `ptrs` points into `ks`, alive for the call.
            check(unsafe { ffi::rn50d_store_wait(raw, ptrs.as_ptr(), ptrs.len(), ms(timeout)) })
        })
    }

    /// The shim's handle, for c10d objects built on this store (valid while the Store lives).
    pub(crate) fn raw(&self) -> *mut c_void {
        self.handle.0
    }
}
