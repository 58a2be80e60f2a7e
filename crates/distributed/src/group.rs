//! The process group: rendezvous through the TCPStore, c10d's ProcessGroupGloo (CPU tensors) and, with the `cuda`
//! feature, ProcessGroupNCCL (CUDA tensors), collectives with rank- and op-named errors.
use crate::env::WorldInfo;
use crate::error::CommError;
use crate::ffi;
use crate::health::{ranks, Heartbeat};
use crate::netif::{gloo_binding, hostname, route_source};
use crate::store::Store;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tch::{Device, Kind, Tensor};

// The interface checks live in crate::netif; their public path stays `group::…`
// (tests/suite/multinode_args.rs uses it).
pub use crate::netif::{
    describe_interfaces, ifname_problem, interfaces, master_addr_problem, Interface,
};

/// Which c10d backend carries collectives of CUDA tensors. CPU tensors always go through Gloo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Gloo only (CPU training).
    Gloo,
    /// NCCL for CUDA tensors, Gloo for CPU tensors (needs the `cuda` feature).
    Nccl,
}

impl Backend {
    /// NCCL when CUDA training was asked for and the shim has it, else Gloo.
    pub fn for_device(device: Device) -> Backend {
        if device.is_cuda() && ffi::cuda_compiled() {
            Backend::Nccl
        } else {
            Backend::Gloo
        }
    }
}

/// How the group is set up.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub backend: Backend,
    /// Rendezvous, connection set-up and every collective fail after this long (c10d's default would be 30 min).
    pub timeout: Duration,
    /// How often each rank proves it is alive in the store (used only to name the culprit after a failure).
    pub heartbeat_interval: Duration,
    /// CUDA device of this rank for NCCL; None: the local rank (one process per GPU).
    pub device_index: Option<usize>,
}

impl Default for InitOptions {
    fn default() -> Self {
        InitOptions {
            backend: Backend::Gloo,
            timeout: Duration::from_secs(600),
            heartbeat_interval: Duration::from_secs(1),
            device_index: None,
        }
    }
}

/// Reduction of all-reduce.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
    Product,
}

impl ReduceOp {
    fn code(self) -> i32 {
        match self {
            ReduceOp::Sum => 0,
            ReduceOp::Max => 1,
            ReduceOp::Min => 2,
            ReduceOp::Product => 3,
        }
    }
}

pub(crate) struct Inner {
    raw: *mut c_void,
    pub(crate) store: Store,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    master: String,
    timeout: Duration,
    heartbeat: Mutex<Option<Heartbeat>>,
    /// Set after a failed collective: c10d objects are then not destroyed (their destructors may block on the
    /// broken connections); the process is expected to exit.
    pub(crate) broken: AtomicBool,
}

// SAFETY: c10d process groups are thread-safe (collectives are queued to the backend's own threads).
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

impl Inner {
    pub(crate) fn raw(&self) -> *mut c_void {
        self.raw
    }

    /// A CommError for `op`, with what the heartbeats say about the other ranks. Marks the group broken.
    pub(crate) fn fail(&self, op: &str, msg: String) -> CommError {
        self.broken.store(true, Ordering::SeqCst);
        let diagnosis = match self
            .heartbeat
            .lock()
            .ok()
            .as_deref()
            .and_then(Option::as_ref)
        {
            Some(hb) => hb.diagnose(&self.store, self.rank, self.world, &self.master),
            None => String::new(),
        };
        let detail = if diagnosis.is_empty() {
            msg
        } else {
            format!("{msg}; {diagnosis}")
        };
        CommError {
            rank: self.rank,
            world_size: self.world,
            op: op.into(),
            detail,
        }
    }

    fn err(&self, op: &str, detail: String) -> CommError {
        CommError {
            rank: self.rank,
            world_size: self.world,
            op: op.into(),
            detail,
        }
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Ok(mut hb) = self.heartbeat.lock() {
            if let Some(mut h) = hb.take() {
                h.stop();
            }
        }
        if !self.broken.load(Ordering::SeqCst) {
            // SAFETY: the handle came from rn50d_pg_new and is freed once.
            unsafe { ffi::rn50d_pg_free(self.raw) }
        }
    }
}

