//! One SVG line chart for the learning curves of the benches (serve, adapt, bootstrap) and the demo: series of
//! per-episode values, optional vertical markers (episode indices) and horizontal reference lines,
//! a legend on the right. Non-finite points are skipped; the y range covers every finite value
//! and reference line.

use std::fmt::Write as _;

/// One curve: `values[i]` is drawn at episode `offset + i`.
#[derive(Debug, Clone)]
pub struct Series<'a> {
    pub name: &'a str,
    pub offset: usize,
    pub values: &'a [f64],
}

/// A chart of several series.
#[derive(Debug, Clone, Default)]
pub struct Chart<'a> {
    pub series: Vec<Series<'a>>,
    /// Vertical lines at these episodes, dashed `vline_dash` (SVG dash array, e.g. "3,3").
    pub vlines: Vec<usize>,
    pub vline_dash: &'a str,
    /// Horizontal reference lines: value and label.
    pub hlines: Vec<(f64, String)>,
    pub x_label: &'a str,
    pub y_label: &'a str,
}

const COLORS: [&str; 8] = [
    "#000", "#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

/// Renders the chart as a standalone SVG document.
pub fn line_chart(c: &Chart<'_>) -> String {
    let (w, h, l, r, t, b) = (760.0, 420.0, 60.0, 190.0, 20.0, 40.0);
    let n = c
        .series
        .iter()
        .map(|s| s.offset + s.values.len())
        .chain(c.vlines.iter().map(|v| v + 1))
        .max()
        .unwrap_or(0);
    let (mut lo, mut hi) = c
        .series
        .iter()
        .flat_map(|s| s.values.iter().copied())
        .chain(c.hlines.iter().map(|(v, _)| *v))
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
    if !lo.is_finite() || !hi.is_finite() {
        (lo, hi) = (0.0, 1.0);
    }
    if hi - lo < 1e-9 {
        hi = lo + 1.0;
    }
    let x = |i: usize| l + (w - l - r) * i as f64 / (n.max(2) - 1) as f64;
    let y = |v: f64| t + (h - t - b) * (1.0 - (v - lo) / (hi - lo));
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">"#
    );
    let _ = write!(
        s,
        r##"<rect x="{l}" y="{t}" width="{}" height="{}" fill="none" stroke="#888"/>"##,
        w - l - r,
        h - t - b
    );
    for k in 0..=4 {
        let v = lo + (hi - lo) * f64::from(k) / 4.0;
        let _ = write!(
            s,
            r#"<text x="{}" y="{:.1}" text-anchor="end">{v:.2}</text>"#,
            l - 4.0,
            y(v) + 4.0
        );
    }
    // Episode ticks: the first, the last and three between.
    let mut ticks: Vec<usize> = (0..=4).map(|k| k * n.saturating_sub(1) / 4).collect();
    ticks.dedup();
    for i in ticks.into_iter().filter(|_| n > 0) {
        let _ = write!(
            s,
            r#"<text x="{:.1}" y="{}" text-anchor="middle">{i}</text>"#,
            x(i),
            h - b + 13.0
        );
    }
    for &e in &c.vlines {
        let xi = x(e);
        let _ = write!(
            s,
            r##"<line x1="{xi:.1}" y1="{t}" x2="{xi:.1}" y2="{}" stroke="#bbb" stroke-dasharray="{}"/>"##,
            h - b,
            c.vline_dash
        );
    }
    let mut legend = 0usize;
    for (v, label) in c.hlines.iter().filter(|(v, _)| v.is_finite()) {
        let _ = write!(
            s,
            r##"<line x1="{l}" y1="{:.1}" x2="{}" y2="{:.1}" stroke="#999" stroke-dasharray="4,3"/><text x="{}" y="{:.1}">{label}</text>"##,
            y(*v),
            w - r,
            y(*v),
            w - r + 8.0,
            y(*v) + 4.0
        );
        legend += 1;
    }
    for (k, se) in c.series.iter().enumerate() {
        let col = COLORS[k % COLORS.len()];
        let pts: Vec<String> = se
            .values
            .iter()
            .enumerate()
            .filter(|(_, v)| v.is_finite())
            .map(|(i, v)| format!("{:.1},{:.1}", x(se.offset + i), y(*v)))
            .collect();
        let _ = write!(
            s,
            r#"<polyline fill="none" stroke="{col}" stroke-width="1.5" points="{}"/>"#,
            pts.join(" ")
        );
        let ly = t + 14.0 * (k + legend) as f64 + 8.0;
        let _ = write!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{col}" stroke-width="2"/><text x="{}" y="{}">{}</text>"#,
            w - r + 8.0,
            w - r + 28.0,
            w - r + 32.0,
            ly + 4.0,
            se.name
        );
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text><text x="14" y="{}" transform="rotate(-90 14 {})" text-anchor="middle">{}</text></svg>"#,
        (l + w - r) / 2.0,
        h - 8.0,
        c.x_label,
        (t + h - b) / 2.0,
        (t + h - b) / 2.0,
        c.y_label
    );
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn points(svg: &str) -> Vec<Vec<(f64, f64)>> {
        svg.split("points=\"")
            .skip(1)
            .map(|p| {
                p.split('"')
                    .next()
                    .unwrap()
                    .split_whitespace()
                    .map(|xy| {
                        let (a, b) = xy.split_once(',').unwrap();
                        (a.parse().unwrap(), b.parse().unwrap())
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn series_are_placed_by_offset_and_value() {
        let a = [1.0, 2.0, 3.0];
        let b = [3.0, f64::NAN, 1.0];
        let svg = line_chart(&Chart {
            series: vec![
                Series {
                    name: "a",
                    offset: 0,
                    values: &a,
                },
                Series {
                    name: "b",
                    offset: 2,
                    values: &b,
                },
            ],
            vlines: vec![2],
            vline_dash: "3,3",
            hlines: vec![(2.5, "target".into())],
            x_label: "episode",
            y_label: "reward",
        });
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        let p = points(&svg);
        assert_eq!(p.len(), 2);
        assert_eq!(p[0].len(), 3);
        // NaN skipped
        assert_eq!(p[1].len(), 2);
        // a rises (SVG y grows downwards); b starts where a ends, at the top
        assert!(p[0][0].1 > p[0][1].1 && p[0][1].1 > p[0][2].1);
        assert_eq!(p[1][0], p[0][2]);
        // the last episode is at the right edge of the plot
        assert!((p[1][1].0 - (760.0 - 190.0)).abs() < 0.1);
        assert!(svg.contains("target") && svg.contains("stroke-dasharray=\"3,3\""));
        assert!(svg.contains(">episode<") && svg.contains(">reward<"));
        // episode ticks 0 … 4 under the plot, the last at the right edge
        let ticks: Vec<&str> = svg
            .split("text-anchor=\"middle\">")
            .skip(1)
            .map(|t| t.split('<').next().unwrap())
            .collect();
        assert_eq!(&ticks[..5], ["0", "1", "2", "3", "4"], "{svg}");
        assert!(svg.contains(r#"<text x="570.0" y="393" text-anchor="middle">4</text>"#));
    }

    #[test]
    fn empty_and_flat_charts_render() {
        let svg = line_chart(&Chart::default());
        assert!(svg.ends_with("</svg>"));
        let flat = [1.0; 4];
        let svg = line_chart(&Chart {
            series: vec![Series {
                name: "flat",
                offset: 0,
                values: &flat,
            }],
            ..Chart::default()
        });
        assert!(!svg.contains("NaN") && !svg.contains("inf"));
    }
}
