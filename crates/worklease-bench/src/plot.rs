//! PNG plots of a run (plotters, bitmap backend; text in DejaVu Sans, which
//! the `dejavu` crate embeds, so no system font or font library is
//! needed): cycle throughput against concurrency, the cycle latency
//! distribution, and hand-off latency against the number of waiters. One
//! panel per store.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use plotters::style::register_font;

use crate::results::{HandoffMode, OpRow, Run, Variant};
use crate::Result;

const OURS: RGBColor = RGBColor(31, 119, 180);
const BASELINE: RGBColor = RGBColor(90, 90, 90);
const PEER: RGBColor = RGBColor(214, 39, 40);
const POLL: RGBColor = RGBColor(255, 127, 14);

const FONT: &str = "sans-serif";

/// Registers the embedded DejaVu Sans as the plots' font.
fn fonts() -> Result<()> {
    register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
        .map_err(|_| "the embedded DejaVu Sans font cannot be read")?;
    register_font(FONT, FontStyle::Bold, dejavu::sans::bold())
        .map_err(|_| "the embedded DejaVu Sans Bold font cannot be read")?;
    Ok(())
}

fn variant_color(v: Variant) -> RGBColor {
    match v {
        Variant::Ours => OURS,
        Variant::Baseline => BASELINE,
        Variant::Peer => PEER,
    }
}

/// Draws every plot the run has data for into `dir`; returns (title,
/// path) of each.
pub fn all(run: &Run, dir: &Path) -> Result<Vec<(String, PathBuf)>> {
    fonts()?;
    let mut plots = Vec::new();
    if !run.cycle.is_empty() {
        let path = dir.join("cycle-throughput.png");
        throughput(run, &path)?;
        plots.push((
            "Cycle throughput against concurrent clients".to_string(),
            path,
        ));
        if let Some(clients) = latency_clients(&run.cycle) {
            let path = dir.join("cycle-latency.png");
            latency(run, clients, &path)?;
            plots.push((
                format!("Cycle latency distribution at {clients} clients"),
                path,
            ));
        }
    }
    if !run.handoff.is_empty() {
        let path = dir.join("handoff.png");
        handoff(run, &path)?;
        plots.push(("Hand-off latency against waiters".to_string(), path));
    }
    Ok(plots)
}

/// 16 clients where measured, else the most measured.
fn latency_clients(rows: &[OpRow]) -> Option<usize> {
    if rows.iter().any(|r| r.clients == 16) {
        return Some(16);
    }
    rows.iter().map(|r| r.clients).max()
}

fn stores_of<T>(items: &[T], store: impl Fn(&T) -> &str) -> Vec<String> {
    let mut v: Vec<String> = Vec::new();
    for i in items {
        let s = store(i);
        if !v.iter().any(|x| x == s) {
            v.push(s.to_string());
        }
    }
    v
}

/// The drawing area split into a titled grid of panels, two per row.
type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn grid<'a>(path: &'a Path, title: &str, panels: usize) -> Result<(Area<'a>, Vec<Area<'a>>)> {
    let rows = panels.div_ceil(2).max(1);
    let root = BitMapBackend::new(path, (1200, 60 + 420 * rows as u32)).into_drawing_area();
    root.fill(&WHITE)?;
    let inner = root.titled(title, (FONT, 26).into_font().style(FontStyle::Bold))?;
    let areas = inner.split_evenly((rows, 2));
    Ok((root, areas))
}

/// A count of clients or waiters on a log2 axis: x = log2(n).
fn log2(n: usize) -> f64 {
    (n.max(1) as f64).log2()
}

/// The label of a log2 axis point: the count, at whole powers of two.
fn pow2_label(x: &f64) -> String {
    if (x - x.round()).abs() < 1e-6 && *x >= 0.0 {
        format!("{}", 1u64 << (x.round() as u32))
    } else {
        String::new()
    }
}

/// A rate with k / M suffixes.
fn si(y: &f64) -> String {
    if *y >= 1e6 {
        format!("{:.1}M", y / 1e6)
    } else if *y >= 1e4 {
        format!("{:.0}k", y / 1e3)
    } else if *y >= 1e3 {
        format!("{:.1}k", y / 1e3)
    } else {
        format!("{y:.0}")
    }
}

