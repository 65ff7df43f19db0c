//! The NBD side of `serve`: the array's volumes as exports by name, each
//! request's error logged and mapped to the errno an NBD client expects,
//! and timed (for the API's latency, and for metrics when they are on).

use std::sync::Arc;
use std::time::Instant;
use tessera_array::{Array, ArrayError};
use tessera_nbd::Failure;

use super::dispatch::{LatencyCounters, Timed};
use crate::metrics::{Metrics, Op};

/// An export: one volume of the array, with errors logged and mapped to
/// NBD errnos, and each request timed.
pub(super) struct ArrayExport {
    volume: tessera_array::Volume,
    metrics: Option<Arc<Metrics>>,
    latency: Arc<LatencyCounters>,
}

/// The exports: the array's volumes by name, the default one first (and
/// for the empty name), as they are when a client asks.
pub(super) struct Volumes {
    pub array: Arc<Array>,
    pub metrics: Option<Arc<Metrics>>,
    pub latency: Arc<LatencyCounters>,
    pub dir: String,
}

impl tessera_nbd::Catalog<ArrayExport> for Volumes {
    fn list(&self) -> Vec<(String, String)> {
        self.array
            .volumes()
            .into_iter()
            .filter(|v| !v.name.starts_with(tessera_kv::store::VOLUME_PREFIX))
            .map(|v| {
                let description = format!("Tessera array {}, volume {}", self.dir, v.name);
                (v.name, description)
            })
            .collect()
    }

    fn open(&self, name: &str) -> Option<Arc<ArrayExport>> {
        let name = if name.is_empty() {
            tessera_array::volume::DEFAULT_VOLUME_NAME
        } else {
            name
        };
        // A KV space's volume is the space's own: no client writes it.
        if name.starts_with(tessera_kv::store::VOLUME_PREFIX) {
            return None;
        }
        let volume = self.array.volume(name).ok()?;
        Some(Arc::new(ArrayExport {
            volume,
            metrics: self.metrics.clone(),
            latency: self.latency.clone(),
        }))
    }
}

impl ArrayExport {
    /// Runs a request of `bytes` (`op`): timed (and counted in the
    /// metrics when they are on), its error logged and mapped to the NBD
    /// errno.
    fn run<T>(&self, op: Op, bytes: u64, request: impl FnOnce() -> Result<T, ArrayError>) -> Result<T, Failure> {
        let started = Instant::now();
        let result = request();
        if let Some(metrics) = &self.metrics {
            metrics.record(op, bytes, started, result.is_ok());
        }
        let timed = match op {
            Op::Read => Some(Timed::Read),
            Op::Write => Some(Timed::Write),
            Op::Flush => Some(Timed::Flush),
            Op::Trim | Op::WriteZeroes => Some(Timed::Zero),
            _ => None,
        };
        if let Some(timed) = timed {
            self.latency.record(timed, started.elapsed());
        }
        result.map_err(|e| {
            eprintln!("tessera: {} failed: {e}", op.name().replace('_', " "));
            Failure {
                errno: nbd_errno(&e),
                message: Some(e.to_string()),
            }
        })
    }
}

/// The errno an NBD client sees for an error of the array: EINVAL for a
/// range outside the volume, ENOSPC for a full array, ENODEV for a volume
/// deleted under it (as a pulled device), EIO for the rest.
fn nbd_errno(error: &ArrayError) -> u32 {
    match error {
        ArrayError::OutOfRange { .. } => 22,
        ArrayError::NoSpace => 28,
        ArrayError::VolumeGone { .. } => 19,
        _ => 5,
    }
}

impl tessera_nbd::Export for ArrayExport {
    fn size(&self) -> u64 {
        self.volume.size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure> {
        self.run(Op::Read, buf.len() as u64, || self.volume.read(offset, buf))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Failure> {
        self.run(Op::Write, data.len() as u64, || self.volume.write(offset, data, fua))
    }
    fn flush(&self) -> Result<(), Failure> {
        self.run(Op::Flush, 0, || self.volume.flush())
    }
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
        self.run(Op::Trim, len, || self.volume.write_zeroes(offset, len, fua))
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure> {
        self.run(Op::WriteZeroes, len, || self.volume.write_zeroes(offset, len, fua))
    }
    fn cache(&self, offset: u64, len: u64) -> Result<(), Failure> {
        self.run(Op::Cache, len, || self.volume.prefetch(offset, len))
    }
    fn block_status(&self, offset: u64, len: u64) -> Result<Vec<(u64, u32)>, Failure> {
        let runs = self.run(Op::BlockStatus, len, || self.volume.allocation(offset, len))?;
        let hole = tessera_nbd::STATE_HOLE | tessera_nbd::STATE_ZERO;
        Ok(runs
            .into_iter()
            .map(|(bytes, stored)| (bytes, if stored { 0 } else { hole }))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::nbd_errno;
    use tessera_array::ArrayError;

    #[test]
    fn array_errors_reach_nbd_clients_as_their_errno() {
        let gone = ArrayError::VolumeGone { name: "v".to_string() };
        let range = ArrayError::OutOfRange {
            offset: 0,
            len: 1,
            size: 0,
        };
        assert_eq!(nbd_errno(&gone), 19);
        assert_eq!(nbd_errno(&range), 22);
        assert_eq!(nbd_errno(&ArrayError::NoSpace), 28);
        assert_eq!(nbd_errno(&ArrayError::Unreadable { slot: 3 }), 5);
    }
}
