//! Loader workers across epoch boundaries: queued epochs decode in the order they are consumed
//! within one shared window, the next epoch (and an evaluation pass) starts while the current one's
//! last batches are consumed, an epoch taken out of order still loads,
//! every worker helps with the oldest batch whatever the prefetch depth, and the batches are those
//! of epochs loaded one at a time.

use crate::common;

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use anyhow::Result;
use common::*;
use rn50_pipeline::sampler::Sampler;
use rn50_pipeline::source::Source;
use rn50_pipeline::{Dataset, Loader, LoaderConfig, Transform};

/// The ImageNet samples, recording the order in which the workers read them.
struct Recording {
    inner: Dataset,
    log: Mutex<Vec<usize>>,
    read: Condvar,
    /// Reads in progress, the most seen at once, and whether a read still waits for a partner.
    active: Mutex<(usize, usize, bool)>,
    partner: Condvar,
}

impl Recording {
    fn new(tmp: &std::path::Path) -> Arc<Recording> {
        Arc::new(Recording {
            inner: Dataset::open(imagenet_folder(tmp)).unwrap(),
            log: Mutex::default(),
            read: Condvar::new(),
            active: Mutex::new((0, 0, false)),
            partner: Condvar::new(),
        })
    }

    fn dataset(self: &Arc<Self>) -> Dataset {
        let classes = self.inner.classes().to_vec();
        Dataset::from_source(self.clone(), classes, "recording".into())
    }

    fn log(&self) -> Vec<usize> {
        self.log.lock().unwrap().clone()
    }

    /// Waits (a minute at most) until every index of `want` has been read.
    fn wait_for(&self, want: &[usize]) -> bool {
        let log = self.log.lock().unwrap();
        let (_log, timeout) = self
            .read
            .wait_timeout_while(log, Duration::from_secs(60), |log| {
                !want.iter().all(|i| log.contains(i))
            })
            .unwrap();
        !timeout.timed_out()
    }

    /// From now on the first read waits (30 s at most) for a second one to start.
    fn expect_partner(&self) {
        *self.active.lock().unwrap() = (0, 0, true);
    }

    fn most_concurrent_reads(&self) -> usize {
        self.active.lock().unwrap().1
    }
}

impl Source for Recording {
    fn len(&self) -> usize {
        self.inner.len()
    }
    fn label(&self, i: usize) -> i64 {
        self.inner.label(i)
    }
    fn read<'a>(&'a self, i: usize, buf: &'a mut Vec<u8>) -> Result<&'a [u8]> {
        {
            let mut a = self.active.lock().unwrap();
            a.0 += 1;
            a.1 = a.1.max(a.0);
            if a.2 && a.0 == 1 {
                a = self
                    .partner
                    .wait_timeout_while(a, Duration::from_secs(30), |a| a.1 < 2)
                    .unwrap()
                    .0;
                a.2 = false;
            }
            self.partner.notify_all();
            a.0 -= 1;
        }
        self.log.lock().unwrap().push(i);
        self.read.notify_all();
        self.inner.read(i, buf)
    }
    fn name(&self, i: usize) -> String {
        self.inner.name(i)
    }
}

fn config(batch: usize, workers: usize, prefetch: usize) -> LoaderConfig {
    LoaderConfig {
        transform: Transform::train(32),
        seed: 3,
        prefetch,
        ..LoaderConfig::train(batch, workers)
    }
}

/// This rank's sample order in `epoch` (one rank, shuffled, as `config`).
fn order(len: usize, epoch: u64) -> Vec<usize> {
    let s = Sampler {
        len,
        shuffle: true,
        seed: 3,
        rank: 0,
        world_size: 1,
        reps: 1,
    };
    s.indices(epoch, true)
}

type Run = Vec<(Vec<u8>, Vec<i64>, Vec<usize>)>;

fn take_all(it: impl Iterator<Item = Result<rn50_pipeline::Batch>>) -> Run {
    it.map(|b| {
        let b = b.unwrap();
        (b.to_vec(), b.labels().to_vec(), b.indices().to_vec())
    })
    .collect()
}

