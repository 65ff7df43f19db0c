//! An SVG line chart of P(loss | f failed drives), one curve per layout.
//!
//! Hand-written SVG: a few dozen lines of markup need no plotting library,
//! and the output is readable in any browser. PNG is the same SVG
//! rasterised by resvg, at twice the size, with the system's fonts.

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

#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the chart could not be drawn: {0}")]
    Svg(#[from] resvg::usvg::Error),
    #[error("no fonts found for the chart's labels; install a font package (Debian: fonts-dejavu-core)")]
    NoFonts,
    #[error("the PNG could not be encoded: {0}")]
    Png(String),
}

/// Rasterises an SVG document (such as [`loss_curves`] returns) to PNG at
/// twice its size.
pub fn svg_to_png(svg: &str) -> Result<Vec<u8>, PlotError> {
    use resvg::{tiny_skia, usvg};
    let mut options = usvg::Options::default();
    let fonts = options.fontdb_mut();
    fonts.load_system_fonts();
    // fontdb's generic sans-serif is Arial, which Debian lacks: fall back to
    // DejaVu or whatever family the system has.
    for family in ["DejaVu Sans", "Liberation Sans", "Noto Sans"] {
        if has_family(fonts, family) {
            fonts.set_sans_serif_family(family);
            break;
        }
    }
    if !has_family(fonts, fonts.family_name(&resvg::usvg::fontdb::Family::SansSerif)) {
        let first = fonts.faces().next().ok_or(PlotError::NoFonts)?;
        let family = first.families.first().ok_or(PlotError::NoFonts)?.0.clone();
        fonts.set_sans_serif_family(family);
    }
    let tree = usvg::Tree::from_str(svg, &options)?;
    let scale = 2.0;
    let size = tree
        .size()
        .to_int_size()
        .scale_by(scale)
        .ok_or(PlotError::Png("empty chart".into()))?;
    let mut pixmap =
        tiny_skia::Pixmap::new(size.width(), size.height()).ok_or(PlotError::Png("chart too large".into()))?;
    resvg::render(
        &tree,
        tiny_skia::Transform::from_scale(scale, scale),
        &mut pixmap.as_mut(),
    );
    pixmap.encode_png().map_err(|e| PlotError::Png(e.to_string()))
}

fn has_family(fonts: &resvg::usvg::fontdb::Database, family: &str) -> bool {
    fonts
        .faces()
        .any(|face| face.families.iter().any(|(name, _)| name == family))
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

    #[test]
    fn png_is_the_chart_drawn_with_labels() {
        let curves = [("10x8+2".to_string(), vec![0.0, 0.0, 0.5, 1.0])];
        let png = super::svg_to_png(&super::loss_curves("t", &curves)).unwrap();
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // IHDR: width and height, big-endian, at twice the SVG's size.
        assert_eq!(u32::from_be_bytes(png[16..20].try_into().unwrap()), 1600);
        assert_eq!(u32::from_be_bytes(png[20..24].try_into().unwrap()), 960);
        // Text was drawn: the same chart without its labels differs.
        let unlabelled = super::loss_curves("", &[(String::new(), vec![0.0, 0.0, 0.5, 1.0])]);
        assert!(
            png != super::svg_to_png(&unlabelled).unwrap(),
            "the labels were not drawn"
        );
    }
}