/// A c10d process group over all ranks of the job. Cheap to clone (shared).
#[derive(Clone)]
pub struct ProcessGroup {
    pub(crate) inner: Arc<Inner>,
}

/// An asynchronous collective; `wait` it before reading the tensors.
pub struct Work {
    raw: *mut c_void,
    group: Arc<Inner>,
    op: String,
    /// Keeps the tensors' storage alive while the collective runs.
    _tensors: Vec<Tensor>,
}

// SAFETY: c10d work handles may be waited on from any thread.
unsafe impl Send for Work {}

impl Work {
    /// Waits for completion; `timeout` None means the process group's own timeout.
    pub fn wait(self, timeout: Option<Duration>) -> Result<(), CommError> {
        let ms = timeout
            .map(|t| i64::try_from(t.as_millis()).unwrap_or(i64::MAX).max(1))
            .unwrap_or(0);
        // SAFETY: live work handle.
        let r = ffi::check(unsafe { ffi::rn50d_work_wait(self.raw, ms) });
        r.map_err(|e| self.group.fail(&self.op, e))
    }

    /// Whether the collective has finished (successfully or not), without blocking.
    pub fn is_completed(&self) -> bool {
        let mut done = 0;
        // SAFETY: live work handle.
        unsafe { ffi::rn50d_work_is_completed(self.raw, &mut done) == 0 && done != 0 }
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if !self.group.broken.load(Ordering::SeqCst) {
            // SAFETY: handle from the shim, freed once.
            unsafe { ffi::rn50d_work_free(self.raw) }
        }
    }
}

