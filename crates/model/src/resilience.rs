//! The resilience calculator: how likely is a layout to lose data?
//!
//! # Theory
//!
//! A layout `SxK+M` has S spans of n = K+M drives, N = S*n drives in all; a
//! span loses data when more than M of its drives are failed at once.
//!
//! **Failures at one instant.** If f of the N drives fail, every set of f
//! drives equally likely, data survives when each span has at most M of
//! them. The number of such sets is the coefficient of x^f in
//!
//! ```text
//!   G(x) = ( sum_{i=0..M} C(n, i) x^i )^S
//! ```
//!
//! (choose i failed drives in each span), so
//! `P(loss | f) = 1 - [x^f] G(x) / C(N, f)`. Coefficients are exact big
//! integers; only the final ratio is rounded to f64. Example: 10x8+2 with
//! f = 3 loses data only if all three fall in one span:
//! `10 * C(10,3) / C(100,3) = 1200 / 161700 = 0.00742`.
//!
//! A Monte Carlo estimate (draw f distinct drives, count per span) is
//! reported beside it with a 95% Wilson interval; the two must agree.
//!
//! **Over time.** Each span is a birth-death Markov chain on the number of
//! failed drives i = 0..M+1: a drive fails at rate (n - i) * lambda, a
//! failed drive is rebuilt at rate i * mu (rebuilds run in parallel), and
//! state M+1 is data loss. With lambda = -ln(1 - AFR) per year and
//! mu = 1 / rebuild time, the mean time to absorption from 0 is
//! `T = sum_i D_i` with `D_0 = 1 / (n lambda)` and
//! `D_i = (1 + i mu D_{i-1}) / ((n - i) lambda)`, which for M = 1 is the
//! textbook `((2n - 1) lambda + mu) / (n (n - 1) lambda^2)`. Spans fail
//! independently, so the layout's MTTDL is T / S and the probability of loss
//! within a mission time t is `1 - exp(-t S / T)` (the exponential
//! approximation, accurate when T is much longer than a rebuild).

use num_bigint::BigUint;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::fmt;

/// Hours in a (Julian) year, for AFRs.
pub const HOURS_PER_YEAR: f64 = 8766.0;
/// Drives in a layout at most: the exact sums stay fast well past this.
pub const DRIVE_COUNT_MAX: usize = 4096;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub spans: usize,
    pub data: usize,
    pub parity: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayoutError {
    #[error("'{text}' is not a layout: write SPANSxK+M, for example 10x8+2 or 1x92+8")]
    Syntax { text: String },
    #[error("layout {text} has no drives that hold data: spans and K must be at least 1")]
    Empty { text: String },
    #[error("layout {text} uses {drives} drives, over the limit of {max}")]
    TooManyDrives { text: String, drives: usize, max: usize },
}

impl Layout {
    pub fn span_drives(&self) -> usize {
        self.data + self.parity
    }

    pub fn drives(&self) -> usize {
        self.spans * self.span_drives()
    }
}

impl fmt::Display for Layout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}+{}", self.spans, self.data, self.parity)
    }
}

impl std::str::FromStr for Layout {
    type Err = LayoutError;

    fn from_str(text: &str) -> Result<Self, LayoutError> {
        let syntax = || LayoutError::Syntax { text: text.to_string() };
        let (spans, code) = text.split_once(['x', 'X']).ok_or_else(syntax)?;
        let (data, parity) = code.split_once('+').ok_or_else(syntax)?;
        let number = |s: &str| s.trim().parse::<usize>().map_err(|_| syntax());
        let layout = Layout {
            spans: number(spans)?,
            data: number(data)?,
            parity: number(parity)?,
        };
        if layout.spans == 0 || layout.data == 0 {
            return Err(LayoutError::Empty { text: text.to_string() });
        }
        let drives = layout
            .spans
            .checked_mul(layout.span_drives())
            .filter(|&d| d <= DRIVE_COUNT_MAX)
            .ok_or(LayoutError::TooManyDrives {
                text: text.to_string(),
                drives: layout.spans.saturating_mul(layout.span_drives()),
                max: DRIVE_COUNT_MAX,
            })?;
        debug_assert!(drives >= 1);
        Ok(layout)
    }
}

fn binomials(n: usize) -> Vec<BigUint> {
    let mut row = vec![BigUint::from(1u32)];
    for k in 1..=n {
        let next = &row[k - 1] * BigUint::from(n - k + 1) / BigUint::from(k);
        row.push(next);
    }
    row
}

