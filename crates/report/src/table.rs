//! Tables in the shapes the sites publish, rendered as Markdown, CSV and aligned text.
//!
//! Each cell carries what a reader sees (rounded, thousands separators, h:m:s) and what a spreadsheet wants
//! (full precision, plain numbers), so the Markdown and the CSV come from one place.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::efficiency::{speedup_throughput, throughput_efficiency_from, time_efficiency_from};
use crate::schema::{
    bench_hardware_label, time_to_target, BenchConfig, BenchResult, SweepResult, TrainRun,
    TrainSummary,
};

#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub display: String,
    pub raw: String,
}

impl Cell {
    pub fn text(s: impl Into<String>) -> Cell {
        let s = s.into();
        Cell {
            display: s.clone(),
            raw: s,
        }
    }
    fn num(display: String, raw: Option<f64>) -> Cell {
        Cell {
            display,
            raw: raw.map(|x| x.to_string()).unwrap_or_default(),
        }
    }
    fn empty() -> Cell {
        Cell {
            display: "—".into(),
            raw: String::new(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Align {
    Left,
    Right,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Column {
    /// Markdown / terminal header.
    pub title: &'static str,
    /// CSV header.
    pub key: &'static str,
    pub align: Align,
}

const fn col(title: &'static str, key: &'static str, align: Align) -> Column {
    Column { title, key, align }
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    pub columns: Vec<Column>,
    pub rows: Vec<Vec<Cell>>,
}

impl Table {
    /// The table without its CSV-only columns (those with an empty title).
    fn visible(&self) -> Table {
        let keep: Vec<bool> = self.columns.iter().map(|c| !c.title.is_empty()).collect();
        let pick = |v: &[Cell]| -> Vec<Cell> {
            v.iter()
                .zip(&keep)
                .filter(|(_, k)| **k)
                .map(|(c, _)| c.clone())
                .collect()
        };
        Table {
            columns: self
                .columns
                .iter()
                .filter(|c| !c.title.is_empty())
                .cloned()
                .collect(),
            rows: self.rows.iter().map(|r| pick(r)).collect(),
        }
    }

    /// The columns with these CSV keys, in this order (unknown keys are skipped): a narrower view for a terminal.
    pub fn select(&self, keys: &[&str]) -> Table {
        let idx: Vec<usize> = keys
            .iter()
            .filter_map(|k| self.columns.iter().position(|c| c.key == *k))
            .collect();
        Table {
            columns: idx.iter().map(|&i| self.columns[i].clone()).collect(),
            rows: self
                .rows
                .iter()
                .map(|r| idx.iter().filter_map(|&i| r.get(i).cloned()).collect())
                .collect(),
        }
    }

    pub fn to_markdown(&self) -> String {
        let t = self.visible();
        let t = &t;
        let mut out = String::new();
        let esc = |s: &str| s.replace('|', "\\|");
        out.push_str("| ");
        let titles: Vec<String> = t.columns.iter().map(|c| esc(c.title)).collect();
        out.push_str(&titles.join(" | "));
        out.push_str(" |\n|");
        for c in &t.columns {
            out.push_str(match c.align {
                Align::Left => " --- |",
                Align::Right => " ---: |",
            });
        }
        out.push('\n');
        for row in &t.rows {
            let cells: Vec<String> = row.iter().map(|c| esc(&c.display)).collect();
            out.push_str("| ");
            out.push_str(&cells.join(" | "));
            out.push_str(" |\n");
        }
        out
    }

    pub fn to_csv(&self) -> String {
        let quote = |s: &str| {
            if s.contains([',', '"', '\n']) {
                format!("\"{}\"", s.replace('"', "\"\""))
            } else {
                s.to_string()
            }
        };
        let mut out = String::new();
        let keys: Vec<String> = self.columns.iter().map(|c| quote(c.key)).collect();
        out.push_str(&keys.join(","));
        out.push('\n');
        for row in &self.rows {
            let cells: Vec<String> = row.iter().map(|c| quote(&c.raw)).collect();
            out.push_str(&cells.join(","));
            out.push('\n');
        }
        out
    }

    /// Columns padded to their widest cell, for a terminal.
    pub fn to_text(&self) -> String {
        let t = self.visible();
        let t = &t;
        let width = |s: &str| s.chars().count();
        let mut widths: Vec<usize> = t.columns.iter().map(|c| width(c.title)).collect();
        for row in &t.rows {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(width(&c.display));
            }
        }
        let line = |cells: Vec<&str>| {
            let parts: Vec<String> = cells
                .iter()
                .zip(&t.columns)
                .zip(&widths)
                .map(|((s, c), &w)| {
                    let pad = " ".repeat(w - width(s));
                    match c.align {
                        Align::Left => format!("{s}{pad}"),
                        Align::Right => format!("{pad}{s}"),
                    }
                })
                .collect();
            let mut l = parts.join("  ");
            l.truncate(l.trim_end().len());
            l.push('\n');
            l
        };
        let mut out = line(t.columns.iter().map(|c| c.title).collect());
        for row in &t.rows {
            out.push_str(&line(row.iter().map(|c| c.display.as_str()).collect()));
        }
        out
    }
}

/// 1234567.8 → "1,234,568"; below 100, one decimal ("19.9"); below 1, three significant digits.
pub fn fmt_rate(x: f64) -> String {
    if !x.is_finite() {
        return "—".into();
    }
    if x.abs() >= 100.0 {
        group_thousands(x.round() as i64)
    } else if x.abs() >= 1.0 {
        format!("{x:.1}")
    } else {
        format!("{x:.3}")
    }
}

/// A count with thousands separators: 50000 → "50,000".
pub fn fmt_count(n: u64) -> String {
    group_thousands(n as i64)
}

fn group_thousands(n: i64) -> String {
    let digits = n.unsigned_abs().to_string();
    let mut out = String::new();
    for (i, ch) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(ch);
    }
    if n < 0 {
        format!("-{out}")
    } else {
        out
    }
}

/// Seconds → "h:mm:ss" (hours unbounded: 36 h is "36:00:00").
pub fn fmt_hms(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "—".into();
    }
    let s = seconds.round() as u64;
    format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// 0.768 → "76.8%".
pub fn fmt_pct(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

/// Learning rates span 1e-4…10: four significant digits, no trailing zeros; below 1e-4 in scientific notation.
pub fn fmt_lr(lr: f64) -> String {
    if lr == 0.0 || !lr.is_finite() {
        return format!("{lr}");
    }
    if lr.abs() < 1e-4 {
        return format!("{lr:.2e}");
    }
    let magnitude = lr.abs().log10().floor() as i64;
    fmt_decimals(lr, (3 - magnitude).max(0) as usize)
}

/// At most `decimals` decimals, no trailing zeros: 30.0 → "30", 2.0/3.0 → "0.667" (3), for numbers a person
/// reads (epochs, rates) rather than f64's shortest round trip ("0.6666666666666666").
pub fn fmt_decimals(x: f64, decimals: usize) -> String {
    let s = format!("{x:.decimals$}");
    let s = match s.contains('.') {
        true => s.trim_end_matches('0').trim_end_matches('.'),
        false => &s,
    };
    match s {
        "-0" => "0".into(),
        s => s.into(),
    }
}

fn opt_cell(x: Option<f64>, f: impl Fn(f64) -> String) -> Cell {
    match x.filter(|v| v.is_finite()) {
        Some(v) => Cell::num(f(v), Some(v)),
        None => Cell::empty(),
    }
}

fn int_cell(x: u64) -> Cell {
    Cell::num(group_thousands(x as i64), Some(x as f64))
}

/// One throughput measurement (a bench result or a sweep point) and how it compares with its group's baseline:
/// a row of the throughput table, and an entry of `rn50 report --json` (under these names, in this order).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ThroughputRow {
    /// The file it came from.
    pub source: String,
    pub hardware: String,
    /// "resnet50 bf16 224px device" — what must match for rows to be compared.
    pub config: String,
    pub workers: u64,
    /// Per worker.
    #[serde(rename = "batch_per_worker")]
    pub batch: u64,
    pub global_batch: u64,
    pub lr: Option<f64>,
    /// Median, all workers together.
    pub images_per_sec: f64,
    /// p10/p90 of a bench, min/max of a sweep point's repeats.
    #[serde(rename = "spread_lo")]
    pub lo: Option<f64>,
    #[serde(rename = "spread_hi")]
    pub hi: Option<f64>,
    pub repeats: Option<usize>,
    /// The comparison with the group's baseline, filled in by [`compare`] (0 and `None` before).
    pub baseline_workers: u64,
    pub speedup: Option<f64>,
    pub efficiency_throughput: Option<f64>,
    pub efficiency_time: Option<f64>,
    pub data_wait_share: Option<f64>,
    pub allreduce_ms: Option<f64>,
    #[serde(skip)]
    pub step_ms: Option<f64>,
    /// The measurement's other settings (channels_last, fused kernels, TF32, dataset folder, optimizer), which
    /// must match too for rows to be compared.
    #[serde(skip)]
    pub settings: String,
}

impl ThroughputRow {
    /// Seconds per image (all workers): the time of a fixed workload, up to a constant, for T1/(N·TN).
    /// From the median step time when there is one, else from the median throughput.
    fn seconds_per_image(&self) -> f64 {
        match self.step_ms {
            Some(ms) if ms > 0.0 && self.global_batch > 0 => ms / 1000.0 / self.global_batch as f64,
            _ => 1.0 / self.images_per_sec,
        }
    }
}

fn config_label(
    arch: &str,
    precision: Option<&str>,
    image_size: Option<u64>,
    data: Option<&str>,
) -> String {
    let mut parts = vec![arch.to_string()];
    parts.extend(precision.map(str::to_string));
    parts.extend(image_size.map(|s| format!("{s}px")));
    parts.extend(data.map(str::to_string));
    parts.join(" ")
}

/// [`ThroughputRow::settings`] of a bench configuration: what it records beyond the config label, the batch and
/// what follows from the worker count (global batch, scaled lr, threads and loader workers per rank), the seed
/// and the measurement's length.
fn settings(c: &BenchConfig) -> String {
    format!(
        "{:?}",
        (
            c.channels_last,
            c.fused_bn,
            c.fused_block,
            c.cudnn_pool,
            c.cuda_graph,
            c.tf32,
            &c.data_dir,
            &c.optimizer,
        )
    )
}

pub fn bench_row(source: &str, b: &BenchResult) -> ThroughputRow {
    let c = &b.config;
    ThroughputRow {
        source: source.into(),
        hardware: bench_hardware_label(c, b.machine.as_ref()),
        config: config_label(
            &c.network(),
            c.precision.as_deref(),
            c.image_size,
            c.data.as_deref(),
        ),
        workers: c.world_size(),
        batch: c.batch_size,
        global_batch: c.global_batch(),
        lr: c.lr,
        images_per_sec: b.images_per_sec,
        lo: b.images_per_sec_p10,
        hi: b.images_per_sec_p90,
        repeats: None,
        data_wait_share: b.data_wait_share,
        allreduce_ms: b.allreduce_ms,
        step_ms: b.step_ms,
        settings: settings(c),
        ..Default::default()
    }
}

pub fn sweep_rows(source: &str, s: &SweepResult) -> Vec<ThroughputRow> {
    let config = config_label(
        &crate::schema::network_label(&s.arch, s.width),
        s.precision.as_deref(),
        s.image_size,
        s.data.as_deref(),
    );
    let hardware = s.hardware_label();
    s.points
        .iter()
        .map(|p| ThroughputRow {
            source: source.into(),
            hardware: hardware.clone(),
            config: config.clone(),
            workers: p.world_size.max(1),
            batch: p.batch_size,
            global_batch: p.global_batch,
            lr: p.lr,
            images_per_sec: p.median,
            lo: Some(p.min),
            hi: Some(p.max),
            repeats: Some(p.images_per_sec.len()),
            allreduce_ms: p.allreduce_ms,
            settings: p.config.as_ref().map(settings).unwrap_or_default(),
            ..Default::default()
        })
        .collect()
}

/// Rows compared for scaling: those that differ in worker count alone (same hardware, model config, per-worker
/// batch and other settings: weak scaling, as the sites run).
fn group_key(r: &ThroughputRow) -> (String, String, u64, String) {
    (
        r.hardware.clone(),
        r.config.clone(),
        r.batch,
        r.settings.clone(),
    )
}

/// Rows sorted into their comparison groups, with each group's baseline (fewest workers; first given on a tie).
pub fn grouped_throughput(rows: &[ThroughputRow]) -> Vec<(ThroughputRow, Vec<ThroughputRow>)> {
    let mut groups: BTreeMap<_, Vec<ThroughputRow>> = BTreeMap::new();
    for r in rows {
        groups.entry(group_key(r)).or_default().push(r.clone());
    }
    groups
        .into_values()
        .map(|mut g| {
            g.sort_by_key(|r| r.workers); // stable: ties keep input order
            (g[0].clone(), g)
        })
        .collect()
}

/// Throughput efficiency and time efficiency of `r` against `base`.
pub fn row_efficiency(base: &ThroughputRow, r: &ThroughputRow) -> (Option<f64>, Option<f64>) {
    (
        throughput_efficiency_from(
            base.workers,
            base.images_per_sec,
            r.workers,
            r.images_per_sec,
        ),
        time_efficiency_from(
            base.workers,
            base.seconds_per_image(),
            r.workers,
            r.seconds_per_image(),
        ),
    )
}

/// The rows sorted into their comparison groups, each compared with its group's baseline: speedup and both
/// efficiencies.
pub fn compare(rows: &[ThroughputRow]) -> Vec<ThroughputRow> {
    let mut out = vec![];
    for (base, group) in grouped_throughput(rows) {
        for mut r in group {
            (r.efficiency_throughput, r.efficiency_time) = row_efficiency(&base, &r);
            r.speedup = speedup_throughput(base.images_per_sec, r.images_per_sec);
            r.baseline_workers = base.workers;
            out.push(r);
        }
    }
    out
}

/// Hardware × workers × img/s, with both efficiencies against each group's smallest worker count.
pub fn throughput_table(rows: &[ThroughputRow]) -> Table {
    use Align::*;
    let columns = vec![
        col("hardware", "hardware", Left),
        col("config", "config", Left),
        col("workers", "workers", Right),
        col("batch/worker", "batch_per_worker", Right),
        col("global batch", "global_batch", Right),
        col("lr", "lr", Right),
        col("img/s", "images_per_sec", Right),
        col("spread", "spread_lo", Right),
        // CSV only: the spread's upper end.
        col("", "spread_hi", Right),
        col("img/s/worker", "images_per_sec_per_worker", Right),
        col("speedup", "speedup", Right),
        col("eff. X_N/(N·X_1)", "efficiency_throughput", Right),
        col("eff. T1/(N·TN)", "efficiency_time", Right),
        col("data wait", "data_wait_share", Right),
        col("all-reduce ms", "allreduce_ms", Right),
        col("source", "source", Left),
    ];
    let mut out = Table {
        columns,
        rows: vec![],
    };
    for r in &compare(rows) {
        let spread = match (r.lo, r.hi) {
            (Some(lo), Some(hi)) => {
                let n = r.repeats.map(|n| format!(" (n={n})")).unwrap_or_default();
                Cell {
                    display: format!("{}–{}{n}", fmt_rate(lo), fmt_rate(hi)),
                    raw: lo.to_string(),
                }
            }
            _ => Cell::empty(),
        };
        out.rows.push(vec![
            Cell::text(&r.hardware),
            Cell::text(&r.config),
            int_cell(r.workers),
            int_cell(r.batch),
            int_cell(r.global_batch),
            opt_cell(r.lr, fmt_lr),
            Cell::num(fmt_rate(r.images_per_sec), Some(r.images_per_sec)),
            spread,
            Cell {
                display: String::new(),
                raw: r.hi.map(|x| x.to_string()).unwrap_or_default(),
            },
            opt_cell(Some(r.images_per_sec / r.workers as f64), fmt_rate),
            opt_cell(r.speedup, |s| format!("{s:.2}x")),
            opt_cell(r.efficiency_throughput, fmt_pct),
            opt_cell(r.efficiency_time, fmt_pct),
            opt_cell(r.data_wait_share, fmt_pct),
            opt_cell(r.allreduce_ms, |m| format!("{m:.1}")),
            Cell::text(&r.source),
        ]);
    }
    out
}

/// What a training run covers: the optimizer steps each epoch trained of a whole pass over the training set, and
/// the validation images its evaluation took of the split. A smoke run (`--steps-per-epoch`, `--val-max-images`)
/// covers less than a result does, and says so wherever it is reported. A field a run has not recorded (an older
/// summary, `--dummy` data, no evaluation yet) is None, and nothing is claimed of it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Coverage {
    /// Optimizer steps each epoch trained (summary.json).
    pub steps_per_epoch: Option<u64>,
    /// Optimizer steps of a whole pass over the training set (summary.json; absent with --dummy).
    pub full_steps_per_epoch: Option<u64>,
    /// The images the last evaluation took (metrics.jsonl's `val_images`, evaluated, and `val_bad_images`,
    /// unreadable): a subset with --val-max-images.
    pub val_images: Option<u64>,
    /// The validation split's images (summary.json).
    pub val_images_total: Option<u64>,
}

impl Coverage {
    /// The coverage of `run`: its summary's steps and split size, its last evaluation's images.
    pub fn of(run: &TrainRun) -> Coverage {
        let s = run.summary.as_ref();
        let last_eval = run.epochs.iter().rev().find(|e| e.val_images.is_some());
        Coverage {
            steps_per_epoch: s.and_then(|s| s.steps_per_epoch),
            full_steps_per_epoch: s.and_then(|s| s.full_steps_per_epoch),
            val_images: last_eval
                .map(|e| e.val_images.unwrap_or(0) + e.val_bad_images.unwrap_or(0)),
            val_images_total: s.and_then(|s| s.val_images_total),
        }
    }

    /// (trained, whole) steps per epoch when the epochs were cut short.
    pub fn short_epochs(&self) -> Option<(u64, u64)> {
        match (self.steps_per_epoch, self.full_steps_per_epoch) {
            (Some(s), Some(f)) if s < f => Some((s, f)),
            _ => None,
        }
    }

    /// (evaluated, total) validation images when the evaluation took a subset.
    pub fn val_subset(&self) -> Option<(u64, u64)> {
        match (self.val_images, self.val_images_total) {
            (Some(v), Some(t)) if v < t => Some((v, t)),
            _ => None,
        }
    }

    /// Epochs cut short or validation on a subset: not a result.
    pub fn is_partial(&self) -> bool {
        self.short_epochs().is_some() || self.val_subset().is_some()
    }

    /// Whole epochs, known to be (and no subset evaluation).
    pub fn is_full(&self) -> bool {
        !self.is_partial()
            && matches!(
                (self.steps_per_epoch, self.full_steps_per_epoch),
                (Some(s), Some(f)) if s >= f
            )
    }

    /// What a partial run covers, short for a table cell ("20 of 5,005 steps/epoch, val 500 of 50,000") or in
    /// words ("20 of 5,005 steps per epoch, validation on 500 of 50,000 images"); None for a run not known to be
    /// partial.
    pub fn describe(&self, short: bool) -> Option<String> {
        let n = |x: u64| group_thousands(x as i64);
        let mut parts = vec![];
        if let Some((s, f)) = self.short_epochs() {
            let per = if short {
                "steps/epoch"
            } else {
                "steps per epoch"
            };
            parts.push(format!("{} of {} {per}", n(s), n(f)));
        }
        if let Some((v, t)) = self.val_subset() {
            parts.push(match short {
                true => format!("val {} of {}", n(v), n(t)),
                false => format!("validation on {} of {} images", n(v), n(t)),
            });
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }

    /// The warning a partial run's report opens with: what it covers and what that means for its numbers.
    pub fn partial_note(&self) -> Option<String> {
        let what = self.describe(false)?;
        let mut s = format!("Partial run: {what}.");
        if self.short_epochs().is_some() {
            s.push_str(
                " A smoke run, not a result: its epochs are not whole passes over the training set, so its \
                 accuracy, wall clock and img/s say nothing of a full run's.",
            );
        }
        if let Some((v, _)) = self.val_subset() {
            s.push_str(&format!(
                " Acc@1 and Acc@5 are over those {} images, not the whole validation set.",
                group_thousands(v as i64)
            ));
        }
        Some(s)
    }

    /// The "covers" cell: "⚠ …" for a partial run, "full" for one known whole, "—" when unknown.
    fn cell(&self) -> Cell {
        match self.describe(true) {
            Some(d) => Cell {
                display: format!("⚠ {d}"),
                raw: d,
            },
            None if self.is_full() => Cell::text("full"),
            None => Cell::empty(),
        }
    }
}

/// A training run as a row of Kempner's table, and an entry of `rn50 report --json` (under these names, in
/// this order, with `partial` after the coverage's fields; without `precision`). Fields a run has not recorded
/// are None.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrainRow {
    #[serde(rename = "run")]
    pub name: String,
    pub arch: Option<String>,
    pub width: Option<u64>,
    /// Training resolution of the last epoch (metrics.jsonl's `resolution`).
    pub image_size: Option<u64>,
    pub dataset: Option<String>,
    pub hardware: Option<String>,
    #[serde(skip)]
    pub precision: Option<String>,
    pub workers: Option<u64>,
    /// Per rank.
    #[serde(rename = "batch_per_rank")]
    pub batch: Option<u64>,
    pub global_batch: Option<u64>,
    pub lr: Option<f64>,
    pub epochs: u64,
    pub wall_clock_s: f64,
    pub acc1: Option<f64>,
    pub acc5: Option<f64>,
    pub best_acc1: Option<f64>,
    /// With `--ema`: the average's top-1, last epoch and best.
    pub ema_acc1: Option<f64>,
    pub best_ema_acc1: Option<f64>,
    pub images_per_sec: Option<f64>,
    /// What the run covers: steps per epoch trained and of a whole pass, validation images evaluated and of the
    /// split; in the JSON, its fields and `partial` when fewer ([`coverage_and_partial`]).
    #[serde(flatten, serialize_with = "coverage_and_partial")]
    pub coverage: Coverage,
}

/// A [`TrainRow`]'s coverage in `rn50 report --json`: the [`Coverage`]'s fields, then `partial`
/// ([`Coverage::is_partial`]).
fn coverage_and_partial<S: serde::Serializer>(
    coverage: &Coverage,
    s: S,
) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct WithPartial<'a> {
        #[serde(flatten)]
        coverage: &'a Coverage,
        partial: bool,
    }
    WithPartial {
        coverage,
        partial: coverage.is_partial(),
    }
    .serialize(s)
}