impl ProcessGroup {
    /// Rendezvous of all `world.world_size` ranks at world.master_addr:master_port, then the c10d process group.
    /// Fails within `opts.timeout` when the store cannot be reached or a rank does not show up, naming them.
    pub fn init(world: &WorldInfo, opts: &InitOptions) -> Result<ProcessGroup, CommError> {
        let (rank, size) = (world.rank, world.world_size);
        let master = format!("{}:{}", world.master_addr, world.master_port);
        let err = |op: &str, detail: String| CommError {
            rank,
            world_size: size,
            op: op.into(),
            detail,
        };
        if size == 0 || rank >= size {
            return Err(err(
                "rendezvous",
                format!("rank {rank} is outside a world of {size}"),
            ));
        }
        if opts.backend == Backend::Nccl && !ffi::cuda_compiled() {
            return Err(err(
                "process group init",
                "NCCL needs rn50 built against a CUDA libtorch (with the CUDA headers)".into(),
            ));
        }
        // c10d logs each retry and timeout with a C++ backtrace; our errors carry its messages. TORCH_CPP_LOG_LEVEL
        // (c10's own setting) wins when set.
        if std::env::var_os("TORCH_CPP_LOG_LEVEL").is_none() {
            // SAFETY: sets an int flag of c10.
            unsafe { ffi::rn50d_set_log_level(3) }
        }
        let secs = opts.timeout.as_secs_f64();
        // A world of one needs no agreed port: the kernel picks a free one (single jobs sharing a node cannot
        // collide).
        let port = if size == 1 { 0 } else { world.master_port };
        // Under torchrun the agent already serves a store at MASTER_ADDR:PORT: connect to it as a client, in a
        // namespace per restart attempt (as torch.distributed does).
        let agent_store = size > 1
            && std::env::var("TORCHELASTIC_USE_AGENT_STORE")
                .is_ok_and(|v| v.eq_ignore_ascii_case("true"));
        let prefix = if agent_store {
            let attempt =
                std::env::var("TORCHELASTIC_RESTART_COUNT").unwrap_or_else(|_| "0".into());
            format!("/worker/attempt_{attempt}/")
        } else {
            String::new()
        };
        let is_server = rank == 0 && !agent_store;
        let check_master = !std::env::var("RN50_MASTER_ADDR_CHECK").is_ok_and(|v| v.trim() == "0");
        if is_server && size > 1 && check_master {
            // Rank 0 serves the store at MASTER_ADDR: an address of another host would only show as the others'
            // rendezvous timeout, after RN50_DIST_TIMEOUT.
            if let Some(problem) = master_addr_problem(&world.master_addr, port, &interfaces()) {
                return Err(err("rendezvous", problem));
            }
        }
        let store = Store::connect(
            &world.master_addr,
            port,
            is_server,
            size,
            opts.timeout,
            &prefix,
        )
        .map_err(|e| {
            let what = if is_server {
                format!("cannot listen on {master} as the store server")
            } else if crate::store::accepts_connections(&world.master_addr, port, Duration::from_secs(2))
            {
                // Connected, yet no valid c10d reply: silence or garbage from whatever holds the port.
                format!(
                    "{master} answers but is not an rn50/c10d store (no valid store reply within {secs:.0} s: \
                     another program holds the port, or rank 0's process is frozen)"
                )
            } else {
                format!("cannot reach the store server (rank 0) at {master} within {secs:.0} s")
            };
            err("rendezvous", format!("{what}: {e}"))
        })?;
        rendezvous(&store, rank, size, opts.timeout)
            .map_err(|e| err("rendezvous", format!("{e} (store at {master})")))?;

        let ifnames = std::env::var("GLOO_SOCKET_IFNAME").unwrap_or_default();
        // Without GLOO_SOCKET_IFNAME, Gloo binds to this host's address on the way to the master (loopback when
        // all ranks are on this machine): the other ranks reach the master there, so they reach this rank too.
        // c10d's own default, the address the hostname resolves to, is often 127.0.1.1 or an interface the other
        // nodes cannot reach, and then Gloo's connection retries ignore the timeout (41 s for an 8 s timeout).
        let host = match ifnames.is_empty() {
            true => route_source(&world.master_addr, world.master_port).unwrap_or_default(),
            false => String::new(),
        };
        let host = host.as_str();
        // A missing, down or address-less interface fails here, naming it, rather than as a timeout on the other
        // ranks; they hear of it through the store when their own connection set-up fails.
        let init_failed = |detail: String| {
            // The job is failing: short store waits from here on, and none once the store is gone.
            let _ = store.set_timeout(Duration::from_secs(2));
            let key = |r: usize| format!("rn50/pg_init_failed/{r}");
            let mut reports = Vec::new();
            if store.set(&key(rank), detail.as_bytes()).is_ok() {
                for r in (0..size).filter(|&r| r != rank) {
                    match store.check(&key(r)) {
                        Ok(true) => reports.extend(store.get(&key(r)).ok().map(|v| {
                            format!("; rank {r} reports: {}", String::from_utf8_lossy(&v))
                        })),
                        Ok(false) => {}
                        Err(_) => break,
                    }
                }
            }
            let more = match reports.len() {
                n if n > 2 => format!("; {} other ranks reported failures too", n - 2),
                _ => String::new(),
            };
            reports.truncate(2);
            err(
                "process group init (connecting to every rank)",
                format!("{detail}{}{more}", reports.concat()),
            )
        };
        if let Some(problem) = ifname_problem(&ifnames, &interfaces()) {
            return Err(init_failed(problem));
        }
        let (c_if, c_host) = (
            CString::new(ifnames.as_str())
                .map_err(|_| err("process group init", "GLOO_SOCKET_IFNAME has a NUL".into()))?,
            CString::new(host).unwrap_or_default(),
        );
        let backend = match opts.backend {
            Backend::Gloo => 0,
            Backend::Nccl => 1,
        };
        let mut raw = std::ptr::null_mut();
        let timeout_ms = i64::try_from(opts.timeout.as_millis()).unwrap_or(i64::MAX);
        // SAFETY: live store handle, valid C strings and out-pointer.
        ffi::check(unsafe {
            ffi::rn50d_pg_new(
                store.raw(),
                rank as i32,
                size as i32,
                backend,
                timeout_ms,
                c_if.as_ptr(),
                c_host.as_ptr(),
                opts.device_index.unwrap_or(world.local_rank) as i32,
                &mut raw,
            )
        })
        .map_err(|e| {
            init_failed(format!(
                "{e}{}",
                gloo_binding(&ifnames, host, &interfaces())
            ))
        })?;
        let heartbeat = Heartbeat::start(&store, rank, opts.heartbeat_interval)
            .map_err(|e| err("heartbeat start", e))?;
        Ok(ProcessGroup {
            inner: Arc::new(Inner {
                raw,
                store,
                rank,
                world: size,
                master,
                timeout: opts.timeout,
                heartbeat: Mutex::new(Some(heartbeat)),
                broken: AtomicBool::new(false),
            }),
        })
    }

