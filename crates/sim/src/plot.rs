//! SVG line charts with `plotters` (its SVG backend, text measured by its
//! built-in estimate: no system fonts, so the bytes depend only on the data).

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;

/// One line: label and points (x ascending).
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

/// Line colors, in series order (then repeated).
const PALETTE: &[RGBColor] = &[
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
    RGBColor(0xbc, 0xbd, 0x22),
    RGBColor(0x17, 0xbe, 0xcf),
    RGBColor(0x00, 0x00, 0x00),
    RGBColor(0xae, 0xc7, 0xe8),
    RGBColor(0xff, 0xbb, 0x78),
    RGBColor(0x98, 0xdf, 0x8a),
    RGBColor(0xff, 0x98, 0x96),
    RGBColor(0xc5, 0xb0, 0xd5),
];

fn color(i: usize) -> RGBColor {
    PALETTE.get(i % PALETTE.len()).copied().unwrap_or(BLACK)
}

/// Y axis scale.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear from zero.
    LinearZero,
    /// Linear over the data range.
    Linear,
    /// Base-10 logarithmic (non-positive values are dropped).
    Log,
}

const SIZE: (u32, u32) = (900, 520);
/// Width of the legend column right of the chart.
const LEGEND_W: u32 = 230;

/// Points drawn: finite, and positive on a log scale.
fn kept(s: &Series, log: bool) -> Vec<(f64, f64)> {
    s.points
        .iter()
        .copied()
        .filter(|(x, y)| x.is_finite() && y.is_finite() && (!log || *y > 0.0))
        .collect()
}

/// A line chart as an SVG document.
pub fn line_chart(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    scale: Scale,
) -> Result<String, String> {
    let log = scale == Scale::Log;
    let lines: Vec<Vec<(f64, f64)>> = series.iter().map(|s| kept(s, log)).collect();
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in lines.iter().flatten() {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = if log {
            (0.0, 1.0, 0.1, 1.0)
        } else {
            (0.0, 1.0, 0.0, 1.0)
        };
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
        if log {
            // Whole decades.
            let lo = 10f64.powf(y0.log10().floor());
            let mut hi = 10f64.powf(y1.log10().ceil());
            if hi <= lo {
                hi = lo * 10.0;
            }
            draw(
                &root,
                title,
                xlabel,
                ylabel,
                series,
                &lines,
                x0..x1,
                (lo..hi).log_scale(),
            )
        } else {
            if scale == Scale::LinearZero {
                y0 = y0.min(0.0);
            }
            if y1 <= y0 {
                y1 = y0 + 1.0;
            }
            // A little headroom above the highest line.
            let pad = if scale == Scale::LinearZero {
                0.05 * (y1 - y0)
            } else {
                0.0
            };
            draw(
                &root,
                title,
                xlabel,
                ylabel,
                series,
                &lines,
                x0..x1,
                y0..y1 + pad,
            )
        }
        .map_err(|e| format!("plot {title:?}: {e}"))?;
    }
    Ok(out)
}

type DrawResult<'a> =
    Result<(), DrawingAreaErrorKind<<SVGBackend<'a> as DrawingBackend>::ErrorType>>;

#[allow(clippy::too_many_arguments)]
fn draw<'a, Y>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    lines: &[Vec<(f64, f64)>],
    xr: std::ops::Range<f64>,
    yr: Y,
) -> DrawResult<'a>
where
    Y: AsRangedCoord<Value = f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    root.fill(&WHITE)?;
    let (area, legend) = root.split_horizontally(SIZE.0 - LEGEND_W);
    let mut chart = ChartBuilder::on(&area)
        .caption(title, ("sans-serif", 14))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(xr, yr)?;
    chart
        .configure_mesh()
        .x_desc(xlabel)
        .y_desc(ylabel)
        .label_style(("sans-serif", 12))
        .light_line_style(RGBColor(0xf0, 0xf0, 0xf0))
        .bold_line_style(RGBColor(0xe0, 0xe0, 0xe0))
        .draw()?;
    for (i, pts) in lines.iter().enumerate() {
        let c = color(i);
        chart.draw_series(LineSeries::new(pts.iter().copied(), c.stroke_width(2)))?;
        if pts.len() <= 20 {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, c.filled())))?;
        }
    }
    // The legend: one row per series, beside the chart.
    for (i, s) in series.iter().enumerate() {
        let c = color(i);
        let y = 40 + 17 * i as i32;
        legend.draw(&PathElement::new(vec![(12, y), (30, y)], c.stroke_width(3)))?;
        legend.draw(&Text::new(
            s.label.clone(),
            (36, y - 6),
            ("sans-serif", 12).into_font(),
        ))?;
    }
    root.present()
}

/// A file-name-safe form of a label.
pub fn slug(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two() -> Vec<Series> {
        vec![
            Series {
                label: "a <&>".into(),
                points: vec![(1.0, 0.5), (2.0, 3.0), (3.0, 20.0)],
            },
            Series {
                label: "b".into(),
                points: vec![(1.0, 0.0), (2.0, f64::NAN), (3.0, 2.0)],
            },
        ]
    }

    #[test]
    fn charts_are_svg_and_deterministic() {
        for scale in [Scale::LinearZero, Scale::Linear, Scale::Log] {
            let a = line_chart("t", "x", "y", &two(), scale).expect("draws");
            let b = line_chart("t", "x", "y", &two(), scale).expect("draws");
            assert_eq!(a, b);
            assert!(a.starts_with("<svg"), "{}", &a[..a.len().min(80)]);
            assert!(a.trim_end().ends_with("</svg>"));
            assert!(a.contains("a &lt;&amp;&gt;"), "labels are escaped");
            assert!(a.contains("<polyline") || a.contains("<path"));
        }
        // No data at all still draws axes.
        let e = line_chart("t", "x", "y", &[], Scale::Log).expect("draws");
        assert!(e.contains("</svg>"));
    }

    #[test]
    fn slugs() {
        assert_eq!(slug("prefix-router:k=1 x"), "prefix-router_k_1_x");
    }
}
