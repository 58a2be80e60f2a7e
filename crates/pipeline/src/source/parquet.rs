//! Hugging Face parquet files (`ILSVRC/imagenet-1k`'s `data/train-*.parquet`, or any `datasets` image
//! dataset written with `to_parquet`) as a random-access source.
//!
//! The schema is the Hub's for an `Image()` and a `ClassLabel` feature: a column `image`, a struct of
//! `bytes` (the encoded image) and `path`, and an integer column `label`. The class names are those of the
//! `ClassLabel` in the file's `huggingface` schema metadata: WordNet ids are used as they are; 1,000 other
//! names (the Hub's human-readable names of the ILSVRC2012 classes) become the WordNet ids by position, in
//! the standard order ([`crate::imagenet`]; names repeat, such as `crane`, so never by text); other lists
//! are kept as they are. A file without that metadata counts in the ImageNet order too.
//!
//! The labels are read at open. An image is read in the loader's thread: the page of the `image.bytes`
//! column chunk that holds its row, found from the page headers ([`SkipTo`]: the pages before it are
//! not read), read and decompressed (snappy, as pyarrow writes by default, or none, as `datasets` writes image bytes).
//! Positioned reads (`pread`), so the threads share each file without sharing an offset.
//!
//! Refused at open, naming the file: not a parquet file, no `image.bytes` or `label` column (another
//! schema), a `ClassLabel` without class names, a row without a label or with one outside the classes, files
//! with different classes, another compression, a row group whose footer claims other rows than its label
//! column holds (a negative count, more than 2^32 - 1, or just not the rows there: a damaged file). The
//! counts and sizes in a file are only its word: no buffer is sized from them before the rows or bytes are
//! there (the labels are read in batches, a read past the file's end is refused before its buffer is made).
//! A row without image bytes, or with damaged ones, is a bad image (skipped and counted).

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, ensure, Context, Result};
use parquet::basic::{Compression, Type as PhysicalType};
use parquet::column::page::{Page, PageMetadata, PageReader};
use parquet::column::reader::{get_column_reader, ColumnReader, ColumnReaderImpl};
use parquet::data_type::DataType;
use parquet::file::reader::{ChunkReader, FileReader, Length};
use parquet::file::serialized_reader::SerializedFileReader;
use rayon::prelude::*;

use super::Source;

pub const EXTENSION: &str = "parquet";

/// A file read with positioned reads: [`ChunkReader`] for `File` seeks a shared offset.
struct Positioned {
    file: Arc<File>,
    len: u64,
}

/// Reads from `pos` on.
struct At {
    file: Arc<File>,
    pos: u64,
}

impl Read for At {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.file.read_at(buf, self.pos)?;
        self.pos += n as u64;
        Ok(n)
    }
}

impl Length for Positioned {
    fn len(&self) -> u64 {
        self.len
    }
}

impl ChunkReader for Positioned {
    type T = std::io::BufReader<At>;

    fn get_read(&self, start: u64) -> parquet::errors::Result<Self::T> {
        Ok(std::io::BufReader::new(At {
            file: self.file.clone(),
            pos: start,
        }))
    }

    /// The buffer is made only for bytes the file has: the offsets and sizes come from the file (its footer's
    /// column chunks, its page headers), and a damaged one must not set aside gigabytes before the read fails.
    fn get_bytes(&self, start: u64, length: usize) -> parquet::errors::Result<bytes::Bytes> {
        if start
            .checked_add(length as u64)
            .is_none_or(|end| end > self.len)
        {
            return Err(parquet::errors::ParquetError::EOF(format!(
                "{length} bytes from byte {start} run past the end of the file ({} bytes)",
                self.len
            )));
        }
        let mut buf = vec![0; length];
        self.file.read_exact_at(&mut buf, start)?;
        Ok(buf.into())
    }
}

/// The page reader of a column chunk without repetition (a level is a row), started at the page holding
/// row `row` by the page headers alone. The parquet crate skips unread pages only with a page index, which
/// pyarrow and `datasets` do not write: without this, reading the last image of a row group would read and
/// decompress every page before it.
struct SkipTo {
    inner: Box<dyn PageReader>,
    /// The dictionary page, read before the pages were skipped, handed out first.
    dictionary: Option<Page>,
}

