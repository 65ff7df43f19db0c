//! The TCO model: what a rack of storage costs per effective terabyte over
//! its deployment term, in the manner of the SNIA storage TCO model.
//!
//! # Theory
//!
//! One rack holds `storage_servers_per_rack` servers with
//! `drives_per_server` drives each, `utility_servers_per_rack` servers with
//! no drives, and `switches_per_rack` switches. Over a term of T years:
//!
//! ```text
//! drives        D   = drives_per_server * storage_servers_per_rack
//! raw TB        R   = D * drive_capacity_gb / 1000
//! effective TB  E   = R * capacity_utilization / (1 - data_reduction) / overhead
//!
//! CapEx storage     = D * drive_capacity_gb * drive_price_per_gb
//! CapEx rack        = (storage + utility servers) * server_cost + switches * switch_cost
//!
//! drive watts       = duty_cycle * active + (1 - duty_cycle) * idle
//! rack watts        = D * drive watts + servers * server_watts + switches * switch_watts
//! OpEx power        = rack watts / 1000 * 8760 h * T * pue * electricity_per_kwh
//! OpEx replacement  = D * drive_afr * T * drive_replacement_cost
//! OpEx rack space   = rack_space_per_month * 12 * T
//!
//! TCO per TBe       = (CapEx + OpEx) / E;  per month: / (12 T)
//! ```
//!
//! `overhead` is raw bytes stored per user byte: 1.5 for 4+2 or 2+1, 3 for
//! three replicas; a layout `SxK+M` gives (K+M)/K. `data_reduction` is the
//! fraction compression and deduplication save (0.5 halves the bytes).
//! `performance_multiplier` does not enter the per-TB figures (the
//! published case's TCO/TBe cells reproduce without it); it is reported as
//! TCO per TBe divided by the multiplier, the cost of a unit of capacity at
//! a unit of performance.
//!
//! # The published case (../shared/reference/snia-tco-case.md)
//!
//! The built-in examples `snia-baseline`, `snia-csd-3.84` and
//! `snia-csd-15.36` reproduce every printed cell but one to the cent or the
//! rounding shown, and TCO per TBe within 0.01%:
//! - Baseline: power 4,650.4 W (72 drives at 6.95 W, 8 servers, a switch)
//!   is $28,516 over 5 years, replacements 72 * 0.44% * 5 * $100 = $158,
//!   rack space $225 * 60 = $13,500; total $42,175 as printed. The copy's
//!   "40% or 45%" data reduction: 40% gives $565.09 as printed, 45% would
//!   give $518.
//! - CSD columns: the printed OpEx $37,269 is $4,906 under the baseline's
//!   with identical drives, which is 800 W less over the term: the copy
//!   says 500 W per server for both, but only 400 W per server (two 24-core
//!   CPUs in place of two 32-core) reproduces it, so the examples use 400 W.
//!   With 500 W, TCO per TBe would be $403.98 and $144.74, 3.8% and 2.6% off.
//! - Not reproducible: the baseline's "OpEx drive failures" cell is garbled
//!   ("?"); the model gives $158, the same drives as the CSD columns. "$225
//!   per rack space" is read as a month per rack; "per U per year" would
//!   need 12 U, which the case never states, and gives the same $13,500.
//!   The headline "CPU savings alone cut TCO 9%" does not follow from the
//!   printed cells and is not reproduced.

use crate::resilience::Layout;
use serde::{Deserialize, Serialize};

/// Hours in the 365-day year the SNIA case uses for energy.
pub const HOURS_PER_YEAR_ENERGY: f64 = 8760.0;

/// Inputs of one scenario: one rack over one term. Field names are the TOML
/// keys and, with `-` for `_`, the `tessera tco` flags.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    #[serde(default)]
    pub name: String,
    pub term_years: f64,
    pub drive_capacity_gb: f64,
    pub drive_price_per_gb: f64,
    pub drive_active_watts: f64,
    pub drive_idle_watts: f64,
    pub drive_afr: f64,
    pub drive_replacement_cost: f64,
    pub server_cost: f64,
    pub server_watts: f64,
    pub drives_per_server: u32,
    pub storage_servers_per_rack: u32,
    pub utility_servers_per_rack: u32,
    pub switch_cost: f64,
    pub switch_watts: f64,
    pub switches_per_rack: u32,
    pub electricity_per_kwh: f64,
    pub pue: f64,
    pub rack_space_per_month: f64,
    pub duty_cycle: f64,
    pub capacity_utilization: f64,
    /// Raw bytes per user byte; give this or `layout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overhead: Option<f64>,
    /// An erasure-coded layout such as `10x8+2`, whose overhead is (K+M)/K.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub layout: Option<String>,
    pub data_reduction: f64,
    pub performance_multiplier: f64,
}

