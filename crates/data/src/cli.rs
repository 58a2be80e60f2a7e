//! The `rn50 prepare` command line.

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{ArgGroup, Args, Subcommand, ValueEnum};

use crate::check::{check_tree, Expect};
use crate::extract::{default_buffer_bytes, ExtractOptions};
use crate::kaggle::prepare_kaggle;
use crate::labels::ValLabels;
use crate::output::write_json_atomic;
use crate::prepare::{prepare, PrepareOptions};
use crate::verify::{verify_files, ArchiveTable};

/// Verify and extract the ILSVRC2012 archives into the ImageFolder layout.
///
/// Writes DIR/train/<wnid>/<file>.JPEG from the train tar (a tar of 1,000 per-class tars,
/// extracted in parallel) and DIR/val/<wnid>/ILSVRC2012_val_NNNNNNNN.JPEG from the val tar,
/// sorted by the built-in ground truth (no valprep.sh needed). Either tar alone also works.
///
/// Resumable: an interrupted run continues where it stopped (completed classes are kept,
/// partial ones redone); a re-run on a finished tree does nothing, except redo the classes
/// whose files no longer match the archive. Ctrl-C, SIGTERM or SIGUSR1 stops between classes,
/// finishing the ones in progress, and exits 3; a second Ctrl-C stops at once. Members with absolute paths, '..', links or
/// device files are refused; nothing is written outside DIR. One run at a time per DIR; files
/// in DIR/train or DIR/val that prepare did not write stop it (see --force).
#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true, subcommand_negates_reqs = true)]
pub struct PrepareArgs {
    #[command(subcommand)]
    pub action: Option<PrepareAction>,

    #[command(flatten)]
    pub extract: ExtractArgs,
}

#[derive(Subcommand, Debug, Clone)]
pub enum PrepareAction {
    /// Check archives' size and MD5 against the built-in table of the official archives.
    Verify(VerifyArgs),
    /// Compare a prepared tree with what the archives held; exit 1 on any difference.
    Check(CheckArgs),
}

/// Extraction (the default action).
#[derive(Args, Debug, Clone)]
#[command(group(ArgGroup::new("archives").required(true).multiple(true).args(["train_tar", "val_tar", "kaggle"])))]
pub struct ExtractArgs {
    /// The train archive (ILSVRC2012_img_train.tar: a tar of per-class <wnid>.tar files).
    #[arg(long, value_name = "FILE")]
    pub train_tar: Option<PathBuf>,

    /// The val archive (ILSVRC2012_img_val.tar: a flat tar of 50,000 JPEGs).
    #[arg(long, value_name = "FILE")]
    pub val_tar: Option<PathBuf>,

    /// Kaggle's ImageNet download, extracted (ILSVRC/Data/CLS-LOC/train and val/, LOC_val_solution.csv,
    /// LOC_synset_mapping.txt), instead of the archives: the same tree, its files hard links to the
    /// download's (copies across file systems), val/ sorted into class folders by LOC_val_solution.csv.
    /// Synsets that are not WordNet ids (n and 8 digits), links in the download, and an --out inside it
    /// are refused before anything is written. Ctrl-C or SIGTERM stops between files and exits 3; run it
    /// again to continue.
    #[arg(long, value_name = "DIR", conflicts_with_all = [
        "train_tar", "val_tar", "verify", "fix_odd_files", "val_labels", "checksums", "buffer_mib",
        "force", "jobs",
    ])]
    pub kaggle: Option<PathBuf>,

    /// Output folder; train/ and val/ are created in it.
    #[arg(long, value_name = "DIR", required = true)]
    pub out: Option<PathBuf>,

    /// Extraction threads, 1 to 1024 [default: number of CPUs].
    #[arg(short = 'j', long = "jobs", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub jobs: Option<u16>,

    /// Check each archive's size (before starting) and MD5 (computed while extracting, no
    /// second pass) against the table of official archives.
    #[arg(long)]
    pub verify: bool,

    /// Re-encode the CMYK/YCCK JPEGs and PNGs named .JPEG (found by content) as RGB JPEGs;
    /// without it they are kept as they are and counted in the summary.
    #[arg(long)]
    pub fix_odd_files: bool,

    /// Validation ground truth for other datasets: a valprep.sh (`mv FILE WNID/` lines) or one
    /// class per line, line N for the file numbered N [default: built-in ILSVRC2012 labels].
    #[arg(long, value_name = "FILE")]
    pub val_labels: Option<PathBuf>,

    /// Checksum table for --verify (TSV: file, bytes, md5) [default: built-in ILSVRC2012].
    #[arg(long, value_name = "FILE")]
    pub checksums: Option<PathBuf>,

    /// Read-ahead memory for the train archive, in MiB, 4 to 65536 [default: 256 per thread].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u32).range(4..=65536))]
    pub buffer_mib: Option<u32>,

    /// Also write the summary as JSON (train_images, val_images, classes, odd_files,
    /// bytes_read, seconds, ...).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Delete files in DIR/train and DIR/val that prepare did not write (a class folder of your
    /// own, a note in a class folder) instead of refusing to start; files directly in DIR are
    /// never touched.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug, Clone)]