/// The row of a run: its summary.json where there is one, metrics.jsonl for the rest.
pub fn train_row(run: &TrainRun) -> TrainRow {
    let mut from_metrics = TrainSummary::default();
    from_metrics.fill_from_metrics(&run.epochs);
    let s = run.summary.as_ref();
    let m = &from_metrics;
    TrainRow {
        name: run.name.clone(),
        arch: s.map(|s| s.arch.clone()),
        width: s.and_then(|s| s.width),
        image_size: run.epochs.last().and_then(|e| e.resolution),
        hardware: s.map(|s| s.device.clone()),
        dataset: s.map(|s| s.dataset.clone()),
        precision: s.map(|s| s.precision.clone()),
        workers: s.map(|s| s.world_size),
        batch: s.map(|s| s.batch_size),
        global_batch: s.map(|s| s.global_batch),
        lr: s.map(|s| s.lr),
        epochs: s.map_or(m.epochs, |s| s.epochs),
        wall_clock_s: s.map_or(m.wall_clock_s, |s| s.wall_clock_s),
        acc1: s.map_or(m.acc1, |s| s.acc1),
        acc5: s.map_or(m.acc5, |s| s.acc5),
        best_acc1: s.map_or(m.best_acc1, |s| s.best_acc1),
        // A summary older than its EMA fields has none: the metrics have them then.
        ema_acc1: s.and_then(|s| s.ema_acc1).or(m.ema_acc1),
        best_ema_acc1: s.and_then(|s| s.best_ema_acc1).or(m.best_ema_acc1),
        images_per_sec: Some(s.map_or(m.images_per_sec, |s| s.images_per_sec)).filter(|x| *x > 0.0),
        coverage: Coverage::of(run),
    }
}

