//! PNG line charts through plotters' bitmap backend.
//!
//! Text is drawn with DejaVu Sans embedded in the binary (plotters' `ab_glyph` feature), so a chart renders the
//! same on a node without fontconfig or any system font.

use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{register_font, FontStyle};

use crate::ReportError;

static FONT: &[u8] = include_bytes!("../assets/DejaVuSans.ttf");
const FAMILY: &str = "sans-serif";

fn register() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // A font embedded at build time: parse failure would be a build defect, not bad input.
        if register_font(FAMILY, FontStyle::Normal, FONT).is_err() {
            tracing::warn!("the embedded font did not parse; plots will have no text");
        }
    });
}

/// Colour-blind-safe qualitative palette (Okabe–Ito), then plotters' 99-colour palette.
fn colour(i: usize) -> RGBColor {
    const OKABE_ITO: [(u8, u8, u8); 7] = [
        (0, 114, 178),
        (213, 94, 0),
        (0, 158, 115),
        (204, 121, 167),
        (230, 159, 0),
        (86, 180, 233),
        (0, 0, 0),
    ];
    match OKABE_ITO.get(i) {
        Some(&(r, g, b)) => RGBColor(r, g, b),
        None => {
            let c = Palette99::pick(i).to_rgba();
            RGBColor(c.0, c.1, c.2)
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LineStyle {
    /// Line through the points with a marker on each (unless `markers` is off: per-step curves).
    Solid,
    /// Dashed, no markers: reference lines (ideal scaling), top-5.
    Dashed,
    /// Dotted, with hollow markers: a second measurement of the same thing (the EMA's accuracy).
    Dotted,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text; empty: not in the legend.
    pub name: String,
    pub points: Vec<(f64, f64)>,
    pub style: LineStyle,
    /// A marker on each point (solid and dotted lines); off for dense per-step curves.
    pub markers: bool,
    /// Palette index; None: the series' position. Lets an ideal line share its measurement's colour.
    pub colour: Option<usize>,
}

impl Series {
    pub fn new(name: impl Into<String>, points: Vec<(f64, f64)>) -> Series {
        Series {
            name: name.into(),
            points,
            style: LineStyle::Solid,
            markers: true,
            colour: None,
        }
    }
    pub fn dashed(mut self) -> Series {
        self.style = LineStyle::Dashed;
        self.markers = false;
        self
    }
    pub fn dotted(mut self) -> Series {
        self.style = LineStyle::Dotted;
        self
    }
    /// A plain line: no marker on each point (thousands of steps).
    pub fn without_markers(mut self) -> Series {
        self.markers = false;
        self
    }
    pub fn colour(mut self, index: usize) -> Series {
        self.colour = Some(index);
        self
    }
}

/// A vertical line across the plot at `x` (data units): an event on the x axis, such as where a resumed attempt
/// started. Drawn grey and dashed; `name` goes in the legend (empty: not in it).
#[derive(Clone, Debug, PartialEq)]
pub struct Marker {
    pub x: f64,
    pub name: String,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum XAxis {
    Linear,
    /// Powers of two evenly spaced (worker counts 1, 2, 4 … 64), labelled with the counts themselves.
    Log2,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum YAxis {
    Linear,
    /// Decades, ticks at 1, 2, 5 × 10^k: series of very different magnitudes on one chart.
    Log10,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Chart {
    pub title: String,
    /// A line under the title, in red: what the reader must know before reading the curves (a partial run).
    pub subtitle: Option<String>,
    pub x_label: String,
    pub y_label: String,
    pub series: Vec<Series>,
    pub x_axis: XAxis,
    pub y_axis: YAxis,
    /// Start the y axis at zero (throughput, efficiency) rather than at the data's minimum (loss).
    pub y_from_zero: bool,
    /// The y axis ends here at most (accuracy: 100%), whatever room the margins and the legend would take.
    pub y_max: Option<f64>,
    /// Vertical lines across the plot.
    pub markers: Vec<Marker>,
    pub width: u32,
    pub height: u32,
}

impl Chart {
    pub fn new(
        title: impl Into<String>,
        x_label: impl Into<String>,
        y_label: impl Into<String>,
    ) -> Chart {
        Chart {
            title: title.into(),
            subtitle: None,
            x_label: x_label.into(),
            y_label: y_label.into(),
            series: vec![],
            x_axis: XAxis::Linear,
            y_axis: YAxis::Linear,
            y_from_zero: false,
            y_max: None,
            markers: vec![],
            width: 1000,
            height: 640,
        }
    }
}

/// Tick label for a value on an axis spanning `span`: enough decimals to tell neighbours apart.
fn tick_label(v: f64, span: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let a = span.abs();
    if a >= 1000.0 || v.abs() >= 10_000.0 {
        crate::table::fmt_rate(v)
    } else if a >= 20.0 {
        format!("{v:.0}")
    } else if a >= 2.0 {
        format!("{v:.1}")
    } else if a >= 0.02 || v.abs() >= 0.01 {
        format!("{v:.3}")
    } else {
        format!("{v:.1e}")
    }
}

/// The largest magnitude plotted: an axis spanning it, with its margins, stays finite.
const MAX_PLOTTED: f64 = 1e300;

fn range(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values.fold(None, |acc, v| match acc {
        None => Some((v, v)),
        Some((lo, hi)) => Some((lo.min(v), hi.max(v))),
    })
}

/// Ticks of a log10 axis spanning [lo, hi] (in log10 units): 1, 2, 5 × 10^k, or only 10^k when that is many.
fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let mut out = vec![];
    for k in (lo.floor() as i32)..=(hi.ceil() as i32) {
        for m in [1.0, 2.0, 5.0] {
            let v = m * 10f64.powi(k);
            if (lo..=hi).contains(&v.log10()) {
                out.push(v);
            }
        }
    }
    if out.len() > 12 {
        out.retain(|v| (v.log10() - v.log10().round()).abs() < 1e-9);
    }
    out
}

/// Length in pixels of a legend entry's line, and the space between it and the entry's text.
const LEGEND_LINE: i32 = 30;
const LEGEND_GAP: i32 = 12;
/// The legend's text size, the height of one of its rows, and the space between its columns.
const LEGEND_FONT: u32 = 20;
const LEGEND_ROW: i32 = 28;
const LEGEND_COLUMN_GAP: i32 = 30;
/// Room left of the plot for the y axis' labels and description; the legend starts there too.
const Y_LABEL_AREA: i32 = 100;

/// What a legend entry shows: a series' line, or a vertical marker's.
#[derive(Clone, Copy)]
enum Sample {
    Line {
        style: LineStyle,
        markers: bool,
        colour: RGBColor,
    },
    Marker,
}

const MARKER_COLOUR: RGBColor = RGBColor(110, 110, 110);
const SUBTITLE_COLOUR: RGBColor = RGBColor(180, 20, 20);

/// Legend entries: every series with a name, then every marker with one (the first of each name).
fn legend_entries(chart: &Chart) -> Vec<(String, Sample)> {
    let mut out: Vec<(String, Sample)> = chart
        .series
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.name.is_empty())
        .map(|(i, s)| {
            let sample = Sample::Line {
                style: s.style,
                markers: s.markers,
                colour: colour(s.colour.unwrap_or(i)),
            };
            (s.name.clone(), sample)
        })
        .collect();
    for m in &chart.markers {
        if !m.name.is_empty() && !out.iter().any(|(n, _)| *n == m.name) {
            out.push((m.name.clone(), Sample::Marker));
        }
    }
    out
}

/// Where the legend's entries go: beneath the plot, outside the curves, in columns of equal width (as many as
/// fit beside each other from the plot's left edge), in rows below the x axis' description.
#[derive(Clone, Copy, Debug, PartialEq)]
struct LegendLayout {
    column: i32,
    columns: usize,
    /// The legend's height, which the image has beyond the chart's `height` (0: no legend).
    height: i32,
}

/// Margin around everything.
const MARGIN: i32 = 20;

fn legend_layout(chart: &Chart) -> LegendLayout {
    register();
    let entries = legend_entries(chart);
    if entries.is_empty() {
        return LegendLayout {
            column: 0,
            columns: 1,
            height: 0,
        };
    }
    // Text is measured the same on any bitmap: a one-pixel one will do.
    let mut buf = [0u8; 3];
    let probe = BitMapBackend::with_buffer(&mut buf, (1, 1)).into_drawing_area();
    let font = TextStyle::from((FAMILY, LEGEND_FONT).into_font());
    let widest = entries
        .iter()
        .map(|(name, _)| {
            probe
                .estimate_text_size(name, &font)
                .map_or(0, |(w, _)| w as i32)
        })
        .max()
        .unwrap_or(0);
    let column = widest + LEGEND_LINE + LEGEND_GAP + LEGEND_COLUMN_GAP;
    let width = chart.width as i32 - 2 * MARGIN - Y_LABEL_AREA;
    let columns = (width / column.max(1)).max(1) as usize;
    let rows = entries.len().div_ceil(columns) as i32;
    LegendLayout {
        column,
        columns,
        height: rows * LEGEND_ROW + 16,
    }
}

/// The image's size: the chart's, and the legend's rows beneath it (so that however many entries, the plot keeps
/// its size).
pub fn image_size(chart: &Chart) -> (u32, u32) {
    let legend = legend_layout(chart);
    (chart.width, chart.height + legend.height as u32)
}

/// The y axis' ends for values `ys` (in axis units): the data's range (from zero with `y_from_zero`), a margin,
/// and no higher than `y_max`. The legend is beneath the plot, so no room is kept for it among the curves.
fn y_range(chart: &Chart, ys: impl Iterator<Item = f64>) -> (f64, f64) {
    let log10 = chart.y_axis == YAxis::Log10;
    let (mut y0, mut y1) = range(ys).unwrap_or((0.0, 1.0));
    if chart.y_from_zero && !log10 {
        y0 = y0.min(0.0);
    }
    if y1 - y0 < 1e-12 {
        let d = if y0.abs() > 0.0 { y0.abs() * 0.1 } else { 1.0 };
        y0 -= d;
        y1 += d;
    }
    // A margin around the data (none below a zero baseline).
    let pad = (y1 - y0) * 0.06;
    y1 += pad;
    if !(chart.y_from_zero && y0 == 0.0) {
        y0 -= pad;
    }
    if let Some(max) = chart.y_max.filter(|m| *m > y0) {
        y1 = y1.min(if log10 { max.log10() } else { max });
    }
    (y0, y1)
}

/// Renders `chart` to a PNG at `path`.
pub fn render(chart: &Chart, path: &Path) -> Result<(), ReportError> {
    let root = BitMapBackend::new(path, image_size(chart)).into_drawing_area();
    draw(chart, root, path)
}

/// Draws `chart` on `root`, a bitmap of its [`image_size`] (`path`: where it goes, for the messages).
fn draw(
    chart: &Chart,
    root: DrawingArea<BitMapBackend, Shift>,
    path: &Path,
) -> Result<(), ReportError> {
    register();
    let err = |e: &dyn std::fmt::Display| ReportError::Plot {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let log2 = chart.x_axis == XAxis::Log2;
    let log10 = chart.y_axis == YAxis::Log10;
    let tx = |x: f64| if log2 { x.log2() } else { x };
    let ty = |y: f64| if log10 { y.log10() } else { y };
    // Only points of a size an axis can span can be drawn: finite, within ±MAX_PLOTTED (an axis over ±1e308
    // overflows to infinity and the tick search never ends), and positive on a logarithmic axis. The others are
    // left out, and said so.
    let plain = |v: f64| v.is_finite() && v.abs() <= MAX_PLOTTED;
    let drawable =
        |&(x, y): &(f64, f64)| plain(x) && plain(y) && (!log2 || x > 0.0) && (!log10 || y > 0.0);
    // (palette index, series, drawable points in axis units)
    type Drawable<'a> = (usize, &'a Series, Vec<(f64, f64)>);
    let series: Vec<Drawable> = chart
        .series
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .filter(|p| drawable(p))
                .map(|&(x, y)| (tx(x), ty(y)))
                .collect();
            let left_out = s.points.len() - pts.len();
            if left_out > 0 {
                tracing::warn!(
                    "{}: {left_out} point(s) of {} left out of the plot (not finite, beyond ±{MAX_PLOTTED:e}, or not \
                     positive on a logarithmic axis)",
                    path.display(),
                    if s.name.is_empty() { &chart.title } else { &s.name }
                );
            }
            (s.colour.unwrap_or(i), s, pts)
        })
        .collect();
    let markers: Vec<f64> = chart
        .markers
        .iter()
        .map(|m| m.x)
        .filter(|&x| plain(x) && (!log2 || x > 0.0))
        .map(tx)
        .collect();
    let all = || series.iter().flat_map(|(_, _, p)| p.iter());
    let (mut x0, mut x1) =
        range(all().map(|p| p.0).chain(markers.iter().copied())).unwrap_or((0.0, 1.0));
    let (y0, y1) = y_range(chart, all().map(|p| p.1));
    if x1 - x0 < 1e-12 {
        x0 -= 1.0;
        x1 += 1.0;
    }
    if log2 {
        x0 -= 0.25;
        x1 += 0.25;
    } else {
        let p = (x1 - x0) * 0.03;
        x0 -= p;
        x1 += p;
    }

    root.fill(&WHITE).map_err(|e| err(&e))?;
    let inner = root.margin(MARGIN, MARGIN, MARGIN, MARGIN);
    let (_, inner_h) = inner.dim_in_pixel();
    // The legend beneath the plot, in rows the image has beyond the chart's height.
    let entries = legend_entries(chart);
    let legend = legend_layout(chart);
    let (upper, legend_area) = inner.split_vertically(inner_h as i32 - legend.height);
    let mut area = upper
        .titled(&chart.title, (FAMILY, 30))
        .map_err(|e| err(&e))?;
    if let Some(sub) = &chart.subtitle {
        area = area
            .titled(sub, (FAMILY, 22).into_font().color(&SUBTITLE_COLOUR))
            .map_err(|e| err(&e))?;
    }
    let mut ctx = ChartBuilder::on(&area)
        .x_label_area_size(70)
        .y_label_area_size(Y_LABEL_AREA)
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| err(&e))?;

    let x_span = x1 - x0;
    let y_span = y1 - y0;
    // Whole-number data (epochs) gets whole-number ticks only.
    let x_whole = !log2 && all().all(|p| p.0.fract() == 0.0);
    let x_fmt = move |v: &f64| {
        if x_whole {
            if v.fract().abs() < 1e-9 {
                format!("{}", v.round())
            } else {
                String::new()
            }
        } else if log2 {
            let n = 2f64.powf(*v);
            if (n - n.round()).abs() < 1e-6 {
                format!("{}", n.round())
            } else {
                String::new()
            }
        } else {
            tick_label(*v, x_span)
        }
    };
    let y_fmt = move |v: &f64| tick_label(*v, y_span);
    let x_ticks = if log2 {
        (x1 - x0).ceil() as usize + 1
    } else if x_whole {
        ((x1 - x0).ceil() as usize + 1).min(12)
    } else {
        10
    };
    let grid = RGBColor(215, 215, 215);
    ctx.configure_mesh()
        .x_desc(&chart.x_label)
        .y_desc(&chart.y_label)
        .axis_desc_style((FAMILY, 24))
        .label_style((FAMILY, 20))
        .x_labels(x_ticks)
        .y_labels(if log10 { 0 } else { 8 })
        .x_label_formatter(&x_fmt)
        .y_label_formatter(&y_fmt)
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(grid)
        .draw()
        .map_err(|e| err(&e))?;
    if log10 {
        // plotters' own ticks would fall on 10^0.5 and the like: draw decade ticks by hand.
        let label =
            TextStyle::from((FAMILY, 20).into_font()).pos(Pos::new(HPos::Right, VPos::Center));
        for v in log_ticks(y0, y1) {
            let ly = v.log10();
            ctx.draw_series(std::iter::once(PathElement::new(
                vec![(x0, ly), (x1, ly)],
                grid,
            )))
            .map_err(|e| err(&e))?;
            let (px, py) = ctx.backend_coord(&(x0, ly));
            root.draw(&Text::new(tick_label(v, v), (px - 8, py), &label))
                .map_err(|e| err(&e))?;
        }
    }
    // Markers under the curves.
    for &x in &markers {
        ctx.draw_series(DashedLineSeries::new(
            [(x, y0), (x, y1)],
            8,
            6,
            MARKER_COLOUR.stroke_width(2),
        ))
        .map_err(|e| err(&e))?;
    }

    for (ci, s, pts) in &series {
        let c = colour(*ci);
        match s.style {
            LineStyle::Solid => ctx
                .draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(3)))
                .map(|_| ()),
            LineStyle::Dashed => ctx
                .draw_series(DashedLineSeries::new(
                    pts.iter().copied(),
                    10,
                    8,
                    c.stroke_width(2),
                ))
                .map(|_| ()),
            LineStyle::Dotted => ctx
                .draw_series(DottedLineSeries::new(pts.iter().copied(), 0, 9, move |p| {
                    Circle::new(p, 2, c.filled())
                }))
                .map(|_| ()),
        }
        .map_err(|e| err(&e))?;
        if s.markers {
            match s.style {
                LineStyle::Dotted => ctx
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.stroke_width(2))))
                    .map(|_| ()),
                _ => ctx
                    .draw_series(pts.iter().map(|&p| Circle::new(p, 5, c.filled())))
                    .map(|_| ()),
            }
            .map_err(|e| err(&e))?;
        }
    }
    if !entries.is_empty() {
        let font = TextStyle::from((FAMILY, LEGEND_FONT).into_font());
        draw_legend(&legend_area, &entries, &font, legend.column, legend.columns)
            .map_err(|e| err(&e))?;
    }
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// The legend's entries in `area` (beneath the plot), row by row, `columns` of `column` pixels from the plot's left
/// edge: each a sample of its line and its text.
fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, Sample)],
    font: &TextStyle,
    column: i32,
    columns: usize,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let text = font.pos(Pos::new(HPos::Left, VPos::Center));
    for (k, (name, sample)) in entries.iter().enumerate() {
        let x = Y_LABEL_AREA + (k % columns) as i32 * column;
        let y = 8 + (k / columns) as i32 * LEGEND_ROW + LEGEND_ROW / 2;
        let (l, r) = (x, x + LEGEND_LINE);
        match *sample {
            Sample::Line {
                style,
                markers,
                colour: c,
            } => match style {
                LineStyle::Solid => {
                    area.draw(&PathElement::new(vec![(l, y), (r, y)], c.stroke_width(3)))?;
                }
                LineStyle::Dashed => {
                    let dash = LEGEND_LINE * 3 / 8;
                    area.draw(&PathElement::new(
                        vec![(l, y), (l + dash, y)],
                        c.stroke_width(2),
                    ))?;
                    area.draw(&PathElement::new(
                        vec![(r - dash, y), (r, y)],
                        c.stroke_width(2),
                    ))?;
                }
                LineStyle::Dotted => {
                    for dx in (0..=LEGEND_LINE).step_by(9) {
                        area.draw(&Circle::new((l + dx, y), 2, c.filled()))?;
                    }
                    if markers {
                        area.draw(&Circle::new((l + LEGEND_LINE / 2, y), 5, c.stroke_width(2)))?;
                    }
                }
            },
            Sample::Marker => {
                let mid = l + LEGEND_LINE / 2;
                area.draw(&PathElement::new(
                    vec![(mid, y - 10), (mid, y - 3)],
                    MARKER_COLOUR.stroke_width(2),
                ))?;
                area.draw(&PathElement::new(
                    vec![(mid, y + 3), (mid, y + 10)],
                    MARKER_COLOUR.stroke_width(2),
                ))?;
            }
        }
        area.draw(&Text::new(name.as_str(), (r + LEGEND_GAP, y), &text))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decade_ticks() {
        assert_eq!(log_ticks(0.9, 2.1), [10.0, 20.0, 50.0, 100.0]);
        assert_eq!(log_ticks(0.0, 20.0).len(), 21); // decades only when 1-2-5 would be too many
    }

    #[test]
    fn tick_labels() {
        assert_eq!(tick_label(0.0, 5.0), "0");
        assert_eq!(tick_label(1500.0, 3000.0), "1,500");
        assert_eq!(tick_label(45.0, 80.0), "45");
        assert_eq!(tick_label(2.5, 4.0), "2.5");
        assert_eq!(tick_label(0.05, 0.1), "0.050");
        assert_eq!(tick_label(0.0001, 0.0004), "1.0e-4");
    }

    #[test]
    fn the_y_axis_stops_at_its_maximum() {
        let mut c = Chart::new("accuracy", "epoch", "%");
        c.series
            .push(Series::new("Acc@1", vec![(0.0, 20.0), (1.0, 99.5)]));
        c.series
            .push(Series::new("Acc@5", vec![(0.0, 60.0), (1.0, 99.9)]));
        let ys = || c.series.iter().flat_map(|s| s.points.iter().map(|p| p.1));
        let (_, free) = y_range(&c, ys());
        assert!(
            free > 100.0,
            "margins and legend room go above the data: {free}"
        );
        let mut capped = c.clone();
        capped.y_max = Some(100.0);
        let (y0, y1) = y_range(&capped, ys());
        assert_eq!(y1, 100.0);
        assert!(y0 < 20.0);
    }

    /// The legend's text starts a few pixels after its line ends (plotters would start it where the line ends).
    #[test]
    fn legend_text_is_clear_of_its_line() {
        let mut c = Chart::new("t", "x", "y");
        c.series
            .push(Series::new("Acc@1", vec![(0.0, 0.0), (1.0, 1.0)]));
        let (w, h) = image_size(&c);
        let mut buf = vec![0u8; w as usize * h as usize * 3];
        let root = BitMapBackend::with_buffer(&mut buf, (w, h)).into_drawing_area();
        let (w, h) = (w as usize, h as usize);
        draw(&c, root, Path::new("memory")).unwrap();
        let px = |x: usize, y: usize| &buf[(y * w + x) * 3..(y * w + x) * 3 + 3];
        let line = colour(0);
        let is_line = |x, y| px(x, y) == [line.0, line.1, line.2];
        // The legend's line: the only horizontal run of the series' colour longer than a marker (the plotted line
        // is diagonal).
        let (y, end) = (0..h)
            .find_map(|y| {
                let mut run = 0;
                (0..w).find_map(|x| {
                    run = if is_line(x, y) { run + 1 } else { 0 };
                    (run >= 25 && (x + 1 == w || !is_line(x + 1, y))).then_some((y, x))
                })
            })
            .expect("no legend line found");
        // Beneath the plot, outside its curves: below the chart's own height (the image is taller by the legend).
        assert!(y + 20 > c.height as usize, "legend line at y {y} of {h}");
        for x in end + 1..=end + 6 {
            for yy in y - 10..=y + 10 {
                assert!(
                    px(x, yy).iter().all(|&v| v > 160),
                    "text at ({x}, {yy}), {} px after the legend's line",
                    x - end
                );
            }
        }
    }

    #[test]
    fn renders_a_png_even_from_awkward_data() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Chart::new("t", "x", "y");
        c.series
            .push(Series::new("a", vec![(1.0, f64::NAN), (2.0, 3.0)]));
        c.series.push(Series::new("b", vec![]));
        let p = dir.path().join("a.png");
        render(&c, &p).unwrap();
        let bytes = std::fs::read(&p).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        // Nothing at all to plot still gives an (empty) chart.
        let mut c = Chart::new("empty", "x", "y");
        c.x_axis = XAxis::Log2;
        render(&c, &dir.path().join("b.png")).unwrap();
    }

    /// Values near f64's limits (a diverged loss of 1.7e308, ±1e308) used to make the axis infinite and the tick
    /// search spin forever; they are left out and the rest is drawn (issue 25). The test hangs without the fix.
    #[test]
    fn huge_values_are_left_out_not_an_endless_axis() {
        let dir = tempfile::tempdir().unwrap();
        for extreme in [
            vec![(0.0, 2.0), (1.0, 1.7e308), (2.0, -1e308)],
            vec![(0.0, 1e308), (1.0, -1e308)],
            vec![(0.0, f64::MAX), (1e308, 1.0)],
        ] {
            let mut c = Chart::new("loss", "epoch", "loss");
            c.y_from_zero = true;
            c.series.push(Series::new("train", extreme));
            let p = dir.path().join("huge.png");
            render(&c, &p).unwrap();
            assert_eq!(&std::fs::read(&p).unwrap()[..8], b"\x89PNG\r\n\x1a\n");
        }
    }
}
