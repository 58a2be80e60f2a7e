//! `rn50 report RUN…` ([`ReportArgs`], [`run`]): bench, sweep and training results → Markdown, CSV, PNG (and
//! JSON).

use std::fs;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use serde::Serialize;

use rn50_args::finite_in;

use crate::plot::{self, Chart, Series, XAxis, YAxis};
use crate::run_report::{accuracy_chart, loss_chart, time_to_accuracy_chart, write_atomic};
use crate::schema::{read_inputs, Input, TrainRun};
use crate::table::{
    bench_row, compare, grouped_throughput, row_efficiency, sweep_rows, throughput_table,
    time_to_target_rows, time_to_target_table, train_row, train_table, ThroughputRow,
    TimeToTargetRow, TrainRow,
};

#[derive(Args, Clone, Debug)]
pub struct ReportArgs {
    /// Bench results (`rn50 bench --json`), sweep results (`rn50 bench --sweep`), training run directories
    /// (or their summary.json), or directories holding those; which is which is told from the contents.
    #[arg(required = true, value_name = "RUN")]
    pub runs: Vec<PathBuf>,
    /// Directory for report.md, the CSV files and the PNG plots.
    #[arg(long, default_value = "report", value_name = "DIR")]
    pub out: PathBuf,
    /// Also write the tables, with their efficiencies, as JSON.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Time to accuracy: for each training run, the epochs and wall-clock until its first evaluation reached this
    /// top-1 (percent, above 0, at most 100), in a table (time_to_accuracy.csv) and a plot of top-1 against
    /// wall-clock (time_to_accuracy.png). Repeat it or separate with commas for several (fast.ai's Imagenette
    /// rows: --target-accuracy 87.43,91.57). A target a run was trained with (`train --target-accuracy`) is timed too.
    #[arg(long, value_name = "PERCENT", value_delimiter = ',',
          value_parser = finite_in((Bound::Excluded(0.0), Bound::Included(100.0))))]
    pub target_accuracy: Vec<f64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct ReportJson {
    pub throughput: Vec<ThroughputRow>,
    /// The training runs' rows, as [`TrainRow`] serializes them.
    pub train: Vec<TrainRow>,
    /// Each run's time to each target (`--target-accuracy`, and those the runs were trained with).
    pub time_to_accuracy: Vec<TimeToTargetRow>,
    pub files: Vec<PathBuf>,
}

/// Everything read from the inputs, ready to tabulate.
#[derive(Clone, Debug, Default)]
pub struct Collected {
    pub throughput: Vec<ThroughputRow>,
    pub runs: Vec<TrainRun>,
    /// The top-1 targets to time, ascending, each once: `--target-accuracy`'s and the runs' own (`train
    /// --target-accuracy`).
    pub targets: Vec<f64>,
}

fn display_name(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| p.display().to_string())
}

/// The inputs read, and the targets to time: `targets` and those the training runs were trained with.
pub fn collect(paths: &[PathBuf], targets: &[f64]) -> anyhow::Result<Collected> {
    let mut c = Collected::default();
    for input in read_inputs(paths)? {
        match input {
            Input::Bench { path, result } => {
                c.throughput.push(bench_row(&display_name(&path), &result))
            }
            Input::Sweep { path, result } => c
                .throughput
                .extend(sweep_rows(&display_name(&path), &result)),
            Input::Train(run) => c.runs.push(run),
        }
    }
    let trained_with = c
        .runs
        .iter()
        .filter_map(|r| r.summary.as_ref().and_then(|s| s.target_acc1));
    c.targets = targets.iter().copied().chain(trained_with).collect();
    c.targets.sort_by(f64::total_cmp);
    c.targets.dedup();
    Ok(c)
}

