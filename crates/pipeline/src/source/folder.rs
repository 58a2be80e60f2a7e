//! torchvision `ImageFolder` semantics: classes are the sorted names of the subdirectories,
//! a class's index is its position, samples are all files with an image extension found by a
//! sorted recursive walk of each class directory (symlinks followed), class by class.
//!
//! A symlink back to a directory the walk is inside (`a/self -> .`, `a/sub/up -> ..`) is a file
//! system loop. torchvision's `os.walk(followlinks=True)` goes round it until the path is too long
//! (80 images became 36,080); here, as in `find -L`, it is recognised by the device and inode of
//! the directories on the current path, reported with a warning and not followed, so every real
//! directory of a class is read once. The directories above the class count as on the path too:
//! the dataset root and everything above it, and above the class's real directory (a class may be
//! a link to elsewhere). A link to one of them (`a/up -> ..`) would list every other class's photos
//! again under this one (24 images became 40), and `find -L` stops there as well. A warning, not an
//! error, because a loop adds no file that the walk does not already list, and `find -L` and `du
//! -L` too carry on after reporting one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, ensure, Context, Result};

use super::common::{refuse_empty_classes, MAX_IMAGE_BYTES};
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
    loops: Vec<String>,
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
        let mut loops = Vec::new();
        let above_root = ancestors(root, root)?;
        for (label, class) in classes.iter().enumerate() {
            let dir = root.join(class);
            let mut path = above_root.clone();
            for a in ancestors(&dir, root)?.into_iter().skip(1) {
                if !path.iter().any(|(id, _)| *id == a.0) {
                    path.push(a);
                }
            }
            let mut found = Vec::new();
            walk(&dir, &mut path, &mut found, &mut loops)?;
            // sorted(os.walk(...)) then sorted(fnames): order by (directory, file name).
            // Compare directories as strings (Python's order), not component-wise.
            found.sort_by_cached_key(|p| {
                (
                    p.parent().map(|d| d.as_os_str().to_owned()),
                    p.file_name().map(|f| f.to_owned()),
                )
            });
            counts.push(found.len() as u64);
            labels.extend(std::iter::repeat_n(label as u32, found.len()));
            files.extend(found);
        }
        // torchvision refuses empty classes too (a sign of an incomplete extraction).
        refuse_empty_classes(
            root,
            &classes,
            &counts,
            &format!(" (extensions: {})", IMG_EXTENSIONS.join(", ")),
        )?;
        for l in &loops {
            tracing::warn!("{l}");
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            files,
            labels,
            loops,
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

    /// The file system loops found (and not followed) while listing, one message each.
    pub fn loops(&self) -> &[String] {
        &self.loops
    }
}

/// (device, inode) and path of `dir` and of every directory above its real location, `dir` first. Named
/// as `dir` itself and, above it, by their real paths, except `root`, named as given.
fn ancestors(dir: &Path, root: &Path) -> Result<Vec<((u64, u64), PathBuf)>> {
    let real =
        std::fs::canonicalize(dir).with_context(|| format!("cannot resolve {}", dir.display()))?;
    let root_id = std::fs::metadata(root).map(|m| (m.dev(), m.ino())).ok();
    let mut out = Vec::new();
    for (i, a) in real.ancestors().enumerate() {
        let meta = std::fs::metadata(a).with_context(|| format!("cannot list {}", a.display()))?;
        let id = (meta.dev(), meta.ino());
        let name = if i == 0 {
            dir
        } else if Some(id) == root_id {
            root
        } else {
            a
        };
        out.push((id, name.to_path_buf()));
    }
    Ok(out)
}

/// Lists the image files under `dir` into `out`. `path` holds the (device, inode) and path of each
/// directory above the class directory ([`ancestors`]) and from it down to `dir`'s parent: a
/// directory found among them is a loop, described in `loops` and not entered.
fn walk(
    dir: &Path,
    path: &mut Vec<((u64, u64), PathBuf)>,
    out: &mut Vec<PathBuf>,
    loops: &mut Vec<String>,
) -> Result<()> {
    // One stat per directory (follows symlinks): the inode `read_dir` gives for an entry is the
    // link's, or the covered directory's for a mount point.
    let meta = std::fs::metadata(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    let id = (meta.dev(), meta.ino());
    if let Some((_, first)) = path.iter().find(|(seen, _)| *seen == id) {
        loops.push(format!(
            "{} leads back to {} (a file system loop): not followed",
            dir.display(),
            first.display()
        ));
        return Ok(());
    }
    let entries =
        std::fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))?;
    path.push((id, dir.to_path_buf()));
    for entry in entries {
        let entry = entry?;
        let p = entry.path();
        // d_type avoids a stat per file (1.3 M of them); only symlinks need one.
        let ft = entry.file_type()?;
        let is_dir = ft.is_dir() || (ft.is_symlink() && p.is_dir());
        if is_dir {
            walk(&p, path, out, loops)?;
        } else if has_image_extension(&p) {
            out.push(p);
        }
    }
    path.pop();
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

    /// The file's bytes; one longer than an image may be ([`MAX_IMAGE_BYTES`]: a sparse file can say 9 GiB in
    /// a few kilobytes) is a bad image, refused from its size before a byte is read, as in a shard.
    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        use std::io::Read;
        let path = &self.files[i];
        buf.clear();
        let mut f =
            std::fs::File::open(path).with_context(|| format!("cannot read {}", path.display()))?;
        let len = f
            .metadata()
            .with_context(|| format!("cannot read {}", path.display()))?
            .len();
        ensure!(
            len <= MAX_IMAGE_BYTES,
            "{}: {len} bytes, more than an image may have ({} MiB): not read",
            path.display(),
            MAX_IMAGE_BYTES >> 20
        );
        // A file that grows while it is read stops at the limit too.
        (&mut f)
            .take(MAX_IMAGE_BYTES + 1)
            .read_to_end(buf)
            .with_context(|| format!("cannot read {}", path.display()))?;
        ensure!(
            buf.len() as u64 <= MAX_IMAGE_BYTES,
            "{}: more than an image may have ({} MiB): not read",
            path.display(),
            MAX_IMAGE_BYTES >> 20
        );
        Ok(buf)
    }

    fn name(&self, i: usize) -> String {
        self.files[i].display().to_string()
    }
}
