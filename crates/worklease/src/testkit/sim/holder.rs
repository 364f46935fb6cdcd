//! A simulated holder: a process that acquires a work ID, reads the
//! checkpoint, works (renewing by hand or in the background, writing
//! checkpoints), and then releases the lease or crashes, again and again.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::rngs::StdRng;
use rand::Rng;
use tokio::time::Instant;

use crate::error::Error;
use crate::lease::renewal::RenewalOptions;
use crate::token::Token;
use crate::{AcquireOptions, Leases};

use super::config::{draw_in, whole_ms, SimConfig};
use super::history::{FaultKind, World};

pub(crate) struct Holder {
    pub idx: usize,
    pub leases: Leases,
    pub world: Arc<World>,
    pub rng: StdRng,
    /// This holder's clock runs at `1 + drift` times real time.
    pub drift: f64,
    pub work_ids: Arc<Vec<String>>,
    pub end: Instant,
    pub config: Arc<SimConfig>,
    pub written: u64,
}

/// Lets every task that is ready at this instant run before the caller
/// goes on: a yielding task runs again only once the run queue has
/// drained (tokio defers it to the scheduler's next park).
async fn settle() {
    for _ in 0..4 {
        tokio::task::yield_now().await;
    }
}

/// How a session step ended.
enum Step {
    Go(Token),
    Lost,
}

impl Holder {
    fn ttl(&self) -> Duration {
        self.config.ttl
    }

    /// Waits `d` as measured by this holder's own clock: `d / (1 + drift)`
    /// of real time.
    async fn wait(&self, d: Duration) {
        let real = whole_ms(d.div_f64(1.0 + self.drift)).max(Duration::from_millis(1));
        tokio::time::sleep(real).await;
    }

    fn unexpected(&self, what: &str, e: &Error) {
        self.world
            .note(format!("h{}: unexpected error from {what}: {e}", self.idx));
    }

    pub async fn run(mut self) {
        while Instant::now() < self.end {
            if self.work_ids.len() > 1 && self.rng.gen::<f64>() < self.config.batch_sessions {
                self.batch().await;
                continue;
            }
            let wid = self.work_ids[self.rng.gen_range(0..self.work_ids.len())].clone();
            match self.leases.acquire(&wid, AcquireOptions::new()).await {
                Ok(t) => {
                    self.world.believe(self.idx, &t);
                    self.world.app(|a| a.sessions += 1);
                    self.session(t).await;
                }
                Err(Error::Held { expires_in, .. }) => {
                    self.world.app(|a| a.held += 1);
                    let (aggressive, x) = (self.rng.gen::<f64>(), self.rng.gen::<f64>());
                    let nap = match expires_in {
                        Some(left) if aggressive < self.config.aggressive_contender => left,
                        _ => self.ttl().mul_f64(0.5 * x),
                    };
                    self.wait(nap).await;
                }
                Err(Error::Expired { .. }) => {
                    self.world.app(|a| a.late_grants += 1);
                    self.short_pause().await;
                }
                Err(Error::Store(_)) => self.short_pause().await,
                Err(e) => {
                    self.unexpected("acquire", &e);
                    self.short_pause().await;
                }
            }
        }
    }

    /// Acquires up to all of a random selection of work IDs in one batch,
    /// and runs a batch session on those granted.
    async fn batch(&mut self) {
        let mut ids: Vec<String> = self
            .work_ids
            .iter()
            .filter(|_| self.rng.gen_bool(0.7))
            .cloned()
            .collect();
        if ids.is_empty() {
            ids.push(self.work_ids[0].clone());
        }
        let max = self.rng.gen_range(1..=ids.len());
        match self.leases.acquire_many(&ids, max).await {
            Ok(tokens) if tokens.is_empty() => {
                self.world.app(|a| a.held += 1);
                self.short_pause().await;
            }
            Ok(tokens) => {
                for t in &tokens {
                    self.world.believe(self.idx, t);
                }
                self.world.app(|a| {
                    a.sessions += tokens.len() as u64;
                    a.batch_sessions += 1;
                    a.batch_leases += tokens.len() as u64;
                });
                self.batch_session(tokens).await;
            }
            Err(Error::Store(_)) => self.short_pause().await,
            Err(e) => {
                self.unexpected("acquire_many", &e);
                self.short_pause().await;
            }
        }
    }