impl TrainRow {
    /// Whether the run has an EMA accuracy to show.
    pub fn has_ema(&self) -> bool {
        [self.ema_acc1, self.best_ema_acc1]
            .iter()
            .any(|a| a.is_some_and(f64::is_finite))
    }
}

/// What must be the same for two runs to be compared for scaling: everything but the worker count (and what follows
/// from it: the global batch and the learning rate scaled to it). A partial run compares only with runs that cover
/// as much (full runs, whether their summary says so or is older, compare with each other).
fn comparable(r: &TrainRow) -> impl PartialEq + '_ {
    (
        (&r.arch, r.width, r.image_size, &r.dataset),
        (&r.hardware, &r.precision, r.batch, r.epochs),
        (
            r.coverage.short_epochs().map(|s| s.0),
            r.coverage.val_subset().map(|v| v.0),
        ),
    )
}

/// Kempner's table: model (arch, width, image size) and dataset, GPUs, batch, lr, wall-clock time, Acc@1, Acc@5,
/// img/s, and with `efficiency` the time- and throughput-based scaling efficiency against the run with the fewest
/// workers among those that differ from it in worker count alone ([`comparable`]).
///
/// What each run covers ([`Coverage`]): a "covers" column after the run's name, shown when some run is partial
/// ("⚠ 20 of 5,005 steps/epoch, val 500 of 50,000"), and in the CSV always, with the numbers apart
/// (steps_per_epoch, full_steps_per_epoch, val_images, val_images_total) for a script to filter on. The EMA's
/// final and best top-1 when some run has them.
pub fn train_table(rows: &[TrainRow], efficiency: bool) -> Table {
    use Align::*;
    let partial = rows.iter().any(|r| r.coverage.is_partial());
    let ema = rows.iter().any(TrainRow::has_ema);
    let mut columns = vec![
        col("run", "run", Left),
        // CSV only unless some run is partial.
        col(if partial { "covers" } else { "" }, "covers", Left),
        col("arch", "arch", Left),
        col("width", "width", Right),
        col("image size", "image_size", Right),
        col("dataset", "dataset", Left),
        col("hardware", "hardware", Left),
        col("GPUs/ranks", "workers", Right),
        col("batch/rank", "batch_per_rank", Right),
        col("global batch", "global_batch", Right),
        col("lr", "lr", Right),
        col("epochs", "epochs", Right),
        col("wall-clock s", "wall_clock_s", Right),
        col("wall-clock h:m:s", "wall_clock_hms", Right),
        col("Acc@1", "acc1", Right),
        col("Acc@5", "acc5", Right),
        col("best Acc@1", "best_acc1", Right),
    ];
    if ema {
        columns.push(col("EMA Acc@1", "ema_acc1", Right));
        columns.push(col("best EMA Acc@1", "best_ema_acc1", Right));
    }
    columns.push(col("img/s", "images_per_sec", Right));
    if efficiency {
        columns.push(col("eff. T1/(N·TN)", "efficiency_time", Right));
        columns.push(col("eff. X_N/(N·X_1)", "efficiency_throughput", Right));
    }
    // CSV only: what the "covers" column says, as numbers.
    for key in [
        "steps_per_epoch",
        "full_steps_per_epoch",
        "val_images",
        "val_images_total",
    ] {
        columns.push(col("", key, Right));
    }
    let acc = |a: f64| format!("{a:.2}");
    let mut table = Table {
        columns,
        rows: vec![],
    };
    for r in rows {
        let mut cells = vec![
            Cell::text(&r.name),
            r.coverage.cell(),
            r.arch.as_deref().map_or_else(Cell::empty, Cell::text),
            r.width.map_or_else(Cell::empty, int_cell),
            r.image_size.map_or_else(Cell::empty, int_cell),
            r.dataset.as_deref().map_or_else(Cell::empty, Cell::text),
            r.hardware.as_deref().map_or_else(Cell::empty, Cell::text),
            r.workers.map_or_else(Cell::empty, int_cell),
            r.batch.map_or_else(Cell::empty, int_cell),
            r.global_batch.map_or_else(Cell::empty, int_cell),
            opt_cell(r.lr, fmt_lr),
            int_cell(r.epochs),
            opt_cell(Some(r.wall_clock_s), |s| format!("{s:.0}")),
            Cell::text(fmt_hms(r.wall_clock_s)),
            opt_cell(r.acc1, acc),
            opt_cell(r.acc5, acc),
            opt_cell(r.best_acc1, acc),
        ];
        if ema {
            cells.push(opt_cell(r.ema_acc1, acc));
            cells.push(opt_cell(r.best_ema_acc1, acc));
        }
        cells.push(opt_cell(r.images_per_sec, fmt_rate));
        if efficiency {
            // Baseline: fewest workers among the comparable runs (first given on a tie).
            let base = rows
                .iter()
                .filter(|b| comparable(b) == comparable(r) && b.workers.is_some())
                .min_by_key(|b| b.workers);
            let (et, ex) = match (base, r.workers) {
                (Some(b), Some(n)) => {
                    let bn = b.workers.unwrap_or(1);
                    (
                        time_efficiency_from(bn, b.wall_clock_s, n, r.wall_clock_s),
                        match (b.images_per_sec, r.images_per_sec) {
                            (Some(xb), Some(xn)) => throughput_efficiency_from(bn, xb, n, xn),
                            _ => None,
                        },
                    )
                }
                _ => (None, None),
            };
            cells.push(opt_cell(et, fmt_pct));
            cells.push(opt_cell(ex, fmt_pct));
        }
        let c = &r.coverage;
        for x in [
            c.steps_per_epoch,
            c.full_steps_per_epoch,
            c.val_images,
            c.val_images_total,
        ] {
            cells.push(x.map_or_else(Cell::empty, int_cell));
        }
        table.rows.push(cells);
    }
    table
}

