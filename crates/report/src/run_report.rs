//! One training run's report, written into its RUN_DIR: metrics.csv, summary.md, loss/accuracy/lr plots.

use std::path::{Path, PathBuf};

use crate::plot::{self, Chart, Marker, Series};
use crate::schema::{read_train_run, EpochMetrics, StepRecord, TrainRun, TrainSummary};
use crate::table::{fmt_count, train_row, train_table, Align, Cell, Column, Coverage, Table};
use crate::ReportError;

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> ReportError + '_ {
    move |e| ReportError::Io {
        path: path.to_path_buf(),
        source: e,
    }
}

/// Writes `contents` to `path` atomically and durably ([`rn50_util::atomic_write`]), so a reader never sees half a
/// file.
pub(crate) fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), ReportError> {
    rn50_util::atomic_write(path, contents).map_err(io_err(path))
}

/// Writes `RUN_DIR/summary.json`.
pub fn write_summary(run_dir: &Path, summary: &TrainSummary) -> Result<PathBuf, ReportError> {
    let path = run_dir.join("summary.json");
    let mut text = serde_json::to_string_pretty(summary).map_err(|e| ReportError::Invalid {
        path: path.clone(),
        message: e.to_string(),
    })?;
    text.push('\n');
    write_atomic(&path, text.as_bytes())?;
    Ok(path)
}

/// Per-epoch metrics as a table, plus the elapsed time at each epoch's end; the columns older runs or runs
/// without I/O figures lack ([`OPTIONAL_COLUMNS`]) only when some epoch has them. What the run covers
/// ([`Coverage`]: steps per epoch trained and of a whole pass, the validation split's images, beside each epoch's
/// `val_images`) closes every row where the summary records it, for a script to tell a smoke run's epochs.
pub fn metrics_table(run: &TrainRun) -> Table {
    let t = all_metrics_table(run);
    let keys: Vec<&str> = t
        .columns
        .iter()
        .enumerate()
        .filter(|&(i, c)| {
            !OPTIONAL_COLUMNS.contains(&c.key) || t.rows.iter().any(|r| !r[i].raw.is_empty())
        })
        .map(|(_, c)| c.key)
        .collect();
    t.select(&keys)
}

/// The metrics an older rn50 did not write (training top-1, validation loss and images, seconds in the training
/// loop), the EMA's (with `--ema`) and the I/O figures, which a run has only with a dataset on a disk /proc
/// describes.
const OPTIONAL_COLUMNS: [&str; 13] = [
    "train_acc1",
    "val_loss",
    "val_images",
    "train_seconds",
    "ema_acc1",
    "ema_acc5",
    "ema_val_loss",
    "disk_read_gbs",
    "disk_read_iops",
    "process_read_gbs",
    "steps_per_epoch",
    "full_steps_per_epoch",
    "val_images_total",
];