pub struct VerifyArgs {
    /// Archives to check, identified by file name (e.g. ILSVRC2012_img_train.tar).
    #[arg(required = true, value_name = "FILES")]
    pub files: Vec<PathBuf>,

    /// Files hashed at once, 1 to 1024 [default: number of CPUs].
    #[arg(short = 'j', long = "jobs", value_name = "N", value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub jobs: Option<u16>,

    /// Checksum table (TSV: file, bytes, md5) [default: built-in ILSVRC2012].
    #[arg(long, value_name = "FILE")]
    pub checksums: Option<PathBuf>,

    /// Also write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Args, Debug, Clone)]
pub struct CheckArgs {
    /// A folder written by `rn50 prepare` (or any train/ and val/ ImageFolder tree).
    #[arg(value_name = "DIR")]
    pub dir: PathBuf,

    /// What to hold the tree to.
    #[arg(long, value_enum, default_value_t = ExpectArg::Auto)]
    pub expect: ExpectArg,

    /// Also read every file and compare its contents (CRC-32) with the archive's, which finds
    /// a damaged image of the right size; without it, names and sizes are compared.
    #[arg(long)]
    pub deep: bool,

    /// Also write the report as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpectArg {
    /// ImageNet's official counts when the tree came from the official archives or has its
    /// 1,000 classes; otherwise the counts recorded from the archives.
    Auto,
    /// ImageNet's official counts and val ground truth.
    Imagenet,
    /// Only the counts recorded from the archives by prepare.
    Recorded,
}

fn threads(jobs: Option<u16>) -> usize {
    jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, |n| n.get()),
        usize::from,
    )
}

fn table(path: &Option<PathBuf>) -> Result<ArchiveTable> {
    match path {
        Some(p) => ArchiveTable::from_file(p),
        None => Ok(ArchiveTable::builtin()),
    }
}