impl SkipTo {
    /// `inner` at the page holding row `row`, and that row's position in it.
    fn new(mut inner: Box<dyn PageReader>, row: usize) -> parquet::errors::Result<(SkipTo, usize)> {
        let mut dictionary = None;
        let mut left = row;
        while let Some(m) = inner.peek_next_page()? {
            let rows = m.num_rows.or(m.num_levels);
            if m.is_dict {
                dictionary = inner.get_next_page()?;
            } else if let Some(n) = rows.filter(|&n| n <= left) {
                inner.skip_next_page()?;
                left -= n;
            } else {
                break;
            }
        }
        Ok((SkipTo { inner, dictionary }, left))
    }
}

impl Iterator for SkipTo {
    type Item = parquet::errors::Result<Page>;

    fn next(&mut self) -> Option<Self::Item> {
        self.get_next_page().transpose()
    }
}

impl PageReader for SkipTo {
    fn get_next_page(&mut self) -> parquet::errors::Result<Option<Page>> {
        match self.dictionary.take() {
            Some(page) => Ok(Some(page)),
            None => self.inner.get_next_page(),
        }
    }

    fn peek_next_page(&mut self) -> parquet::errors::Result<Option<PageMetadata>> {
        match &self.dictionary {
            Some(_) => Ok(Some(PageMetadata {
                num_rows: None,
                num_levels: None,
                is_dict: true,
            })),
            None => self.inner.peek_next_page(),
        }
    }

    fn skip_next_page(&mut self) -> parquet::errors::Result<()> {
        match self.dictionary.take() {
            Some(_) => Ok(()),
            None => self.inner.skip_next_page(),
        }
    }
}

struct ParquetFile {
    path: PathBuf,
    reader: SerializedFileReader<Positioned>,
    /// The leaf column `image.bytes`.
    image: usize,
}

#[derive(Clone, Copy)]
struct Entry {
    file: u32,
    group: u32,
    /// The row within its row group.
    row: u32,
    label: u32,
}

/// Parquet files read as one dataset: rows in file order.
pub struct ParquetSet {
    files: Vec<ParquetFile>,
    entries: Vec<Entry>,
    classes: Vec<String>,
}

/// The class names of a `ClassLabel` feature `label` in the `huggingface` metadata, if any.
fn class_label_names(reader: &SerializedFileReader<Positioned>) -> Option<Vec<String>> {
    let kv = reader.metadata().file_metadata().key_value_metadata()?;
    let text = kv
        .iter()
        .find(|kv| kv.key == "huggingface")?
        .value
        .as_ref()?;
    let info: serde_json::Value = serde_json::from_str(text).ok()?;
    let names = info.pointer("/info/features/label/names")?.as_array()?;
    names.iter().map(|n| n.as_str().map(String::from)).collect()
}

/// Labels are read this many at a time: the column reader sizes its buffers by the rows it is asked for, and
/// the rows a footer claims are only the file's word until they are read.
const LABELS_AT_ONCE: usize = 1 << 16;

/// The most rows of a row group: a row's position in its group is kept in 32 bits.
const MAX_GROUP_ROWS: u64 = u32::MAX as u64;

/// The rows row group `g` of `path` has, as its footer says: refused if no row group could have them.
fn claimed_rows(path: &Path, g: usize, claimed: i64) -> Result<usize> {
    ensure!(
        claimed >= 0,
        "{}: its footer says row group {g} has {claimed} rows (a damaged file?)",
        path.display()
    );
    ensure!(
        claimed as u64 <= MAX_GROUP_ROWS,
        "{}: its footer says row group {g} has {claimed} rows, more than a row group can hold here \
         ({MAX_GROUP_ROWS}; a damaged file?)",
        path.display()
    );
    Ok(claimed as usize)
}

