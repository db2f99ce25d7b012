//! Plots of a comparison, as SVG and PNG: latency CDF per policy, traffic share per second per
//! backend per policy. Text needs a TrueType font at run time (DejaVu Sans on Debian).

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{anyhow, bail, Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use harness::summary::SecondShares;

/// Set to a .ttf file to choose the plots' font.
pub const FONT_ENV: &str = "EWMA_BENCH_FONT";
const FONT_CANDIDATES: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
];
const FONT: &str = "sans-serif";

/// Finds and registers a font for the plots' text, once; a clear error when there is none.
pub fn ensure_font() -> Result<()> {
    static DONE: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    let r = DONE.get_or_init(|| {
        let path = match std::env::var_os(FONT_ENV) {
            Some(p) => PathBuf::from(p),
            None => FONT_CANDIDATES.iter().map(PathBuf::from).find(|p| p.is_file()).ok_or_else(|| {
                format!(
                    "no TrueType font for the plots' text: install one (`apt-get install fonts-dejavu-core`), \
                     set {FONT_ENV}=/path/to/font.ttf, or pass --no-plots"
                )
            })?,
        };
        let bytes = std::fs::read(&path).map_err(|e| format!("reading font {}: {e}", path.display()))?;
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font(FONT, FontStyle::Normal, bytes)
            .map_err(|_| format!("{} is not a usable TrueType font (set {FONT_ENV})", path.display()))?;
        Ok(path)
    });
    match r {
        Ok(_) => Ok(()),
        Err(e) => bail!("{e}"),
    }
}

/// One line of the CDF plot: a policy's sorted latencies in ms.
pub struct CdfLine {
    pub label: String,
    pub sorted_ms: Vec<f64>,
}

/// One panel of the share plot: a policy's per-second shares.
pub struct SharePanel {
    pub label: String,
    pub seconds: Vec<SecondShares>,
}

fn palette(i: usize) -> RGBColor {
    const C: [RGBColor; 8] = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    C[i % C.len()]
}

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("plotting: {e:?}")
}

/// Labels only 1, 2 and 5 times a power of ten, so a log axis stays readable.
fn log_label(v: f64) -> String {
    if v.is_nan() || v <= 0.0 {
        return String::new();
    }
    let mag = 10f64.powf(v.log10().floor());
    let lead = v / mag;
    if [1.0, 2.0, 5.0].iter().any(|d| (lead - d).abs() < 0.02) {
        if v >= 1.0 {
            format!("{v:.0}")
        } else {
            format!("{v}")
        }
    } else {
        String::new()
    }
}

fn draw_cdf<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    lines: &[CdfLine],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let all = lines.iter().flat_map(|l| l.sorted_ms.iter().copied());
    let (lo, hi) = all.fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (lo, hi) = if hi > 0.0 {
        ((lo * 0.9).max(0.01), hi * 1.1)
    } else {
        (0.1, 10.0)
    };
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d((lo..hi).log_scale(), 0f64..1.0f64)
        .map_err(err)?;
    chart
        .configure_mesh()
        .x_desc("latency (ms, log scale)")
        .x_labels(30)
        .x_label_formatter(&|v| log_label(*v))
        .y_desc("fraction of requests")
        .label_style((FONT, 14))
        .draw()
        .map_err(err)?;
    for (i, line) in lines.iter().enumerate() {
        let n = line.sorted_ms.len();
        if n == 0 {
            continue;
        }
        // At most ~600 points per line: every quantile step, plus the tail in full detail.
        let step = (n / 600).max(1);
        let mut pts: Vec<(f64, f64)> = Vec::new();
        for (k, v) in line.sorted_ms.iter().enumerate() {
            if k % step == 0 || k + 200 >= n {
                pts.push((v.max(lo), (k + 1) as f64 / n as f64));
            }
        }
        let color = palette(i);
        chart
            .draw_series(LineSeries::new(pts, color.stroke_width(2)))
            .map_err(err)?
            .label(line.label.clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 14))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::LowerRight)
        .draw()
        .map_err(err)?;
    root.present().map_err(err)?;
    Ok(())
}