/// Time to accuracy, one target of one training run: a row of the time-to-accuracy table, and an entry of
/// `rn50 report --json` (under these names).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TimeToTargetRow {
    pub run: String,
    /// The top-1 (percent) timed.
    pub target_acc1: f64,
    /// The epochs trained when the first evaluation reached it, and their wall-clock seconds
    /// ([`time_to_target`]); None: not reached.
    pub epochs: Option<u64>,
    pub seconds: Option<f64>,
    /// The best top-1 of the run (the trained weights' or their EMA's): how near a run that did not reach it came.
    pub best_acc1: Option<f64>,
}

/// The time to each target of each run, runs in the order given, each run's targets ascending.
pub fn time_to_target_rows(runs: &[TrainRun], targets: &[f64]) -> Vec<TimeToTargetRow> {
    let mut rows = vec![];
    for run in runs {
        let best = run
            .epochs
            .iter()
            .filter_map(|e| e.best_of_acc1())
            .reduce(f64::max);
        for &t in targets {
            let reached = time_to_target(&run.epochs, t);
            rows.push(TimeToTargetRow {
                run: run.name.clone(),
                target_acc1: t,
                epochs: reached.map(|(n, _)| n),
                seconds: reached.map(|(_, s)| s),
                best_acc1: best,
            });
        }
    }
    rows
}