fn legend_line(color: RGBColor) -> impl Fn((i32, i32)) -> PathElement<(i32, i32)> {
    move |(x, y)| PathElement::new(vec![(x, y), (x + 24, y)], color.stroke_width(3))
}

/// Draws the series' legend box of a panel at `position`.
fn draw_legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, BitMapBackend<'a>, CT>,
    position: SeriesLabelPosition,
) -> Result<()> {
    chart
        .configure_series_labels()
        .label_font((FONT, 15))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(position)
        .draw()?;
    Ok(())
}

/// Milliseconds on a log axis: two decimals below 1 ms.
fn ms(y: &f64) -> String {
    if *y < 1.0 {
        format!("{y:.2}")
    } else {
        format!("{y:.0}")
    }
}

fn throughput(run: &Run, path: &Path) -> Result<()> {
    let stores = stores_of(&run.cycle, |r| &r.store);
    let (root, areas) = grid(
        path,
        "Cycle (acquire → release) throughput against concurrent clients",
        stores.len(),
    )?;
    for (store, area) in stores.iter().zip(areas) {
        let rows: Vec<&OpRow> = run.cycle.iter().filter(|r| &r.store == store).collect();
        let xmax = log2(rows.iter().map(|r| r.clients).max().unwrap_or(1));
        let ymax = rows.iter().map(|r| r.ops_per_sec).fold(1.0, f64::max) * 1.4;
        let mut chart = ChartBuilder::on(&area)
            .caption(store, (FONT, 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.3..xmax + 0.3, 0.0..ymax)?;
        chart
            .configure_mesh()
            .x_desc("concurrent clients (log scale)")
            .y_desc("cycles per second")
            .x_labels(xmax as usize + 1)
            .x_label_formatter(&pow2_label)
            .y_label_formatter(&si)
            .label_style((FONT, 15))
            .draw()?;
        for variant in [Variant::Ours, Variant::Baseline, Variant::Peer] {
            let mut pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|r| r.variant == variant)
                .map(|r| (log2(r.clients), r.ops_per_sec))
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let color = variant_color(variant);
            let label = match variant {
                Variant::Ours => "worklease",
                Variant::Baseline => "baseline (2 compare-and-sets)",
                Variant::Peer => "peer lock",
            };
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?
                .label(label)
                .legend(legend_line(color));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}

/// x of a percentile on a "nines" scale: 0 → 0, 90 → 1, 99 → 2, 99.9 →
/// 3, 99.99 → 4; the maximum at 5.
fn nines(p: f64) -> f64 {
    if p >= 100.0 {
        5.0
    } else {
        (-(1.0 - p / 100.0).log10()).min(4.5)
    }
}

fn nines_label(x: &f64) -> String {
    match x.round() as i64 {
        0 => "0%".to_string(),
        1 => "90%".to_string(),
        2 => "99%".to_string(),
        3 => "99.9%".to_string(),
        4 => "99.99%".to_string(),
        _ => "max".to_string(),
    }
}

fn latency(run: &Run, clients: usize, path: &Path) -> Result<()> {
    let rows: Vec<&OpRow> = run.cycle.iter().filter(|r| r.clients == clients).collect();
    let stores = stores_of(&rows, |r| &r.store);
    let (root, areas) = grid(
        path,
        &format!("Cycle latency distribution at {clients} clients (ms, log scale)"),
        stores.len(),
    )?;
    for (store, area) in stores.iter().zip(areas) {
        let mine: Vec<&&OpRow> = rows.iter().filter(|r| &r.store == store).collect();
        let ys = mine
            .iter()
            .flat_map(|r| r.latency.curve.iter().map(|(_, us)| *us as f64 / 1000.0));
        let (ymin, ymax) = ys.fold((f64::MAX, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
        let (ymin, ymax) = ((ymin * 0.7).max(0.001), (ymax * 6.0).max(0.01));
        let mut chart = ChartBuilder::on(&area)
            .caption(store, (FONT, 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(0.0..5.0, (ymin..ymax).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("percentile")
            .y_desc("ms per cycle")
            .x_labels(6)
            .x_label_formatter(&nines_label)
            .y_label_formatter(&ms)
            .label_style((FONT, 15))
            .draw()?;
        for r in &mine {
            let color = variant_color(r.variant);
            let pts: Vec<(f64, f64)> = r
                .latency
                .curve
                .iter()
                .map(|&(p, us)| (nines(p), (us as f64 / 1000.0).max(ymin)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?
                .label(match r.variant {
                    Variant::Ours => "worklease",
                    Variant::Baseline => "baseline",
                    Variant::Peer => "peer lock",
                })
                .legend(legend_line(color));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperLeft)?;
    }
    root.present()?;
    Ok(())
}

fn handoff(run: &Run, path: &Path) -> Result<()> {
    let stores = stores_of(&run.handoff, |h| &h.store);
    let (root, areas) = grid(
        path,
        "Hand-off: release → next holder, median ms (log scale) against waiters",
        stores.len(),
    )?;
    for (store, area) in stores.iter().zip(areas) {
        let rows: Vec<_> = run.handoff.iter().filter(|h| &h.store == store).collect();
        let xmax = log2(rows.iter().map(|h| h.waiters).max().unwrap_or(1));
        let rtt2 = rows
            .first()
            .map_or(0.0, |h| 2.0 * h.round_trip_us as f64 / 1000.0);
        let ys = rows
            .iter()
            .map(|h| h.latency.p50_us as f64 / 1000.0)
            .chain([rtt2]);
        let (ymin, ymax) = ys.fold((f64::MAX, 0.0f64), |(a, b), y| (a.min(y), b.max(y)));
        let (ymin, ymax) = ((ymin * 0.5).max(0.001), (ymax * 12.0).max(0.01));
        let mut chart = ChartBuilder::on(&area)
            .caption(store, (FONT, 22))
            .margin(12)
            .x_label_area_size(45)
            .y_label_area_size(80)
            .build_cartesian_2d(-0.3..xmax + 0.3, (ymin..ymax).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("waiters (log scale)")
            .y_desc("median ms")
            .x_labels(xmax as usize + 1)
            .x_label_formatter(&pow2_label)
            .y_label_formatter(&ms)
            .label_style((FONT, 15))
            .draw()?;
        for (mode, across) in [
            (HandoffMode::Push, false),
            (HandoffMode::Poll, false),
            (HandoffMode::Peer, false),
            (HandoffMode::Push, true),
            (HandoffMode::Poll, true),
        ] {
            let mut pts: Vec<(f64, f64)> = rows
                .iter()
                .filter(|h| h.mode == mode && h.across_processes == across)
                .map(|h| {
                    (
                        log2(h.waiters),
                        (h.latency.p50_us as f64 / 1000.0).max(ymin),
                    )
                })
                .collect();
            if pts.is_empty() {
                continue;
            }
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            let (color, label) = match (mode, across) {
                (HandoffMode::Push, false) => (OURS, "worklease, push"),
                (HandoffMode::Poll, false) => (POLL, "worklease, polling only"),
                (HandoffMode::Peer, _) => (PEER, "peer lock"),
                (HandoffMode::Push, true) => (OURS, "push, waiters in other processes"),
                (HandoffMode::Poll, true) => (POLL, "polling, waiters in other processes"),
            };
            if across {
                // Dashed, with triangles: the same way of waiting as the
                // solid line of its color, across processes.
                chart
                    .draw_series(DashedLineSeries::new(
                        pts.clone(),
                        6,
                        4,
                        color.stroke_width(2),
                    ))?
                    .label(label)
                    .legend(move |(x, y)| TriangleMarker::new((x + 12, y), 6, color.filled()));
                chart.draw_series(
                    pts.iter()
                        .map(|&p| TriangleMarker::new(p, 6, color.filled())),
                )?;
            } else {
                chart
                    .draw_series(LineSeries::new(pts.clone(), color.stroke_width(3)))?
                    .label(label)
                    .legend(legend_line(color));
                chart.draw_series(pts.iter().map(|&p| Circle::new(p, 5, color.filled())))?;
            }
        }
        if rtt2 > 0.0 {
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(-0.3, rtt2), (xmax + 0.3, rtt2)],
                    8,
                    6,
                    BASELINE.stroke_width(2),
                ))?
                .label("2 store round trips")
                .legend(legend_line(BASELINE));
        }
        draw_legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    root.present()?;
    Ok(())
}
