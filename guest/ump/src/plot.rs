//! A small SVG line plot with logarithmic axes, for the benchmark's
//! versions of the paper's Figures 8 and 9 (no plotting dependency).

use std::fmt::Write;

/// One line of a plot.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points; points with x or y <= 0 are left out (log axes).
    pub points: Vec<(f64, f64)>,
}

const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#7f7f7f"];

fn nice_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().floor() as i32, hi.log10().ceil() as i32);
    (a..=b).map(|e| 10f64.powi(e)).collect()
}

fn label(v: f64, bytes: bool) -> String {
    if bytes {
        match v {
            v if v >= 1048576.0 => format!("{}M", v / 1048576.0),
            v if v >= 1024.0 => format!("{}K", v / 1024.0),
            v => format!("{v}"),
        }
    } else if v >= 1.0 {
        format!("{v}")
    } else {
        format!("{v:.2}")
    }
}

/// An SVG document: log-log axes, one polyline per series, a legend.
/// `x_bytes`: x values are sizes in bytes (ticks in powers of two).
pub fn svg(title: &str, x_label: &str, y_label: &str, series: &[Series], x_bytes: bool) -> String {
    let (w, h, l, r, t, b) = (760.0, 480.0, 80.0, 200.0, 40.0, 60.0);
    let pts: Vec<(f64, f64)> =
        series.iter().flat_map(|s| s.points.iter().copied()).filter(|p| p.0 > 0.0 && p.1 > 0.0).collect();
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in &pts {
        x0 = x0.min(*x);
        x1 = x1.max(*x);
        y0 = y0.min(*y);
        y1 = y1.max(*y);
    }
    if pts.is_empty() {
        (x0, x1, y0, y1) = (1.0, 10.0, 1.0, 10.0);
    }
    let xt: Vec<f64> = if x_bytes {
        let (a, b) = (x0.log2().floor() as i32, x1.log2().ceil() as i32);
        (a..=b).step_by(2).map(|e| 2f64.powi(e)).collect()
    } else {
        nice_ticks(x0, x1)
    };
    let yt = nice_ticks(y0, y1);
    let (lx0, lx1) = (xt[0].log10(), xt[xt.len() - 1].log10().max(xt[0].log10() + 1e-9));
    let (ly0, ly1) = (yt[0].log10(), yt[yt.len() - 1].log10().max(yt[0].log10() + 1e-9));
    let px = |x: f64| l + (x.log10() - lx0) / (lx1 - lx0) * (w - l - r);
    let py = |y: f64| h - b - (y.log10() - ly0) / (ly1 - ly0) * (h - t - b);
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(o, r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{title}</text>"#, (w - r + l) / 2.0);
    for &x in &xt {
        let _ = writeln!(
            o,
            r##"<line x1="{0}" y1="{1}" x2="{0}" y2="{2}" stroke="#ddd"/><text x="{0}" y="{3}" text-anchor="middle">{4}</text>"##,
            px(x),
            t,
            h - b,
            h - b + 16.0,
            label(x, x_bytes)
        );
    }
    for &y in &yt {
        let _ = writeln!(
            o,
            r##"<line x1="{0}" y1="{2}" x2="{1}" y2="{2}" stroke="#ddd"/><text x="{3}" y="{4}" text-anchor="end">{5}</text>"##,
            l,
            w - r,
            py(y),
            l - 6.0,
            py(y) + 4.0,
            label(y, false)
        );
    }
    let _ = writeln!(o, r#"<text x="{}" y="{}" text-anchor="middle">{x_label}</text>"#, (w - r + l) / 2.0, h - 16.0);
    let _ = writeln!(
        o,
        r#"<text x="18" y="{0}" text-anchor="middle" transform="rotate(-90 18 {0})">{y_label}</text>"#,
        (h - b + t) / 2.0
    );
    for (i, s) in series.iter().enumerate() {
        let c = COLORS[i % COLORS.len()];
        let line: Vec<String> = s
            .points
            .iter()
            .filter(|p| p.0 > 0.0 && p.1 > 0.0)
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(o, r#"<polyline fill="none" stroke="{c}" stroke-width="2" points="{}"/>"#, line.join(" "));
        let ly = t + 20.0 + 20.0 * i as f64;
        let _ = writeln!(
            o,
            r#"<line x1="{0}" y1="{1}" x2="{2}" y2="{1}" stroke="{c}" stroke-width="3"/><text x="{3}" y="{4}">{5}</text>"#,
            w - r + 12.0,
            ly,
            w - r + 36.0,
            w - r + 42.0,
            ly + 4.0,
            s.name
        );
    }
    o.push_str("</svg>\n");
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plots_every_series_inside_the_frame() {
        let s = vec![
            Series { name: "a".into(), points: vec![(1.0, 2.0), (1024.0, 50.0), (1048576.0, 3000.0)] },
            Series { name: "b".into(), points: vec![(0.0, 1.0), (8.0, 4.0), (65536.0, 90.0)] },
        ];
        let doc = svg("t", "size", "us", &s, true);
        assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"));
        assert_eq!(doc.matches("<polyline").count(), 2);
        // Every plotted coordinate is inside the drawing.
        for pl in doc.lines().filter(|l| l.starts_with("<polyline")) {
            let pts = pl.split("points=\"").nth(1).unwrap().trim_end_matches("\"/>");
            for p in pts.split(' ') {
                let (x, y) = p.split_once(',').unwrap();
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!((79.0..=561.0).contains(&x) && (39.0..=421.0).contains(&y), "{p}");
            }
        }
        // The point at x = 0 cannot be on a log axis: left out, not drawn at the edge.
        assert_eq!(doc.lines().filter(|l| l.starts_with("<polyline")).nth(1).unwrap().matches(',').count(), 2);
    }
}
