//! Helpers for the crates' own test binaries (built with the `testing` feature, which their dev-dependencies
//! enable): no production code calls these, and they add no dependency.
//!
//! - where the shared test data is ([`shared_data`], its ImageNet photos [`shared_photos`]) and the Python that
//!   reference scripts run under ([`python`]), and how a test runs one ([`python_output`]);
//! - [`serial`]: tests that start many processes, one at a time, and [`serial_shared`]: those whose processes
//!   mostly wait, several at a time but never beside a [`serial`] one;
//! - for tests of the commands that stop on request ([`crate::stop`]), a Ctrl-C sent once the command under test
//!   got somewhere ([`sigint_when`]).
use std::ffi::OsStr;
use std::io::{BufRead, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The repository's root (this crate is `crates/util` in it).
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The shared test data (real photos, archives): `RN50_SHARED_DATA`, else `<repo>/../shared/data`. Panics,
/// saying so, if it has no `jpeg/` folder.
pub fn shared_data() -> PathBuf {
    let p = std::env::var_os("RN50_SHARED_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("../shared/data"));
    assert!(
        p.join("jpeg").is_dir(),
        "shared test data not found at {} (set RN50_SHARED_DATA)",
        p.display()
    );
    p
}

/// The 220 shared ImageNet sample photos (`jpeg/imagenet/<wnid>.JPEG`, one per class), sorted by path (so by
/// WordNet id).
pub fn shared_photos() -> Vec<PathBuf> {
    let dir = shared_data().join("jpeg/imagenet");
    let mut v: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    v.sort();
    assert!(
        v.len() >= 200,
        "expected the 220 shared ImageNet photos in {}",
        dir.display()
    );
    v
}

/// The Python with torch and torchvision that reference scripts run under: `RN50_PYTHON`, else the repo's
/// `.venv` (what `./dev setup` makes).
pub fn python() -> PathBuf {
    std::env::var_os("RN50_PYTHON")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join(".venv/bin/python"))
}

/// Runs the reference Python ([`python`]) with `args` as its command line (`SCRIPT ARGS…`, `-c CODE ARGS…` or
/// `-m MODULE ARGS…`) in `cwd` (`None`: this process's), with this process's environment and `env`, and returns
/// what it printed and how it ended, as `Command::output` does. Panics, saying what to install, if that Python
/// cannot import torch and torchvision.
///
/// The process is forked from a Python that imported torch and torchvision once for this test binary and this
/// `env` (`python_forkserver.py`, next to this file): the import alone costs about 6 CPU-seconds on the 2-core CI
/// machine, more than most reference scripts spend on their work. `env` is in place before that import (what is
/// read when a library starts, such as `MKL_CBWR`, must be there); the forked process is otherwise what a fresh
/// `python ARGS…` would be (the script's directory first on `sys.path`, stdin /dev/null, atexit handlers run).
pub fn python_output<S: AsRef<OsStr>>(
    args: &[S],
    cwd: Option<&Path>,
    env: &[(&str, &str)],
) -> Output {
    let server = fork_server(env);
    let n = server.requests.fetch_add(1, Ordering::Relaxed);
    let (out, err) = (
        server.dir.join(format!("{n}.stdout")),
        server.dir.join(format!("{n}.stderr")),
    );
    let cwd = cwd.map_or_else(|| std::env::current_dir().unwrap(), Path::to_path_buf);
    let vars: Vec<Vec<u8>> = std::env::vars_os()
        .filter(|(k, _)| !env.iter().any(|(e, _)| OsStr::new(e) == k))
        .map(|(k, v)| [k.as_bytes(), b"=", v.as_bytes()].concat())
        .chain(env.iter().map(|(k, v)| format!("{k}={v}").into_bytes()))
        .collect();
    let mut request = Vec::new();
    let n_vars = vars.len().to_string();
    let fields = [
        cwd.as_os_str(),
        out.as_os_str(),
        err.as_os_str(),
        OsStr::new(&n_vars),
    ];
    for field in fields
        .iter()
        .map(|f| f.as_bytes())
        .chain(vars.iter().map(Vec::as_slice))
        .chain(args.iter().map(|a| a.as_ref().as_bytes()))
    {
        assert!(
            !field.contains(&0),
            "a NUL in {:?}",
            String::from_utf8_lossy(field)
        );
        request.extend_from_slice(field);
        request.push(0);
    }
    let mut stream = UnixStream::connect(&server.socket)
        .unwrap_or_else(|e| panic!("the Python fork server at {}: {e}", server.socket.display()));
    stream.write_all(&request).unwrap();
    stream.shutdown(std::net::Shutdown::Write).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status: i32 = reply.parse().unwrap_or_else(|_| {
        let line: Vec<&OsStr> = args.iter().map(AsRef::as_ref).collect();
        panic!("the Python fork server replied {reply:?} to python {line:?}")
    });
    let take = |p: &Path| {
        let bytes = std::fs::read(p).unwrap_or_default();
        let _ = std::fs::remove_file(p);
        bytes
    };
    Output {
        status: ExitStatus::from_raw(status),
        stdout: take(&out),
        stderr: take(&err),
    }
}

/// A running `python_forkserver.py`: its folder (the script, the socket, the requests' output files), which it
/// removes when it ends, and the process, whose stdin's write end closing (this test binary ending) ends it.
struct ForkServer {
    dir: PathBuf,
    socket: PathBuf,
    requests: AtomicU64,
    _process: Child,
}

/// The fork server of `env`, started on first use.
fn fork_server(env: &[(&str, &str)]) -> Arc<ForkServer> {
    type Servers = Vec<(Vec<(String, String)>, Arc<ForkServer>)>;
    static SERVERS: Mutex<Servers> = Mutex::new(Vec::new());
    let key: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let mut servers = crate::lock_unpoisoned(&SERVERS);
    if let Some((_, s)) = servers.iter().find(|(k, _)| *k == key) {
        return s.clone();
    }
    let dir = std::env::temp_dir().join(format!(
        "rn50-python-{}-{}",
        std::process::id(),
        servers.len()
    ));
    // A folder left by an earlier process of this pid would hold its socket, which bind(2) refuses.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("python_forkserver.py");
    std::fs::write(&script, include_str!("python_forkserver.py")).unwrap();
    let socket = dir.join("socket");
    let stderr = dir.join("server.stderr");
    let py = python();
    let mut child = Command::new(&py)
        .arg(&script)
        .arg(&socket)
        .envs(env.iter().copied())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr).unwrap())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {} (run ./dev setup): {e}", py.display()));
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(
        line.trim() == "ready",
        "{} could not start the reference scripts' Python (it needs torch and torchvision: run ./dev setup):\n{}",
        py.display(),
        std::fs::read_to_string(&stderr).unwrap_or_default()
    );
    let server = Arc::new(ForkServer {
        dir,
        socket,
        requests: AtomicU64::new(0),
        _process: child,
    });
    servers.push((key, server.clone()));
    server
}

/// The lock of [`serial`] and [`serial_shared`].
static SERIAL: RwLock<()> = RwLock::new(());

/// Holds the test binary's one lock alone: tests that take it run one at a time, and never beside a
/// [`serial_shared`] one (multi-process tests whose processes compute: on a 2-core machine, several such jobs at once
/// only make each slow enough to time out). A test that panicked while holding it does not poison it for the others.
pub fn serial() -> RwLockWriteGuard<'static, ()> {
    crate::unpoisoned(SERIAL.write())
}

/// Holds the test binary's lock shared: tests that take it may run beside one another (as many as there are test
/// threads), never beside a [`serial`] one. For multi-process tests whose processes mostly wait (sleeping workers, a
/// timeout that must run out, a frozen peer): what they wait for is wall-clock, not CPU, so two of them take about
/// the time of one (the distributed tests: 107 s with every test serial, docs/testing.md).
pub fn serial_shared() -> RwLockReadGuard<'static, ()> {
    crate::unpoisoned(SERIAL.read())
}

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