/// `numerator / denominator` as f64, for big integers of any size.
fn ratio(numerator: &BigUint, denominator: &BigUint) -> f64 {
    let shift = denominator.bits().saturating_sub(120);
    let to_f64 = |x: &BigUint| {
        let shifted: BigUint = x >> shift;
        shifted
            .to_u64_digits()
            .iter()
            .rev()
            .fold(0.0, |acc, &d| acc * 18446744073709551616.0 + d as f64)
    };
    to_f64(numerator) / to_f64(denominator)
}

/// `P(loss | f failed)` for f = 0..=N, exactly.
pub fn loss_probability(layout: &Layout) -> Vec<f64> {
    let n = layout.span_drives();
    let span_binomials = binomials(n);
    // Survivable failures in one span: sum_{i<=M} C(n,i) x^i.
    let span: Vec<BigUint> = span_binomials[..=layout.parity.min(n)].to_vec();
    let mut survivable = vec![BigUint::from(1u32)];
    for _ in 0..layout.spans {
        let mut product = vec![BigUint::from(0u32); survivable.len() + span.len() - 1];
        for (i, a) in survivable.iter().enumerate() {
            for (j, b) in span.iter().enumerate() {
                product[i + j] += a * b;
            }
        }
        survivable = product;
    }
    let total = binomials(layout.drives());
    (0..=layout.drives())
        .map(|f| {
            let good = survivable.get(f).cloned().unwrap_or_default();
            1.0 - ratio(&good, &total[f])
        })
        .map(|p| p.clamp(0.0, 1.0))
        .collect()
}

/// A Monte Carlo estimate with its 95% Wilson score interval.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Estimate {
    pub probability: f64,
    pub low: f64,
    pub high: f64,
}

/// Wilson score interval for `hits` of `trials` at `z` standard deviations.
pub fn wilson(hits: u64, trials: u64, z: f64) -> Estimate {
    let n = trials as f64;
    let p = hits as f64 / n;
    let denominator = 1.0 + z * z / n;
    let centre = (p + z * z / (2.0 * n)) / denominator;
    let half = z * (p * (1.0 - p) / n + z * z / (4.0 * n * n)).sqrt() / denominator;
    Estimate {
        probability: p,
        low: (centre - half).max(0.0),
        high: (centre + half).min(1.0),
    }
}

/// `P(loss | f)` for f = 0..=N by simulation, `trials` draws each, from `seed`.
pub fn monte_carlo(layout: &Layout, trials: u64, seed: u64) -> Vec<Estimate> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let drives = layout.drives();
    let n = layout.span_drives();
    let mut order: Vec<usize> = (0..drives).collect();
    let mut per_span = vec![0usize; layout.spans];
    (0..=drives)
        .map(|f| {
            let mut losses = 0u64;
            for _ in 0..trials {
                per_span.fill(0);
                let mut lost = false;
                // A partial Fisher-Yates shuffle draws f distinct drives.
                for i in 0..f {
                    let j = rng.gen_range(i..drives);
                    order.swap(i, j);
                    let span = order[i] / n;
                    per_span[span] += 1;
                    lost |= per_span[span] > layout.parity;
                }
                losses += u64::from(lost);
            }
            wilson(losses, trials, 1.96)
        })
        .collect()
}

/// Mean time to data loss of one span, in hours.
pub fn span_mttdl_hours(span_drives: usize, parity: usize, afr: f64, rebuild_hours: f64) -> f64 {
    assert!(afr > 0.0 && afr < 1.0 && rebuild_hours > 0.0);
    let lambda = -(1.0 - afr).ln() / HOURS_PER_YEAR;
    let mu = 1.0 / rebuild_hours;
    let mut total = 0.0;
    let mut previous = 0.0;
    for i in 0..=parity.min(span_drives - 1) {
        let d = (1.0 + i as f64 * mu * previous) / ((span_drives - i) as f64 * lambda);
        total += d;
        previous = d;
    }
    total
}

/// The report for one layout, in the shape `tessera resilience --json` prints.
#[derive(Clone, Debug, Serialize)]
pub struct LayoutReport {
    pub layout: String,
    pub drives: usize,
    pub loss_probability: Vec<f64>,
    pub monte_carlo: Vec<Estimate>,
    pub mttdl_hours: Option<f64>,
    pub mission_loss_probability: Option<f64>,
}

