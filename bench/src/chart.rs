//! The `small` section as a picture: ops/s, p50 latency and the server
//! side's own CPU per PUT against concurrency, one line per variant
//! (direct, nginx, fencegate, and the baseline if it ran), so the gap
//! between the proxy and a plain reverse proxy is seen, not computed.
//!
//! Drawn with plotters' SVG backend only (no font files, no bitmap
//! encoders): text is left to the SVG viewer.

use crate::small::{Kind, SmallReport};
use plotters::coord::ranged1d::{IntoSegmentedCoord, SegmentValue};
use plotters::prelude::*;
use std::path::Path;

fn color(kind: Kind) -> RGBColor {
    match kind {
        Kind::Direct => RGBColor(40, 40, 40),
        Kind::DirectFenced => RGBColor(130, 130, 130),
        Kind::Nginx => RGBColor(0, 140, 60),
        Kind::Fencegate => RGBColor(210, 40, 40),
        Kind::Baseline => RGBColor(150, 150, 210),
        Kind::Floor => RGBColor(230, 160, 30),
    }
}

/// One panel: a value per (variant, concurrency level).
struct Panel {
    title: &'static str,
    y_desc: &'static str,
    log_y: bool,
    /// Direct (plain or fenced) has no proxy: its own CPU is the store's,
    /// not comparable.
    proxies_only: bool,
    value: fn(&crate::small::VariantLevel) -> f64,
}

const PANELS: [Panel; 3] = [
    Panel {
        title: "throughput (higher is better)",
        y_desc: "PUTs/s (median of rounds)",
        log_y: false,
        proxies_only: false,
        value: |v| v.series.median_ops_per_sec,
    },
    Panel {
        title: "p50 latency (lower is better)",
        y_desc: "p50 ms (log scale)",
        log_y: true,
        proxies_only: false,
        value: |v| v.series.latency.p50_ms,
    },
    Panel {
        title: "the proxy's own CPU per PUT (store excluded)",
        y_desc: "CPU us per PUT (log scale)",
        log_y: true,
        proxies_only: true,
        value: |v| v.server_cpu_us_per_put,
    },
];

fn shown(panel: &Panel, kind: Kind) -> bool {
    !(panel.proxies_only && matches!(kind, Kind::Direct | Kind::DirectFenced))
}

/// An axis label with as many decimals as the value needs.
fn short(v: f64) -> String {
    if v >= 10.0 {
        format!("{v:.0}")
    } else if v >= 1.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

/// The line under the chart's title: the machine, its load, the binary.
pub fn note(nproc: &dyn std::fmt::Display, cpu_model: &str, load: &str, fencegate: &str) -> String {
    format!("{nproc} x {cpu_model}, load {load} at the start; fencegate = {fencegate}")
}

/// Writes the chart of `r` to `path`; `note` goes under the title (the
/// machine, the load, the date).
pub fn draw(r: &SmallReport, path: &Path, note: &str) -> anyhow::Result<()> {
    draw_inner(r, path, note).map_err(|e| anyhow::anyhow!("chart {}: {e}", path.display()))
}

fn draw_inner(r: &SmallReport, path: &Path, note: &str) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1500, 520)).into_drawing_area();
    root.fill(&WHITE)?;
    let (head, body) = root.split_vertically(70);
    head.draw(&Text::new(
        format!(
            "{} B PUTs, one run, variants in rotated rounds ({} x {:.1} s per level)",
            r.object_bytes, r.rounds, r.round_secs
        ),
        (20, 12),
        ("sans-serif", 22).into_font().color(&BLACK),
    ))?;
    head.draw(&Text::new(
        note.to_owned(),
        (20, 42),
        ("sans-serif", 14).into_font().color(&RGBColor(90, 90, 90)),
    ))?;
    // One legend for the three panels, top right, clear of the data.
    for (i, info) in r.variants.iter().enumerate() {
        let x = 1000 + 120 * i as i32;
        let style = ShapeStyle::from(&color(info.kind)).stroke_width(4);
        head.draw(&PathElement::new(vec![(x, 24), (x + 28, 24)], style))?;
        head.draw(&Text::new(
            info.label.clone(),
            (x + 34, 16),
            ("sans-serif", 16).into_font().color(&BLACK),
        ))?;
    }
    let levels: Vec<usize> = r.levels.iter().map(|l| l.concurrency).collect();
    let n = levels.len().max(1);
    let panels = body.split_evenly((1, PANELS.len()));
    for (area, panel) in panels.iter().zip(PANELS.iter()) {
        let mut values = r
            .levels
            .iter()
            .flat_map(|l| l.variants.iter().filter(|v| shown(panel, v.kind)))
            .map(panel.value)
            .filter(|v| v.is_finite() && *v > 0.0);
        let first = values.next().unwrap_or(1.0);
        let (lo, hi) = values.fold((first, first), |(lo, hi), v| (lo.min(v), hi.max(v)));
        let mut chart = ChartBuilder::on(area);
        chart
            .caption(panel.title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(70);
        // Concurrency levels as evenly spaced categories (1, 8, 64 are
        // powers of 8: a log axis, labelled with the levels themselves).
        let x = (0..n - 1).into_segmented();
        let label_x = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) => levels.get(*i).map_or(String::new(), |c| c.to_string()),
            _ => String::new(),
        };
        let point = |i: usize| SegmentValue::CenterOf(i);
        if panel.log_y {
            let mut c = chart.build_cartesian_2d(x, (lo * 0.7..hi * 1.4).log_scale())?;
            c.configure_mesh()
                .x_desc("concurrency")
                .y_desc(panel.y_desc)
                .x_label_formatter(&label_x)
                .y_label_formatter(&|v| short(*v))
                .light_line_style(TRANSPARENT)
                .draw()?;
            series(r, panel, &mut c, point)?;
        } else {
            let mut c = chart.build_cartesian_2d(x, 0.0..hi * 1.15)?;
            c.configure_mesh()
                .x_desc("concurrency")
                .y_desc(panel.y_desc)
                .x_label_formatter(&label_x)
                .y_label_formatter(&|v| format!("{v:.0}"))
                .light_line_style(TRANSPARENT)
                .draw()?;
            series(r, panel, &mut c, point)?;
        }
    }
    root.present()?;
    Ok(())
}

/// Draws one line with points per variant.
fn series<'a, DB, Y>(
    r: &SmallReport,
    panel: &Panel,
    chart: &mut ChartContext<
        'a,
        DB,
        Cartesian2d<
            plotters::coord::ranged1d::SegmentedCoord<plotters::coord::types::RangedCoordusize>,
            Y,
        >,
    >,
    point: impl Fn(usize) -> SegmentValue<usize>,
) -> Result<(), String>
where
    DB: DrawingBackend + 'a,
    Y: Ranged<ValueType = f64>,
{
    for info in r.variants.iter().filter(|i| shown(panel, i.kind)) {
        let pts: Vec<(SegmentValue<usize>, f64)> = r
            .levels
            .iter()
            .enumerate()
            .filter_map(|(i, l)| l.get(info.kind).map(|v| (point(i), (panel.value)(v))))
            .filter(|(_, v)| v.is_finite() && *v > 0.0)
            .collect();
        let col = color(info.kind);
        let style = ShapeStyle::from(&col).stroke_width(3);
        chart
            .draw_series(LineSeries::new(pts.clone(), style))
            .map_err(|e| e.to_string())?;
        chart
            .draw_series(pts.iter().map(|p| Circle::new(p.clone(), 4, col.filled())))
            .map_err(|e| e.to_string())?;
    }
    Ok(())
}
