//! Small ILSVRC-layout archives built from the real photos in shared/data.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use clap::Parser;
use rn50_data::{ExtractOptions, PrepareOptions, ValLabels};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    cmd: rn50_data::cli::PrepareArgs,
}

/// `rn50 prepare ARGS` through its command line.
pub fn cli(args: &[&str]) -> anyhow::Result<()> {
    let c = Cli::try_parse_from(std::iter::once("prepare").chain(args.iter().copied())).unwrap();
    rn50_data::cli::run(&c.cmd)
}

pub use rn50_util::testing::shared_data;

/// The real ImageNet photos (one per class), sorted by name.
pub use rn50_util::testing::shared_photos as photos;

pub fn edge(name: &str) -> Vec<u8> {
    std::fs::read(shared_data().join("jpeg/edge").join(name)).unwrap()
}

/// The files a prepared tree must contain: relative path → bytes.
pub type Tree = BTreeMap<String, Vec<u8>>;

pub struct Fixture {
    pub dir: tempfile::TempDir,
    pub train_tar: PathBuf,
    pub val_tar: PathBuf,
    /// Class ids in archive order.
    pub classes: Vec<String>,
    pub expected: Tree,
    /// Paths (relative) of the two odd files planted under ordinary names.
    pub odd: Vec<String>,
}

/// A tar member with a GNU header.
pub fn append(b: &mut tar::Builder<Vec<u8>>, name: &str, data: &[u8]) {
    let mut h = tar::Header::new_gnu();
    h.set_size(data.len() as u64);
    h.set_mode(0o644);
    h.set_mtime(1_330_000_000);
    h.set_entry_type(tar::EntryType::Regular);
    b.append_data(&mut h, name, data).unwrap();
}

pub fn tar_of(members: &[(String, Vec<u8>)]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for (name, data) in members {
        append(&mut b, name, data);
    }
    b.into_inner().unwrap()
}

/// Six classes taken from the shared photos' class ids, 3 to 8 images each (real JPEG bytes),
/// a CMYK JPEG and a PNG hidden under ordinary `<wnid>_N.JPEG` names, and a val tar of 24
/// `ILSVRC2012_val_000000NN.JPEG` files whose classes follow the built-in ground truth.
pub fn build() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let photos = photos();
    let mut next_photo = photos.iter().cycle();
    let mut expected = Tree::new();
    let mut odd = Vec::new();
    let mut outer = Vec::new();
    let mut classes = Vec::new();
    for (c, photo) in photos.iter().step_by(37).take(6).enumerate() {
        let wnid = photo.file_stem().unwrap().to_str().unwrap().to_string();
        let mut members = Vec::new();
        for k in 0..(3 + c) {
            let data = std::fs::read(next_photo.next().unwrap()).unwrap();
            members.push((format!("{wnid}_{}.JPEG", 1000 + k * 17), data));
        }
        let planted = match c {
            1 => Some(edge("cmyk_from_imagenet.jpg")),
            4 => Some(edge("png_named_as.JPEG")),
            _ => None,
        };
        if let Some(data) = planted {
            let name = format!("{wnid}_777.JPEG");
            odd.push(format!("train/{wnid}/{name}"));
            members.push((name, data));
        }
        for (name, data) in &members {
            expected.insert(format!("train/{wnid}/{name}"), data.clone());
        }
        outer.push((format!("{wnid}.tar"), tar_of(&members)));
        classes.push(wnid);
    }
    let train_tar = dir.path().join("ILSVRC2012_img_train.tar");
    std::fs::write(&train_tar, tar_of(&outer)).unwrap();

    let labels = ValLabels::builtin();
    let mut val = Vec::new();
    for n in 1..=24 {
        let name = format!("ILSVRC2012_val_{n:08}.JPEG");
        let data = std::fs::read(next_photo.next().unwrap()).unwrap();
        let wnid = labels.class_of(&name).unwrap();
        expected.insert(format!("val/{wnid}/{name}"), data.clone());
        val.push((name, data));
    }
    let val_tar = dir.path().join("ILSVRC2012_img_val.tar");
    std::fs::write(&val_tar, tar_of(&val)).unwrap();
    Fixture {
        dir,
        train_tar,
        val_tar,
        classes,
        expected,
        odd,
    }
}

/// Options for tests: 2 threads and a tiny read-ahead pool, so buffers run out and the
/// reader waits on workers many times.
pub fn options(train: Option<&Path>, val: Option<&Path>, out: &Path) -> PrepareOptions {
    PrepareOptions {
        train_tar: train.map(Path::to_path_buf),
        val_tar: val.map(Path::to_path_buf),
        out: out.to_path_buf(),
        val_labels: ValLabels::builtin(),
        extract: ExtractOptions {
            threads: 2,
            buffer_bytes: 4 * 64 * 1024,
            chunk_bytes: 64 * 1024,
            ..ExtractOptions::default()
        },
        force: false,
    }
}

/// Every regular file under `root` (markers excluded): relative path → bytes. Panics on
/// symlinks or other non-regular files, which prepare must never create.
pub fn read_tree(root: &Path) -> Tree {
    fn walk(root: &Path, dir: &Path, out: &mut Tree) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let t = e.file_type().unwrap();
            let p = e.path();
            let rel = p.strip_prefix(root).unwrap().to_str().unwrap().to_string();
            if rel == ".rn50-prepare" {
                continue;
            }
            if t.is_dir() {
                walk(root, &p, out);
            } else {
                assert!(t.is_file(), "{rel} is not a regular file");
                out.insert(rel, std::fs::read(&p).unwrap());
            }
        }
    }
    let mut out = Tree::new();
    walk(root, root, &mut out);
    out
}

/// Asserts two trees hold the same files with the same bytes, naming the first difference.
pub fn assert_same_tree(got: &Tree, want: &Tree) {
    for (k, v) in want {
        let g = got.get(k).unwrap_or_else(|| panic!("missing {k}"));
        assert!(
            g == v,
            "{k}: contents differ ({} vs {} bytes)",
            g.len(),
            v.len()
        );
    }
    for k in got.keys() {
        assert!(want.contains_key(k), "unexpected file {k}");
    }
}

/// Every path under `dir` (recursively), for "nothing written outside" checks.
pub fn all_paths(dir: &Path) -> Vec<PathBuf> {
    let mut v = Vec::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() && !p.is_symlink() {
            v.extend(all_paths(&p));
        }
        v.push(p);
    }
    v.sort();
    v
}