/// The built-in scenarios: (name, TOML).
pub const EXAMPLES: [(&str, &str); 3] = [
    ("snia-baseline", include_str!("../scenarios/snia-baseline.toml")),
    ("snia-csd-3.84", include_str!("../scenarios/snia-csd-3.84.toml")),
    ("snia-csd-15.36", include_str!("../scenarios/snia-csd-15.36.toml")),
];

#[derive(Debug, thiserror::Error)]
pub enum TcoError {
    #[error("scenario is not valid TOML for the TCO model: {0}")]
    Parse(#[from] toml::de::Error),
    #[error("no built-in scenario named '{name}'; the examples are: {known}")]
    UnknownExample { name: String, known: String },
    #[error("{field} = {value} is out of range: it must be {rule}")]
    OutOfRange {
        field: &'static str,
        value: f64,
        rule: &'static str,
    },
    #[error("give exactly one of overhead (raw bytes per user byte) and layout (for example 10x8+2)")]
    Overhead,
    #[error("layout: {0}")]
    Layout(#[from] crate::resilience::LayoutError),
    #[error("a rack needs at least one storage server with at least one drive")]
    NoDrives,
}

/// Everything the model computes for one rack over the term. Money is in
/// the scenario's currency; OpEx is summed over the whole term.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Report {
    pub name: String,
    pub drives_per_rack: u32,
    pub overhead: f64,
    pub raw_tb: f64,
    pub effective_tb: f64,
    pub capex_storage: f64,
    pub capex_rack: f64,
    pub capex_total: f64,
    pub capex_per_raw_tb: f64,
    pub capex_per_effective_tb: f64,
    pub rack_watts: f64,
    pub opex_power: f64,
    pub opex_drive_replacement: f64,
    pub opex_rack_space: f64,
    pub opex_total: f64,
    pub opex_per_raw_tb: f64,
    pub opex_per_effective_tb: f64,
    pub tco_total: f64,
    pub tco_per_raw_tb: f64,
    pub tco_per_effective_tb: f64,
    pub tco_per_effective_tb_month: f64,
    pub tco_per_effective_tb_per_performance: f64,
}

impl Scenario {
    /// Parses and validates a scenario.
    pub fn from_toml(text: &str) -> Result<Scenario, TcoError> {
        let scenario: Scenario = toml::from_str(text)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// A built-in scenario by name.
    pub fn example(name: &str) -> Result<Scenario, TcoError> {
        match EXAMPLES.iter().find(|(n, _)| *n == name) {
            Some((_, text)) => Scenario::from_toml(text),
            None => Err(TcoError::UnknownExample {
                name: name.to_string(),
                known: EXAMPLES.map(|(n, _)| n).join(", "),
            }),
        }
    }

    /// Raw bytes per user byte, from `overhead` or `layout`.
    pub fn overhead(&self) -> Result<f64, TcoError> {
        match (&self.overhead, &self.layout) {
            (Some(overhead), None) => Ok(*overhead),
            (None, Some(layout)) => {
                let layout: Layout = layout.parse()?;
                Ok((layout.data + layout.parity) as f64 / layout.data as f64)
            }
            _ => Err(TcoError::Overhead),
        }
    }

    pub fn validate(&self) -> Result<(), TcoError> {
        let positive = [
            ("term_years", self.term_years),
            ("drive_capacity_gb", self.drive_capacity_gb),
            ("pue", self.pue),
            ("capacity_utilization", self.capacity_utilization),
            ("performance_multiplier", self.performance_multiplier),
        ];
        for (field, value) in positive {
            if !(value > 0.0 && value.is_finite()) {
                return Err(TcoError::OutOfRange {
                    field,
                    value,
                    rule: "a positive number",
                });
            }
        }
        let costs = [
            ("drive_price_per_gb", self.drive_price_per_gb),
            ("drive_active_watts", self.drive_active_watts),
            ("drive_idle_watts", self.drive_idle_watts),
            ("drive_replacement_cost", self.drive_replacement_cost),
            ("server_cost", self.server_cost),
            ("server_watts", self.server_watts),
            ("switch_cost", self.switch_cost),
            ("switch_watts", self.switch_watts),
            ("electricity_per_kwh", self.electricity_per_kwh),
            ("rack_space_per_month", self.rack_space_per_month),
        ];
        for (field, value) in costs {
            if !(value >= 0.0 && value.is_finite()) {
                return Err(TcoError::OutOfRange {
                    field,
                    value,
                    rule: "zero or more",
                });
            }
        }
        let fractions = [
            ("drive_afr", self.drive_afr, 0.0..=1.0),
            ("duty_cycle", self.duty_cycle, 0.0..=1.0),
            ("capacity_utilization", self.capacity_utilization, 0.0..=1.0),
        ];
        for (field, value, range) in fractions {
            if !range.contains(&value) {
                return Err(TcoError::OutOfRange {
                    field,
                    value,
                    rule: "a fraction from 0 to 1 (0.3 is 30%)",
                });
            }
        }
        if !(0.0..1.0).contains(&self.data_reduction) {
            return Err(TcoError::OutOfRange {
                field: "data_reduction",
                value: self.data_reduction,
                rule: "a fraction from 0 up to, not including, 1 (0.5 halves the bytes)",
            });
        }
        let overhead = self.overhead()?;
        if !(overhead >= 1.0 && overhead.is_finite()) {
            return Err(TcoError::OutOfRange {
                field: "overhead",
                value: overhead,
                rule: "at least 1 (raw bytes per user byte)",
            });
        }
        if self.drives_per_server == 0 || self.storage_servers_per_rack == 0 {
            return Err(TcoError::NoDrives);
        }
        Ok(())
    }

    /// Runs the model.
    pub fn report(&self) -> Result<Report, TcoError> {
        self.validate()?;
        let overhead = self.overhead()?;
        let drives = self.drives_per_server * self.storage_servers_per_rack;
        let drive_count = f64::from(drives);
        let servers = f64::from(self.storage_servers_per_rack + self.utility_servers_per_rack);
        let switches = f64::from(self.switches_per_rack);

        let raw_tb = drive_count * self.drive_capacity_gb / 1000.0;
        let effective_tb = raw_tb * self.capacity_utilization / (1.0 - self.data_reduction) / overhead;

        let capex_storage = drive_count * self.drive_capacity_gb * self.drive_price_per_gb;
        let capex_rack = servers * self.server_cost + switches * self.switch_cost;
        let capex_total = capex_storage + capex_rack;

        let drive_watts = self.duty_cycle * self.drive_active_watts + (1.0 - self.duty_cycle) * self.drive_idle_watts;
        let rack_watts = drive_count * drive_watts + servers * self.server_watts + switches * self.switch_watts;
        let kwh = rack_watts / 1000.0 * HOURS_PER_YEAR_ENERGY * self.term_years * self.pue;
        let opex_power = kwh * self.electricity_per_kwh;
        let opex_drive_replacement = drive_count * self.drive_afr * self.term_years * self.drive_replacement_cost;
        let opex_rack_space = self.rack_space_per_month * 12.0 * self.term_years;
        let opex_total = opex_power + opex_drive_replacement + opex_rack_space;

        let tco_total = capex_total + opex_total;
        let tco_per_effective_tb = tco_total / effective_tb;
        Ok(Report {
            name: self.name.clone(),
            drives_per_rack: drives,
            overhead,
            raw_tb,
            effective_tb,
            capex_storage,
            capex_rack,
            capex_total,
            capex_per_raw_tb: capex_total / raw_tb,
            capex_per_effective_tb: capex_total / effective_tb,
            rack_watts,
            opex_power,
            opex_drive_replacement,
            opex_rack_space,
            opex_total,
            opex_per_raw_tb: opex_total / raw_tb,
            opex_per_effective_tb: opex_total / effective_tb,
            tco_total,
            tco_per_raw_tb: tco_total / raw_tb,
            tco_per_effective_tb,
            tco_per_effective_tb_month: tco_per_effective_tb / (12.0 * self.term_years),
            tco_per_effective_tb_per_performance: tco_per_effective_tb / self.performance_multiplier,
        })
    }
}

/// The saving of `b` over `a` in percent of `a` (positive when b costs less).
pub fn saving_percent(a: f64, b: f64) -> f64 {
    (a - b) / a * 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn within(actual: f64, printed: f64, tolerance: f64) {
        assert!(
            (actual - printed).abs() <= tolerance,
            "model gives {actual}, the case prints {printed}"
        );
    }

    /// Every printed cell of the SNIA case that the copy does not mark as
    /// garbled, at the precision printed.
    #[test]
    fn reproduces_the_published_case() {
        let printed = [
            // raw TB, CapEx storage, rack, total, per TB raw, per TBe, rack space, OpEx, TCO/TBe, per month
            (
                "snia-baseline",
                [
                    276.48, 19_354.0, 94_708.0, 114_062.0, 413.0, 412.55, 13_500.0, 42_175.0, 565.09, 9.42,
                ],
            ),
            (
                "snia-csd-3.84",
                [
                    276.48, 19_354.0, 72_500.0, 91_854.0, 332.0, 276.85, 13_500.0, 37_269.0, 389.19, 6.49,
                ],
            ),
            (
                "snia-csd-15.36",
                [
                    1105.92, 77_414.0, 72_500.0, 149_914.0, 136.0, 112.96, 13_500.0, 37_269.0, 141.05, 2.35,
                ],
            ),
        ];
        for (name, cells) in printed {
            let r = Scenario::example(name).unwrap().report().unwrap();
            within(r.raw_tb, cells[0], 0.005);
            within(r.capex_storage, cells[1], 0.5);
            within(r.capex_rack, cells[2], 0.5);
            within(r.capex_total, cells[3], 0.5);
            within(r.capex_per_raw_tb, cells[4], 0.5);
            within(r.capex_per_effective_tb, cells[5], 0.006);
            within(r.opex_rack_space, cells[6], 0.5);
            within(r.opex_total, cells[7], 1.0);
            // The issue asks for 1%; the model does far better.
            within(r.tco_per_effective_tb, cells[8], cells[8] * 0.0001);
            within(r.tco_per_effective_tb_month, cells[9], 0.005);
            within(r.opex_drive_replacement, 158.0, 0.5);
        }
    }

    #[test]
    fn the_case_headline_saving_is_31_percent() {
        let a = Scenario::example("snia-baseline").unwrap().report().unwrap();
        let b = Scenario::example("snia-csd-3.84").unwrap().report().unwrap();
        within(
            saving_percent(a.tco_per_effective_tb, b.tco_per_effective_tb),
            31.1,
            0.05,
        );
    }

    #[test]
    fn a_hand_computed_rack() {
        // One server of 10 drives of 1000 GB at $0.01/GB, drawing 10 W
        // each always; a server of 100 W and $1000; no switch; $0.10/kWh;
        // one year; no failures or rent; 3 replicas, no reduction.
        let text = r#"
            term_years = 1.0
            drive_capacity_gb = 1000.0
            drive_price_per_gb = 0.01
            drive_active_watts = 10.0
            drive_idle_watts = 0.0
            drive_afr = 0.0
            drive_replacement_cost = 0.0
            server_cost = 1000.0
            server_watts = 100.0
            drives_per_server = 10
            storage_servers_per_rack = 1
            utility_servers_per_rack = 0
            switch_cost = 0.0
            switch_watts = 0.0
            switches_per_rack = 0
            electricity_per_kwh = 0.10
            pue = 2.0
            rack_space_per_month = 0.0
            duty_cycle = 1.0
            capacity_utilization = 1.0
            overhead = 3.0
            data_reduction = 0.0
            performance_multiplier = 1.0
        "#;
        let r = Scenario::from_toml(text).unwrap().report().unwrap();
        assert_eq!(r.raw_tb, 10.0);
        within(r.effective_tb, 10.0 / 3.0, 1e-9);
        assert_eq!(r.capex_total, 100.0 + 1000.0);
        // 200 W * 8760 h * PUE 2 = 3504 kWh at $0.10.
        within(r.opex_power, 350.4, 1e-9);
        within(r.tco_per_effective_tb, (1100.0 + 350.4) * 3.0 / 10.0, 1e-9);
    }

    #[test]
    fn a_layout_sets_the_overhead() {
        let mut s = Scenario::example("snia-baseline").unwrap();
        s.overhead = None;
        s.layout = Some("10x8+2".to_string());
        within(s.overhead().unwrap(), 1.25, 1e-12);
        s.layout = Some("1x92+8".to_string());
        within(s.overhead().unwrap(), 100.0 / 92.0, 1e-12);
        s.overhead = Some(1.5);
        assert!(matches!(s.report(), Err(TcoError::Overhead)));
    }

    #[test]
    fn bad_inputs_are_refused_by_name() {
        let mut s = Scenario::example("snia-baseline").unwrap();
        s.data_reduction = 1.0;
        assert!(matches!(
            s.report(),
            Err(TcoError::OutOfRange {
                field: "data_reduction",
                ..
            })
        ));
        let mut s = Scenario::example("snia-baseline").unwrap();
        s.duty_cycle = 30.0;
        assert!(matches!(
            s.report(),
            Err(TcoError::OutOfRange {
                field: "duty_cycle",
                ..
            })
        ));
        assert!(matches!(
            Scenario::from_toml("term_years = 5.0\nbogus = 1"),
            Err(TcoError::Parse(_))
        ));
        assert!(matches!(
            Scenario::example("nope"),
            Err(TcoError::UnknownExample { .. })
        ));
    }
}
