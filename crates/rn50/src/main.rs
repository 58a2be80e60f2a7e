use std::process::ExitCode;

use rn50::cli::{Command, Refused};
use rn50::train::Outcome;

fn main() -> ExitCode {
    end_without_libtorchs_teardown();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    // Parse and stop (docs/train.md): for train, the rules between flags are checked too, and the resolved flags
    // (the run directory's config.toml) go to stdout.
    if std::env::var_os("RN50_PARSE_ONLY").is_some() {
        let parsed = rn50::cli::parse_only(argv);
        print!("{}", parsed.stdout);
        eprint!("{}", parsed.stderr);
        return ExitCode::from(parsed.code);
    }
    let cli = match rn50::cli::parse(argv) {
        Ok(cli) => cli,
        Err(Refused::Config(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
        Err(Refused::Clap(e)) => e.exit(),
    };
    // Log lines: UTC time stamp, level, `[rank N]` when this process is one of several ranks; RUST_LOG filters.
    let rank = rn50_distributed::WorldInfo::from_env()
        .ok()
        .filter(|w| w.is_distributed())
        .map(|w| w.rank);
    rn50_util::log::init(rank);
    rn50::alloc::keep_freed_memory();
    // libtorch's out-of-memory error reaches rn50 as a panic of tch's tensor methods: it becomes an error that
    // names the batch size (other panics keep Rust's report).
    let rust_report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        if out_of_memory(info.payload()).is_none() {
            rust_report(info)
        }
    }));
    let result = match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run(&cli.command)))
    {
        Ok(Ok(code)) => return code,
        Ok(Err(e)) => Err(e),
        Err(panic) => match out_of_memory(&*panic) {
            Some(what) => Err(anyhow::anyhow!(
                "out of memory ({what}) {}",
                memory_advice(&cli.command)
            )),
            None => std::panic::resume_unwind(panic),
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // Stopped on request (Ctrl-C, SIGTERM) with the work kept or cleaned up: not an error.
        Err(e) if e.chain().any(|c| c.is::<rn50_util::stop::Stopped>()) => {
            tracing::warn!("{e:#}");
            ExitCode::from(rn50_util::stop::EXIT_STOPPED)
        }
        Err(e) => {
            eprintln!("error: {e:#}");
            // Flags that do not go together are a usage error, exit 2 like clap's for a value out of its range.
            if e.chain().any(|c| c.is::<rn50_args::UsageError>()) {
                ExitCode::from(2)
            } else {
                ExitCode::FAILURE
            }
        }
    }
}

/// Runs the subcommand; its exit code when it ends without an error.
fn run(cmd: &Command) -> anyhow::Result<ExitCode> {
    match cmd {
        Command::Prepare(a) => rn50_data::cli::run(a)?,
        Command::Pack(a) => rn50_pipeline::cli::pack::run(a)?,
        Command::Bench(a) => rn50::bench::run(a)?,
        Command::Train(a) => {
            return Ok(match rn50::train::run(a)? {
                Outcome::Done => ExitCode::SUCCESS,
                // Checkpointed on SIGINT/SIGTERM/SIGUSR1: the job script may requeue.
                Outcome::Preempted => ExitCode::from(rn50::train::EXIT_PREEMPTED),
            });
        }
        Command::Eval(a) => rn50::train::eval::run(a)?,
        Command::Classify(a) => rn50::classify::run(a)?,
        Command::Export(a) => rn50::export::run(a)?,
        Command::BenchLoader(a) => rn50_pipeline::cli::bench_loader::run(a)?,
        Command::Doctor(a) => rn50::doctor::run(a)?,
        Command::Launch(a) => return rn50_distributed::launch::run(a, &std::env::current_exe()?),
        Command::Report(a) => rn50_report::report::run(a)?,
        Command::Scaling(a) => rn50_report::scaling::run(a)?,
    }
    Ok(ExitCode::SUCCESS)
}

/// Makes the process end as soon as `exit` is called, once Rust has flushed stdout, where the CUDA driver was never
/// loaded: libtorch's teardown at exit (the C++ destructors of its statics, which deregister every operator and free
/// its tables) then has nothing to release that the end of the process does not. It took a third of a short command
/// (`rn50 --version`: 0.62 s, 0.43 s without, on the 2-core CI machine). Where CUDA ran, exit runs in full: CUDA's
/// own tools (Nsight Systems, Nsight Compute) write what they recorded from exit handlers.
fn end_without_libtorchs_teardown() {
    extern "C" {
        // glibc's: an exit handler that is told the exit status. Handlers run last registered first, so this one
        // runs before the destructors libtorch's static initialisers registered while the program loaded.
        fn on_exit(
            handler: extern "C" fn(std::ffi::c_int, *mut std::ffi::c_void),
            arg: *mut std::ffi::c_void,
        ) -> std::ffi::c_int;
    }
    extern "C" fn end_now(status: std::ffi::c_int, _: *mut std::ffi::c_void) {
        // SAFETY: dlopen with RTLD_NOLOAD only looks the library up (a handle, counted, if it is loaded); the handle
        // is closed at once.
        let cuda = unsafe {
            let handle = libc::dlopen(c"libcuda.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
            if !handle.is_null() {
                libc::dlclose(handle);
            }
            !handle.is_null()
        };
        if !cuda {
            // SAFETY: flushes C's buffered streams (libtorch may print through them), then ends the process with
            // the status exit was given.
            unsafe {
                libc::fflush(std::ptr::null_mut());
                libc::_exit(status)
            }
        }
    }
    // SAFETY: registers a handler that lives as long as the program.
    unsafe { on_exit(end_now, std::ptr::null_mut()) };
}

/// What ran out, when a panic is libtorch's allocation failing ("DefaultCPUAllocator: can't allocate memory: you
/// tried to allocate 1233125376 bytes", "CUDA out of memory. Tried to allocate 2.00 GiB ..."): the message's
/// first line from there, without libtorch's C++ stack.
fn out_of_memory(panic: &(dyn std::any::Any + Send)) -> Option<String> {
    let text = panic
        .downcast_ref::<String>()
        .map(String::as_str)
        .or_else(|| panic.downcast_ref::<&str>().copied())?;
    let at = [
        "can't allocate memory",
        "CUDA out of memory",
        "out of memory",
    ]
    .iter()
    .find_map(|m| text.find(m))?;
    let what = text[at..].split(['\n', '\\']).next().unwrap_or_default();
    Some(
        what.split(" Error code")
            .next()
            .unwrap_or(what)
            .trim_end_matches('.')
            .to_string(),
    )
}

/// What to lower when memory runs out in `cmd`.
fn memory_advice(cmd: &Command) -> String {
    match cmd {
        Command::Train(a) => format!(
            "at --batch-size {} per process: lower --batch-size (--accum-steps keeps the global batch) or \
             --image-size; the run directory is as it was before the step that failed",
            a.batch_size
        ),
        Command::Bench(a) => match a.batch_size {
            Some(b) => format!("at --batch-size {b}: lower --batch-size or --image-size"),
            None => "at the default batch size: set a lower --batch-size or --image-size".into(),
        },
        Command::Eval(a) => format!("at --batch-size {}: lower --batch-size", a.batch_size),
        Command::BenchLoader(a) => format!(
            "at --batch-size {}: lower --batch-size or --prefetch",
            a.batch_size
        ),
        _ => "with these inputs: free memory, or use smaller ones".into(),
    }
}