/// Long enough for the one worker to read a batch it was allowed to: a read that should not
/// happen would show up in the log by then.
fn settle() {
    std::thread::sleep(Duration::from_millis(300));
}

fn cat(parts: &[&[usize]]) -> Vec<usize> {
    parts.concat()
}

/// Two epochs queued at once share one window of `prefetch` batches: while the consumer has taken
/// nothing, the one worker reads the first epoch's window and nothing of the second; each batch
/// taken lets one more batch start, the first epoch's before the second's.
#[test]
fn queued_epochs_share_one_window_in_the_order_they_are_consumed() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording::new(tmp.path());
    let (b, p) = (8, 2);
    let loader = Loader::new(rec.dataset(), config(b, 1, p)).unwrap();
    let mut e0 = loader.batches(0, 0..3);
    let e1 = loader.epoch(1, 0);
    let (o0, o1) = (order(220, 0), order(220, 1));
    let expect = |want: Vec<usize>, what: &str| {
        assert!(rec.wait_for(&want), "{what}: read only {:?}", rec.log());
        settle();
        assert_eq!(rec.log(), want, "{what}");
    };
    expect(o0[..p * b].to_vec(), "nothing taken");
    e0.next().unwrap().unwrap();
    expect(o0[..3 * b].to_vec(), "one batch taken");
    e0.next().unwrap().unwrap();
    expect(cat(&[&o0[..3 * b], &o1[..b]]), "two batches taken");
    e0.next().unwrap().unwrap();
    expect(cat(&[&o0[..3 * b], &o1[..2 * b]]), "epoch 0 taken");
    drop((e0, e1));
}

/// A consumer that takes a later epoch first (the window full of the earlier one's batches) still
/// gets its batches, one at a time, and both epochs hold what they would alone.
#[test]
fn an_epoch_taken_out_of_queue_order_still_loads() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let single = Loader::new(ds.clone(), config(8, 1, 1)).unwrap();
    let (alone0, alone1) = (take_all(single.epoch(0, 0)), take_all(single.epoch(1, 0)));
    let loader = Loader::new(ds, config(8, 2, 2)).unwrap();
    let e0 = loader.epoch(0, 0);
    let e1 = loader.epoch(1, 0);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let later = take_all(e1);
        let earlier = take_all(e0);
        let _ = tx.send((earlier, later));
    });
    let (earlier, later) = rx
        .recv_timeout(Duration::from_secs(120))
        .expect("the later epoch's consumer hangs while the earlier one holds the window");
    assert!(later == alone1, "epoch 1 differs");
    assert!(earlier == alone0, "epoch 0 differs");
}

/// With a prefetch depth of one batch, both workers still decode: they share the batch.
#[test]
fn every_worker_helps_whatever_the_prefetch_depth() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording::new(tmp.path());
    let loader = Loader::new(rec.dataset(), config(16, 2, 1)).unwrap();
    rec.expect_partner();
    let batches = take_all(loader.epoch(0, 0).take(3));
    assert_eq!(batches.len(), 3);
    assert_eq!(rec.most_concurrent_reads(), 2, "one worker idled");
}

/// `epochs` queues the next epoch as the current one is handed out: the next epoch's first batch
/// is read while the current one's last batch has not been taken yet.
#[test]
fn next_epoch_is_read_before_the_last_batch_is_taken() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording::new(tmp.path());
    let b = 8;
    let loader = Loader::new(rec.dataset(), config(b, 2, 2)).unwrap();
    let mut epochs = loader.epochs(0, 0);
    let mut e0 = epochs.next().unwrap();
    assert_eq!(e0.epoch(), 0);
    for _ in 1..e0.remaining() {
        e0.next().unwrap().unwrap();
    }
    assert_eq!(e0.remaining(), 1);
    let first = &order(220, 1)[..b];
    assert!(
        rec.wait_for(first),
        "epoch 1's first batch not read while epoch 0's last one waits"
    );
    assert!(e0.next().unwrap().is_ok());
    assert!(e0.next().is_none());
    let mut e1 = epochs.next().unwrap();
    assert_eq!(e1.epoch(), 1);
    assert_eq!(e1.next().unwrap().unwrap().indices(), first);
}