fn all_metrics_table(run: &TrainRun) -> Table {
    let epochs = &run.epochs;
    let coverage = Coverage::of(run);
    let c = |title, key| Column {
        title,
        key,
        align: Align::Right,
    };
    let num = |x: Option<f64>| match x.filter(|v| v.is_finite()) {
        Some(v) => Cell {
            display: format!("{v}"),
            raw: v.to_string(),
        },
        None => Cell {
            display: "—".into(),
            raw: String::new(),
        },
    };
    let mut elapsed = 0.0;
    Table {
        columns: vec![
            c("epoch", "epoch"),
            c("train loss", "train_loss"),
            c("train Acc@1", "train_acc1"),
            c("lr", "lr"),
            c("img/s", "images_per_sec"),
            c("Acc@1", "acc1"),
            c("Acc@5", "acc5"),
            c("val loss", "val_loss"),
            c("val images", "val_images"),
            c("EMA Acc@1", "ema_acc1"),
            c("EMA Acc@5", "ema_acc5"),
            c("EMA val loss", "ema_val_loss"),
            c("seconds", "seconds"),
            c("train s", "train_seconds"),
            c("elapsed s", "elapsed_s"),
            c("disk GB/s", "disk_read_gbs"),
            c("disk IOPS", "disk_read_iops"),
            c("process GB/s", "process_read_gbs"),
            c("steps/epoch", "steps_per_epoch"),
            c("full steps/epoch", "full_steps_per_epoch"),
            c("val images total", "val_images_total"),
        ],
        rows: epochs
            .iter()
            .map(|e| {
                elapsed += e.seconds.unwrap_or(0.0);
                vec![
                    Cell::text(e.epoch.to_string()),
                    num(e.train_loss),
                    num(e.train_acc1),
                    num(e.lr),
                    num(e.images_per_sec),
                    num(e.acc1),
                    num(e.acc5),
                    num(e.val_loss),
                    num(e.val_images.map(|n| n as f64)),
                    num(e.ema_acc1),
                    num(e.ema_acc5),
                    num(e.ema_val_loss),
                    num(e.seconds),
                    num(e.train_seconds),
                    num(Some(elapsed)),
                    num(e.disk_read_gbs),
                    num(e.disk_read_iops),
                    num(e.process_read_gbs),
                    num(coverage.steps_per_epoch.map(|n| n as f64)),
                    num(coverage.full_steps_per_epoch.map(|n| n as f64)),
                    num(coverage.val_images_total.map(|n| n as f64)),
                ]
            })
            .collect(),
    }
}

/// Epochs on the x axis are numbered as in the logs, metrics.jsonl and metrics.csv: from 0.
fn curve(epochs: &[EpochMetrics], f: impl Fn(&EpochMetrics) -> Option<f64>) -> Vec<(f64, f64)> {
    epochs
        .iter()
        .filter_map(|e| f(e).map(|y| (e.epoch as f64, y)))
        .collect()
}

/// A run's name in a legend; among several runs, a partial run's says what it covers ("smoke (⚠ 20 of 5,005
/// steps/epoch, val 500 of 50,000)"). A single run's chart says so under its title.
fn legend_name(r: &TrainRun, runs: usize) -> String {
    match Coverage::of(r).describe(true) {
        Some(d) if runs > 1 => format!("{} (⚠ {d})", r.name),
        _ => r.name.clone(),
    }
}

/// Charts of several runs: a line under the title when some run is partial.
fn partial_subtitle(c: &mut Chart, runs: &[&TrainRun]) {
    if runs.len() > 1 && runs.iter().any(|r| Coverage::of(r).is_partial()) {
        c.subtitle =
            Some("⚠ partial runs: epochs cut short or validation on a subset, not results".into());
    }
}

/// Loss of several runs overlaid (legend = run name).
pub fn loss_chart(runs: &[&TrainRun]) -> Chart {
    let mut c = Chart::new("Training loss", "epoch", "train loss (mean over the epoch)");
    for r in runs {
        c.series.push(Series::new(
            legend_name(r, runs.len()),
            curve(&r.epochs, |e| e.train_loss),
        ));
    }
    partial_subtitle(&mut c, runs);
    c
}

/// Top-1 and top-5 accuracy, and a run with `--ema` its average's dotted. One run: a colour for each curve,
/// each in the legend. Several overlaid: a colour for each run, named once, top-1 solid, top-5 dashed, the EMA's
/// top-1 dotted, and what each line style means in black. Each of `targets` (top-1, percent) a level line.
pub fn accuracy_chart(runs: &[&TrainRun], targets: &[f64]) -> Chart {
    let mut c = epoch_accuracy_chart(runs);
    let epochs = runs.iter().flat_map(|r| &r.epochs).map(|e| e.epoch as f64);
    target_lines(&mut c, targets, epochs);
    c
}

