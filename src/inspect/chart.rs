//! Line charts over iterations, drawn to PNG with plotters in a font the binary
//! carries (DejaVu Sans), so a report looks the same on a machine without any fonts.

use std::ops::Range;
use std::path::Path;
use std::sync::Once;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::FontStyle;
use plotters::style::text_anchor::{HPos, Pos, VPos};

const FONT: &str = "sans-serif";
const WIDTH: u32 = 960;
const HEIGHT: u32 = 480;

/// One line: a value per iteration.
#[derive(Debug, Clone, PartialEq)]
pub struct Series {
    pub name: String,
    pub points: Vec<(i64, f64)>,
}

/// A chart of one or more series against the iteration.
#[derive(Debug, Clone)]
pub struct LineChart<'a> {
    pub title: &'a str,
    pub x_label: &'a str,
    pub y_label: &'a str,
    /// A fixed y range (fractions: 0..1); the data's own range, padded, without it.
    pub y_range: Option<Range<f64>>,
    pub series: &'a [Series],
}

#[derive(Debug, thiserror::Error)]
#[error("cannot draw the chart {path}: {message}")]
pub struct ChartError {
    pub path: String,
    pub message: String,
}

/// Draws `chart` to a PNG file at `path`.
pub fn draw_png(chart: &LineChart, path: &Path) -> Result<(), ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError { path: path.display().to_string(), message: e.to_string() };
    let (root, plot_area, legend_area) =
        canvas(path, chart.series.iter().map(|s| s.name.as_str())).map_err(|e| fail(&e))?;
    let xs = x_range(chart.series);
    let ys = chart.y_range.clone().unwrap_or_else(|| y_range(chart.series));
    // One label per iteration while they fit, so no tick falls between two iterations.
    let x_labels = (xs.end - xs.start + 1).clamp(2, 12) as usize;
    let span = ys.end - ys.start;
    let mut plot = ChartBuilder::on(&plot_area)
        .caption(chart.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(xs, ys)
        .map_err(|e| fail(&e))?;
    plot.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_labels(x_labels)
        .y_label_formatter(&|y| tick_label(*y, span))
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(|e| fail(&e))?;
    for (index, series) in chart.series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        plot.draw_series(LineSeries::new(series.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| fail(&e))?;
        plot.draw_series(series.points.iter().map(|&p| Circle::new(p, 3, color.filled()))).map_err(|e| fail(&e))?;
        let y = 48 + 22 * index as i32;
        legend_area.draw(&PathElement::new([(4, y), (28, y)], color.stroke_width(3))).map_err(|e| fail(&e))?;
        legend_area.draw(&Text::new(series.name.as_str(), (34, y - 8), (FONT, 14))).map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))
}

/// Bars with an error bar each: one bar per series in every group (a task), e.g. held-out
/// success per method and task with its spread over seeds.
#[derive(Debug, Clone)]
pub struct BarChart<'a> {
    pub title: &'a str,
    pub y_label: &'a str,
    pub groups: &'a [String],
    pub series: &'a [Bars],
}

/// One series of bars: per group, (height, error) or nothing.
#[derive(Debug, Clone, PartialEq)]
pub struct Bars {
    pub name: String,
    pub values: Vec<Option<(f64, f64)>>,
}

