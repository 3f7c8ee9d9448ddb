//! Hand-written SVG line charts (no plotting dependency).

use std::fmt::Write as _;

/// One line: label and points (x ascending).
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
}

const PALETTE: &[&str] = &[
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
    "#bcbd22", "#17becf", "#000000", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5",
];

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// "Nice" tick step for a range.
fn step(range: f64, ticks: f64) -> f64 {
    if range <= 0.0 || !range.is_finite() {
        return 1.0;
    }
    let raw = range / ticks;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let nice = if norm < 1.5 {
        1.0
    } else if norm < 3.0 {
        2.0
    } else if norm < 7.0 {
        5.0
    } else {
        10.0
    };
    nice * mag
}

fn fmt_tick(v: f64) -> String {
    if v.abs() >= 1000.0 || (v - v.round()).abs() < 1e-9 {
        format!("{:.0}", v)
    } else if v.abs() >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
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

/// A line chart.
pub fn line_chart(
    title: &str,
    xlabel: &str,
    ylabel: &str,
    series: &[Series],
    scale: Scale,
) -> String {
    let log = scale == Scale::Log;
    let y_from_zero = scale == Scale::LinearZero;
    let ty = |y: f64| {
        if !log {
            y
        } else if y > 0.0 {
            y.log10()
        } else {
            f64::NAN
        }
    };
    let (w, h) = (900.0, 520.0);
    let (ml, mr, mt, mb) = (70.0, 230.0, 40.0, 55.0);
    let pw = w - ml - mr;
    let ph = h - mt - mb;
    let pts = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &(x, y) in pts {
        let y = ty(y);
        if x.is_finite() && y.is_finite() {
            x0 = x0.min(x);
            x1 = x1.max(x);
            y0 = y0.min(y);
            y1 = y1.max(y);
        }
    }
    if !x0.is_finite() {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if y_from_zero {
        y0 = y0.min(0.0);
    }
    if x1 <= x0 {
        x1 = x0 + 1.0;
    }
    if y1 <= y0 {
        y1 = y0 + 1.0;
    }
    let ys = if log { 1.0 } else { step(y1 - y0, 6.0) };
    y0 = (y0 / ys).floor() * ys;
    y1 = (y1 / ys).ceil() * ys;
    if y1 <= y0 {
        y1 = y0 + ys;
    }
    let xs = step(x1 - x0, 8.0);
    let sx = |x: f64| ml + (x - x0) / (x1 - x0) * pw;
    let sy = |y: f64| mt + ph - (y - y0) / (y1 - y0) * ph;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{w}" height="{h}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="22" font-size="14" text-anchor="middle">{}</text>"#,
        w / 2.0,
        esc(title)
    );
    // Grid and ticks.
    let mut y = y0;
    while y <= y1 + ys * 1e-6 {
        let py = sy(y);
        let _ = writeln!(
            s,
            r##"<line x1="{ml}" y1="{py:.1}" x2="{:.1}" y2="{py:.1}" stroke="#e0e0e0"/>"##,
            ml + pw
        );
        let _ = writeln!(
            s,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
            ml - 6.0,
            py + 4.0,
            if log {
                fmt_tick(10f64.powf(y))
            } else {
                fmt_tick(y)
            }
        );
        y += ys;
    }
    let mut x = (x0 / xs).ceil() * xs;
    while x <= x1 + xs * 1e-6 {
        let px = sx(x);
        let _ = writeln!(
            s,
            r##"<line x1="{px:.1}" y1="{mt}" x2="{px:.1}" y2="{:.1}" stroke="#f0f0f0"/>"##,
            mt + ph
        );
        let _ = writeln!(
            s,
            r#"<text x="{px:.1}" y="{:.1}" text-anchor="middle">{}</text>"#,
            mt + ph + 18.0,
            fmt_tick(x)
        );
        x += xs;
    }
    let _ = writeln!(
        s,
        r#"<rect x="{ml}" y="{mt}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        ml + pw / 2.0,
        h - 12.0,
        esc(xlabel)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        mt + ph / 2.0,
        mt + ph / 2.0,
        esc(ylabel)
    );
    for (i, se) in series.iter().enumerate() {
        let color = PALETTE.get(i % PALETTE.len()).copied().unwrap_or("#000000");
        let path: Vec<String> = se
            .points
            .iter()
            .map(|&(x, y)| (x, ty(y)))
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .map(|(x, y)| format!("{:.1},{:.1}", sx(x), sy(y)))
            .collect();
        if !path.is_empty() {
            let _ = writeln!(
                s,
                r#"<polyline fill="none" stroke="{color}" stroke-width="1.6" points="{}"/>"#,
                path.join(" ")
            );
            if se.points.len() <= 20 {
                for p in &path {
                    if let Some((a, b)) = p.split_once(',') {
                        let _ = writeln!(s, r#"<circle cx="{a}" cy="{b}" r="3" fill="{color}"/>"#);
                    }
                }
            }
        }
        let ly = mt + 10.0 + i as f64 * 17.0;
        let lx = ml + pw + 12.0;
        let _ = writeln!(
            s,
            r#"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/>"#,
            lx + 18.0
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}">{}</text>"#,
            lx + 24.0,
            ly + 4.0,
            esc(&se.label)
        );
    }
    s.push_str("</svg>\n");
    s
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
