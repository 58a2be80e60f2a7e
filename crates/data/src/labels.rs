//! Class lists and validation ground truth.

use std::collections::HashMap;
use std::path::Path;

use anyhow::{bail, Context, Result};

use crate::archive::is_plain_component;

const VAL_LABELS_TXT: &str = include_str!("../assets/val_labels.txt");

/// Official counts, for `check`.
pub const IMAGENET_TRAIN_IMAGES: u64 = 1_281_167;
pub const IMAGENET_VAL_IMAGES: u64 = 50_000;

pub use rn50_pipeline::imagenet::{classes as imagenet_classes, wnids as imagenet_wnids};

/// Maps a validation file name to its class.
#[derive(Debug, Clone)]
pub enum ValLabels {
    /// Line `i` (from 1) is the class of the file whose name ends in number `i`
    /// (`ILSVRC2012_val_00000001.JPEG` → line 1).
    ByNumber(Vec<String>),
    /// File name → class, from a `valprep.sh` (`mv NAME WNID/` lines).
    ByName(HashMap<String, String>),
}

impl ValLabels {
    /// The built-in ILSVRC2012 ground truth (50,000 lines).
    pub fn builtin() -> ValLabels {
        ValLabels::parse(VAL_LABELS_TXT).expect("the built-in val_labels.txt parses")
    }

    pub fn from_file(path: &Path) -> Result<ValLabels> {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("reading validation labels {}", path.display()))?;
        ValLabels::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    /// Accepts either a `valprep.sh` (any line starting with `mv`) or one class per line.
    pub fn parse(text: &str) -> Result<ValLabels> {
        let is_script = text.lines().any(|l| l.trim_start().starts_with("mv "));
        if is_script {
            let mut map = HashMap::new();
            for (i, line) in text.lines().enumerate() {
                let words: Vec<&str> = line.split_whitespace().collect();
                if words.first() != Some(&"mv") {
                    continue; // mkdir lines, comments, shebang
                }
                let [_, file, dir] = words[..] else {
                    bail!("line {}: expected `mv FILE CLASS/`, got {line:?}", i + 1);
                };
                let wnid = dir.trim_end_matches('/');
                check_class(wnid, i)?;
                map.insert(file.to_string(), wnid.to_string());
            }
            Ok(ValLabels::ByName(map))
        } else {
            let mut list = Vec::new();
            for (i, line) in text.lines().enumerate() {
                let wnid = line.trim();
                if wnid.is_empty() {
                    continue;
                }
                check_class(wnid, i)?;
                list.push(wnid.to_string());
            }
            if list.is_empty() {
                bail!("no labels found");
            }
            Ok(ValLabels::ByNumber(list))
        }
    }

    /// The class of a validation file, by its name.
    pub fn class_of(&self, file: &str) -> Option<&str> {
        match self {
            ValLabels::ByName(map) => map.get(file).map(String::as_str),
            ValLabels::ByNumber(list) => {
                let n = file_number(file)?;
                list.get(n.checked_sub(1)?).map(String::as_str)
            }
        }
    }

    /// Expected files per class, when the labels name every file (`check` uses it).
    pub fn expected_files(&self) -> Vec<(String, &str)> {
        match self {
            ValLabels::ByName(map) => map.iter().map(|(f, c)| (f.clone(), c.as_str())).collect(),
            ValLabels::ByNumber(list) => list
                .iter()
                .enumerate()
                .map(|(i, c)| (format!("ILSVRC2012_val_{:08}.JPEG", i + 1), c.as_str()))
                .collect(),
        }
    }
}

fn check_class(wnid: &str, line: usize) -> Result<()> {
    if !is_plain_component(wnid) || wnid.starts_with('.') {
        bail!(
            "line {}: {wnid:?} is not usable as a class folder name",
            line + 1
        );
    }
    Ok(())
}

/// The last run of digits in the file stem: `ILSVRC2012_val_00000042.JPEG` → 42.
fn file_number(file: &str) -> Option<usize> {
    let stem = file.rsplit_once('.').map_or(file, |(s, _)| s);
    let end = stem.rfind(|c: char| c.is_ascii_digit())? + 1;
    let start = stem[..end]
        .rfind(|c: char| !c.is_ascii_digit())
        .map_or(0, |i| i + 1);
    stem[start..end].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_tables() {
        let val = ValLabels::builtin();
        assert_eq!(
            val.class_of("ILSVRC2012_val_00000001.JPEG"),
            Some("n01751748")
        );
        assert_eq!(
            val.class_of("ILSVRC2012_val_00050000.JPEG"),
            Some("n02437616")
        );
        assert_eq!(val.class_of("ILSVRC2012_val_00050001.JPEG"), None);
        assert_eq!(val.class_of("ILSVRC2012_val_00000000.JPEG"), None);
        assert_eq!(val.class_of("README"), None);
        assert_eq!(val.expected_files().len(), 50_000);
    }

    #[test]
    fn valprep_script_and_plain_list() {
        let script = "#!/bin/bash\nmkdir -p n01751748\nmv ILSVRC2012_val_00000001.JPEG n01751748/\nmv b.JPEG n09193705/\n";
        let l = ValLabels::parse(script).unwrap();
        assert_eq!(
            l.class_of("ILSVRC2012_val_00000001.JPEG"),
            Some("n01751748")
        );
        assert_eq!(l.class_of("b.JPEG"), Some("n09193705"));
        assert_eq!(l.class_of("c.JPEG"), None);
        let list = ValLabels::parse("cat\ndog\n").unwrap();
        assert_eq!(list.class_of("img_2.png"), Some("dog"));
        assert!(ValLabels::parse("mv a ../x/\n").is_err());
        assert!(ValLabels::parse("..\n").is_err());
        assert!(ValLabels::parse("\n\n").is_err());
    }
}
