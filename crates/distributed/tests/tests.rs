//! rn50-distributed's integration tests in one test binary (one link instead of one per file), as ripgrep's
//! tests/tests.rs does: each file of tests/suite/ is a module, so `cargo test -p rn50-distributed --test tests
//! launch::` runs one file's tests. Nothing here changes the test process's own state: the signals of interrupt.rs go to
//! a launcher started in a process group of its own.
mod common;

#[path = "suite/ddp.rs"]
mod ddp;
#[path = "suite/env.rs"]
mod env;
#[path = "suite/failures.rs"]
mod failures;
#[path = "suite/interrupt.rs"]
mod interrupt;
#[path = "suite/launch.rs"]
mod launch;
#[path = "suite/multinode_args.rs"]
mod multinode_args;
#[path = "suite/torchrun.rs"]
mod torchrun;
