//! `rn50 prepare`: verify and extract the ILSVRC2012 archives into the ImageFolder layout
//! (`DIR/train/<wnid>/*.JPEG`, `DIR/val/<wnid>/*.JPEG`) fast, safely and resumably.
//!
//! Pure Rust, no libtorch. See `docs/prepare.md` for what it guarantees.

pub mod archive;
pub mod check;
pub mod chunks;
pub mod cli;
pub mod extract;
pub mod labels;
pub mod lock;
pub mod odd;
pub mod output;
pub mod prepare;
pub mod progress;
pub mod summary;
pub mod train;
pub mod tree;
pub mod val;
pub mod verify;

pub use extract::ExtractOptions;
pub use labels::ValLabels;
pub use prepare::{prepare, PrepareOptions};
pub use summary::Summary;
pub use verify::ArchiveTable;
