//! torchvision `ImageFolder` semantics: classes are the sorted names of the subdirectories,
//! a class's index is its position, samples are all files with an image extension found by a
//! sorted recursive walk of each class directory (symlinks followed), class by class.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

use super::Source;

/// torchvision's `IMG_EXTENSIONS` (matched case-insensitively, as `has_file_allowed_extension`).
const IMG_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "png", "ppm", "bmp", "pgm", "tif", "tiff", "webp",
];

pub struct ImageFolder {
    root: PathBuf,
    classes: Vec<String>,
    files: Vec<PathBuf>,
    labels: Vec<u32>,
}

impl ImageFolder {
    pub fn open(root: &Path) -> Result<ImageFolder> {
        let mut classes = Vec::new();
        for entry in std::fs::read_dir(root)
            .with_context(|| format!("cannot list image folder {}", root.display()))?
        {
            let entry = entry?;
            // `entry.path().is_dir()` follows symlinks, like os.scandir's `is_dir()`.
            if entry.path().is_dir() {
                let name = entry.file_name().into_string().map_err(|n| {
                    anyhow::anyhow!("class directory name {n:?} is not valid UTF-8")
                })?;
                classes.push(name);
            }
        }
        classes.sort();
        if classes.is_empty() {
            bail!(
                "{} has no class subdirectories (expected ImageFolder layout root/<class>/<image>)",
                root.display()
            );
        }
        let mut files = Vec::new();
        let mut labels = Vec::new();
        let mut counts = Vec::with_capacity(classes.len());
        for (label, class) in classes.iter().enumerate() {
            let mut found = Vec::new();
            walk(&root.join(class), &mut found)?;
            // sorted(os.walk(...)) then sorted(fnames): order by (directory, file name).
            // Compare directories as strings (Python's order), not component-wise.
            found.sort_by_cached_key(|p| {
                (
                    p.parent().map(|d| d.as_os_str().to_owned()),
                    p.file_name().map(|f| f.to_owned()),
                )
            });
            counts.push(found.len());
            labels.extend(std::iter::repeat_n(label as u32, found.len()));
            files.extend(found);
        }
        // torchvision refuses empty classes too (a sign of an incomplete extraction).
        let empty: Vec<&str> = classes
            .iter()
            .zip(&counts)
            .filter(|(_, &n)| n == 0)
            .map(|(c, _)| c.as_str())
            .collect();
        if !empty.is_empty() {
            bail!(
                "{}: no image files for the classes {} (extensions: {})",
                root.display(),
                empty.join(", "),
                IMG_EXTENSIONS.join(", ")
            );
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            files,
            labels,
        })
    }

    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    pub fn path(&self, i: usize) -> &Path {
        &self.files[i]
    }

    pub fn root(&self) -> &Path {
        &self.root
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    for entry in entries {
        let entry = entry?;
        let path = entry.path();
        // d_type avoids a stat per file (1.3 M of them); only symlinks need one.
        let ft = entry.file_type()?;
        let is_dir = ft.is_dir() || (ft.is_symlink() && path.is_dir());
        if is_dir {
            walk(&path, out)?;
        } else if has_image_extension(&path) {
            out.push(path);
        }
    }
    Ok(())
}

fn has_image_extension(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMG_EXTENSIONS.iter().any(|x| x.eq_ignore_ascii_case(e)))
}

impl Source for ImageFolder {
    fn len(&self) -> usize {
        self.files.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.labels[i] as i64
    }

    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        use std::io::Read;
        let path = &self.files[i];
        buf.clear();
        std::fs::File::open(path)
            .and_then(|mut f| f.read_to_end(buf))
            .with_context(|| format!("cannot read {}", path.display()))?;
        Ok(buf)
    }

    fn name(&self, i: usize) -> String {
        self.files[i].display().to_string()
    }
}
