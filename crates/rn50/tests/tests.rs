//! rn50's integration tests in one test binary (one link against libtorch instead of one per file), as ripgrep's
//! tests/tests.rs does: each file of tests/program/ is a module, so `cargo test -p rn50 --test tests cli::` runs
//! one file's tests. Most run the `rn50` program as a subprocess and check what it prints and writes; some also
//! build models in this process (eval, export, classify, torch_save, parity_torchvision, train) through libtorch's
//! thread-safe calls. Nothing here changes the test process's own state (signal handlers, environment, file
//! descriptors, libtorch's global seed or settings): tests that do, or that must run alone, keep a binary of their
//! own (tests/*.rs: mix and fused_block seed libtorch, pin_memory captures stderr, cuda_fused is the GPU's,
//! multinode and schedulers run one job at a time on the whole machine).
mod common;

#[path = "program/args.rs"]
mod args;
#[path = "program/bn_sync.rs"]
mod bn_sync;
#[path = "program/cifar.rs"]
mod cifar;
#[path = "program/classify.rs"]
mod classify;
#[path = "program/cli.rs"]
mod cli;
#[path = "program/config.rs"]
mod config;
#[path = "program/containers.rs"]
mod containers;
#[path = "program/ema.rs"]
mod ema;
#[path = "program/eval.rs"]
mod eval;
#[path = "program/export.rs"]
mod export;
#[path = "program/help_examples.rs"]
mod help_examples;
#[path = "program/imagenette_gpu.rs"]
mod imagenette_gpu;
#[path = "program/interrupt.rs"]
mod interrupt;
#[path = "program/launch_restart.rs"]
mod launch_restart;
#[path = "program/logs.rs"]
mod logs;
#[path = "program/mllog.rs"]
mod mllog;
#[path = "program/narrow_cpu.rs"]
mod narrow_cpu;
#[path = "program/parity_torchvision.rs"]
mod parity_torchvision;
#[path = "program/profile.rs"]
mod profile;
#[path = "program/ranks.rs"]
mod ranks;
#[path = "program/smoke.rs"]
mod smoke;
#[path = "program/sources.rs"]
mod sources;
#[path = "program/tensorboard.rs"]
mod tensorboard;
#[path = "program/torch_save.rs"]
mod torch_save;
#[path = "program/train.rs"]
mod train;