/// Options for the time-based part of the model.
#[derive(Clone, Copy, Debug)]
pub struct Reliability {
    pub afr: f64,
    pub rebuild_hours: f64,
    pub mission_hours: f64,
}

pub fn report(layout: &Layout, trials: u64, seed: u64, reliability: Option<Reliability>) -> LayoutReport {
    let mttdl = reliability
        .map(|r| span_mttdl_hours(layout.span_drives(), layout.parity, r.afr, r.rebuild_hours) / layout.spans as f64);
    LayoutReport {
        layout: layout.to_string(),
        drives: layout.drives(),
        loss_probability: loss_probability(layout),
        monte_carlo: monte_carlo(layout, trials, seed),
        mttdl_hours: mttdl,
        mission_loss_probability: reliability.zip(mttdl).map(|(r, t)| -(-r.mission_hours / t).exp_m1()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(text: &str) -> Layout {
        text.parse().unwrap()
    }

    #[test]
    fn single_span_loses_nothing_up_to_m_and_everything_beyond() {
        let p = loss_probability(&layout("1x8+3"));
        assert!(p[..=3].iter().all(|&x| x == 0.0));
        assert!(p[4..].iter().all(|&x| x == 1.0));
    }

    #[test]
    fn three_failures_in_ten_spans_of_8_plus_2() {
        let p = loss_probability(&layout("10x8+2"));
        let expected = 10.0 * 120.0 / 161_700.0;
        assert!((p[3] - expected).abs() < 1e-15, "{} vs {expected}", p[3]);
        assert_eq!(p[2], 0.0);
    }

    #[test]
    fn pigeonhole_makes_loss_certain() {
        // 10 spans each tolerating 2: 21 failures must put 3 in some span.
        let p = loss_probability(&layout("10x8+2"));
        assert_eq!(p[21], 1.0);
        assert!(p[20] < 1.0);
        assert_eq!(*p.last().unwrap(), 1.0);
    }

    #[test]
    fn wide_layouts_are_exact_without_overflow() {
        let p = loss_probability(&layout("1x92+8"));
        assert_eq!(p[8], 0.0);
        assert_eq!(p[9], 1.0);
        let p = loss_probability(&layout("20x17+3"));
        assert!(p.iter().all(|x| x.is_finite() && (0.0..=1.0).contains(x)));
        assert!(p.windows(2).all(|w| w[0] <= w[1] + 1e-12), "more failures never help");
    }

    #[test]
    fn monte_carlo_agrees_with_the_exact_answer() {
        for text in ["10x8+2", "5x17+3", "3x4+1"] {
            let l = layout(text);
            let exact = loss_probability(&l);
            let simulated = monte_carlo(&l, 4000, 7);
            for (f, (e, s)) in exact.iter().zip(&simulated).enumerate() {
                // The 95% interval misses now and then by design; four standard
                // errors of slack keeps this deterministic (fixed seed) test honest.
                let slack = 4.0 * (e * (1.0 - e) / 4000.0).sqrt() + 1e-9;
                assert!(
                    s.low - slack <= *e && *e <= s.high + slack,
                    "{text} f={f}: exact {e}, simulated {s:?}"
                );
            }
        }
    }

    #[test]
    fn markov_chain_matches_the_closed_form_for_one_parity() {
        let (n, afr, rebuild) = (9usize, 0.02, 24.0);
        let lambda = -(1.0f64 - afr).ln() / HOURS_PER_YEAR;
        let mu = 1.0 / rebuild;
        let closed = ((2.0 * n as f64 - 1.0) * lambda + mu) / (n as f64 * (n as f64 - 1.0) * lambda * lambda);
        let chain = span_mttdl_hours(n, 1, afr, rebuild);
        assert!((chain - closed).abs() / closed < 1e-12);
        // More parity lasts longer.
        assert!(span_mttdl_hours(n, 2, afr, rebuild) > 100.0 * chain);
    }

    #[test]
    fn layouts_parse_and_bad_ones_are_refused() {
        assert_eq!(
            layout("10x8+2"),
            Layout {
                spans: 10,
                data: 8,
                parity: 2
            }
        );
        assert!(matches!("8+2".parse::<Layout>(), Err(LayoutError::Syntax { .. })));
        assert!(matches!("0x8+2".parse::<Layout>(), Err(LayoutError::Empty { .. })));
        assert!(matches!(
            "1000x8+2".parse::<Layout>(),
            Err(LayoutError::TooManyDrives { .. })
        ));
    }
}
