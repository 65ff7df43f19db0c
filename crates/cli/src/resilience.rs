//! `tessera resilience`: the probability of data loss for layouts
//! SPANSxK+M, exact and by Monte Carlo, and over a mission (the model
//! crate's `resilience`).

use anyhow::{Context, Result};
use std::path::PathBuf;

/// `tessera resilience`'s flags.
#[derive(clap::Args)]
pub struct Resilience {
    /// A layout such as 10x8+2 or 1x92+8; repeat to compare.
    #[arg(long = "layout", required = true)]
    pub layouts: Vec<tessera_model::resilience::Layout>,
    /// Drive annual failure rate (0.01 = 1%), for MTTDL.
    #[arg(long)]
    pub afr: Option<f64>,
    /// Hours to rebuild one failed drive.
    #[arg(long, default_value_t = 24.0)]
    pub rebuild_hours: f64,
    /// Mission time for the probability of loss over time.
    #[arg(long, default_value_t = 5.0)]
    pub mission_years: f64,
    /// Monte Carlo draws for each number of failed drives.
    #[arg(long, default_value_t = 10_000)]
    pub trials: u64,
    /// Monte Carlo seed (printed, so a run can be repeated).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Write the loss curves of all layouts to this file: .svg, or .png (drawn with the system's fonts).
    #[arg(long)]
    pub plot: Option<PathBuf>,
    /// Print one JSON object: {"layouts": [...]}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Resilience) -> Result<()> {
    let Resilience {
        layouts,
        afr,
        rebuild_hours,
        mission_years,
        trials,
        seed,
        plot,
        json,
    } = args;
    let (afr, rebuild_hours, mission_years, trials, seed, plot, json) = (
        *afr,
        *rebuild_hours,
        *mission_years,
        *trials,
        *seed,
        plot.as_deref(),
        *json,
    );
    use tessera_model::resilience::{self, Reliability, HOURS_PER_YEAR};
    if let Some(afr) = afr {
        anyhow::ensure!(
            afr > 0.0 && afr < 1.0,
            "--afr must be between 0 and 1 (0.01 is 1% a year)"
        );
    }
    anyhow::ensure!(rebuild_hours > 0.0, "--rebuild-hours must be positive");
    anyhow::ensure!(trials > 0, "--trials must be at least 1");
    let reliability = afr.map(|afr| Reliability {
        afr,
        rebuild_hours,
        mission_hours: mission_years * HOURS_PER_YEAR,
    });
    let reports: Vec<_> = layouts
        .iter()
        .map(|l| resilience::report(l, trials, seed, reliability))
        .collect();
    if let Some(path) = plot {
        let curves: Vec<(String, Vec<f64>)> = reports
            .iter()
            .map(|r| (r.layout.clone(), r.loss_probability.clone()))
            .collect();
        let svg = tessera_model::plot::loss_curves("Probability of data loss by drives failed", &curves);
        let png = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("png"));
        let bytes = if png {
            tessera_model::plot::svg_to_png(&svg)?
        } else {
            svg.into_bytes()
        };
        std::fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))?;
        eprintln!("wrote {}", path.display());
    }
    if json {
        println!("{}", serde_json::json!({ "layouts": reports }));
        return Ok(());
    }
    println!("Monte Carlo: {trials} draws per row, seed {seed}; interval is 95% (Wilson)");
    for r in &reports {
        println!("\n{} ({} drives)", r.layout, r.drives);
        if let Some(mttdl) = r.mttdl_hours {
            println!(
                "  MTTDL {:.3e} hours ({:.3e} years); P(loss within {mission_years} years) = {:.3e}",
                mttdl,
                mttdl / HOURS_PER_YEAR,
                r.mission_loss_probability.unwrap_or(0.0)
            );
        }
        println!(
            "  {:>6} {:>14} {:>14} {:>25}",
            "failed", "P(loss) exact", "monte carlo", "95% interval"
        );
        // Rows from the last certain survival to the first certain loss.
        let first = r.loss_probability.iter().rposition(|&p| p == 0.0).unwrap_or(0);
        let last = r.loss_probability.iter().position(|&p| p >= 1.0).unwrap_or(r.drives);
        for f in first..=last.min(r.drives) {
            let mc = &r.monte_carlo[f];
            println!(
                "  {f:>6} {:>14.6e} {:>14.6e}   [{:.4e}, {:.4e}]",
                r.loss_probability[f], mc.probability, mc.low, mc.high
            );
        }
    }
    Ok(())
}
