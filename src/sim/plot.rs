//! `--plot FILE.svg`: a hand-written SVG with three panels over the same time axis — arrival
//! rate; the oldest wait of each policy against the target (log scale); the replicas holding a
//! GPU under each policy — with a legend, axes with units, and the warm-up shaded.

use std::fmt::Write;

use super::engine::Point;
use super::workload::Workload;
use super::{Us, SEC};

pub struct Series<'a> {
    pub policy: &'a str,
    pub points: &'a [Point],
}

const W: f64 = 1100.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 64.0;
const PANEL_H: f64 = 210.0;
const GAP: f64 = 62.0;

fn color(policy: &str) -> &'static str {
    match policy {
        "hearth" => "#d62728",
        "hearth-nopool" => "#e377c2",
        "hpa-util" => "#1f77b4",
        "hpa-queue" => "#17becf",
        "kpa" => "#2ca02c",
        "ray" => "#ff7f0e",
        "cortex" => "#9467bd",
        "oracle" => "#000000",
        _ => "#7f7f7f",
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A round step giving about five ticks up to `max`.
fn nice_step(max: f64) -> f64 {
    let raw = (max / 5.0).max(1e-9);
    let mag = 10f64.powf(raw.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * mag >= raw {
            return m * mag;
        }
    }
    10.0 * mag
}

fn fmt_num(v: f64) -> String {
    if v == v.round() {
        format!("{v:.0}")
    } else if (v * 10.0) == (v * 10.0).round() {
        format!("{v:.1}")
    } else {
        format!("{v}")
    }
}

struct Panel {
    top: f64,
    x_max_min: f64,
}

impl Panel {
    fn x(&self, minutes: f64) -> f64 {
        LEFT + (W - LEFT - RIGHT) * (minutes / self.x_max_min).clamp(0.0, 1.0)
    }
    fn bottom(&self) -> f64 {
        self.top + PANEL_H
    }
    fn frame(&self, svg: &mut String, title: &str, y_label: &str, warmup_min: f64) {
        let (x0, x1) = (LEFT, W - RIGHT);
        let _ = write!(
            svg,
            r##"<rect x="{x0}" y="{}" width="{}" height="{PANEL_H}" fill="#eeeeee"/>"##,
            self.top,
            self.x(warmup_min) - x0
        );
        if warmup_min > 0.0 {
            let _ = write!(
                svg,
                r##"<text x="{}" y="{}" font-size="10" fill="#777">warm-up (not measured)</text>"##,
                x0 + 4.0,
                self.top + 12.0
            );
        }
        let _ = write!(
            svg,
            r##"<rect x="{x0}" y="{}" width="{}" height="{PANEL_H}" fill="none" stroke="#444"/>"##,
            self.top,
            x1 - x0
        );
        let _ = write!(
            svg,
            r##"<text x="{x0}" y="{}" font-size="14" font-weight="bold">{}</text>"##,
            self.top - 8.0,
            esc(title)
        );
        let cy = self.top + PANEL_H / 2.0;
        let _ = write!(
            svg,
            r##"<text x="18" y="{cy}" font-size="12" text-anchor="middle" transform="rotate(-90 18 {cy})">{}</text>"##,
            esc(y_label)
        );
        // Time axis.
        let step = nice_step(self.x_max_min * 5.0 / 8.0);
        let mut m = 0.0;
        while m <= self.x_max_min + 1e-9 {
            let x = self.x(m);
            let _ = write!(
                svg,
                r##"<line x1="{x}" y1="{b}" x2="{x}" y2="{b2}" stroke="#444"/><text x="{x}" y="{t}" font-size="11" text-anchor="middle">{}</text>"##,
                fmt_num(m),
                b = self.bottom(),
                b2 = self.bottom() + 5.0,
                t = self.bottom() + 17.0
            );
            m += step;
        }
        let _ = write!(
            svg,
            r##"<text x="{}" y="{}" font-size="11" text-anchor="end">time (min)</text>"##,
            x1,
            self.bottom() + 32.0
        );
    }
    fn y_tick(&self, svg: &mut String, y: f64, label: &str) {
        let _ = write!(
            svg,
            r##"<line x1="{a}" y1="{y}" x2="{b}" y2="{y}" stroke="#ccc" stroke-width="0.5"/><text x="{c}" y="{ty}" font-size="11" text-anchor="end">{}</text>"##,
            esc(label),
            a = LEFT,
            b = W - RIGHT,
            c = LEFT - 6.0,
            ty = y + 4.0
        );
    }
}

/// Breaks `text` into lines of at most `width` characters, at spaces.
fn wrap(text: &str, width: usize) -> Vec<String> {
    let mut out = Vec::new();
    let mut line = String::new();
    for word in text.split(' ') {
        if !line.is_empty() && line.chars().count() + 1 + word.chars().count() > width {
            out.push(std::mem::take(&mut line));
            line.push_str("    ");
        } else if !line.is_empty() {
            line.push(' ');
        }
        line.push_str(word);
    }
    if !line.trim().is_empty() {
        out.push(line);
    }
    out
}

fn polyline(svg: &mut String, pts: &[(f64, f64)], stroke: &str, width: f64, dash: Option<&str>) {
    if pts.is_empty() {
        return;
    }
    let mut d = String::new();
    for (x, y) in pts {
        let _ = write!(d, "{x:.1},{y:.1} ");
    }
    let dash = dash.map_or(String::new(), |d| format!(r#" stroke-dasharray="{d}""#));
    let _ = write!(
        svg,
        r#"<polyline points="{}" fill="none" stroke="{stroke}" stroke-width="{width}"{dash}/>"#,
        d.trim_end()
    );
}

/// Renders the plot.
#[allow(clippy::too_many_arguments)]
pub fn svg(
    w: &Workload,
    series: &[Series],
    target_wait: Us,
    warmup: Us,
    max_replicas: u32,
    title: &str,
    notes: &[String],
) -> String {
    let end_s = series
        .iter()
        .map(|s| s.points.len() as u64)
        .max()
        .unwrap_or(0)
        .min(w.horizon / SEC)
        .max(1);
    let bin_s = (end_s / 360).max(10);
    let bins = end_s.div_ceil(bin_s) as usize;
    let x_max = end_s as f64 / 60.0;
    let warm_min = warmup as f64 / SEC as f64 / 60.0;
    let bin_mid = |i: usize| (i as f64 + 0.5) * bin_s as f64 / 60.0;
    let lines: Vec<String> = notes.iter().flat_map(|n| wrap(n, 150)).collect();
    let height = TOP + 3.0 * (PANEL_H + GAP) + 30.0 + 16.0 * lines.len() as f64;
    let mut svg = String::new();
    let _ = write!(
        svg,
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{height}" viewBox="0 0 {W} {height}" font-family="sans-serif"><rect width="100%" height="100%" fill="white"/><text x="{LEFT}" y="28" font-size="18" font-weight="bold">{}</text>"##,
        esc(title)
    );

    // Panel 1: arrival rate.
    let p1 = Panel {
        top: TOP,
        x_max_min: x_max,
    };
    let mut counts = vec![0u64; bins];
    for r in &w.requests {
        let i = (r.t / SEC / bin_s) as usize;
        if i < bins {
            counts[i] += 1;
        }
    }
    let rates: Vec<f64> = counts.iter().map(|&c| c as f64 / bin_s as f64).collect();
    let rmax = rates.iter().cloned().fold(0.0, f64::max).max(1.0);
    let step = nice_step(rmax);
    let ytop = (rmax / step).ceil() * step;
    p1.frame(
        &mut svg,
        &format!("Arrival rate ({bin_s} s bins)"),
        "requests / s",
        warm_min,
    );
    let y1 = |v: f64| p1.bottom() - PANEL_H * v / ytop;
    let mut v = 0.0;
    while v <= ytop + 1e-9 {
        p1.y_tick(&mut svg, y1(v), &fmt_num(v));
        v += step;
    }
    let pts: Vec<(f64, f64)> = rates
        .iter()
        .enumerate()
        .map(|(i, &r)| (p1.x(bin_mid(i)), y1(r)))
        .collect();
    polyline(&mut svg, &pts, "#333", 1.5, None);

    // Panel 2: oldest wait, log scale.
    let p2 = Panel {
        top: TOP + PANEL_H + GAP,
        x_max_min: x_max,
    };
    let floor_s = 0.01f64;
    let worst = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.oldest))
        .max()
        .unwrap_or(0) as f64
        / SEC as f64;
    let target_s = target_wait as f64 / SEC as f64;
    let top_s = 10f64.powf(worst.max(target_s * 10.0).log10().ceil());
    let lo = floor_s.log10();
    let hi = top_s.log10();
    p2.frame(
        &mut svg,
        &format!("Oldest waiting request (max per {bin_s} s; below 10 ms drawn at the floor)"),
        "oldest wait (s, log)",
        warm_min,
    );
    let y2 = |s: f64| p2.bottom() - PANEL_H * (s.max(floor_s).log10() - lo) / (hi - lo);
    let mut e = lo.round() as i32;
    while e as f64 <= hi + 1e-9 {
        let v = 10f64.powi(e);
        p2.y_tick(&mut svg, y2(v), &fmt_num(v));
        e += 1;
    }
    // Lines that coincide stay visible: each policy is drawn a pixel or so apart.
    let offset = |i: usize| (i as f64 - (series.len() as f64 - 1.0) / 2.0) * 1.5;
    for (k, s) in series.iter().enumerate() {
        let dy = offset(k);
        let pts: Vec<(f64, f64)> = (0..bins)
            .map(|i| {
                let a = i * bin_s as usize;
                let b = ((i + 1) * bin_s as usize).min(s.points.len());
                let m = s
                    .points
                    .get(a..b)
                    .map_or(0, |ps| ps.iter().map(|p| p.oldest).max().unwrap_or(0));
                (p2.x(bin_mid(i)), y2(m as f64 / SEC as f64) + dy)
            })
            .collect();
        let width = if s.policy == "hearth" { 2.0 } else { 1.3 };
        polyline(&mut svg, &pts, color(s.policy), width, None);
    }
    let ty = y2(target_s);
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{ty}" x2="{}" y2="{ty}" stroke="#000" stroke-dasharray="6 4"/><text x="{}" y="{}" font-size="11">target {}</text>"##,
        W - RIGHT,
        W - RIGHT + 6.0,
        ty + 4.0,
        esc(&super::workload::fmt_secs(target_wait))
    );

    // Panel 3: replicas holding a GPU.
    let p3 = Panel {
        top: TOP + 2.0 * (PANEL_H + GAP),
        x_max_min: x_max,
    };
    let most = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.holding))
        .max()
        .unwrap_or(0)
        .max(max_replicas)
        .max(1) as f64;
    let step = nice_step(most).max(1.0).round();
    let ytop = (most / step).ceil() * step;
    p3.frame(
        &mut svg,
        &format!(
            "Replicas holding a GPU (starting, warm, routed, draining; max per {bin_s} s; \
             lines drawn 1.5 px apart)"
        ),
        "replicas",
        warm_min,
    );
    let y3 = |v: f64| p3.bottom() - PANEL_H * v / ytop;
    let mut v = 0.0;
    while v <= ytop + 1e-9 {
        p3.y_tick(&mut svg, y3(v), &fmt_num(v));
        v += step;
    }
    let my = y3(max_replicas as f64);
    let _ = write!(
        svg,
        r##"<line x1="{LEFT}" y1="{my}" x2="{}" y2="{my}" stroke="#000" stroke-dasharray="2 3"/><text x="{}" y="{}" font-size="11">max {max_replicas}</text>"##,
        W - RIGHT,
        W - RIGHT + 6.0,
        my + 4.0
    );
    for (k, s) in series.iter().enumerate() {
        let dy = offset(k);
        let mut pts = Vec::with_capacity(bins * 2);
        for i in 0..bins {
            let a = i * bin_s as usize;
            let b = ((i + 1) * bin_s as usize).min(s.points.len());
            let Some(ps) = s.points.get(a..b).filter(|ps| !ps.is_empty()) else {
                continue;
            };
            let m = ps.iter().map(|p| p.holding).max().unwrap_or(0) as f64;
            pts.push((p3.x(a as f64 / 60.0), y3(m) + dy));
            pts.push((p3.x(b as f64 / 60.0), y3(m) + dy));
        }
        let width = if s.policy == "hearth" { 2.0 } else { 1.3 };
        polyline(&mut svg, &pts, color(s.policy), width, None);
    }

    // Legend.
    let lx = W - RIGHT + 20.0;
    let mut ly = TOP + 40.0;
    let _ = write!(
        svg,
        r##"<text x="{lx}" y="{}" font-size="12" font-weight="bold">policy</text>"##,
        ly - 18.0
    );
    for s in series {
        let _ = write!(
            svg,
            r##"<line x1="{lx}" y1="{ly}" x2="{}" y2="{ly}" stroke="{}" stroke-width="3"/><text x="{}" y="{}" font-size="12">{}</text>"##,
            lx + 24.0,
            color(s.policy),
            lx + 30.0,
            ly + 4.0,
            esc(s.policy)
        );
        ly += 20.0;
    }
    let mut ny = TOP + 3.0 * (PANEL_H + GAP) + 4.0;
    for n in &lines {
        let _ = write!(
            svg,
            r##"<text x="{LEFT}" y="{ny}" font-size="11" fill="#333">{}</text>"##,
            esc(n)
        );
        ny += 16.0;
    }
    svg.push_str("</svg>\n");
    svg
}
