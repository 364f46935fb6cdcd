//! What a simulation run does: its size, its holders' behaviour and the
//! probability of every fault.

use std::ops::RangeInclusive;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;

use crate::store::LeaseStore;

/// Wraps each store a run builds, between the store and the fault layer:
/// how a test puts a deliberately broken store variant (a mutant) under
/// the simulation. Called once per store value per run, inside the run's
/// runtime.
pub type StoreWrapper = Arc<dyn Fn(Arc<dyn LeaseStore>) -> Arc<dyn LeaseStore> + Send + Sync>;

/// A delay of one kind: with `probability`, a wait drawn uniformly from
/// zero to `short_max`, or (with `long_probability` of those) up to
/// `long_max`: a request stuck in a queue, a GC pause of the server.
#[derive(Clone, Debug)]
pub struct Delay {
    /// Probability that a call is delayed at all.
    pub probability: f64,
    /// Upper bound of an ordinary delay.
    pub short_max: Duration,
    /// Of the delayed calls, the fraction delayed by up to `long_max`.
    pub long_probability: f64,
    /// Upper bound of a long delay (beyond the TTL: a request that arrives
    /// after its sender gave up).
    pub long_max: Duration,
}

impl Delay {
    /// No delay.
    pub fn none() -> Self {
        Self {
            probability: 0.0,
            short_max: Duration::ZERO,
            long_probability: 0.0,
            long_max: Duration::ZERO,
        }
    }

    /// Draws a delay. Always takes the same number of values from `rng`,
    /// whatever the outcome, so that one decision never shifts the others.
    pub(crate) fn draw(&self, rng: &mut StdRng) -> Duration {
        let (hit, long, x) = (rng.gen::<f64>(), rng.gen::<f64>(), rng.gen::<f64>());
        if hit >= self.probability {
            return Duration::ZERO;
        }
        let max = if long < self.long_probability {
            self.long_max
        } else {
            self.short_max
        };
        whole_ms(max.mul_f64(x))
    }
}

/// The faults of the register underneath a [`crate::store::register::RegisterStore`]
/// (only for [`super::Backend::Register`]): they make adapters interleave
/// between read and compare-and-swap, and make register writes ambiguous.
#[derive(Clone, Debug)]
pub struct RegisterFaults {
    /// Delay of a register read (before or after it takes effect).
    pub read_delay: Delay,
    /// Delay of a register write before it takes effect.
    pub write_delay: Delay,
    /// Probability that a write fails before it takes effect.
    pub write_error: f64,
    /// Probability that a write takes effect but its reply is lost: the
    /// adapter sees a store error for a write that happened.
    pub write_lost_reply: f64,
}

/// The probability and size of every fault the simulation injects. See the
/// module docs for what each models.
#[derive(Clone, Debug)]
pub struct FaultConfig {
    /// Delay of a request before the store applies it.
    pub delay_before: Delay,
    /// Delay of a reply after the store applied the request.
    pub delay_after: Delay,
    /// Probability that a request fails before the store sees it.
    pub error_before: f64,
    /// Probability that the store applies a request and the reply is lost:
    /// the caller sees a store error ("timed out") at `reply_timeout` after
    /// it sent the request.
    pub lost_reply: f64,
    /// When the caller of a lost reply gives up.
    pub reply_timeout: Duration,
    /// Up to this many intervals per run in which the store is unreachable
    /// (every request sent then fails without reaching it).
    pub max_outages: usize,
    /// Length of an outage, drawn uniformly.
    pub outage: RangeInclusive<Duration>,
    /// Probability, per step of a holder's session, that the holder process
    /// freezes (GC, SIGSTOP, VM migration): no request leaves it and no
    /// reply reaches it while simulated time moves on.
    pub freeze: f64,
    /// Length of a freeze, drawn uniformly.
    pub freeze_length: RangeInclusive<Duration>,
    /// Bound of each holder's clock-rate error: a holder's clock runs at
    /// `1 + rho` times real time, `rho` drawn uniformly from
    /// `-max_drift..=max_drift`. S1 holds while `max_drift` is at most
    /// safety margin / TTL (module docs, "Clocks").
    pub max_drift: f64,
    /// Probability, per reply carrying a wall-clock expiry, that the wall
    /// clock behind it steps forward or back.
    pub wall_step: f64,
    /// Largest wall-clock step.
    pub wall_step_max: Duration,
    /// Faults of the register underneath the register adapter.
    pub register: RegisterFaults,
}

impl FaultConfig {
    /// No faults at all.
    pub fn none() -> Self {
        Self {
            delay_before: Delay::none(),
            delay_after: Delay::none(),
            error_before: 0.0,
            lost_reply: 0.0,
            reply_timeout: Duration::from_millis(250),
            max_outages: 0,
            outage: Duration::ZERO..=Duration::ZERO,
            freeze: 0.0,
            freeze_length: Duration::ZERO..=Duration::ZERO,
            max_drift: 0.0,
            wall_step: 0.0,
            wall_step_max: Duration::ZERO,
            register: RegisterFaults {
                read_delay: Delay::none(),
                write_delay: Delay::none(),
                write_error: 0.0,
                write_lost_reply: 0.0,
            },
        }
    }

