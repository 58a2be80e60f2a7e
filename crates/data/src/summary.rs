//! The end-of-run summary: one line on stdout, optionally JSON.

use std::path::Path;

use anyhow::Result;
use serde::Serialize;

use crate::output::{write_json_atomic, OddRecord};

#[derive(Debug, Clone, Default, Serialize)]
pub struct Summary {
    /// Images in the train tree (including classes completed by earlier runs).
    pub train_images: u64,
    /// Images in the val tree.
    pub val_images: u64,
    /// Classes in the train tree (the val tree's when only val was prepared).
    pub classes: u64,
    /// Files that are not plain RGB/grayscale JPEGs (CMYK/YCCK JPEG, PNG, other).
    pub odd_files: u64,
    /// Of those, re-encoded as RGB JPEG by `--fix-odd-files`.
    pub odd_fixed: u64,
    /// Archive bytes read by this run (0 when everything was already done).
    pub bytes_read: u64,
    /// Image bytes written by this run.
    pub bytes_written: u64,
    pub seconds: f64,
    pub threads: usize,
    /// Train classes extracted by this run / skipped as complete from an earlier run.
    pub train_classes_extracted: u64,
    pub train_classes_skipped: u64,
    /// MD5 of each archive verified, by file name.
    pub verified: Vec<VerifiedArchive>,
    pub odd: Vec<OddRecord>,
}

#[derive(Debug, Clone, Serialize)]
pub struct VerifiedArchive {
    pub file: String,
    pub md5: String,
}

impl Summary {
    pub fn line(&self) -> String {
        let mb = self.bytes_read as f64 / 1e6;
        let rate = if self.seconds > 0.0 {
            mb / self.seconds
        } else {
            0.0
        };
        let odd = if self.odd_files == 0 {
            "no odd files".to_string()
        } else if self.odd_fixed == self.odd_files {
            format!("{} odd files re-encoded as RGB JPEG", self.odd_files)
        } else {
            format!(
                "{} odd files ({} re-encoded; see --fix-odd-files)",
                self.odd_files, self.odd_fixed
            )
        };
        let verified = if self.verified.is_empty() {
            String::new()
        } else {
            format!(", {} archive(s) verified", self.verified.len())
        };
        format!(
            "prepared {} train + {} val images in {} classes, {odd}{verified}; read {mb:.1} MB in \
             {:.1} s ({rate:.1} MB/s, -j {}); {} classes extracted, {} already complete",
            self.train_images,
            self.val_images,
            self.classes,
            self.seconds,
            self.threads,
            self.train_classes_extracted,
            self.train_classes_skipped
        )
    }

    pub fn write_json(&self, path: &Path) -> Result<()> {
        write_json_atomic(path, self)
    }
}
