//! `rn50 prepare`: verify and extract the ILSVRC2012 archives into the ImageFolder layout
//! (`DIR/train/<wnid>/*.JPEG`, `DIR/val/<wnid>/*.JPEG`) fast, safely and resumably.
//!
//! Pure Rust, no libtorch. See `docs/prepare.md` for what it guarantees. The command is
//! [`cli::run`]`(&`[`cli::PrepareArgs`]`)`; the library, [`prepare`], [`check`] and [`verify_files`];
//! the modules behind them are private.

mod archive;
mod check;
mod chunks;
pub mod cli;
mod extract;
mod extract_train;
mod extract_val;
mod kaggle;
mod labels;
mod lock;
mod odd;
mod output;
mod prepare;
mod progress;
mod summary;
mod tree;
mod verify;

pub use check::{check, CheckReport, Expect};
pub use extract::ExtractOptions;
pub use kaggle::{prepare_kaggle, KaggleSummary};
pub use labels::{imagenet_classes, ValLabels};
pub use odd::{detect as detect_odd, OddKind};
pub use prepare::{prepare, PrepareOptions};
pub use summary::Summary;
pub use verify::{hex, verify_files, ArchiveTable, Verified};