    pub fn rank(&self) -> usize {
        self.inner.rank
    }

    pub fn world_size(&self) -> usize {
        self.inner.world
    }

    pub fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    /// The job's key-value store (small metadata; keys under "rn50/" are used by this crate).
    pub fn store(&self) -> &Store {
        &self.inner.store
    }

    fn work(&self, op: String, raw: *mut c_void, ts: &[&Tensor]) -> Work {
        Work {
            raw,
            group: self.inner.clone(),
            op,
            _tensors: ts.iter().map(|t| t.shallow_clone()).collect(),
        }
    }

    /// Starts an in-place all-reduce of `ts` (each tensor reduced across ranks element-wise).
    pub fn allreduce_async(
        &self,
        ts: &[&Tensor],
        op: ReduceOp,
        what: &str,
    ) -> Result<Work, CommError> {
        let hs = ffi::handles(ts);
        let mut raw = std::ptr::null_mut();
        let name = format!("all-reduce of {what}");
        // SAFETY: live group, tensor handles alive for the call (and kept by the Work).
        ffi::check(unsafe {
            ffi::rn50d_allreduce(self.inner.raw, hs.as_ptr(), hs.len(), op.code(), &mut raw)
        })
        .map_err(|e| self.inner.fail(&name, e))?;
        Ok(self.work(name, raw, ts))
    }

    /// In-place all-reduce, waited for.
    pub fn allreduce(&self, ts: &[&Tensor], op: ReduceOp, what: &str) -> Result<(), CommError> {
        self.allreduce_async(ts, op, what)?.wait(None)
    }

    /// Sums (or max/min…) a few host numbers over all ranks: metrics, eval counts.
    pub fn allreduce_f64(
        &self,
        values: &mut [f64],
        op: ReduceOp,
        what: &str,
    ) -> Result<(), CommError> {
        if values.is_empty() {
            return Ok(());
        }
        let t = Tensor::from_slice(values);
        self.allreduce(&[&t], op, what)?;
        let out = Vec::<f64>::try_from(&t).map_err(|e| self.inner.err(what, e.to_string()))?;
        values.copy_from_slice(&out);
        Ok(())
    }

    /// Whether `flag` is set on any rank (an all-reduce MAX). For decisions every rank must take at the same step,
    /// e.g. stopping after SIGTERM/SIGUSR1 reached only some ranks, or a non-finite loss on one of them.
    ///
    /// A rank out of step (in another collective at this point, e.g. because its epoch ended earlier) must not pass
    /// for a rank that set the flag: Gloo does not check that the ranks' collectives match, and the other rank's
    /// numbers would be read as flags. So every rank also sends a tag t derived from `what`, as t and -t: after the
    /// MAX both come back unchanged only if every rank sent exactly t; anything else is an error.
    pub fn any_rank(&self, flag: bool, what: &str) -> Result<bool, CommError> {
        let t = tag(what);
        let mut v = [if flag { 1.0 } else { 0.0 }, t, -t];
        self.allreduce_f64(&mut v, ReduceOp::Max, what)?;
        if v[1] != t || v[2] != -t {
            return Err(self.inner.fail(
                &format!("all-reduce of {what}"),
                "the ranks are out of step: another rank was in a different collective (were they started with \
                 different settings or data?)"
                    .into(),
            ));
        }
        Ok(v[0] > 0.0)
    }