/// Appends the labels of row group `g` of `path` to `labels`, and their definition levels (0: no label) to
/// `defs`, reading until the `rows` its footer claims are read: refused if the column holds fewer or more.
/// The buffers grow as labels are read, [`LABELS_AT_ONCE`] at most at a time.
fn read_labels<T: DataType>(
    mut r: ColumnReaderImpl<T>,
    (path, g, rows): (&Path, usize, usize),
    labels: &mut Vec<i64>,
    defs: &mut Vec<i16>,
) -> Result<()>
where
    T::T: Into<i64>,
{
    let what = || {
        format!(
            "{}: cannot read the labels of row group {g}",
            path.display()
        )
    };
    let mut values = Vec::new();
    let mut read = 0;
    while read < rows {
        let want = (rows - read).min(LABELS_AT_ONCE);
        let (records, _, _) = r
            .read_records(want, Some(&mut *defs), None, &mut values)
            .with_context(what)?;
        ensure!(
            records > 0,
            "{}: its footer says row group {g} has {rows} rows, but it holds {read} (a damaged \
             file?)",
            path.display()
        );
        labels.extend(values.drain(..).map(Into::into));
        read += records;
    }
    let (more, _, _) = r
        .read_records(1, Some(&mut Vec::new()), None, &mut values)
        .with_context(what)?;
    ensure!(
        more == 0,
        "{}: its footer says row group {g} has {rows} rows, but it holds more (a damaged file?)",
        path.display()
    );
    Ok(())
}

/// The classes `names` stand for (see the module doc).
fn classes_of(names: Option<Vec<String>>) -> Vec<String> {
    let wnids = crate::imagenet::wnids();
    match names {
        Some(names)
            if names.len() != wnids.len() || names.iter().all(|n| crate::imagenet::is_wnid(n)) =>
        {
            names
        }
        _ => wnids.into_iter().map(String::from).collect(),
    }
}

