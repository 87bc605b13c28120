//! The suite of workloads, and its results as a table, JSON and an SVG
//! chart.

use super::*;

/// The standard suite: matmul 1024³, attention forward at S = 1024…8192
/// (up to `max_s`) and backward at S = 1024…4096 (up to `max_bwd_s`),
/// causal and not.
///
/// With `torch`, PyTorch is measured beside every workload.
pub fn suite(max_s: usize, max_bwd_s: usize, torch: bool) -> Vec<(Workload, Vec<Method>)> {
    let mut v = vec![(Workload::Matmul { n: 1024 }, vec![Method::Jit, Method::Xla])];
    let mut s = 1024;
    while s <= max_s {
        for causal in [false, true] {
            v.push((
                Workload::Attention { s, causal },
                vec![Method::Jit, Method::Decomposed, Method::Xla],
            ));
        }
        s *= 2;
    }
    let mut s = 1024;
    while s <= max_bwd_s {
        for causal in [false, true] {
            v.push((
                Workload::AttentionBwd { s, causal },
                vec![Method::Jit, Method::Decomposed, Method::Xla],
            ));
        }
        s *= 2;
    }
    if torch {
        for (_, methods) in &mut v {
            methods.push(Method::Torch);
        }
    }
    v
}

/// `tessera bench masked_attention`: the attention forward (up to
/// `max_s`) and backward (up to `max_bwd_s`) workloads, causal and not, on
/// the band kernels and as masks through the table-driven kernels, both
/// native JIT at the same blocks.
pub fn masked_suite(max_s: usize, max_bwd_s: usize) -> Vec<(Workload, Vec<Method>)> {
    suite(max_s, max_bwd_s, false)
        .into_iter()
        .filter(|(w, _)| !matches!(w, Workload::Matmul { .. }))
        .map(|(w, _)| (w, vec![Method::Jit, Method::Tables]))
        .collect()
}

/// Seconds of a [`Method::Tables`] row over the band kernel's
/// ([`Method::Jit`]) of the same workload, where both were measured.
fn tables_vs_band(rows: &[Result<Measurement, BenchError>], m: &Measurement) -> Option<f64> {
    let band = rows
        .iter()
        .flatten()
        .find(|b| b.workload == m.workload && b.method == Method::Jit)?;
    (m.method == Method::Tables && band.seconds > 0.0).then(|| m.seconds / band.seconds)
}

/// A table of measurements with time and peak-memory ratios against the
/// XLA baseline of the same workload; where the table-driven kernels ran,
/// their time over the band kernels' follows the table.
pub fn table(rows: &[Result<Measurement, BenchError>]) -> String {
    let mut out = format!(
        "{:<26} {:<24} {:>10} {:>9} {:>11} {:>10} {:>10} {:>11}\n",
        "workload", "method", "time", "GFLOP/s", "peak mem", "time/xla", "mem/xla", "time/torch"
    );
    let torch = |w: Workload| {
        rows.iter()
            .flatten()
            .find(|m| m.workload == w && m.method == Method::Torch)
    };
    let base = |w: Workload| {
        rows.iter()
            .flatten()
            .find(|m| m.workload == w && m.method == Method::Xla)
    };
    for r in rows {
        match r {
            Ok(m) => {
                let b = base(m.workload);
                let ratio = |x: f64, y: Option<f64>| match y {
                    Some(y) if y > 0.0 => format!("{:.2}x", x / y),
                    _ => "-".into(),
                };
                out += &format!(
                    "{:<26} {:<24} {:>8.1}ms {:>9.1} {:>11} {:>10} {:>10} {:>11}\n",
                    m.workload.to_string(),
                    m.method.name(m.workload),
                    m.seconds * 1e3,
                    m.gflops(),
                    kernel_ir::human_bytes(m.peak_bytes),
                    ratio(m.seconds, b.map(|b| b.seconds)),
                    ratio(m.peak_bytes as f64, b.map(|b| b.peak_bytes as f64)),
                    ratio(m.seconds, torch(m.workload).map(|t| t.seconds)),
                );
            }
            Err(e) => out += &format!("error: {e}\n"),
        }
    }
    let versus: Vec<String> = rows
        .iter()
        .flatten()
        .filter_map(|m| {
            tables_vs_band(rows, m).map(|r| format!("  {:<26} {r:.2}x\n", m.workload.to_string()))
        })
        .collect();
    if !versus.is_empty() {
        out += "\nmask tables / band kernel (time, native JIT, same blocks):\n";
        out += &versus.concat();
    }
    out
}

/// The measurements as JSON (an array of objects; ratios against the XLA
/// baseline of the same workload, `null` where there is none).
pub fn to_json(rows: &[Result<Measurement, BenchError>]) -> String {
    let base = |w: Workload| {
        rows.iter()
            .flatten()
            .find(|m| m.workload == w && m.method == Method::Xla)
    };
    let torch_of = |w: Workload| {
        rows.iter()
            .flatten()
            .find(|m| m.workload == w && m.method == Method::Torch)
    };
    let items: Vec<String> = rows
        .iter()
        .map(|r| match r {
            Ok(m) => {
                let b = base(m.workload);
                let ratio = |x: f64, y: Option<f64>| match y {
                    Some(y) if y > 0.0 => format!("{:.4}", x / y),
                    _ => "null".into(),
                };
                format!(
                    "{{\"workload\": \"{}\", \"method\": \"{}\", \"seconds\": {:.6}, \"runs\": {}, \"gflops\": {:.2}, \"peak_bytes\": {}, \"time_vs_xla\": {}, \"memory_vs_xla\": {}, \"time_vs_torch\": {}, \"time_vs_band\": {}}}",
                    m.workload,
                    m.method.name(m.workload),
                    m.seconds,
                    m.runs,
                    m.gflops(),
                    m.peak_bytes,
                    ratio(m.seconds, b.map(|b| b.seconds)),
                    ratio(m.peak_bytes as f64, b.map(|b| b.peak_bytes as f64)),
                    ratio(m.seconds, torch_of(m.workload).map(|t| t.seconds)),
                    tables_vs_band(rows, m).map_or("null".into(), |r| format!("{r:.4}"))
                )
            }
            Err(e) => {
                format!("{{\"error\": {}}}", kernel_ir::quote::json_str(&e.to_string()))
            }
        })
        .collect();
    format!("[\n  {}\n]\n", items.join(",\n  "))
}

