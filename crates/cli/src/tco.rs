//! `tessera tco`: the TCO model from a TOML file, a built-in example, or
//! flags, one scenario or two side by side.

use anyhow::{Context, Result};
use clap::Args;
use serde::Serialize;
use std::path::Path;
use tessera_model::tco::{saving_percent, Report, Scenario, EXAMPLES};

/// One flag per scenario field, each overriding the file or example. The
/// names are the TOML keys with `-` for `_`.
#[derive(Args, Serialize, Default)]
pub struct Overrides {
    /// Deployment term in years.
    #[arg(long)]
    term_years: Option<f64>,
    /// Drive capacity in GB (10^9 bytes).
    #[arg(long)]
    drive_capacity_gb: Option<f64>,
    /// Drive price per GB.
    #[arg(long)]
    drive_price_per_gb: Option<f64>,
    /// Drive power when active, in watts.
    #[arg(long)]
    drive_active_watts: Option<f64>,
    /// Drive power when idle, in watts.
    #[arg(long)]
    drive_idle_watts: Option<f64>,
    /// Drive annual failure rate (0.0044 = 0.44%).
    #[arg(long)]
    drive_afr: Option<f64>,
    /// Cost of replacing one failed drive (labour and logistics; the drive is under warranty).
    #[arg(long)]
    drive_replacement_cost: Option<f64>,
    /// Price of one server.
    #[arg(long)]
    server_cost: Option<f64>,
    /// Power of one server, in watts.
    #[arg(long)]
    server_watts: Option<f64>,
    /// Drives in each storage server.
    #[arg(long)]
    drives_per_server: Option<u32>,
    /// Storage servers in a rack.
    #[arg(long)]
    storage_servers_per_rack: Option<u32>,
    /// Servers in a rack with no drives (monitors, gateways).
    #[arg(long)]
    utility_servers_per_rack: Option<u32>,
    /// Price of one switch.
    #[arg(long)]
    switch_cost: Option<f64>,
    /// Power of one switch, in watts.
    #[arg(long)]
    switch_watts: Option<f64>,
    /// Switches in a rack.
    #[arg(long)]
    switches_per_rack: Option<u32>,
    /// Electricity price per kWh.
    #[arg(long)]
    electricity_per_kwh: Option<f64>,
    /// Power usage effectiveness of the data centre (1.0 = no cooling overhead).
    #[arg(long)]
    pue: Option<f64>,
    /// Rent for one rack's space per month.
    #[arg(long)]
    rack_space_per_month: Option<f64>,
    /// Fraction of time the drives are active rather than idle.
    #[arg(long)]
    duty_cycle: Option<f64>,
    /// Fraction of raw capacity filled with data.
    #[arg(long)]
    capacity_utilization: Option<f64>,
    /// Raw bytes stored per user byte (1.5 for 4+2, 3 for three replicas).
    #[arg(long, conflicts_with = "layout")]
    overhead: Option<f64>,
    /// An erasure-coded layout such as 10x8+2; sets the overhead to (K+M)/K.
    #[arg(long)]
    layout: Option<String>,
    /// Fraction of bytes saved by compression and deduplication (0.5 halves them).
    #[arg(long)]
    data_reduction: Option<f64>,
    /// Relative performance, reported as TCO per effective TB per unit of performance.
    #[arg(long)]
    performance_multiplier: Option<f64>,
}

impl Overrides {
    fn apply(&self, scenario: Scenario) -> Result<Scenario> {
        let serde_json::Value::Object(mut overrides) = serde_json::to_value(self)? else {
            unreachable!("a struct serialises to an object")
        };
        // Flags not given are null.
        overrides.retain(|_, value| !value.is_null());
        if overrides.is_empty() {
            return Ok(scenario);
        }
        let serde_json::Value::Object(mut fields) = serde_json::to_value(&scenario)? else {
            unreachable!("a struct serialises to an object")
        };
        // A layout replaces the overhead and the other way round.
        if overrides.contains_key("layout") {
            fields.remove("overhead");
        }
        if overrides.contains_key("overhead") {
            fields.remove("layout");
        }
        fields.extend(overrides);
        let scenario: Scenario = serde_json::from_value(serde_json::Value::Object(fields))?;
        scenario.validate()?;
        Ok(scenario)
    }
}

/// A scenario from a file path, or else a built-in example's name.
fn load(source: &str) -> Result<Scenario> {
    let path = Path::new(source);
    if path.exists() {
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let mut scenario = Scenario::from_toml(&text).with_context(|| format!("in {}", path.display()))?;
        if scenario.name.is_empty() {
            scenario.name = source.to_string();
        }
        return Ok(scenario);
    }
    Scenario::example(source).with_context(|| format!("'{source}' is neither a file nor a built-in example"))
}