/// Opens `path` and reads its labels: (file, labels of each row group, class names).
fn open_file(path: &Path) -> Result<(ParquetFile, Vec<Vec<i64>>, Vec<String>)> {
    let file = File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = file.metadata()?.len();
    let reader = SerializedFileReader::new(Positioned {
        file: Arc::new(file),
        len,
    })
    .with_context(|| format!("{}: not a parquet file", path.display()))?;
    let schema = reader.metadata().file_metadata().schema_descr_ptr();
    let column =
        |name: &str| (0..schema.num_columns()).find(|&i| schema.column(i).path().string() == name);
    let columns = || {
        (0..schema.num_columns())
            .map(|i| schema.column(i).path().string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let (Some(image), Some(label)) = (column("image.bytes"), column("label")) else {
        bail!(
            "{}: not an image dataset as the Hub stores it: its columns are {}; rn50 reads \
             image.bytes (an Image() feature) and label",
            path.display(),
            columns()
        );
    };
    ensure!(
        schema.column(image).physical_type() == PhysicalType::BYTE_ARRAY
            && schema.column(image).max_rep_level() == 0,
        "{}: its image.bytes column is not binary, one value a row",
        path.display()
    );
    let label_type = schema.column(label).physical_type();
    ensure!(
        matches!(label_type, PhysicalType::INT64 | PhysicalType::INT32),
        "{}: its label column holds {label_type}, not integers",
        path.display()
    );
    let names = class_label_names(&reader);
    ensure!(
        names.as_ref().is_none_or(|n| !n.is_empty()),
        "{}: its label is a ClassLabel feature with no class names (the huggingface metadata's \
         info.features.label.names is empty), so no row has a class",
        path.display()
    );
    let classes = classes_of(names);
    let mut labels = Vec::new();
    for g in 0..reader.num_row_groups() {
        let group = reader
            .get_row_group(g)
            .with_context(|| format!("{}: cannot read row group {g}", path.display()))?;
        let codec = group.metadata().column(image).compression();
        ensure!(
            matches!(codec, Compression::UNCOMPRESSED | Compression::SNAPPY),
            "{}: its images are compressed with {codec}; rn50 reads snappy (pyarrow's default) \
             or none",
            path.display()
        );
        let rows = claimed_rows(path, g, group.metadata().num_rows())?;
        let (mut values, mut defs) = (Vec::new(), Vec::new());
        let at = (path, g, rows);
        match group
            .get_column_reader(label)
            .with_context(|| format!("{}: cannot read row group {g}", path.display()))?
        {
            ColumnReader::Int64ColumnReader(r) => read_labels(r, at, &mut values, &mut defs)?,
            ColumnReader::Int32ColumnReader(r) => read_labels(r, at, &mut values, &mut defs)?,
            _ => unreachable!("checked above"),
        }
        if values.len() < rows {
            let first = defs.iter().position(|&d| d == 0).unwrap_or(values.len());
            bail!(
                "{}: row {first} of row group {g} has no label",
                path.display()
            );
        }
        labels.push(values);
    }
    Ok((
        ParquetFile {
            path: path.to_path_buf(),
            reader,
            image,
        },
        labels,
        classes,
    ))
}

impl ParquetSet {
    /// Opens `paths` (in this order) and reads their labels.
    pub fn open(paths: &[PathBuf]) -> Result<ParquetSet> {
        ensure!(!paths.is_empty(), "no parquet files given");
        let opened: Vec<_> = paths
            .par_iter()
            .map(|p| open_file(p))
            .collect::<Result<_>>()?;
        let mut set = ParquetSet {
            files: Vec::with_capacity(paths.len()),
            entries: Vec::new(),
            classes: opened[0].2.clone(),
        };
        for (i, (file, labels, classes)) in opened.into_iter().enumerate() {
            ensure!(
                classes == set.classes,
                "{} has other classes than {} ({} against {})",
                file.path.display(),
                paths[0].display(),
                classes.len(),
                set.classes.len()
            );
            let mut row = 0;
            for (g, group) in labels.iter().enumerate() {
                for (r, &label) in group.iter().enumerate() {
                    ensure!(
                        (0..set.classes.len() as i64).contains(&label),
                        "{}: row {} has label {label}, outside its {} classes (0 to {})",
                        file.path.display(),
                        row + r,
                        set.classes.len(),
                        set.classes.len().saturating_sub(1)
                    );
                    set.entries.push(Entry {
                        file: i as u32,
                        group: g as u32,
                        row: r as u32,
                        label: label as u32,
                    });
                }
                row += group.len();
            }
            set.files.push(file);
        }
        Ok(set)
    }

    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    pub fn num_files(&self) -> usize {
        self.files.len()
    }
}

impl Source for ParquetSet {
    fn len(&self) -> usize {
        self.entries.len()
    }

    fn label(&self, i: usize) -> i64 {
        self.entries[i].label as i64
    }

    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        let e = self.entries[i];
        let f = &self.files[e.file as usize];
        let what = || format!("cannot read row {} of {}", e.row, f.path.display());
        let group = f
            .reader
            .get_row_group(e.group as usize)
            .with_context(what)?;
        let pages = group.get_column_page_reader(f.image).with_context(what)?;
        let (pages, row) = SkipTo::new(pages, e.row as usize).with_context(what)?;
        let descr = f
            .reader
            .metadata()
            .file_metadata()
            .schema_descr()
            .column(f.image);
        let ColumnReader::ByteArrayColumnReader(mut r) = get_column_reader(descr, Box::new(pages))
        else {
            unreachable!("image.bytes is checked to be binary at open");
        };
        r.skip_records(row).with_context(what)?;
        let (mut values, mut defs) = (Vec::with_capacity(1), Vec::with_capacity(1));
        r.read_records(1, Some(&mut defs), None, &mut values)
            .with_context(what)?;
        let Some(bytes) = values.first() else {
            bail!("row {} of {} has no image bytes", e.row, f.path.display());
        };
        buf.clear();
        buf.extend_from_slice(bytes.data());
        Ok(buf)
    }

    fn name(&self, i: usize) -> String {
        let e = self.entries[i];
        let f = &self.files[e.file as usize];
        format!(
            "{} (row group {}, row {})",
            f.path.display(),
            e.group,
            e.row
        )
    }
}

/// The split a Hub parquet file's name gives: `train-00000-of-00294.parquet` → `train`.
pub fn split_of(path: &Path) -> Option<&str> {
    let name = path.file_name()?.to_str()?;
    name.split_once('-').map(|(split, _)| split)
}
