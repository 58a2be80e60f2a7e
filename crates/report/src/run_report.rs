//! One training run's report, written into its RUN_DIR: metrics.csv, summary.md, loss/accuracy/lr plots.

use std::path::{Path, PathBuf};

use crate::plot::{self, Chart, Legend, Series};
use crate::schema::{read_train_run, EpochMetrics, TrainRun, TrainSummary};
use crate::table::{train_row, train_table, Align, Cell, Column, Table};
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
/// without I/O figures lack ([`OPTIONAL_COLUMNS`]) only when some epoch has them.
pub fn metrics_table(epochs: &[EpochMetrics]) -> Table {
    let t = all_metrics_table(epochs);
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

/// The metrics an older rn50 did not write (training top-1, validation loss), the EMA's (with `--ema`) and the
/// I/O figures, which a run has only with a dataset on a disk /proc describes.
const OPTIONAL_COLUMNS: [&str; 8] = [
    "train_acc1",
    "val_loss",
    "ema_acc1",
    "ema_acc5",
    "ema_val_loss",
    "disk_read_gbs",
    "disk_read_iops",
    "process_read_gbs",
];

fn all_metrics_table(epochs: &[EpochMetrics]) -> Table {
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
            c("EMA Acc@1", "ema_acc1"),
            c("EMA Acc@5", "ema_acc5"),
            c("EMA val loss", "ema_val_loss"),
            c("seconds", "seconds"),
            c("elapsed s", "elapsed_s"),
            c("disk GB/s", "disk_read_gbs"),
            c("disk IOPS", "disk_read_iops"),
            c("process GB/s", "process_read_gbs"),
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
                    num(e.ema_acc1),
                    num(e.ema_acc5),
                    num(e.ema_val_loss),
                    num(e.seconds),
                    num(Some(elapsed)),
                    num(e.disk_read_gbs),
                    num(e.disk_read_iops),
                    num(e.process_read_gbs),
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

/// Loss of several runs overlaid (legend = run name).
pub fn loss_chart(runs: &[&TrainRun]) -> Chart {
    let mut c = Chart::new("Training loss", "epoch", "train loss (mean over the epoch)");
    for r in runs {
        c.series
            .push(Series::new(&r.name, curve(&r.epochs, |e| e.train_loss)));
    }
    c
}

/// Top-1 (and, for a single run, top-5) accuracy; several runs overlaid show top-1 solid and top-5 dashed.
pub fn accuracy_chart(runs: &[&TrainRun]) -> Chart {
    let mut c = Chart::new("Validation accuracy", "epoch", "accuracy (%)");
    c.legend = Legend::UpperLeft;
    c.y_max = Some(100.0);
    for (i, r) in runs.iter().enumerate() {
        let (n1, n5) = if runs.len() == 1 {
            ("Acc@1 (top-1)".to_string(), "Acc@5 (top-5)".to_string())
        } else {
            (
                format!("{} Acc@1", r.name),
                format!("{} Acc@5 (dashed)", r.name),
            )
        };
        // One run, one colour: top-1 solid, top-5 dashed.
        let colour = if runs.len() == 1 { 2 * i + 1 } else { i };
        c.series.push(
            Series::new(n1, curve(&r.epochs, |e| e.acc1)).colour(if runs.len() == 1 {
                0
            } else {
                i
            }),
        );
        c.series.push(
            Series::new(n5, curve(&r.epochs, |e| e.acc5))
                .dashed()
                .colour(colour),
        );
    }
    c
}

pub fn lr_chart(runs: &[&TrainRun]) -> Chart {
    let mut c = Chart::new(
        "Learning rate",
        "epoch",
        "learning rate (at the epoch's end)",
    );
    c.y_from_zero = true;
    for r in runs {
        c.series
            .push(Series::new(&r.name, curve(&r.epochs, |e| e.lr)));
    }
    c
}

/// Reads RUN_DIR (metrics.jsonl, summary.json if present) and writes metrics.csv, summary.md, loss.png,
/// accuracy.png and lr.png beside them. Returns the files written.
pub fn write_run_report(run_dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let run = read_train_run(run_dir)?;
    let mut written = vec![];
    let csv = run_dir.join("metrics.csv");
    write_atomic(&csv, metrics_table(&run.epochs).to_csv().as_bytes())?;
    written.push(csv);
    let md = run_dir.join("summary.md");
    write_atomic(&md, summary_markdown(&run).as_bytes())?;
    written.push(md);
    for (name, chart) in [
        ("loss.png", loss_chart(&[&run])),
        ("accuracy.png", accuracy_chart(&[&run])),
        ("lr.png", lr_chart(&[&run])),
    ] {
        let mut chart = chart;
        chart.title = format!("{} — {}", chart.title, run.name);
        let path = run_dir.join(name);
        plot::render(&chart, &path)?;
        written.push(path);
    }
    Ok(written)
}

pub fn summary_markdown(run: &TrainRun) -> String {
    let mut s = format!("# Training run `{}`\n\n", run.name);
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
    } else {
        s.push_str("\nNo summary.json yet: configuration columns are unknown, the rest is from metrics.jsonl.\n");
    }
    s
}

/// The run's summary table as aligned text, for the terminal at the end of `rn50 train`.
pub fn summary_text(run_dir: &Path) -> Result<String, ReportError> {
    let run = read_train_run(run_dir)?;
    Ok(train_table(&[train_row(&run)], false).to_text())
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
        for chart in [loss_chart(&[&r]), accuracy_chart(&[&r]), lr_chart(&[&r])] {
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
        assert_eq!(accuracy_chart(&[&run(&[(0, 99.0)])]).y_max, Some(100.0));
    }
}