fn draw_shares<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    panels: &[SharePanel],
    backends: &[String],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let (top, body) = root.split_vertically(36);
    top.titled(title, (FONT, 22)).map_err(err)?;
    let areas = body.split_evenly((panels.len().max(1), 1));
    let last_second = panels
        .iter()
        .flat_map(|p| p.seconds.last())
        .map(|s| s.second)
        .max()
        .unwrap_or(1)
        .max(1);
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.label, (FONT, 16))
            .margin(6)
            .x_label_area_size(30)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..(last_second + 1) as f64, 0f64..1.0f64)
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("second")
            .y_desc("share")
            .y_labels(5)
            .label_style((FONT, 12))
            .draw()
            .map_err(err)?;
        for (i, b) in backends.iter().enumerate() {
            let pts: Vec<(f64, f64)> = panel
                .seconds
                .iter()
                .filter(|s| s.count > 0)
                .map(|s| {
                    (
                        s.second as f64 + 0.5,
                        s.shares.get(b).copied().unwrap_or(0.0),
                    )
                })
                .collect();
            let color = palette(i);
            chart
                .draw_series(LineSeries::new(pts, color.stroke_width(2)))
                .map_err(err)?
                .label(b.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                });
        }
        chart
            .configure_series_labels()
            .label_font((FONT, 12))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(err)?;
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `latency-cdf.svg` and `latency-cdf.png`; returns the paths.
pub fn latency_cdf(dir: &Path, title: &str, lines: &[CdfLine]) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let (svg, png) = (dir.join("latency-cdf.svg"), dir.join("latency-cdf.png"));
    let size = (1000, 650);
    draw_cdf(
        &SVGBackend::new(&svg, size).into_drawing_area(),
        title,
        lines,
    )
    .with_context(|| svg.display().to_string())?;
    draw_cdf(
        &BitMapBackend::new(&png, size).into_drawing_area(),
        title,
        lines,
    )
    .with_context(|| png.display().to_string())?;
    Ok(vec![svg, png])
}

/// Writes `share-over-time.svg` and `share-over-time.png`; returns the paths.
pub fn share_over_time(
    dir: &Path,
    title: &str,
    panels: &[SharePanel],
    backends: &[String],
) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let (svg, png) = (
        dir.join("share-over-time.svg"),
        dir.join("share-over-time.png"),
    );
    let size = (1000, 40 + 230 * panels.len().max(1) as u32);
    draw_shares(
        &SVGBackend::new(&svg, size).into_drawing_area(),
        title,
        panels,
        backends,
    )
    .with_context(|| svg.display().to_string())?;
    draw_shares(
        &BitMapBackend::new(&png, size).into_drawing_area(),
        title,
        panels,
        backends,
    )
    .with_context(|| png.display().to_string())?;
    Ok(vec![svg, png])
}

/// One line of a line chart.
pub struct Line {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

fn draw_lines<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    axes: (&str, &str),
    log_x: bool,
    lines: &[Line],
) -> Result<()> {
    root.fill(&WHITE).map_err(err)?;
    let pts = || lines.iter().flat_map(|l| l.points.iter());
    let (x_lo, x_hi) = pts().fold((f64::MAX, f64::MIN), |(lo, hi), (x, _)| {
        (lo.min(*x), hi.max(*x))
    });
    let y_hi = pts().fold(0.0f64, |hi, (_, y)| hi.max(*y)) * 1.1;
    let (x_lo, x_hi) = if x_lo < x_hi {
        (x_lo, x_hi)
    } else {
        (x_lo - 1.0, x_lo + 1.0)
    };
    let y_hi = if y_hi > 0.0 { y_hi } else { 1.0 };
    let mut builder = ChartBuilder::on(root);
    builder
        .caption(title, (FONT, 22))
        .margin(12)
        .x_label_area_size(45)
        .y_label_area_size(60);
    macro_rules! finish {
        ($chart:expr) => {{
            let mut chart = $chart;
            chart
                .configure_mesh()
                .x_desc(axes.0)
                .y_desc(axes.1)
                .label_style((FONT, 14))
                .draw()
                .map_err(err)?;
            for (i, line) in lines.iter().enumerate() {
                let color = palette(i);
                chart
                    .draw_series(LineSeries::new(line.points.clone(), color.stroke_width(2)))
                    .map_err(err)?
                    .label(line.label.clone())
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        line.points
                            .iter()
                            .map(|p| Circle::new(*p, 3, color.filled())),
                    )
                    .map_err(err)?;
            }
            chart
                .configure_series_labels()
                .label_font((FONT, 14))
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::UpperLeft)
                .draw()
                .map_err(err)?;
        }};
    }
    if log_x {
        finish!(builder
            .build_cartesian_2d((x_lo * 0.8..x_hi * 1.25).log_scale(), 0f64..y_hi)
            .map_err(err)?);
    } else {
        finish!(builder
            .build_cartesian_2d(x_lo..x_hi, 0f64..y_hi)
            .map_err(err)?);
    }
    root.present().map_err(err)?;
    Ok(())
}

/// Writes `<stem>.svg` and `<stem>.png`, a line chart (x on a log scale when `log_x`).
pub fn lines(
    dir: &Path,
    stem: &str,
    title: &str,
    axes: (&str, &str),
    log_x: bool,
    lines: &[Line],
) -> Result<Vec<PathBuf>> {
    ensure_font()?;
    let (svg, png) = (
        dir.join(format!("{stem}.svg")),
        dir.join(format!("{stem}.png")),
    );
    let size = (1000, 600);
    draw_lines(
        &SVGBackend::new(&svg, size).into_drawing_area(),
        title,
        axes,
        log_x,
        lines,
    )
    .with_context(|| svg.display().to_string())?;
    draw_lines(
        &BitMapBackend::new(&png, size).into_drawing_area(),
        title,
        axes,
        log_x,
        lines,
    )
    .with_context(|| png.display().to_string())?;
    Ok(vec![svg, png])
}