/// An SVG chart of attention forward: time and peak memory against
/// sequence length (log-log), one line per method, causal dashed.
pub fn svg_chart(rows: &[Result<Measurement, BenchError>]) -> String {
    let pts: Vec<&Measurement> = rows
        .iter()
        .flatten()
        .filter(|m| matches!(m.workload, Workload::Attention { .. }))
        .collect();
    let (w, h, pad) = (460.0, 300.0, 55.0);
    let mut svg = String::from(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"980\" height=\"360\" font-family=\"sans-serif\" font-size=\"11\">\n",
    );
    svg += "<text x=\"490\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">Attention forward: fused (Tessera) vs unfused (XLA), B=1 H=8 D=128 f32</text>\n";
    let colors = [
        (Method::Jit, "#1f77b4"),
        (Method::Decomposed, "#2ca02c"),
        (Method::Xla, "#d62728"),
    ];
    type Value = fn(&Measurement) -> f64;
    let panels: [(&str, Value); 2] = [
        ("time (ms)", |m| m.seconds * 1e3),
        ("peak memory (MiB)", |m| m.peak_bytes as f64 / 1048576.0),
    ];
    for (p, (title, value)) in panels.iter().enumerate() {
        let x0 = 20.0 + p as f64 * 490.0;
        let y0 = 30.0;
        let vals: Vec<f64> = pts.iter().map(|m| value(m)).filter(|v| *v > 0.0).collect();
        let ss: Vec<f64> = pts
            .iter()
            .filter_map(|m| match m.workload {
                Workload::Attention { s, .. } => Some(s as f64),
                _ => None,
            })
            .collect();
        if vals.is_empty() || ss.is_empty() {
            continue;
        }
        let (vmin, vmax) = vals
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let (smin, smax) = ss
            .iter()
            .fold((f64::MAX, f64::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        let (lv0, lv1) = (
            vmin.log10().floor(),
            vmax.log10().ceil().max(vmin.log10().floor() + 1.0),
        );
        let (ls0, ls1) = (smin.log2(), smax.log2().max(smin.log2() + 1.0));
        let px = |s: f64| x0 + pad + (s.log2() - ls0) / (ls1 - ls0) * (w - pad - 10.0);
        let py = |v: f64| y0 + h - pad + 10.0 - (v.log10() - lv0) / (lv1 - lv0) * (h - pad);
        svg += &format!(
            "<rect x=\"{x0}\" y=\"{y0}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"#ccc\"/>\n<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" font-size=\"12\">{title}</text>\n",
            x0 + w / 2.0,
            y0 + 14.0
        );
        let mut e = lv0;
        while e <= lv1 {
            let v = 10f64.powf(e);
            svg += &format!(
                "<line x1=\"{}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#eee\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{v}</text>\n",
                x0 + pad,
                x0 + w - 10.0,
                x0 + pad - 4.0,
                py(v) + 4.0,
                y = py(v)
            );
            e += 1.0;
        }
        let mut s = smin;
        while s <= smax {
            svg += &format!(
                "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">S={s}</text>\n",
                px(s),
                y0 + h - 8.0
            );
            s *= 2.0;
        }
        for (method, color) in colors {
            for causal in [false, true] {
                let mut line: Vec<(f64, f64)> = pts
                    .iter()
                    .filter(|m| m.method == method && matches!(m.workload, Workload::Attention { causal: c, .. } if c == causal))
                    .filter_map(|m| match m.workload {
                        Workload::Attention { s, .. } => Some((s as f64, value(m))),
                        _ => None,
                    })
                    .filter(|(_, v)| *v > 0.0)
                    .collect();
                line.sort_by(|a, b| a.0.total_cmp(&b.0));
                if line.is_empty() {
                    continue;
                }
                let path: Vec<String> = line
                    .iter()
                    .map(|(s, v)| format!("{:.1},{:.1}", px(*s), py(*v)))
                    .collect();
                svg += &format!(
                    "<polyline points=\"{}\" fill=\"none\" stroke=\"{color}\" stroke-width=\"2\"{}/>\n",
                    path.join(" "),
                    if causal {
                        " stroke-dasharray=\"5,4\""
                    } else {
                        ""
                    }
                );
            }
        }
    }
    // Legend.
    for (i, (method, color)) in colors.iter().enumerate() {
        let x = 80.0 + i as f64 * 220.0;
        let name = method.name(Workload::Attention {
            s: 1,
            causal: false,
        });
        svg += &format!(
            "<line x1=\"{x}\" x2=\"{}\" y1=\"348\" y2=\"348\" stroke=\"{color}\" stroke-width=\"2\"/><text x=\"{}\" y=\"352\">{name}</text>\n",
            x + 24.0,
            x + 30.0
        );
    }
    svg += "<text x=\"740\" y=\"352\">solid: full, dashed: causal</text>\n</svg>\n";
    svg
}
