//! The clocks a store judges expiry by: the host's monotonic clock with
//! the boot ID (the default), and tokio's for tests.

use crate::error::{Result, StoreError};

#[cfg(doc)]
use super::SqliteStore;
use super::KIND;

/// A reading of a store clock: milliseconds since an epoch, and the epoch's
/// identity. Readings of different epochs cannot be compared: a lease
/// stamped in another epoch counts as expired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClockReading {
    /// Identifies the epoch (for [`BootClock`], the boot ID).
    pub epoch: String,
    /// Milliseconds since the epoch began.
    pub millis: u64,
}

/// The clock a [`SqliteStore`] judges expiry by. It must be monotonic within
/// an epoch and shared by every process using the file.
pub trait StoreClock: Send + Sync + 'static {
    /// The current reading.
    ///
    /// # Errors
    /// A [`StoreError`] when the clock cannot be read.
    fn now(&self) -> Result<ClockReading, StoreError>;
}

/// The host's monotonic clock (`CLOCK_MONOTONIC`) with the boot ID as
/// epoch: the default. Immune to wall-clock steps, shared by every process
/// of the host, and the clock of the holders' own deadlines (see the module
/// docs on suspend).
#[derive(Debug, Clone)]
pub struct BootClock {
    boot_id: String,
}

impl BootClock {
    /// Reads the boot ID.
    ///
    /// # Errors
    /// A [`StoreError`] when `/proc/sys/kernel/random/boot_id` cannot be
    /// read (not Linux, or `/proc` not mounted).
    pub fn new() -> Result<Self, StoreError> {
        let path = "/proc/sys/kernel/random/boot_id";
        let boot_id = std::fs::read_to_string(path).map_err(|e| {
            StoreError::with_source(KIND, format!("cannot read the boot ID from {path}"), e)
        })?;
        Ok(Self {
            boot_id: boot_id.trim().to_string(),
        })
    }
}

impl StoreClock for BootClock {
    fn now(&self) -> Result<ClockReading, StoreError> {
        let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
            .map_err(|e| StoreError::with_source(KIND, "cannot read CLOCK_MONOTONIC", e))?;
        Ok(ClockReading {
            epoch: self.boot_id.clone(),
            millis: ts.tv_sec() as u64 * 1000 + ts.tv_nsec() as u64 / 1_000_000,
        })
    }
}

/// A clock on tokio's [`tokio::time::Instant`], for tests with a paused
/// clock in ONE process (its epoch is random per instance, so another
/// process sees every lease it stamps as expired).
#[derive(Debug, Clone)]
pub struct TokioClock {
    base: tokio::time::Instant,
    epoch: String,
}

impl TokioClock {
    /// A clock starting at zero now.
    pub fn new() -> Self {
        Self {
            base: tokio::time::Instant::now(),
            epoch: format!("tokio-{:016x}", rand::random::<u64>()),
        }
    }
}

impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

impl StoreClock for TokioClock {
    fn now(&self) -> Result<ClockReading, StoreError> {
        Ok(ClockReading {
            epoch: self.epoch.clone(),
            millis: self.base.elapsed().as_millis() as u64,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_clock_reads_boot_time() {
        let clock = BootClock::new().expect("Linux has a boot ID");
        let a = clock.now().expect("read");
        let b = clock.now().expect("read");
        assert_eq!(a.epoch, b.epoch);
        assert!(b.millis >= a.millis && a.millis > 0);
    }
}
