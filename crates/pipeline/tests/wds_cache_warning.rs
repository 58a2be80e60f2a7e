//! A cache directory that cannot be written (issue 43): opening WebDataset shards logged one warning per tar,
//! 3,000 lines for 3,000 shards. It is one warning per process, naming the directory and the error; the tars
//! are still read, indexed at every open. A test binary of its own: the warning is the process's, once, and
//! the log is caught by a subscriber set for the whole process (the tars are indexed in rayon's threads).

mod common;

use std::fmt::Debug;
use std::path::Path;
use std::sync::Mutex;

use rn50_pipeline::source::wds::WebDataset;
use rn50_pipeline::source::Source;
use tracing::field::{Field, Visit};
use tracing::{span, Event, Level, Metadata, Subscriber};

/// The messages of the warnings logged.
static WARNINGS: Mutex<Vec<String>> = Mutex::new(Vec::new());

struct Warnings;

struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }
}

impl Subscriber for Warnings {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &span::Attributes<'_>) -> span::Id {
        span::Id::from_u64(1)
    }
    fn record(&self, _: &span::Id, _: &span::Record<'_>) {}
    fn record_follows_from(&self, _: &span::Id, _: &span::Id) {}
    fn event(&self, event: &Event<'_>) {
        if *event.metadata().level() == Level::WARN {
            let mut m = Message(String::new());
            event.record(&mut m);
            WARNINGS.lock().unwrap().push(m.0);
        }
    }
    fn enter(&self, _: &span::Id) {}
    fn exit(&self, _: &span::Id) {}
}

/// A tar of one sample, `key.jpg` (the bytes of `photo`) and `key.cls` (`label`), as webdataset writes one.
fn one_sample_tar(path: &Path, photo: &Path, label: u32) {
    let mut tar = tar::Builder::new(std::fs::File::create(path).unwrap());
    let label = label.to_string();
    let image = std::fs::read(photo).unwrap();
    for (name, bytes) in [("s.jpg", &image[..]), ("s.cls", label.as_bytes())] {
        let mut h = tar::Header::new_gnu();
        h.set_size(bytes.len() as u64);
        h.set_mode(0o644);
        tar.append_data(&mut h, name, bytes).unwrap();
    }
    tar.finish().unwrap();
}

#[test]
fn an_unwritable_cache_directory_is_one_warning_per_process() {
    tracing::subscriber::set_global_default(Warnings).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let photo = common::shared_data().join("jpeg/imagenet/n01440764.JPEG");
    let tars: Vec<_> = (0..5)
        .map(|i| {
            let t = tmp.path().join(format!("s-{i:06}.tar"));
            one_sample_tar(&t, &photo, i);
            t
        })
        .collect();
    // Below a file: no directory can be made there, whoever runs the test (root writes anywhere else).
    let file = tmp.path().join("a-file");
    std::fs::write(&file, b"").unwrap();
    let cache = file.join("cache");
    for _ in 0..2 {
        let w = WebDataset::open(&tars, Some(&cache)).unwrap();
        assert_eq!(w.len(), 5);
        assert_eq!(
            (0..5).map(|i| w.label(i)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 4]
        );
    }
    let warnings = WARNINGS.lock().unwrap().clone();
    assert_eq!(warnings.len(), 1, "{warnings:#?}");
    let w = &warnings[0];
    assert!(
        w.contains(&format!("in {} (", cache.display())) && w.contains("Not a directory"),
        "{w}"
    );
}