    /// Element-wise sums of `values` over ranks, checked as [`ProcessGroup::any_rank`] is: every rank also sends
    /// the tag of `what`, so a rank in another collective at this point is an error, not numbers read as counts.
    pub fn sum_in_step(&self, values: &mut [f64], what: &str) -> Result<(), CommError> {
        let t = tag(what);
        let mut v: Vec<f64> = values.iter().copied().chain([t, -t]).collect();
        self.allreduce_f64(&mut v, ReduceOp::Sum, what)?;
        let all = t * self.world_size() as f64;
        let n = values.len();
        if v[n] != all || v[n + 1] != -all {
            return Err(self.inner.fail(
                &format!("all-reduce of {what}"),
                "the ranks are out of step: another rank was in a different collective (were they started with \
                 different settings or data?)"
                    .into(),
            ));
        }
        values.copy_from_slice(&v[..n]);
        Ok(())
    }

    /// Starts an in-place broadcast of rank `root`'s `ts` to every rank.
    pub fn broadcast_async(
        &self,
        ts: &[&Tensor],
        root: usize,
        what: &str,
    ) -> Result<Work, CommError> {
        let hs = ffi::handles(ts);
        let mut raw = std::ptr::null_mut();
        let name = format!("broadcast of {what} from rank {root}");
        // SAFETY: as allreduce_async.
        ffi::check(unsafe {
            ffi::rn50d_broadcast(self.inner.raw, hs.as_ptr(), hs.len(), root as i32, &mut raw)
        })
        .map_err(|e| self.inner.fail(&name, e))?;
        Ok(self.work(name, raw, ts))
    }

    pub fn broadcast(&self, ts: &[&Tensor], root: usize, what: &str) -> Result<(), CommError> {
        self.broadcast_async(ts, root, what)?.wait(None)
    }

    /// Rank `root`'s tensors onto every rank, packed into few large messages (DDP's start-of-training sync).
    pub fn broadcast_coalesced(
        &self,
        ts: &[&Tensor],
        root: usize,
        buffer_bytes: usize,
        what: &str,
    ) -> Result<(), CommError> {
        if ts.is_empty() {
            return Ok(());
        }
        let hs = ffi::handles(ts);
        // SAFETY: live group and tensor handles for the duration of the (blocking) call.
        ffi::check(unsafe {
            ffi::rn50d_broadcast_coalesced(
                self.inner.raw,
                hs.as_ptr(),
                hs.len(),
                buffer_bytes,
                root as i32,
            )
        })
        .map_err(|e| {
            self.inner
                .fail(&format!("broadcast of {what} from rank {root}"), e)
        })
    }

    /// Every rank's `t`, in rank order.
    pub fn allgather(&self, t: &Tensor, what: &str) -> Result<Vec<Tensor>, CommError> {
        let outs: Vec<Tensor> = (0..self.inner.world).map(|_| t.empty_like()).collect();
        let refs: Vec<&Tensor> = outs.iter().collect();
        let hs = ffi::handles(&refs);
        let mut raw = std::ptr::null_mut();
        let name = format!("all-gather of {what}");
        // SAFETY: live group, input and output handles alive for the call and kept by the Work.
        ffi::check(unsafe {
            ffi::rn50d_allgather(
                self.inner.raw,
                ffi::handle(t),
                hs.as_ptr(),
                hs.len(),
                &mut raw,
            )
        })
        .map_err(|e| self.inner.fail(&name, e))?;
        let mut keep = refs.clone();
        keep.push(t);
        self.work(name, raw, &keep).wait(None)?;
        Ok(outs)
    }