/// Runs `rn50 prepare` as the command line asked.
pub fn run(cmd: &PrepareArgs) -> Result<()> {
    match &cmd.action {
        Some(PrepareAction::Verify(a)) => {
            let ok = verify_files(&a.files, &table(&a.checksums)?, threads(a.jobs))?;
            for v in &ok {
                println!(
                    "{}: OK ({} bytes, md5 {})",
                    v.file.display(),
                    v.bytes,
                    v.md5
                );
            }
            if let Some(json) = &a.json {
                write_json_atomic(json, &ok)?;
            }
            Ok(())
        }
        Some(PrepareAction::Check(a)) => {
            let expect = match a.expect {
                ExpectArg::Auto => Expect::Auto,
                ExpectArg::Imagenet => Expect::ImageNet,
                ExpectArg::Recorded => Expect::Recorded,
            };
            let r = check_tree(&a.dir, expect, a.deep)?;
            if let Some(json) = &a.json {
                write_json_atomic(json, &r)?;
            }
            let what = if r.imagenet {
                " (checked against ILSVRC2012)"
            } else {
                ""
            };
            println!(
                "{}: {} train images in {} classes, {} val images in {} classes{what}",
                a.dir.display(),
                r.train_images,
                r.train_classes,
                r.val_images,
                r.val_classes
            );
            for n in &r.notes {
                println!("  note: {n}");
            }
            for p in &r.problems {
                println!("  {p}");
            }
            if !r.ok() {
                bail!("{}: {} problem(s) found", a.dir.display(), r.problems.len());
            }
            println!("complete");
            Ok(())
        }
        None => {
            let e = &cmd.extract;
            let Some(out) = e.out.clone() else {
                bail!("--out DIR is required");
            };
            if let Some(dir) = &e.kaggle {
                let s = prepare_kaggle(dir, &out)?;
                println!(
                    "{}: {} train images in {} classes, {} val images in {} classes ({} hard \
                     links and {} copies made, the rest already there)",
                    out.display(),
                    s.train_images,
                    s.train_classes,
                    s.val_images,
                    s.val_classes,
                    s.linked,
                    s.copied
                );
                if let Some(json) = &e.json {
                    write_json_atomic(json, &s)?;
                }
                return Ok(());
            }
            let threads = threads(e.jobs);
            let opts = PrepareOptions {
                train_tar: e.train_tar.clone(),
                val_tar: e.val_tar.clone(),
                out,
                val_labels: match &e.val_labels {
                    Some(p) => ValLabels::from_file(p)?,
                    None => ValLabels::builtin(),
                },
                extract: ExtractOptions {
                    threads,
                    verify: e.verify,
                    table: table(&e.checksums)?,
                    fix_odd: e.fix_odd_files,
                    buffer_bytes: e
                        .buffer_mib
                        .map_or(default_buffer_bytes(threads), |m| m as usize * (1 << 20)),
                    ..ExtractOptions::default()
                },
                force: e.force,
            };
            let summary = prepare(&opts)?;
            println!("{}", summary.line());
            if let Some(json) = &e.json {
                summary.write_json(json)?;
            }
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Top {
        #[command(flatten)]
        cmd: PrepareArgs,
    }

    fn parse(args: &[&str]) -> Result<PrepareArgs, clap::Error> {
        Top::try_parse_from(std::iter::once("prepare").chain(args.iter().copied())).map(|t| t.cmd)
    }

    #[test]
    fn command_surface() {
        let c = parse(&[
            "--train-tar",
            "t.tar",
            "--out",
            "o",
            "-j",
            "2",
            "--verify",
            "--json",
            "s.json",
        ])
        .unwrap();
        assert!(c.action.is_none());
        assert_eq!(c.extract.jobs, Some(2));
        assert!(c.extract.verify && !c.extract.fix_odd_files && !c.extract.force);
        assert!(
            parse(&["--val-tar", "v.tar", "--out", "o", "--force"]).is_ok_and(|c| c.extract.force)
        );
        assert!(parse(&["--val-tar", "v.tar", "--out", "o"]).is_ok());
        assert!(parse(&["--kaggle", "k", "--out", "o"]).is_ok_and(|c| c.extract.kaggle.is_some()));
        assert!(parse(&["--kaggle", "k", "--val-tar", "v.tar", "--out", "o"]).is_err());
        assert!(parse(&["--kaggle", "k"]).is_err());
        // An archive and --out are required for extraction, not for the sub-actions.
        assert!(parse(&["--out", "o"]).is_err());
        assert!(parse(&["--train-tar", "t.tar"]).is_err());
        assert!(parse(&["--train-tar", "t.tar", "--out", "o", "-j", "0"]).is_err());
        let v = parse(&["verify", "a.tar", "b.tar"]).unwrap();
        assert!(matches!(v.action, Some(PrepareAction::Verify(ref a)) if a.files.len() == 2));
        assert!(parse(&["verify"]).is_err());
        let k = parse(&["check", "d", "--expect", "imagenet"]).unwrap();
        assert!(
            matches!(k.action, Some(PrepareAction::Check(ref a)) if a.expect == ExpectArg::Imagenet)
        );
        assert!(parse(&["--out", "o", "check", "d"]).is_err());
        let k = parse(&["check", "d", "--deep"]).unwrap();
        assert!(matches!(k.action, Some(PrepareAction::Check(ref a)) if a.deep));
    }
}