/// report.md's text: the throughput table and the training table, each with how to read it.
pub fn markdown(c: &Collected) -> String {
    let mut s = String::from("# rn50 report\n");
    if !c.throughput.is_empty() {
        s.push_str("\n## Throughput\n\n");
        s.push_str(&throughput_table(&c.throughput).to_markdown());
        s.push_str(
            "\nimg/s: median over steps (bench) or over repeats (sweep), all workers together; spread: \
             p10–p90 of the steps, or min–max of n repeats. Efficiency against the fewest workers among the rows \
             that differ in worker count alone (hardware, config, batch per worker and the bench's other \
             settings): X_N/(N·X_1) from img/s, T1/(N·TN) from the time a fixed number of images takes (median \
             step time / global batch). lr is the effective rate.\n",
        );
    }
    if !c.runs.is_empty() {
        s.push_str("\n## Training runs\n\n");
        let rows: Vec<TrainRow> = c.runs.iter().map(train_row).collect();
        let partial: Vec<&str> = rows
            .iter()
            .filter(|r| r.coverage.is_partial())
            .map(|r| r.name.as_str())
            .collect();
        if !partial.is_empty() {
            s.push_str(&format!(
                "> **⚠ Partial runs: {}.** Their \"covers\" says what they trained and evaluated (\"full\": whole \
                 epochs and every validation image; \"—\": not recorded): epochs cut short \
                 (--steps-per-epoch; steps per epoch of a whole pass) or validation on a subset (--val-max-images; \
                 images of the split). Smoke runs, not results: their accuracy, wall clock and img/s say nothing of \
                 a full run's, and their efficiencies compare them only with runs that cover as much.\n\n",
                partial.join(", ")
            ));
        }
        s.push_str(&train_table(&rows, true).to_markdown());
        s.push_str(
            "\nWall-clock: training and evaluation of all epochs. Acc@1/Acc@5: last epoch, percent. Efficiency \
             against the run with the fewest GPUs/ranks among those that differ in worker count alone (arch, \
             width, image size, dataset, hardware, precision, batch per rank and epochs the same): T1/(N·TN) \
             from wall-clock time, X_N/(N·X_1) from mean img/s.\n",
        );
        if rows.iter().any(TrainRow::has_ema) {
            s.push_str(
                "\nEMA Acc@1: the weights' moving average (--ema) evaluated on the same images, last epoch and \
                 best; Acc@1 and best Acc@1 are the trained weights'.\n",
            );
        }
        if !c.targets.is_empty() {
            s.push_str("\n## Time to accuracy\n\n");
            s.push_str(
                &time_to_target_table(&time_to_target_rows(&c.runs, &c.targets)).to_markdown(),
            );
            s.push_str(
                "\nTime to it: the wall-clock of the epochs up to the end of the first evaluation whose top-1 (the \
                 trained weights' or their EMA's) reached the target: training, evaluation and checkpoints, and a \
                 resumed run's earlier attempts, as `train --target-accuracy` counts it. best Acc@1: the run's \
                 best evaluation.\n",
            );
        }
    }
    s
}

pub fn json(c: &Collected, files: Vec<PathBuf>) -> ReportJson {
    let throughput = compare(&c.throughput);
    let train = c.runs.iter().map(train_row).collect();
    ReportJson {
        throughput,
        train,
        time_to_accuracy: time_to_target_rows(&c.runs, &c.targets),
        files,
    }
}

/// "Intel(R) Xeon(R) Gold 6338 CPU @ 2.00GHz" → "Intel Xeon Gold 6338": legend text that fits.
fn short_hardware(h: &str) -> String {
    let mut s = h.replace("(R)", "").replace("(TM)", "").replace("(tm)", "");
    if let Some(i) = s.find(" CPU @") {
        s.truncate(i);
    }
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > 48 {
        s.chars().take(47).chain(['…']).collect()
    } else {
        s
    }
}

/// Throughput vs workers per comparison group, each with its ideal linear line from its baseline (same colour,
/// dashed); and the throughput-based efficiency of each group. Groups whose throughputs differ by more than
/// 20x (a CPU next to GPUs) share a log-scale y axis.
pub fn scaling_charts(rows: &[ThroughputRow]) -> (Chart, Chart) {
    let mut tp = Chart::new(
        "Training throughput vs workers",
        "workers (GPUs or ranks)",
        "images/s",
    );
    let mut eff = Chart::new(
        "Scaling efficiency vs workers",
        "workers (GPUs or ranks)",
        "efficiency X_N/(N·X_1) (%)",
    );
    tp.x_axis = XAxis::Log2;
    tp.y_from_zero = true;
    eff.x_axis = XAxis::Log2;
    eff.y_from_zero = true;
    let groups = grouped_throughput(rows);
    let configs: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.config.as_str()).collect();
    let mut max_n = 1u64;
    for (gi, (base, group)) in groups.iter().enumerate() {
        let mut label = short_hardware(&base.hardware);
        if configs.len() > 1 {
            label.push_str(&format!(", {}", base.config));
        }
        label.push_str(&format!(", batch {}", base.batch));
        let measured: Vec<(f64, f64)> = group
            .iter()
            .map(|r| (r.workers as f64, r.images_per_sec))
            .collect();
        let ns: Vec<u64> = group.iter().map(|r| r.workers).collect();
        let per_worker = base.images_per_sec / base.workers as f64;
        let ideal = ns
            .iter()
            .map(|&n| (n as f64, per_worker * n as f64))
            .collect();
        tp.series
            .push(Series::new(label.clone(), measured).colour(gi));
        // One legend entry says what dashed means; the other groups' ideal lines go unlabelled.
        let ideal_name = if gi == 0 {
            "ideal: linear from the fewest workers"
        } else {
            ""
        };
        tp.series
            .push(Series::new(ideal_name, ideal).dashed().colour(gi));
        eff.series.push(
            Series::new(
                label,
                group
                    .iter()
                    .filter_map(|r| {
                        row_efficiency(base, r)
                            .0
                            .map(|e| (r.workers as f64, e * 100.0))
                    })
                    .collect(),
            )
            .colour(gi),
        );
        max_n = max_n.max(*ns.iter().max().unwrap_or(&1));
    }
    let min_n = rows.iter().map(|r| r.workers).min().unwrap_or(1) as f64;
    eff.series.push(
        Series::new("ideal (100%)", vec![(min_n, 100.0), (max_n as f64, 100.0)])
            .dashed()
            .colour(6),
    );
    let peaks: Vec<f64> = groups
        .iter()
        .map(|(_, g)| g.iter().map(|r| r.images_per_sec).fold(0.0, f64::max))
        .filter(|x| *x > 0.0)
        .collect();
    let hi = peaks.iter().copied().fold(0.0, f64::max);
    let lo = peaks.iter().copied().fold(f64::INFINITY, f64::min);
    if hi / lo > 20.0 {
        tp.y_axis = YAxis::Log10;
        tp.y_label = "images/s (log scale)".into();
    }
    (tp, eff)
}