fn epoch_accuracy_chart(runs: &[&TrainRun]) -> Chart {
    let mut c = Chart::new("Validation accuracy", "epoch", "accuracy (%)");
    c.y_max = Some(100.0);
    let ema = |r: &TrainRun| curve(&r.epochs, |e| e.ema_acc1.filter(|a| a.is_finite()));
    if let [r] = runs {
        c.series
            .push(Series::new("Acc@1 (top-1)", curve(&r.epochs, |e| e.acc1)).colour(0));
        c.series.push(
            Series::new("Acc@5 (top-5)", curve(&r.epochs, |e| e.acc5))
                .dashed()
                .colour(1),
        );
        let ema1 = ema(r);
        if !ema1.is_empty() {
            c.series
                .push(Series::new("EMA Acc@1 (dotted)", ema1).dotted().colour(2));
            let ema5 = curve(&r.epochs, |e| e.ema_acc5.filter(|a| a.is_finite()));
            c.series
                .push(Series::new("EMA Acc@5 (dotted)", ema5).dotted().colour(3));
        }
        return c;
    }
    let mut any_ema = false;
    for (i, r) in runs.iter().enumerate() {
        c.series
            .push(Series::new(legend_name(r, runs.len()), curve(&r.epochs, |e| e.acc1)).colour(i));
        c.series.push(
            Series::new("", curve(&r.epochs, |e| e.acc5))
                .dashed()
                .colour(i),
        );
        let ema1 = ema(r);
        if !ema1.is_empty() {
            any_ema = true;
            c.series.push(Series::new("", ema1).dotted().colour(i));
        }
    }
    // The key to the line styles: legend entries without points.
    const BLACK: usize = 6;
    c.series.push(
        Series::new("Acc@1 (solid)", vec![])
            .without_markers()
            .colour(BLACK),
    );
    c.series
        .push(Series::new("Acc@5 (dashed)", vec![]).dashed().colour(BLACK));
    if any_ema {
        c.series.push(
            Series::new("EMA Acc@1 (dotted)", vec![])
                .dotted()
                .colour(BLACK),
        );
    }
    partial_subtitle(&mut c, runs);
    c
}

/// Time to accuracy as a picture: each run's top-1 at the end of each evaluated epoch against the wall-clock until
/// then (the seconds [`crate::schema::time_to_target`] sums; a run with `--ema` the better of its weights' and
/// their average's, as the target judges it), and each target a level line: the first point of a run on or
/// above a line is its time to that target.
pub fn time_to_accuracy_chart(runs: &[&TrainRun], targets: &[f64]) -> Chart {
    let mut c = Chart::new("Time to accuracy", "wall-clock (s)", "top-1 (%)");
    c.y_max = Some(100.0);
    let mut end = 0.0f64;
    for (i, r) in runs.iter().enumerate() {
        let mut clock = 0.0;
        let mut points = vec![];
        for e in &r.epochs {
            clock += e.seconds.unwrap_or(0.0);
            if let Some(a) = e.best_of_acc1() {
                points.push((clock, a));
            }
        }
        end = end.max(clock);
        c.series
            .push(Series::new(legend_name(r, runs.len()), points).colour(i));
    }
    target_lines(&mut c, targets, [0.0, end].into_iter());
    partial_subtitle(&mut c, runs);
    c
}

/// A black level line across `xs`' range for each target top-1, named in the legend.
fn target_lines(c: &mut Chart, targets: &[f64], xs: impl Iterator<Item = f64>) {
    let (lo, hi) = xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), x| {
        (lo.min(x), hi.max(x))
    });
    if lo > hi {
        return;
    }
    for &t in targets {
        c.series.push(
            Series::new(format!("target {t}% top-1"), vec![(lo, t), (hi, t)])
                .without_markers()
                .colour(6),
        );
    }
}