    /// The default fault mix for a TTL of `ttl`: every kind on, each rare
    /// enough that leases still change hands many times per run.
    pub fn for_ttl(ttl: Duration) -> Self {
        let delay = Delay {
            probability: 0.08,
            short_max: ttl / 20,
            long_probability: 0.15,
            long_max: ttl.mul_f64(1.5),
        };
        Self {
            delay_before: delay.clone(),
            delay_after: delay,
            error_before: 0.03,
            lost_reply: 0.03,
            reply_timeout: ttl / 4,
            max_outages: 3,
            outage: ttl / 10..=ttl * 2,
            freeze: 0.04,
            freeze_length: ttl / 2..=ttl * 3,
            max_drift: 0.05,
            wall_step: 0.02,
            wall_step_max: Duration::from_secs(3600),
            register: RegisterFaults {
                read_delay: Delay {
                    probability: 0.1,
                    short_max: ttl / 20,
                    long_probability: 0.1,
                    long_max: ttl,
                },
                write_delay: Delay {
                    probability: 0.1,
                    short_max: ttl / 20,
                    long_probability: 0.1,
                    long_max: ttl,
                },
                write_error: 0.02,
                write_lost_reply: 0.02,
            },
        }
    }
}

/// One simulation run's settings. Each seed draws its own scenario within
/// these bounds (number of holders and work IDs, each holder's drift, the
/// outage schedule), so a campaign of seeds covers calm and contended runs.
#[derive(Clone)]
pub struct SimConfig {
    /// How many holders (each with its own holder ID, `Leases` handle and
    /// fault-injecting link to the store).
    pub holders: RangeInclusive<usize>,
    /// How many work IDs they compete for.
    pub work_ids: RangeInclusive<usize>,
    /// The lease TTL (whole milliseconds).
    pub ttl: Duration,
    /// The holders' safety margin (whole milliseconds).
    pub safety_margin: Duration,
    /// Simulated time per run; holders start no new session after it.
    pub duration: Duration,
    /// Probability that a session renews in the background
    /// ([`crate::Leases::start_renewal`]) instead of by hand.
    pub renewal_sessions: f64,
    /// Probability that a holder acquires several work IDs at once
    /// ([`crate::Leases::acquire_many`]) and renews them together in the
    /// background, in batches of its handle's session.
    pub batch_sessions: f64,
    /// Probability that a session ends with a release (otherwise the holder
    /// crashes: it abandons the lease, which must expire).
    pub release: f64,
    /// Probability that a contender told `Held` sleeps exactly until the
    /// expiry the store reported (an aggressive contender).
    pub aggressive_contender: f64,
    /// The faults.
    pub faults: FaultConfig,
    /// A wrapper put around every store the run builds (mutation tests).
    pub wrap: Option<StoreWrapper>,
}

impl std::fmt::Debug for SimConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimConfig")
            .field("holders", &self.holders)
            .field("work_ids", &self.work_ids)
            .field("ttl", &self.ttl)
            .field("safety_margin", &self.safety_margin)
            .field("duration", &self.duration)
            .field("renewal_sessions", &self.renewal_sessions)
            .field("batch_sessions", &self.batch_sessions)
            .field("release", &self.release)
            .field("faults", &self.faults)
            .field("wrapped", &self.wrap.is_some())
            .finish()
    }
}

impl Default for SimConfig {
    /// 2 to 7 holders on 1 to 3 work IDs, TTL 1 s, margin 100 ms, 30 s of
    /// simulated time, the default fault mix of [`FaultConfig::for_ttl`].
    fn default() -> Self {
        let ttl = Duration::from_millis(1000);
        Self {
            holders: 2..=7,
            work_ids: 1..=3,
            ttl,
            safety_margin: ttl / 10,
            duration: ttl * 30,
            renewal_sessions: 0.35,
            batch_sessions: 0.25,
            release: 0.75,
            aggressive_contender: 0.5,
            faults: FaultConfig::for_ttl(ttl),
            wrap: None,
        }
    }
}

/// Rounds up to whole milliseconds, the resolution of tokio's timer: every
/// simulated instant is then a whole millisecond after the start.
pub(crate) fn whole_ms(d: Duration) -> Duration {
    let ms = d.as_nanos().div_ceil(1_000_000);
    Duration::from_millis(u64::try_from(ms).unwrap_or(u64::MAX))
}

/// A duration drawn uniformly from `range`, in whole milliseconds.
pub(crate) fn draw_in(rng: &mut StdRng, range: &RangeInclusive<Duration>) -> Duration {
    let (lo, hi) = (range.start().as_millis(), range.end().as_millis());
    let x = rng.gen::<f64>();
    if hi <= lo {
        return Duration::from_millis(lo as u64);
    }
    Duration::from_millis((lo + ((hi - lo) as f64 * x) as u128) as u64)
}