/// MLPerf's measure as a table: run, target top-1, the epochs and wall-clock to it ("not reached" otherwise), and
/// the run's best top-1.
pub fn time_to_target_table(rows: &[TimeToTargetRow]) -> Table {
    use Align::*;
    let acc = |a: f64| format!("{a:.2}");
    Table {
        columns: vec![
            col("run", "run", Left),
            col("target Acc@1", "target_acc1", Right),
            col("epochs to it", "epochs", Right),
            col("time to it s", "seconds", Right),
            col("time to it h:m:s", "hms", Right),
            col("best Acc@1", "best_acc1", Right),
        ],
        rows: rows
            .iter()
            .map(|r| {
                let not_reached = || Cell {
                    display: "not reached".into(),
                    raw: String::new(),
                };
                vec![
                    Cell::text(&r.run),
                    Cell::num(fmt_decimals(r.target_acc1, 2), Some(r.target_acc1)),
                    r.epochs.map_or_else(not_reached, int_cell),
                    r.seconds
                        .map_or_else(not_reached, |s| Cell::num(format!("{s:.0}"), Some(s))),
                    r.seconds
                        .map_or_else(not_reached, |s| Cell::text(fmt_hms(s))),
                    opt_cell(r.best_acc1, acc),
                ]
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(fmt_rate(1252.4), "1,252");
        assert_eq!(fmt_rate(1_234_567.8), "1,234,568");
        assert_eq!(fmt_rate(19.88), "19.9");
        assert_eq!(fmt_rate(0.5), "0.500");
        assert_eq!(fmt_rate(f64::NAN), "—");
        assert_eq!(fmt_hms(36.0 * 3600.0), "36:00:00");
        assert_eq!(fmt_hms(1.13 * 3600.0), "1:07:48");
        assert_eq!(fmt_hms(59.6), "0:01:00");
        assert_eq!(fmt_pct(0.768), "76.8%");
        assert_eq!(fmt_lr(0.1), "0.1");
        assert_eq!(fmt_lr(0.0125), "0.0125");
        assert_eq!(fmt_lr(25.6), "25.6");
        assert_eq!(fmt_lr(0.00001), "1.00e-5");
        assert_eq!(
            fmt_lr(0.1 * 768.0 / 256.0),
            "0.3",
            "not 0.30000000000000004"
        );
        assert_eq!(fmt_lr(0.1 * 6.0 / 256.0), "0.002344");
        assert_eq!(fmt_lr(0.00025), "0.00025");
        assert_eq!(fmt_lr(0.0), "0");
        assert_eq!(fmt_decimals(2.0 / 3.0, 3), "0.667");
        assert_eq!(fmt_decimals(80.0, 3), "80");
        assert_eq!(fmt_decimals(1.5, 3), "1.5");
        assert_eq!(fmt_decimals(100.0, 0), "100");
        assert_eq!(fmt_decimals(-0.0001, 3), "0");
    }

    fn bench(workers: u64, images_per_sec: f64, channels_last: bool) -> BenchResult {
        serde_json::from_value(serde_json::json!({
            "images_per_sec": images_per_sec,
            "config": {
                "arch": "resnet50", "batch_size": 32, "image_size": 224, "precision": "bf16",
                "channels_last": channels_last, "device": "cuda:0", "data": "device", "world_size": workers,
            },
        }))
        .unwrap()
    }

    #[test]
    fn throughput_is_compared_only_across_worker_counts() {
        let rows = [
            bench_row("1", &bench(1, 100.0, true)),
            bench_row("2", &bench(2, 190.0, true)),
            // Another setting at 2 workers: its own baseline, not 75% of the channels_last row's 1 worker.
            bench_row("2nchw", &bench(2, 150.0, false)),
        ];
        let c = compare(&rows);
        let by = |s: &str| c.iter().find(|r| r.source == s).unwrap();
        assert_eq!(by("2").baseline_workers, 1);
        assert!((by("2").efficiency_throughput.unwrap() - 0.95).abs() < 1e-12);
        assert_eq!(by("2nchw").baseline_workers, 2);
        assert_eq!(by("2nchw").efficiency_throughput, Some(1.0));
    }

    fn run(name: &str, workers: u64, image_size: u64, wall_clock_s: f64) -> TrainRow {
        TrainRow {
            name: name.into(),
            arch: Some("resnet50".into()),
            width: Some(64),
            image_size: Some(image_size),
            hardware: Some("NVIDIA A100-SXM4-40GB".into()),
            dataset: Some("imagenet".into()),
            precision: Some("bf16".into()),
            workers: Some(workers),
            batch: Some(256),
            global_batch: Some(256 * workers),
            lr: Some(0.1 * workers as f64),
            epochs: 5,
            wall_clock_s,
            acc1: None,
            acc5: None,
            best_acc1: None,
            ema_acc1: None,
            best_ema_acc1: None,
            images_per_sec: None,
            coverage: Coverage::default(),
        }
    }

    #[test]
    fn training_runs_show_their_model_and_data_and_compare_across_worker_counts_only() {
        let rows = [
            run("one", 1, 224, 1000.0),
            run("four", 4, 224, 250.0),
            run("four-small", 4, 128, 100.0),
        ];
        let t = train_table(&rows, true);
        let csv = t.to_csv();
        let mut lines = csv.lines();
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("run,covers,arch,width,image_size,dataset,hardware,"),
            "{csv}"
        );
        assert!(
            lines
                .next()
                .unwrap()
                .starts_with("one,,resnet50,64,224,imagenet,"),
            "{csv}"
        );
        let eff = t
            .columns
            .iter()
            .position(|c| c.key == "efficiency_time")
            .unwrap();
        assert_eq!(
            t.rows[1][eff].raw, "1",
            "4 workers, 224 px: 1000 / (4 · 250)"
        );
        // 128 px at 4 workers: its own baseline, not 250% of the 224 px run on 1 worker.
        assert_eq!(t.rows[2][eff].raw, "1");
    }

    fn coverage(steps: (u64, u64), val: (u64, u64)) -> Coverage {
        Coverage {
            steps_per_epoch: Some(steps.0),
            full_steps_per_epoch: Some(steps.1),
            val_images: Some(val.0),
            val_images_total: Some(val.1),
        }
    }

    #[test]
    fn coverage_says_what_a_run_left_out() {
        let smoke = coverage((20, 5005), (500, 50_000));
        assert!(smoke.is_partial() && !smoke.is_full());
        assert_eq!(
            smoke.describe(true).unwrap(),
            "20 of 5,005 steps/epoch, val 500 of 50,000"
        );
        assert_eq!(
            smoke.cell().display,
            "⚠ 20 of 5,005 steps/epoch, val 500 of 50,000"
        );
        let full = coverage((5005, 5005), (50_000, 50_000));
        assert!(full.is_full() && full.describe(false).is_none());
        assert_eq!(full.cell().raw, "full");
        // Only the evaluation a subset: no "smoke run", the accuracy's images said.
        let note = coverage((5005, 5005), (500, 50_000))
            .partial_note()
            .unwrap();
        assert!(
            note.starts_with("Partial run: validation on 500 of 50,000 images."),
            "{note}"
        );
        assert!(!note.contains("smoke"), "{note}");
        // --dummy (no whole pass) and older summaries: nothing claimed either way.
        let dummy = Coverage {
            steps_per_epoch: Some(100),
            ..Default::default()
        };
        assert!(!dummy.is_partial() && !dummy.is_full());
        assert_eq!(dummy.cell().raw, "");
    }

    /// The images an evaluation took are those evaluated and those unreadable: a few unreadable images of the
    /// whole set do not make it a subset.
    #[test]
    fn unreadable_validation_images_are_not_a_subset() {
        let run = TrainRun {
            dir: "r".into(),
            name: "r".into(),
            epochs: vec![crate::schema::EpochMetrics {
                val_images: Some(49_997),
                val_bad_images: Some(3),
                ..Default::default()
            }],
            summary: Some(TrainSummary {
                steps_per_epoch: Some(5005),
                full_steps_per_epoch: Some(5005),
                val_images_total: Some(50_000),
                ..Default::default()
            }),
        };
        let c = Coverage::of(&run);
        assert_eq!(c.val_images, Some(50_000));
        assert!(c.is_full(), "{c:?}");
    }

    /// A smoke run is not a full run's baseline, nor a full run its: each compares with runs covering as much.
    #[test]
    fn partial_runs_compare_only_with_runs_that_cover_as_much() {
        let mut smoke = run("smoke", 1, 224, 10.0);
        smoke.coverage = coverage((20, 5005), (500, 50_000));
        let rows = [smoke, run("four", 4, 224, 250.0)];
        let t = train_table(&rows, true);
        let eff = t
            .columns
            .iter()
            .position(|c| c.key == "efficiency_time")
            .unwrap();
        assert_eq!(
            t.rows[1][eff].raw, "1",
            "its own baseline, not 1 % of the smoke run's"
        );
        let covers = t.columns.iter().position(|c| c.key == "covers").unwrap();
        assert_eq!(t.columns[covers].title, "covers");
        // Without a partial run the column is the CSV's alone.
        let t = train_table(&rows[1..], true);
        assert_eq!(t.columns[covers].title, "");
        assert!(!t.to_text().contains("covers"));
        assert!(t.to_csv().starts_with("run,covers,"));
    }

    #[test]
    fn csv_quotes() {
        let t = Table {
            columns: vec![col("a", "a", Align::Left), col("b", "b", Align::Left)],
            rows: vec![vec![Cell::text("x,y"), Cell::text("say \"hi\"")]],
        };
        assert_eq!(t.to_csv(), "a,b\n\"x,y\",\"say \"\"hi\"\"\"\n");
        assert_eq!(
            t.to_markdown(),
            "| a | b |\n| --- | --- |\n| x,y | say \"hi\" |\n"
        );
        assert_eq!(t.to_text(), "a    b\nx,y  say \"hi\"\n");
        let b = t.select(&["b", "nope"]);
        assert_eq!(b.to_csv(), "b\n\"say \"\"hi\"\"\"\n");
    }
}
