//! rn50-data's integration tests in one test binary (one link instead of one per file), as ripgrep's
//! tests/tests.rs does: each file of tests/suite/ is a module, so `cargo test -p rn50-data --test tests kaggle::`
//! runs one file's tests. Nothing here changes the test process's own state: interrupt.rs (a signal handler)
//! keeps a binary of its own.
mod common;

#[path = "suite/hostile.rs"]
mod hostile;
#[path = "suite/kaggle.rs"]
mod kaggle;
#[path = "suite/prepare.rs"]
mod prepare;
#[path = "suite/safety.rs"]
mod safety;