/// Draws `chart` to a PNG file at `path`, with a y axis from 0 to 1 (fractions).
pub fn draw_bars_png(chart: &BarChart, path: &Path) -> Result<(), ChartError> {
    let fail = |e: &dyn std::fmt::Display| ChartError { path: path.display().to_string(), message: e.to_string() };
    let (root, plot_area, legend_area) =
        canvas(path, chart.series.iter().map(|s| s.name.as_str())).map_err(|e| fail(&e))?;
    let mut plot = ChartBuilder::on(&plot_area)
        .caption(chart.title, (FONT, 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(72)
        .build_cartesian_2d(0.0..chart.groups.len().max(1) as f64, 0.0..1.05)
        .map_err(|e| fail(&e))?;
    plot.configure_mesh()
        .disable_x_mesh()
        .x_labels(0)
        .y_desc(chart.y_label)
        .label_style((FONT, 14))
        .axis_desc_style((FONT, 16))
        .draw()
        .map_err(|e| fail(&e))?;
    // Each group is one unit wide: its bars fill the middle 80%.
    let width = 0.8 / chart.series.len().max(1) as f64;
    for (index, bars) in chart.series.iter().enumerate() {
        let color = Palette99::pick(index).to_rgba();
        for (group, value) in bars.values.iter().enumerate() {
            let Some((height, error)) = *value else { continue };
            let left = group as f64 + 0.1 + width * index as f64;
            let middle = left + width / 2.0;
            plot.draw_series([Rectangle::new([(left, 0.0), (left + width * 0.9, height)], color.filled())])
                .map_err(|e| fail(&e))?;
            let (low, high) = ((height - error).max(0.0), (height + error).min(1.05));
            plot.draw_series([PathElement::new([(middle, low), (middle, high)], BLACK.stroke_width(1))])
                .map_err(|e| fail(&e))?;
        }
        let y = 48 + 22 * index as i32;
        legend_area.draw(&Rectangle::new([(4, y - 6), (28, y + 6)], color.filled())).map_err(|e| fail(&e))?;
        legend_area.draw(&Text::new(bars.name.as_str(), (34, y - 8), (FONT, 14))).map_err(|e| fail(&e))?;
    }
    let style = TextStyle::from((FONT, 16).into_font()).pos(Pos::new(HPos::Center, VPos::Top));
    for (group, name) in chart.groups.iter().enumerate() {
        let (x, y) = plot.backend_coord(&(group as f64 + 0.5, 0.0));
        root.draw(&Text::new(name.as_str(), (x, y + 8), style.clone())).map_err(|e| fail(&e))?;
    }
    root.present().map_err(|e| fail(&e))
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, Shift>;
type AreaError<'a> = DrawingAreaErrorKind<<BitMapBackend<'a> as DrawingBackend>::ErrorType>;

/// A white picture split into the plot and, to its right, a legend column as wide as the
/// longest of `names` needs, so the legend never hides data.
fn canvas<'a, 'n>(
    path: &'a Path,
    names: impl Iterator<Item = &'n str>,
) -> Result<(Area<'a>, Area<'a>, Area<'a>), AreaError<'a>> {
    register_font();
    let root = BitMapBackend::new(path, (WIDTH, HEIGHT)).into_drawing_area();
    root.fill(&WHITE)?;
    let (plot, legend) = root.split_horizontally(WIDTH - legend_width(names));
    Ok((root, plot, legend))
}

/// Room for the longest name at 14 px (about 7.5 px a character), within limits that
/// leave the plot most of the width.
fn legend_width<'a>(names: impl Iterator<Item = &'a str>) -> u32 {
    let longest = names.map(|n| n.chars().count()).max().unwrap_or(0) as u32;
    (longest * 15 / 2 + 44).clamp(190, 420)
}

fn register_font() {
    static REGISTER: Once = Once::new();
    REGISTER.call_once(|| {
        let bytes: &'static [u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");
        if plotters::style::register_font(FONT, FontStyle::Normal, bytes).is_err() {
            panic!("the embedded DejaVu Sans font does not parse");
        }
    });
}

/// A y tick with as many decimals as tell ticks about a tenth of `span` apart; tiny
/// spans (logprob drift on CPU is ~1e-6) in scientific notation.
fn tick_label(y: f64, span: f64) -> String {
    if !(span.is_finite() && span > 0.0) {
        return format!("{y}");
    }
    // The tick at zero arrives as 1e-22 or so after the axis arithmetic.
    let y = if y.abs() < span * 1e-9 { 0.0 } else { y };
    if span < 1e-3 {
        return format!("{y:.1e}");
    }
    let decimals = (1.0 - span.log10().floor()).clamp(0.0, 4.0) as usize;
    format!("{y:.decimals$}")
}

/// The iterations the series cover, one wider on each side when there is only one.
fn x_range(series: &[Series]) -> Range<i64> {
    let xs = || series.iter().flat_map(|s| &s.points).map(|p| p.0);
    match (xs().min(), xs().max()) {
        (Some(lo), Some(hi)) if lo < hi => lo..hi,
        (Some(x), _) => x - 1..x + 1,
        _ => 0..1,
    }
}

/// The values' range with 5% room above and below, or ±0.5 around a constant.
fn y_range(series: &[Series]) -> Range<f64> {
    let ys: Vec<f64> = series.iter().flat_map(|s| &s.points).map(|p| p.1).filter(|y| y.is_finite()).collect();
    let lo = ys.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ys.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if ys.is_empty() {
        0.0..1.0
    } else if hi - lo < 1e-12 {
        lo - 0.5..hi + 0.5
    } else {
        let pad = (hi - lo) * 0.05;
        lo - pad..hi + pad
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(points: &[(i64, f64)]) -> Series {
        Series { name: "s".into(), points: points.to_vec() }
    }

    #[test]
    fn ranges_cover_the_data_and_widen_a_single_point() {
        assert_eq!(x_range(&[series(&[(2, 1.0), (5, 3.0)])]), 2..5);
        assert_eq!(x_range(&[series(&[(4, 1.0)])]), 3..5);
        assert_eq!(y_range(&[series(&[(0, 1.0), (1, 3.0)])]), 0.9..3.1);
        assert_eq!(y_range(&[series(&[(0, 2.0)])]), 1.5..2.5);
        assert_eq!(y_range(&[]), 0.0..1.0);
        assert_eq!(tick_label(0.5, 1.0), "0.5");
        assert_eq!(tick_label(20.0, 25.0), "20");
        assert_eq!(tick_label(7.5, 7.3), "7.5");
        assert_eq!(tick_label(0.001, 0.004), "0.0010");
        assert_eq!(tick_label(0.000007, 0.0000075), "7.0e-6");
        assert_eq!(tick_label(2.1e-22, 0.0000075), "0.0e0");
    }

    #[test]
    fn draws_a_png_with_text_in_the_embedded_font() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.png");
        let data = [series(&[(0, 0.1), (1, 0.5), (2, 0.9)]), Series { name: "other".into(), points: vec![(1, 0.2)] }];
        let chart = LineChart {
            title: "success",
            x_label: "iteration",
            y_label: "rate",
            y_range: Some(0.0..1.0),
            series: &data,
        };
        draw_png(&chart, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 5_000, "{} bytes", bytes.len());
    }
}
