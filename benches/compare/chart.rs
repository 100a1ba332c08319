//! The chart: ns per value against keys, `compare.svg`.

use std::error::Error;

use crate::report::ScenarioRuns;

/// ns/value against keys for `timed`, `timed_acked`, `diy_delayqueue`, `diy_exact`,
/// `origin_port` and `mpsc` (the floor: no batching at all), one panel per window and
/// producer count.
pub(crate) fn chart(
    path: &std::path::Path,
    scenarios: &[ScenarioRuns],
) -> Result<(), Box<dyn Error>> {
    use plotters::prelude::*;

    let lines: [(&str, RGBColor); 6] = [
        ("timed", RGBColor(0x1f, 0x77, 0xb4)),
        ("timed_acked", RGBColor(0x94, 0x67, 0xbd)),
        ("diy_delayqueue", RGBColor(0xff, 0x7f, 0x0e)),
        ("diy_exact", RGBColor(0xd6, 0x27, 0x28)),
        ("origin_port", RGBColor(0x2c, 0xa0, 0x2c)),
        ("mpsc", RGBColor(0x7f, 0x7f, 0x7f)),
    ];
    let root = SVGBackend::new(path, (1000, 760)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        "keyed-batch: ns per value against keys (lower is better)",
        ("sans-serif", 22),
    )?;
    let panels = root.split_evenly((2, 2));
    for (panel, (window_ms, producers)) in panels.iter().zip([(0, 1), (0, 4), (50, 1), (50, 4)]) {
        let points = |variant: &str| -> Vec<(f64, f64)> {
            scenarios
                .iter()
                .filter(|s| {
                    s.scenario.window_ms == window_ms
                        && s.scenario.producers == producers
                        && s.has(variant)
                })
                .map(|s| {
                    (
                        s.scenario.keys as f64,
                        s.figure(variant, |r| r.ns_per_value),
                    )
                })
                .collect()
        };
        let all: Vec<f64> = lines
            .iter()
            .flat_map(|(v, _)| points(v))
            .map(|p| p.1)
            .collect();
        if all.is_empty() {
            continue;
        }
        let lo = all.iter().copied().fold(f64::MAX, f64::min) / 1.5;
        // Head room for the legend in the upper left.
        let hi = all.iter().copied().fold(f64::MIN, f64::max) * 6.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!(
                    "window {window_ms} ms, {producers} producer{}",
                    if producers == 1 { "" } else { "s" }
                ),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d((500f64..2_000_000f64).log_scale(), (lo..hi).log_scale())?;
        chart
            .configure_mesh()
            .x_desc("keys")
            .y_desc("ns per value")
            .x_label_formatter(&|x| format!("{x:.0}"))
            .y_label_formatter(&|y| format!("{y:.0}"))
            .draw()?;
        for (variant, color) in lines {
            let pts = points(variant);
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(variant)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()?;
    }
    root.present()?;
    Ok(())
}
