//! An SVG line chart of P(loss | f failed drives), one curve per layout.
//!
//! Hand-written SVG: a few dozen lines of markup need no plotting library,
//! and the output is readable in any browser.

use std::fmt::Write;

/// Colours for up to eight curves, then repeated; chosen to be told apart.
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const WIDTH: f64 = 800.0;
const HEIGHT: f64 = 480.0;
const MARGIN_LEFT: f64 = 70.0;
const MARGIN_RIGHT: f64 = 180.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 60.0;

/// `curves`: (name, P(loss | f) for f = 0..). Returns the SVG document.
pub fn loss_curves(title: &str, curves: &[(String, Vec<f64>)]) -> String {
    let f_max = curves
        .iter()
        .map(|(_, p)| p.len().saturating_sub(1))
        .max()
        .unwrap_or(1)
        .max(1) as f64;
    let plot_width = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_height = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let x = |f: f64| MARGIN_LEFT + f / f_max * plot_width;
    let y = |p: f64| MARGIN_TOP + (1.0 - p) * plot_height;
    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" font-size="16" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    for tick in 0..=10 {
        let p = tick as f64 / 10.0;
        let _ = writeln!(
            svg,
            r##"<line x1="{MARGIN_LEFT}" x2="{}" y1="{y}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{p:.1}</text>"##,
            MARGIN_LEFT + plot_width,
            MARGIN_LEFT - 6.0,
            y(p) + 4.0,
            y = y(p)
        );
    }
    let step = (f_max / 10.0).ceil().max(1.0);
    let mut f = 0.0;
    while f <= f_max {
        let _ = writeln!(
            svg,
            r#"<text x="{}" y="{}" text-anchor="middle">{f}</text>"#,
            x(f),
            MARGIN_TOP + plot_height + 18.0
        );
        f += step;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">drives failed at the same time</text>"#,
        MARGIN_LEFT + plot_width / 2.0,
        HEIGHT - 16.0
    );
    let _ = writeln!(
        svg,
        r#"<text transform="translate(18 {}) rotate(-90)" text-anchor="middle">probability of data loss</text>"#,
        MARGIN_TOP + plot_height / 2.0
    );
    for (i, (name, probabilities)) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let points: Vec<String> = probabilities
            .iter()
            .enumerate()
            .map(|(f, &p)| format!("{:.1},{:.1}", x(f as f64), y(p)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{colour}" stroke-width="2" points="{}"/>"#,
            points.join(" ")
        );
        let legend_y = MARGIN_TOP + 20.0 * i as f64 + 10.0;
        let legend_x = MARGIN_LEFT + plot_width + 16.0;
        let _ = writeln!(
            svg,
            r#"<line x1="{legend_x}" x2="{}" y1="{legend_y}" y2="{legend_y}" stroke="{colour}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            legend_x + 24.0,
            legend_x + 30.0,
            legend_y + 4.0,
            escape(name)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_layout_is_named_and_drawn() {
        let svg = super::loss_curves(
            "t",
            &[
                ("10x8+2".to_string(), vec![0.0, 0.0, 0.5, 1.0]),
                ("1x92+8".to_string(), vec![0.0, 1.0]),
            ],
        );
        assert!(svg.contains(">10x8+2</text>") && svg.contains(">1x92+8</text>"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    }
}
