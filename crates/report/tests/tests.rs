//! rn50-report's integration tests in one test binary (one link instead of one per file), as ripgrep's
//! tests/tests.rs does: each file of tests/suite/ is a module, so `cargo test -p rn50-report --test tests golden::`
//! runs one file's tests.

#[path = "suite/cli.rs"]
mod cli;
#[path = "suite/golden.rs"]
mod golden;
#[path = "suite/io.rs"]
mod io;
#[path = "suite/tensorboard.rs"]
mod tensorboard;