    /// Every rank's `t` stacked in rank order (`[world, …t's shape]`), recorded for autograd: backward gives `t`
    /// the sum of the gradients of its copies on every rank (an all-reduce). Every rank must call it in the same
    /// order and run its backward.
    pub fn allgather_autograd(&self, t: &Tensor, what: &str) -> Result<Tensor, CommError> {
        let mut out = std::ptr::null_mut();
        // SAFETY: live group and tensor handles; on success the shim stores a new heap tensor in `out`.
        ffi::check(unsafe {
            ffi::rn50d_allgather_autograd(self.inner.raw, ffi::handle(t), &mut out)
        })
        .map_err(|e| self.inner.fail(&format!("all-gather of {what}"), e))?;
        // SAFETY: on success `out` is a new heap tensor, owned from here on by the returned Tensor.
        Ok(unsafe { Tensor::from_ptr(out) })
    }

    /// Waits until every rank got here.
    pub fn barrier(&self, what: &str) -> Result<(), CommError> {
        let mut raw = std::ptr::null_mut();
        let name = format!("barrier ({what})");
        // SAFETY: live group, out-pointer.
        ffi::check(unsafe { ffi::rn50d_barrier(self.inner.raw, &mut raw) })
            .map_err(|e| self.inner.fail(&name, e))?;
        self.work(name, raw, &[]).wait(None)
    }

    /// Fails unless every rank has the same number of tensors with the same shapes and dtypes.
    pub fn verify_same_shapes(&self, ts: &[&Tensor], what: &str) -> Result<(), CommError> {
        let hs = ffi::handles(ts);
        // SAFETY: live group and tensor handles for the blocking call.
        ffi::check(unsafe { ffi::rn50d_verify_params(self.inner.raw, hs.as_ptr(), hs.len()) })
            .map_err(|e| {
                self.inner
                    .fail(&format!("check that every rank has the same {what}"), e)
            })
    }

    /// Fails unless every rank runs with the same `config` (a resolved configuration as JSON) apart from the leaves
    /// under the `skip` paths: what may differ between processes (a device index, loader threads, a node-local
    /// data path) and values derived from compared ones (named in the message otherwise). Compared through
    /// the store, bounded by the group's timeout: every rank fails alike, naming each differing flag and the ranks'
    /// values (see [`crate::settings`]).
    pub fn check_same_config(
        &self,
        config: &serde_json::Value,
        skip: &[&str],
    ) -> Result<(), CommError> {
        let mine = crate::settings::flatten(config, skip);
        let json = serde_json::to_vec(&mine)
            .map_err(|e| self.inner.err("configuration check", e.to_string()))?;
        let round = Round {
            key: "config",
            what: "configuration check",
            absent: "did not reach the configuration check",
        };
        let (rank, world) = (self.inner.rank, self.inner.world);
        agree(
            &self.inner.store,
            rank,
            world,
            self.inner.timeout,
            &round,
            &json,
            |all| {
                let parsed: Result<Vec<_>, _> =
                    all.iter().map(|v| serde_json::from_slice(v)).collect();
                match parsed {
                    Ok(configs) => crate::settings::differences(&configs),
                    Err(e) => Some(format!(
                        "a rank sent an unreadable configuration ({e}): different rn50 versions?"
                    )),
                }
            },
        )
        .map_err(|e| self.inner.err("configuration check", e))
    }

    /// Clean end of the job: waits for every rank (so that rank 0, which serves the store, does not leave while
    /// others still use it) and stops the heartbeats.
    pub fn finish(self) -> Result<(), CommError> {
        self.barrier("end of job")?;
        if let Ok(mut hb) = self.inner.heartbeat.lock() {
            if let Some(mut h) = hb.take() {
                h.stop();
            }
        }
        Ok(())
    }
}

/// Every rank registers; rank 0 checks that they agree on the world size.
fn rendezvous(store: &Store, rank: usize, world: usize, timeout: Duration) -> Result<(), String> {
    let me = format!("{world} {} {}", hostname(), std::process::id());
    let round = Round {
        key: "joined",
        what: "rendezvous",
        absent: "did not join",
    };
    agree(store, rank, world, timeout, &round, me.as_bytes(), |all| {
        all.iter().enumerate().skip(1).find_map(|(r, v)| {
            let theirs = String::from_utf8_lossy(v).into_owned();
            let w = theirs.split(' ').next().unwrap_or("").to_string();
            (w != world.to_string()).then(|| {
                format!("rank {r} (host, pid: {theirs}) was started with WORLD_SIZE={w}, rank 0 with {world}")
            })
        })
    })
}