    /// Renews several leases in the background, together (the handle's
    /// session sends them in batches); between steps, notes what each
    /// renewal reports and checkpoints one live lease; ends with a batch
    /// release of the ones left, or a crash.
    async fn batch_session(&mut self, tokens: Vec<Token>) {
        let ttl = self.ttl();
        let options =
            RenewalOptions::new()
                .interval(ttl / 3)
                .backoff(whole_ms(ttl / 100), ttl / 4, 0.0);
        let mut held: Vec<(crate::Renewal, Token)> = Vec::new();
        for t in tokens {
            match self.leases.start_renewal(t.clone(), options.clone()) {
                Ok(r) => held.push((r, t)),
                Err(e) => self.unexpected("start_renewal", &e),
            }
        }
        let steps = self.rng.gen_range(1..=6);
        for _ in 0..steps {
            self.between_steps().await;
            if Instant::now() >= self.end {
                break;
            }
            let mut live = Vec::new();
            for (renewal, t) in held {
                match renewal.ensure_live() {
                    Ok(now) => {
                        self.world.believe(self.idx, &now);
                        live.push((renewal, now));
                    }
                    Err(_) => self.lost(&t),
                }
            }
            held = live;
            if held.is_empty() {
                return;
            }
            let i = self.rng.gen_range(0..held.len());
            let t = held[i].1.clone();
            let data = self.data(&t);
            let result = self.leases.checkpoint(&t, data).await;
            if let Step::Lost = self.outcome(&t, result, "checkpoint") {
                held.swap_remove(i);
            }
        }
        settle().await;
        if self.rng.gen::<f64>() < self.config.release {
            let mut last = Vec::new();
            for (renewal, t) in held {
                match renewal.stop().await {
                    Ok(token) => last.push(token),
                    Err(_) => self.lost(&t),
                }
            }
            for t in &last {
                // The holder stops believing when it sends the release.
                self.world
                    .disbelieve(self.idx, t.work_id().as_str(), t.fencing_token());
            }
            self.world.app(|a| a.releases += last.len() as u64);
            match self.leases.release_many(last).await {
                Ok(outcomes) => {
                    for r in outcomes {
                        match r {
                            Ok(()) | Err(Error::Store(_)) => {}
                            Err(e) if e.is_lease_lost() => {}
                            Err(e) => self.unexpected("release_many", &e),
                        }
                    }
                }
                Err(Error::Store(_)) => {}
                Err(e) => self.unexpected("release_many", &e),
            }
        } else {
            self.world.app(|a| a.abandoned += held.len() as u64);
            drop(held);
        }
    }

    async fn short_pause(&mut self) {
        let x = self.rng.gen::<f64>();
        self.wait(self.ttl().mul_f64(0.1 * x)).await;
    }

    fn lost(&self, t: &Token) {
        self.world
            .disbelieve(self.idx, t.work_id().as_str(), t.fencing_token());
        self.world.app(|a| a.lost += 1);
    }

    fn data(&mut self, t: &Token) -> Bytes {
        self.written += 1;
        Bytes::from(format!("{}/h{}/{}", t.work_id(), self.idx, self.written))
    }

    /// A session on a freshly acquired lease.
    async fn session(&mut self, t: Token) {
        match self.leases.read_checkpoint(&t).await {
            Ok(c) => {
                if c.clean_handoff() {
                    self.world.app(|a| a.clean_reads += 1);
                }
            }
            Err(e) if e.is_lease_lost() => return self.lost(&t),
            Err(Error::Store(_)) => {}
            Err(e) => self.unexpected("read_checkpoint", &e),
        }
        if self.rng.gen::<f64>() < self.config.renewal_sessions {
            self.renewal_session(t).await;
        } else {
            self.manual_session(t).await;
        }
    }

    /// Between two operations: work for a while, or freeze.
    async fn between_steps(&mut self) {
        let (freeze, x) = (self.rng.gen::<f64>(), self.rng.gen::<f64>());
        if freeze < self.config.faults.freeze {
            let d = draw_in(&mut self.rng, &self.config.faults.freeze_length);
            self.world.fault(FaultKind::Freeze);
            if d > self.ttl() {
                self.world.fault(FaultKind::FreezePastTtl);
            }
            let until = Instant::now() + d;
            self.world.freeze(self.idx, until);
            tokio::time::sleep_until(until).await;
        } else {
            self.wait(self.ttl().mul_f64(0.45 * x)).await;
        }
    }

    /// Renews and checkpoints by hand, trusting each reply's token.
    async fn manual_session(&mut self, mut t: Token) {
        let steps = self.rng.gen_range(1..=6);
        for _ in 0..steps {
            self.between_steps().await;
            if Instant::now() >= self.end {
                break;
            }
            let result = if self.rng.gen_bool(0.5) {
                self.leases.renew(&t).await
            } else {
                let data = self.data(&t);
                self.leases.checkpoint(&t, data).await
            };
            match self.outcome(&t, result, "renew/checkpoint") {
                Step::Go(next) => t = next,
                Step::Lost => return,
            }
        }
        self.finish(t).await;
    }