/// Writes report.md, throughput.csv, train.csv and the plots into `out`; returns the files written.
pub fn write_report(c: &Collected, out: &Path) -> anyhow::Result<Vec<PathBuf>> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut files = vec![];
    let mut put = |name: &str, text: String| -> anyhow::Result<()> {
        let p = out.join(name);
        write_atomic(&p, text.as_bytes())?;
        files.push(p);
        Ok(())
    };
    put("report.md", markdown(c))?;
    if !c.throughput.is_empty() {
        put("throughput.csv", throughput_table(&c.throughput).to_csv())?;
    }
    let train_rows: Vec<TrainRow> = c.runs.iter().map(train_row).collect();
    if !c.runs.is_empty() {
        put("train.csv", train_table(&train_rows, true).to_csv())?;
        if !c.targets.is_empty() {
            let rows = time_to_target_rows(&c.runs, &c.targets);
            put("time_to_accuracy.csv", time_to_target_table(&rows).to_csv())?;
        }
    }
    let mut charts = vec![];
    if !c.throughput.is_empty() {
        let (tp, eff) = scaling_charts(&c.throughput);
        charts.push(("throughput.png", tp));
        charts.push(("efficiency.png", eff));
    }
    if !c.runs.is_empty() {
        let runs: Vec<&TrainRun> = c.runs.iter().collect();
        charts.push(("train_loss.png", loss_chart(&runs)));
        charts.push(("train_accuracy.png", accuracy_chart(&runs, &c.targets)));
        if !c.targets.is_empty() {
            charts.push((
                "time_to_accuracy.png",
                time_to_accuracy_chart(&runs, &c.targets),
            ));
        }
    }
    for (name, chart) in charts {
        let p = out.join(name);
        plot::render(&chart, &p)?;
        files.push(p);
    }
    Ok(files)
}

/// What fits a terminal of the throughput table; report.md and the CSV have every column.
const TERMINAL_COLUMNS: [&str; 11] = [
    "hardware",
    "workers",
    "batch_per_worker",
    "global_batch",
    "lr",
    "images_per_sec",
    "spread_lo",
    "speedup",
    "efficiency_throughput",
    "efficiency_time",
    "allreduce_ms",
];

/// `rn50 report`.
pub fn run(args: &ReportArgs) -> anyhow::Result<()> {
    let c = collect(&args.runs, &args.target_accuracy)?;
    if !args.target_accuracy.is_empty() && c.runs.is_empty() {
        tracing::warn!(
            "--target-accuracy: no training run among the inputs, so no time to accuracy to report"
        );
    }
    let files = write_report(&c, &args.out)?;
    if !c.throughput.is_empty() {
        let narrow = throughput_table(&c.throughput).select(&TERMINAL_COLUMNS);
        println!("{}", narrow.to_text());
    }
    if !c.runs.is_empty() {
        let rows: Vec<TrainRow> = c.runs.iter().map(train_row).collect();
        println!("{}", train_table(&rows, true).to_text());
        let partial: Vec<&str> = rows
            .iter()
            .filter(|r| r.coverage.is_partial())
            .map(|r| r.name.as_str())
            .collect();
        if !partial.is_empty() {
            println!(
                "⚠ partial runs, smoke runs and not results (epochs cut short or validation on a subset; see \
                 \"covers\"): {}\n",
                partial.join(", ")
            );
        }
        if !c.targets.is_empty() {
            let rows = time_to_target_rows(&c.runs, &c.targets);
            println!("{}", time_to_target_table(&rows).to_text());
        }
    }
    if let Some(path) = &args.json {
        let mut text = serde_json::to_string_pretty(&json(&c, files.clone()))?;
        text.push('\n');
        write_atomic(path, text.as_bytes())?;
    }
    for f in &files {
        tracing::info!("wrote {}", f.display());
    }
    Ok(())
}