/// The learning rate of a run: of each step steps.jsonl logged, when there is a steps.jsonl (warm-up and schedule
/// as trained, resumes marked), else of each epoch's last step (metrics.jsonl).
pub fn lr_chart(run: &TrainRun, steps: &[StepRecord]) -> Chart {
    if steps.is_empty() {
        let mut c = Chart::new(
            "Learning rate",
            "epoch",
            "learning rate (at the epoch's end)",
        );
        c.y_from_zero = true;
        c.series
            .push(Series::new(&run.name, curve(&run.epochs, |e| e.lr)));
        return c;
    }
    let per_epoch = run
        .summary
        .as_ref()
        .and_then(|s| s.steps_per_epoch)
        .or_else(|| steps.iter().map(|r| r.step + 1).max())
        .unwrap_or(1)
        .max(1);
    let (points, resumes) = lr_per_step(steps, per_epoch);
    let mut c = Chart::new(
        "Learning rate",
        "epochs trained (epoch e runs from e to e + 1)",
        "learning rate (each logged step)",
    );
    c.y_from_zero = true;
    c.series.push(
        Series::new("learning rate at each logged step", thin(points, 2000)).without_markers(),
    );
    c.markers = resumes
        .into_iter()
        .map(|x| Marker {
            x,
            name: "a resumed attempt starts".into(),
        })
        .collect();
    c
}

/// steps.jsonl's learning rates at x = epoch + (step + 1) / steps per epoch, the point of training the trainer
/// computed each rate for, and where later attempts start over: a record at or before one already read (an
/// older rn50 appended a resumed attempt's steps after the killed one's) starts an attempt, whose records replace
/// those of the same steps and after. rn50 now trims steps.jsonl to the checkpoint a resume goes on from, and the
/// run's clock (`time_s`) goes on from the checkpoint's, so its log shows no resume (none is marked).
pub fn lr_per_step(steps: &[StepRecord], per_epoch: u64) -> (Vec<(f64, f64)>, Vec<f64>) {
    let x = |r: &StepRecord| r.epoch as f64 + (r.step + 1) as f64 / per_epoch as f64;
    let mut kept: Vec<&StepRecord> = vec![];
    let mut resumes = vec![];
    for r in steps {
        let key = (r.epoch, r.step);
        if kept.last().is_some_and(|l| (l.epoch, l.step) >= key) {
            kept.retain(|k| (k.epoch, k.step) < key);
            resumes.push(x(r));
        }
        kept.push(r);
    }
    let points = kept
        .iter()
        .filter(|r| r.lr.is_finite())
        .map(|r| (x(r), r.lr))
        .collect();
    (points, resumes)
}

/// At most about `2 * buckets` of `points` (sorted by x): the first and last of each of `buckets` equal spans of
/// x, which keeps the curve's shape (jumps included) at a plot's resolution, however many steps were logged.
fn thin(points: Vec<(f64, f64)>, buckets: usize) -> Vec<(f64, f64)> {
    if points.len() <= 2 * buckets {
        return points;
    }
    let (lo, hi) = (points[0].0, points[points.len() - 1].0);
    let width = (hi - lo) / buckets as f64;
    let bucket = |x: f64| (((x - lo) / width) as usize).min(buckets - 1);
    let mut out: Vec<(f64, f64)> = vec![];
    for (i, &p) in points.iter().enumerate() {
        let b = bucket(p.0);
        let first = i == 0 || bucket(points[i - 1].0) != b;
        let last = i + 1 == points.len() || bucket(points[i + 1].0) != b;
        if first || last {
            out.push(p);
        }
    }
    out
}

/// Reads a run's steps.jsonl, in the order written: none when there is no such file; blank lines skipped; a
/// last line without its newline (a record being written) left out; another line that does not parse, an error.
pub fn read_steps(path: &Path) -> Result<Vec<StepRecord>, ReportError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(vec![]),
        Err(e) => return Err(io_err(path)(e)),
    };
    let complete = text.ends_with('\n');
    let n_lines = text.lines().count();
    let mut out = vec![];
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(r) => out.push(r),
            Err(_) if !complete && i + 1 == n_lines => break,
            Err(e) => return Err(ReportError::json(path, i + 1, &e)),
        }
    }
    Ok(out)
}