    fn outcome(&self, t: &Token, result: crate::Result<Token>, what: &str) -> Step {
        match result {
            Ok(next) => {
                self.world.believe(self.idx, &next);
                Step::Go(next)
            }
            Err(e) if e.is_lease_lost() => {
                self.lost(t);
                Step::Lost
            }
            Err(Error::Store(_)) => Step::Go(t.clone()),
            Err(e) => {
                self.unexpected(what, &e);
                Step::Go(t.clone())
            }
        }
    }

    /// Renews in the background and checkpoints only after checking the
    /// lease is live ([`crate::Renewal::ensure_live`]).
    async fn renewal_session(&mut self, t: Token) {
        self.world.app(|a| a.renewal_sessions += 1);
        let ttl = self.ttl();
        let options = RenewalOptions::new()
            .interval(ttl / 3)
            // No jitter: the library draws it from the thread's RNG, which
            // the seed does not control.
            .backoff(whole_ms(ttl / 100), ttl / 4, 0.0);
        let mut renewal = match self.leases.start_renewal(t.clone(), options) {
            Ok(r) => r,
            Err(e) => return self.unexpected("start_renewal", &e),
        };
        let end = self.renewal_steps(&mut renewal, t).await;
        // The renewal task's selects are not biased: stopping it in the
        // same poll as one of its own events (a reply, a timer) would let
        // tokio's unseeded RNG decide which wins. Let it take every event
        // of this instant first; time does not move while tasks run.
        settle().await;
        match end {
            Step::Lost => drop(renewal),
            Step::Go(t) => {
                if self.rng.gen::<f64>() < self.config.release {
                    match renewal.stop().await {
                        Ok(last) => self.release(last).await,
                        Err(_) => self.lost(&t),
                    }
                } else {
                    drop(renewal);
                    self.world.app(|a| a.abandoned += 1);
                }
            }
        }
    }

    async fn renewal_steps(&mut self, renewal: &mut crate::Renewal, mut t: Token) -> Step {
        let ttl = self.ttl();
        let steps = self.rng.gen_range(1..=6);
        for _ in 0..steps {
            let (freeze, x) = (self.rng.gen::<f64>(), self.rng.gen::<f64>());
            if freeze < self.config.faults.freeze {
                let d = draw_in(&mut self.rng, &self.config.faults.freeze_length);
                self.world.fault(FaultKind::Freeze);
                if d > ttl {
                    self.world.fault(FaultKind::FreezePastTtl);
                }
                let until = Instant::now() + d;
                self.world.freeze(self.idx, until);
                tokio::time::sleep_until(until).await;
            } else {
                let real = whole_ms(ttl.mul_f64(0.45 * x).div_f64(1.0 + self.drift));
                let wake = Instant::now() + real.max(Duration::from_millis(1));
                loop {
                    tokio::select! {
                        biased;
                        r = renewal.changed() => match r {
                            Ok(next) => self.world.believe(self.idx, &next),
                            Err(_) => {
                                self.lost(&t);
                                return Step::Lost;
                            }
                        },
                        _ = tokio::time::sleep_until(wake) => break,
                    }
                }
            }
            if Instant::now() >= self.end {
                break;
            }
            t = match renewal.ensure_live() {
                Ok(live) => live,
                Err(_) => {
                    self.lost(&t);
                    return Step::Lost;
                }
            };
            let data = self.data(&t);
            let result = self.leases.checkpoint(&t, data).await;
            if let Step::Lost = self.outcome(&t, result, "checkpoint") {
                return Step::Lost;
            }
        }
        Step::Go(t)
    }

    /// Ends a session: a release, or a crash.
    async fn finish(&mut self, t: Token) {
        if self.rng.gen::<f64>() < self.config.release {
            self.release(t).await;
        } else {
            self.world.app(|a| a.abandoned += 1);
        }
    }

    async fn release(&mut self, t: Token) {
        // The holder stops believing when it sends the release.
        self.world
            .disbelieve(self.idx, t.work_id().as_str(), t.fencing_token());
        self.world.app(|a| a.releases += 1);
        match self.leases.release(t).await {
            Ok(()) | Err(Error::Store(_)) => {}
            Err(e) if e.is_lease_lost() => {}
            Err(e) => self.unexpected("release", &e),
        }
    }
}