/// Epochs loaded back to back, resumed mid-epoch or cut short hold the batches of epochs loaded
/// one at a time by a loader with one worker: same order, same crops, same bytes.
#[test]
fn pipelined_epochs_match_epochs_loaded_one_at_a_time() {
    let tmp = tempfile::tempdir().unwrap();
    let ds = Dataset::open(imagenet_folder(tmp.path())).unwrap();
    let single = Loader::new(ds.clone(), config(16, 1, 1)).unwrap();
    let alone: Vec<Run> = (0..4).map(|e| take_all(single.epoch(e, 0))).collect();
    assert_eq!(alone[0].len(), 13);
    let loader = Loader::new(ds.clone(), config(16, 3, 4)).unwrap();
    let piped: Vec<Run> = loader.epochs(0, 0).take(3).map(take_all).collect();
    assert!(piped == alone[..3], "pipelined epochs differ");
    let resumed: Vec<Run> = loader.epochs(2, 5).take(2).map(take_all).collect();
    assert!(resumed[0] == alone[2][5..], "resumed epoch differs");
    assert!(
        resumed[1] == alone[3],
        "the epoch after a resumed one differs"
    );
    // A part of an epoch decodes nothing past its end.
    let before = loader.stats().images;
    assert!(take_all(loader.batches(1, 3..5)) == alone[1][3..5]);
    assert_eq!(loader.stats().images - before, 2 * 16);
}

/// An evaluation pass on a loader sharing the workers, queued between two training epochs, is
/// read as the first epoch's batches are taken and before the second epoch's, within the one
/// window, and yields the same batches as a loader of its own.
#[test]
fn evaluation_queued_between_epochs_decodes_in_turn() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording::new(tmp.path());
    let (b, p) = (8, 2);
    let train = Loader::new(rec.dataset(), config(b, 1, p)).unwrap();
    let val_cfg = LoaderConfig {
        transform: Transform::val(40, 32),
        prefetch: p,
        ..LoaderConfig::val(b, 1)
    };
    let val = train.share_workers(rec.dataset(), val_cfg.clone()).unwrap();
    let e0 = train.batches(0, 0..p);
    let pass = val.epoch(0, 0);
    let e1 = train.epoch(1, 0);
    let (o0, o1) = (order(220, 0), order(220, 1));
    let val_order: Vec<usize> = (0..220).collect();
    let expect = |want: Vec<usize>, what: &str| {
        assert!(rec.wait_for(&want), "{what}: read only {:?}", rec.log());
        settle();
        assert_eq!(rec.log(), want, "{what}");
    };
    expect(o0[..p * b].to_vec(), "nothing taken");
    assert_eq!(take_all(e0).len(), p);
    expect(cat(&[&o0[..p * b], &val_order[..p * b]]), "epoch 0 taken");
    let pass = take_all(pass);
    expect(
        cat(&[&o0[..p * b], &val_order, &o1[..p * b]]),
        "evaluation taken",
    );
    let own = Loader::new(rec.dataset(), val_cfg).unwrap();
    assert!(pass == take_all(own.epoch(0, 0)));
    drop(e1);
}

/// Dropping an epoch mid-way (samples still being decoded) leaves the epoch queued behind it
/// whole; dropping the loader and its epochs stops the threads, which let go of the dataset.
#[test]
fn dropping_mid_epoch_leaves_the_next_whole_and_shuts_down() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording::new(tmp.path());
    let single = Loader::new(rec.dataset(), config(8, 1, 1)).unwrap();
    let want = take_all(single.epoch(1, 0));
    drop(single);
    let loader = Loader::new(rec.dataset(), config(8, 2, 3)).unwrap();
    let mut epochs = loader.epochs(0, 0);
    let mut e0 = epochs.next().unwrap();
    e0.next().unwrap().unwrap();
    drop(e0);
    let e1 = epochs.next().unwrap();
    assert!(
        take_all(e1) == want,
        "epoch 1 differs after epoch 0 was dropped"
    );
    drop((epochs, loader));
    assert_eq!(Arc::strong_count(&rec), 1, "workers still hold the dataset");
}