/// Reads RUN_DIR (metrics.jsonl, summary.json and steps.jsonl if present) and writes metrics.csv, summary.md,
/// loss.png, accuracy.png and lr.png beside them. Returns the files written. A partial run's plots say so under
/// their titles.
pub fn write_run_report(run_dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let run = read_train_run(run_dir)?;
    let steps = read_steps(&run_dir.join("steps.jsonl"))?;
    let mut written = vec![];
    let csv = run_dir.join("metrics.csv");
    write_atomic(&csv, metrics_table(&run).to_csv().as_bytes())?;
    written.push(csv);
    let md = run_dir.join("summary.md");
    write_atomic(&md, summary_markdown(&run).as_bytes())?;
    written.push(md);
    let coverage = Coverage::of(&run);
    let target: Vec<f64> = run.summary.iter().filter_map(|s| s.target_acc1).collect();
    for (name, chart) in [
        ("loss.png", loss_chart(&[&run])),
        ("accuracy.png", accuracy_chart(&[&run], &target)),
        ("lr.png", lr_chart(&run, &steps)),
    ] {
        let mut chart = chart;
        chart.title = format!("{} — {}", chart.title, run.name);
        if let Some(what) = coverage.describe(false) {
            chart.subtitle = Some(format!("⚠ partial run: {what}"));
            if let Some((s, f)) = coverage.short_epochs() {
                if chart.x_label == "epoch" {
                    chart.x_label =
                        format!("epoch ({} of {} steps each)", fmt_count(s), fmt_count(f));
                }
            }
        }
        let path = run_dir.join(name);
        plot::render(&chart, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// summary.md: the run's row of the training table, then what it ran on. A partial run's opens with what it
/// covers, before the table.
pub fn summary_markdown(run: &TrainRun) -> String {
    let mut s = format!("# Training run `{}`\n\n", run.name);
    if let Some(note) = Coverage::of(run).partial_note() {
        let (head, rest) = note.split_once(". ").unwrap_or((&note, ""));
        s.push_str(&format!("> **⚠ {head}.** {rest}\n\n"));
    }
    s.push_str(&train_table(&[train_row(run)], false).to_markdown());
    if let Some(sum) = &run.summary {
        // Where the rate came from, when the summary says: scaled from --lr-base, or --lr itself.
        let lr = match (sum.lr_base, sum.lr_base_size) {
            (Some(base), Some(size)) => format!(
                "; lr is the effective rate, --lr-base {base} scaled by global batch {} / {size}",
                sum.global_batch
            ),
            _ => String::new(),
        };
        s.push_str(&format!(
            "\n{} {} on {}, {} precision{lr}.\n",
            sum.arch, sum.dataset, sum.device, sum.precision
        ));
        if let Some(redone) = sum.redone_s {
            s.push_str(&format!(
                "\n{redone:.0} s of training were done twice: attempts killed without a checkpoint had trained \
                 that far past their last one. The wall clock above is the run's without them.\n"
            ));
        }
    } else {
        s.push_str("\nNo summary.json yet: configuration columns are unknown, the rest is from metrics.jsonl.\n");
    }
    if train_row(run).has_ema() {
        s.push_str(
            "\nEMA Acc@1: the weights' moving average (--ema) evaluated on the same images, last epoch and best; \
             Acc@1 and best Acc@1 are the trained weights'.\n",
        );
    }
    s
}

/// The run's summary table as aligned text, for the terminal at the end of `rn50 train`.
/// A partial run's table is followed by what it covers.
pub fn summary_text(run_dir: &Path) -> Result<String, ReportError> {
    let run = read_train_run(run_dir)?;
    let mut s = train_table(&[train_row(&run)], false).to_text();
    if let Some(note) = Coverage::of(&run).partial_note() {
        s.push_str(&format!(
            "⚠ {note}
"
        ));
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(epochs: &[(u64, f64)]) -> TrainRun {
        TrainRun {
            dir: PathBuf::from("r"),
            name: "r".into(),
            epochs: epochs
                .iter()
                .map(|&(epoch, acc)| EpochMetrics {
                    epoch,
                    acc1: Some(acc),
                    acc5: Some(acc),
                    train_loss: Some(1.0),
                    ..Default::default()
                })
                .collect(),
            summary: None,
        }
    }

    #[test]
    fn plots_number_epochs_as_the_logs_do() {
        // metrics.jsonl's epoch 0 is the logs' "epoch 0" and metrics.csv's 0: the plots' 0 too.
        let r = run(&[(0, 40.0), (1, 60.0)]);
        for chart in [
            loss_chart(&[&r]),
            accuracy_chart(&[&r], &[]),
            lr_chart(&r, &[]),
        ] {
            let xs: Vec<f64> = chart.series[0].points.iter().map(|p| p.0).collect();
            assert!(xs.is_empty() || xs == [0.0, 1.0], "{}: {xs:?}", chart.title);
        }
    }

    /// "lr is the effective rate" only where the summary says it was scaled from --lr-base; a rate given with
    /// --lr is the rate itself.
    #[test]
    fn the_lr_note_only_when_the_rate_was_scaled() {
        let mut r = run(&[(0, 40.0)]);
        let summary = TrainSummary {
            global_batch: 1024,
            lr: 0.4,
            ..Default::default()
        };
        r.summary = Some(summary.clone());
        assert!(
            !summary_markdown(&r).contains("lr is"),
            "{}",
            summary_markdown(&r)
        );
        r.summary = Some(TrainSummary {
            lr_base: Some(0.1),
            lr_base_size: Some(256),
            ..summary
        });
        assert!(
            summary_markdown(&r).contains(
                "lr is the effective rate, --lr-base 0.1 scaled by global batch 1024 / 256."
            ),
            "{}",
            summary_markdown(&r)
        );
    }

    #[test]
    fn accuracy_axis_ends_at_100_percent() {
        assert_eq!(
            accuracy_chart(&[&run(&[(0, 99.0)])], &[]).y_max,
            Some(100.0)
        );
    }

    /// The time chart's x is the wall-clock summed up to the end of each epoch, an epoch not evaluated adding its
    /// seconds but no point; each target is a level line across the runs' range, on both accuracy charts.
    #[test]
    fn time_to_accuracy_plots_top_1_against_the_summed_wall_clock() {
        let mut a = run(&[(0, 40.0), (1, 0.0), (2, 80.0)]);
        a.epochs[1].acc1 = None;
        for (e, s) in a.epochs.iter_mut().zip([10.0, 11.0, 12.0]) {
            e.seconds = Some(s);
        }
        let mut b = run(&[(0, 50.0)]);
        b.epochs[0].seconds = Some(100.0);
        let c = time_to_accuracy_chart(&[&a, &b], &[75.0, 90.0]);
        assert_eq!(c.series[0].points, [(10.0, 40.0), (33.0, 80.0)]);
        assert_eq!(c.series[1].points, [(100.0, 50.0)]);
        assert_eq!(c.series[2].name, "target 75% top-1");
        assert_eq!(c.series[2].points, [(0.0, 75.0), (100.0, 75.0)]);
        assert_eq!(c.series[3].points, [(0.0, 90.0), (100.0, 90.0)]);
        let per_epoch = accuracy_chart(&[&a], &[75.0]);
        let line = per_epoch.series.last().unwrap();
        assert_eq!(
            (line.name.as_str(), &line.points[..]),
            ("target 75% top-1", &[(0.0, 75.0), (2.0, 75.0)][..])
        );
        assert!(!accuracy_chart(&[&a], &[])
            .series
            .iter()
            .any(|s| s.name.starts_with("target")));
    }
}
