//! Planning models for choosing a layout and hardware before buying it.
//!
//! - [`resilience`]: the exact probability that a layout loses data when f
//!   drives fail at once, a Monte Carlo check of it, and MTTDL from a
//!   Markov model with rebuilds.
//! - [`plot`]: the loss curves of several layouts on one SVG chart (and PNG).
//! - [`tco`]: total cost of ownership per effective terabyte, SNIA style.

pub mod plot;
pub mod resilience;
pub mod tco;