/// A round of [`agree`].
pub(crate) struct Round<'a> {
    /// Its keys: rn50/{key}/…
    pub key: &'a str,
    /// What it is, for messages: "rendezvous".
    pub what: &'a str,
    /// What a rank that did not publish in time did: "did not join".
    pub absent: &'a str,
}

/// One round of agreement through the store: every rank publishes `mine` (rn50/{key}/{rank}); rank 0 waits for
/// all, `judge`s them (None: agreed; Some: what is wrong, as a sentence) and publishes the verdict ("ok" or that
/// sentence), which the others read in the same round trip as they wait for it (they wait a little longer than
/// rank 0, so that they hear its verdict rather than time out too). Ranks that have not published within `timeout`
/// make the verdict "rank(s) … of N {absent} within T s". Every rank returns the verdict, so that all fail alike.
pub(crate) fn agree(
    store: &Store,
    rank: usize,
    world: usize,
    timeout: Duration,
    round: &Round,
    mine: &[u8],
    judge: impl FnOnce(&[Vec<u8>]) -> Option<String>,
) -> Result<(), String> {
    let key = |r: usize| format!("rn50/{}/{r}", round.key);
    let (verdict_key, read_key) = (
        format!("rn50/{}/verdict", round.key),
        format!("rn50/{}/read", round.key),
    );
    let secs = timeout.as_secs_f64();
    store.set(&key(rank), mine)?;
    if rank == 0 {
        let keys: Vec<String> = (0..world).map(key).collect();
        let mut present = world;
        let verdict = match store.wait(&keys, timeout) {
            Err(_) => {
                let missing: Vec<usize> = (0..world)
                    .filter(|&r| !store.check(&key(r)).unwrap_or(false))
                    .collect();
                present = world - missing.len();
                format!(
                    "{} of {world} {} within {secs:.0} s",
                    ranks(&missing),
                    round.absent
                )
            }
            Ok(()) => {
                let all = (0..world)
                    .map(|r| store.get(&key(r)))
                    .collect::<Result<Vec<_>, _>>()?;
                judge(&all).unwrap_or_else(|| "ok".into())
            }
        };
        store.set(&verdict_key, verdict.as_bytes())?;
        if verdict == "ok" {
            return Ok(());
        }
        // This process serves the store: stay until the others have read the verdict (or a few seconds).
        let until = std::time::Instant::now() + Duration::from_secs(3);
        while store.add(&read_key, 0).unwrap_or(0) < present as i64 - 1
            && std::time::Instant::now() < until
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        return Err(verdict);
    }
    let got = store
        .wait(
            std::slice::from_ref(&verdict_key),
            timeout + Duration::from_secs(3),
        )
        .and_then(|()| store.get(&verdict_key));
    if got.is_ok() {
        let _ = store.add(&read_key, 1);
    }
    match got {
        Ok(v) if v == b"ok" => Ok(()),
        Ok(v) => Err(format!("rank 0 reports: {}", String::from_utf8_lossy(&v))),
        Err(e) => Err(format!(
            "rank 0 did not complete the {} within {secs:.0} s: {e}",
            round.what
        )),
    }
}

/// A number in 1..=2^20 (exact in an f64) that tells collectives apart by their description (FNV-1a).
fn tag(what: &str) -> f64 {
    let h = what.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    ((h >> 44) + 1) as f64
}

/// A CPU f64 tensor's elements (helper for tests and metrics).
pub fn to_f64_vec(t: &Tensor) -> Vec<f64> {
    Vec::<f64>::try_from(
        &t.to_kind(Kind::Double)
            .to_device(Device::Cpu)
            .flatten(0, -1),
    )
    .unwrap_or_default()
}
