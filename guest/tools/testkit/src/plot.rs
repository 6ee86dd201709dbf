//! The benchmarks' plots in the style of the papers' figures (UMP's
//! Figures 8 and 9 in `ump-tool bench`, MPI against MPICH in
//! `scripts/mpi-bench.sh`): line plots with logarithmic axes, drawn as SVG
//! by `plotters`. No I/O (the caller writes the document); no threads.

use plotters::prelude::*;
use thiserror::Error;

/// Why a plot could not be drawn.
#[derive(Debug, Error)]
pub enum PlotError {
    /// No point has x > 0 and y > 0 (nothing fits on log axes).
    #[error("nothing to plot: no point with x > 0 and y > 0")]
    NoPoints,
    /// plotters failed.
    #[error("drawing the plot: {0}")]
    Draw(String),
}

/// One line of a plot.
pub struct Series {
    /// Legend text.
    pub name: String,
    /// (x, y) points; points with x or y <= 0 are left out (log axes).
    pub points: Vec<(f64, f64)>,
}

/// The powers of `base` around `lo..hi`.
fn decades(lo: f64, hi: f64, base: f64) -> (f64, f64) {
    let (a, b) = (base.powf(lo.log(base).floor()), base.powf(hi.log(base).ceil()));
    if a < b {
        (a, b)
    } else {
        (a, b * base)
    }
}

/// A size in bytes as a short label (1K, 64K, 1M).
fn size_label(v: f64) -> String {
    match v {
        v if v >= 1048576.0 => format!("{}M", (v / 1048576.0 * 10.0).round() / 10.0),
        v if v >= 1024.0 => format!("{}K", (v / 1024.0 * 10.0).round() / 10.0),
        v => format!("{v}"),
    }
}

fn draw<E: std::fmt::Display>(e: E) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// An SVG document: log-log axes (x in bytes), one line per series, a legend.
pub fn svg(title: &str, x_label: &str, y_label: &str, series: &[Series]) -> Result<String, PlotError> {
    let usable = |s: &Series| -> Vec<(f64, f64)> {
        s.points.iter().copied().filter(|&(x, y)| x > 0.0 && y > 0.0 && x.is_finite() && y.is_finite()).collect()
    };
    let pts: Vec<(f64, f64)> = series.iter().flat_map(usable).collect();
    if pts.is_empty() {
        return Err(PlotError::NoPoints);
    }
    let fold = |f: fn(f64, f64) -> f64, init: f64, by: fn(&(f64, f64)) -> f64| pts.iter().map(by).fold(init, f);
    // Sizes in bytes: ticks at powers of 8 (1, 8, 64, 512, 4K, ...).
    let (x0, x1) = decades(fold(f64::min, f64::MAX, |p| p.0), fold(f64::max, 0.0, |p| p.0), 8.0);
    let (y0, y1) = decades(fold(f64::min, f64::MAX, |p| p.1), fold(f64::max, 0.0, |p| p.1), 10.0);
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (760, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(draw)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d((x0..x1).log_scale().base(8.0), (y0..y1).log_scale())
            .map_err(draw)?;
        chart
            .configure_mesh()
            .x_desc(x_label)
            .y_desc(y_label)
            .x_label_formatter(&|v| size_label(*v))
            .draw()
            .map_err(draw)?;
        for (i, s) in series.iter().enumerate() {
            let color = Palette99::pick(i).to_rgba();
            chart
                .draw_series(LineSeries::new(usable(s), color.stroke_width(2)))
                .map_err(draw)?
                .label(s.name.as_str())
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(draw)?;
        root.present().map_err(draw)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_series_is_drawn_with_its_legend() {
        let s = vec![
            Series { name: "shm".into(), points: vec![(1.0, 2.0), (1024.0, 50.0), (1048576.0, 3000.0)] },
            Series { name: "mc".into(), points: vec![(0.0, 1.0), (8.0, 4.0), (65536.0, 90.0)] },
        ];
        let doc = svg("UMP title", "size", "us", &s).unwrap();
        assert!(doc.starts_with("<svg") && doc.trim_end().ends_with("</svg>"), "{}", &doc[..80.min(doc.len())]);
        // Texts: title, axes, legend, and byte-size ticks at powers of 8.
        let texts: Vec<&str> =
            doc.split("<text").skip(1).filter_map(|t| t.split('>').nth(1)?.split('<').next()).map(str::trim).collect();
        for text in ["UMP title", "shm", "mc", "size", "us", "64", "4K", "256K"] {
            assert!(texts.contains(&text), "{text} missing from {texts:?}");
        }
        // One line per series (width 2), plus a legend sample each; the
        // point at x = 0 cannot be on a log axis and is left out, not drawn
        // at the edge.
        let lines: Vec<&str> =
            doc.lines().filter(|l| l.starts_with("<polyline") && l.contains("stroke-width=\"2\"")).collect();
        let points =
            |l: &str| l.split("points=\"").nth(1).unwrap().split_whitespace().filter(|p| p.contains(',')).count();
        let counts: Vec<usize> = lines.iter().map(|l| points(l)).collect();
        assert_eq!(counts, vec![3, 2, 2, 2], "series, then legend samples");
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        assert!(matches!(svg("t", "x", "y", &[]), Err(PlotError::NoPoints)));
        let s = [Series { name: "z".into(), points: vec![(0.0, 1.0), (1.0, -2.0)] }];
        assert!(matches!(svg("t", "x", "y", &s), Err(PlotError::NoPoints)));
    }

    #[test]
    fn labels_and_ranges() {
        assert_eq!(size_label(1024.0), "1K");
        assert_eq!(size_label(3.0 * 1048576.0), "3M");
        assert_eq!(size_label(8.0), "8");
        assert_eq!(decades(3.0, 700.0, 10.0), (1.0, 1000.0));
        assert_eq!(decades(10.0, 10.0, 10.0), (10.0, 100.0));
        assert_eq!(decades(100.0, 5000.0, 8.0), (64.0, 32768.0));
    }
}
