//! The pipeline's integration tests in one test binary (one link instead of one per file), as ripgrep's
//! tests/tests.rs does: each file of tests/suite/ is a module, so `cargo test -p rn50-pipeline --test tests wds::`
//! runs one file's tests. Nothing here changes the test process's own state: interrupt.rs (a signal handler) and
//! wds_cache_warning.rs (a process-wide log subscriber) keep a binary of their own.
mod common;

#[path = "suite/augment.rs"]
mod augment;
#[path = "suite/autoaugment.rs"]
mod autoaugment;
#[path = "suite/decode.rs"]
mod decode;
#[path = "suite/epochs.rs"]
mod epochs;
#[path = "suite/loader.rs"]
mod loader;
#[path = "suite/parquet.rs"]
mod parquet;
#[path = "suite/reference_python.rs"]
mod reference_python;
#[path = "suite/shards.rs"]
mod shards;
#[path = "suite/train_augment.rs"]
mod train_augment;
#[path = "suite/wds.rs"]
mod wds;