/// `tessera tco`'s flags.
#[derive(Args)]
pub struct Options {
    /// A scenario: a TOML file, or a built-in example (snia-baseline, snia-csd-3.84, snia-csd-15.36).
    pub scenario: Option<String>,
    /// Two scenarios (files or examples) side by side, with B's saving over A.
    #[arg(long, num_args = 2, value_names = ["A", "B"])]
    pub compare: Vec<String>,
    #[command(flatten)]
    pub overrides: Box<Overrides>,
    /// Print the scenario (after flags) as TOML, a starting point for a file of your own.
    #[arg(long)]
    pub print_toml: bool,
    /// Print one JSON object: {"inputs": ..., "report": ...}.
    #[arg(long)]
    pub json: bool,
}

pub fn run(options: &Options) -> Result<()> {
    if options.compare.is_empty() {
        let Some(source) = options.scenario.as_deref() else {
            anyhow::bail!(
                "name a scenario: a TOML file or a built-in example ({}), or --compare A B",
                EXAMPLES.map(|(n, _)| n).join(", ")
            );
        };
        let scenario = options.overrides.apply(load(source)?)?;
        if options.print_toml {
            print!("{}", toml::to_string(&scenario)?);
            return Ok(());
        }
        let report = scenario.report()?;
        if options.json {
            println!("{}", serde_json::json!({ "inputs": scenario, "report": report }));
        } else {
            print_table(&[&report]);
        }
        return Ok(());
    }
    anyhow::ensure!(
        options.scenario.is_none() && !options.print_toml,
        "--compare takes its two scenarios itself; give no other scenario"
    );
    let [a, b] = options.compare.as_slice() else {
        anyhow::bail!("--compare takes two scenarios");
    };
    let (a, b) = (options.overrides.apply(load(a)?)?, options.overrides.apply(load(b)?)?);
    let (ra, rb) = (a.report()?, b.report()?);
    let saving = saving_percent(ra.tco_per_effective_tb, rb.tco_per_effective_tb);
    if options.json {
        println!(
            "{}",
            serde_json::json!({
                "a": { "inputs": a, "report": ra },
                "b": { "inputs": b, "report": rb },
                "tco_per_effective_tb_saving_percent": saving,
                "tco_per_effective_tb_per_performance_saving_percent": saving_percent(
                    ra.tco_per_effective_tb_per_performance,
                    rb.tco_per_effective_tb_per_performance
                ),
            })
        );
    } else {
        print_table(&[&ra, &rb]);
        println!(
            "\nB saves {saving:.1}% of A's TCO per effective TB ({:.1}% per unit of performance)",
            saving_percent(
                ra.tco_per_effective_tb_per_performance,
                rb.tco_per_effective_tb_per_performance
            )
        );
    }
    Ok(())
}

/// One row per output; with two reports, a third column with B's change
/// from A in percent.
fn print_table(reports: &[&Report]) {
    type Cell = fn(&Report) -> f64;
    let rows: [(&str, Cell, usize); 20] = [
        ("drives per rack", |r| f64::from(r.drives_per_rack), 0),
        ("overhead (raw/user)", |r| r.overhead, 3),
        ("raw TB", |r| r.raw_tb, 2),
        ("effective TB", |r| r.effective_tb, 2),
        ("CapEx storage", |r| r.capex_storage, 0),
        ("CapEx servers+switches", |r| r.capex_rack, 0),
        ("CapEx total", |r| r.capex_total, 0),
        ("CapEx per raw TB", |r| r.capex_per_raw_tb, 2),
        ("CapEx per effective TB", |r| r.capex_per_effective_tb, 2),
        ("rack power (W)", |r| r.rack_watts, 1),
        ("OpEx power", |r| r.opex_power, 0),
        ("OpEx drive replacement", |r| r.opex_drive_replacement, 0),
        ("OpEx rack space", |r| r.opex_rack_space, 0),
        ("OpEx total (term)", |r| r.opex_total, 0),
        ("OpEx per effective TB", |r| r.opex_per_effective_tb, 2),
        ("TCO total", |r| r.tco_total, 0),
        ("TCO per raw TB", |r| r.tco_per_raw_tb, 2),
        ("TCO per effective TB", |r| r.tco_per_effective_tb, 2),
        ("  per month", |r| r.tco_per_effective_tb_month, 2),
        ("  per unit performance", |r| r.tco_per_effective_tb_per_performance, 2),
    ];
    let names: Vec<&str> = reports.iter().map(|r| r.name.as_str()).collect();
    for (i, name) in names.iter().enumerate() {
        println!("{}: {name}", ["A", "B"][i.min(1)]);
    }
    let mut header = format!("{:<26}", "per rack, over the term");
    for i in 0..reports.len() {
        header += &format!(" {:>14}", ["A", "B"][i.min(1)]);
    }
    if reports.len() == 2 {
        header += &format!(" {:>9}", "B vs A");
    }
    println!("{header}");
    for (label, cell, decimals) in rows {
        let mut line = format!("{label:<26}");
        for r in reports {
            line += &format!(" {:>14.*}", decimals, cell(r));
        }
        if let [a, b] = reports {
            let (a, b) = (cell(a), cell(b));
            if a != 0.0 {
                line += &format!(" {:>+8.1}%", (b - a) / a * 100.0);
            }
        }
        println!("{line}");
    }
}
