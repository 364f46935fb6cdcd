//! Campaigns: many seeds of the simulation on one store, run on worker
//! threads (each seed alone on its own current-thread runtime), with
//! totals, progress lines and the replay command of every failure.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{run_with_env, Backend, Report, SimConfig, Stats, Violation};

/// Many seeds on one store, with totals.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// The store.
    pub backend: Backend,
    /// The settings of every run.
    pub config: SimConfig,
    /// The seeds.
    pub seeds: Vec<u64>,
    /// Extra environment for replay commands (e.g. a mutant's name).
    pub replay_env: String,
    /// Stop after this many failed seeds.
    pub max_failures: usize,
    /// Violation codes ([`Violation::code`]) of known, reported library
    /// issues: counted and listed with their replay commands, but they do
    /// not fail a seed. Any other violation does.
    pub known_issues: Vec<&'static str>,
    /// How many threads run seeds at once (each seed runs alone on its own
    /// current-thread runtime, so the outcome of a seed does not depend on
    /// it); default: the machine's available parallelism.
    pub workers: usize,
    /// How often a line of progress (seeds done, rate, failures so far)
    /// goes to stderr while the campaign runs; `None` (the default): never.
    pub progress: Option<Duration>,
}

/// The outcome of a [`Campaign`].
#[derive(Clone, Debug)]
pub struct CampaignReport {
    /// The store.
    pub store: String,
    /// Figures over all seeds run.
    pub totals: Stats,
    /// The failed runs (a violation not among the known issues).
    pub failures: Vec<Report>,
    /// Violations of known issues: the seed, the replay command and the
    /// violation.
    pub known: Vec<(u64, String, Violation)>,
    /// Real time taken.
    pub elapsed: Duration,
}

impl Campaign {
    /// A campaign over `seeds` with the default settings.
    pub fn new(backend: Backend, seeds: Vec<u64>) -> Self {
        Self {
            backend,
            config: SimConfig::default(),
            seeds,
            replay_env: String::new(),
            max_failures: 3,
            known_issues: Vec::new(),
            workers: std::thread::available_parallelism().map_or(1, |n| n.get()),
            progress: None,
        }
    }

    /// Runs the seeds on [`Campaign::workers`] threads, each taking the
    /// next seed not yet run, and stops taking seeds after
    /// `max_failures` failures. The failures are reported in seed order,
    /// each with its replay command.
    pub fn run(&self) -> CampaignReport {
        let started = std::time::Instant::now();
        let next = AtomicUsize::new(0);
        let failed = AtomicUsize::new(0);
        let done = AtomicUsize::new(0);
        let finished = AtomicBool::new(false);
        let report = Mutex::new(CampaignReport {
            store: self.backend.name().to_string(),
            totals: Stats::default(),
            failures: Vec::new(),
            known: Vec::new(),
            elapsed: Duration::ZERO,
        });
        let (next, failed, done, finished, outcomes) = (&next, &failed, &done, &finished, &report);
        std::thread::scope(|scope| {
            let workers: Vec<_> = (0..self.workers.max(1))
                .map(|_| {
                    scope.spawn(move || {
                        while failed.load(Ordering::SeqCst) < self.max_failures {
                            let i = next.fetch_add(1, Ordering::SeqCst);
                            let Some(&seed) = self.seeds.get(i) else {
                                break;
                            };
                            let report =
                                run_with_env(&self.backend, &self.config, seed, &self.replay_env);
                            let mut out = outcomes.lock().unwrap_or_else(|p| p.into_inner());
                            out.totals.merge(&report.stats);
                            let (old, new): (Vec<&Violation>, Vec<&Violation>) = report
                                .violations
                                .iter()
                                .partition(|v| self.known_issues.contains(&v.code));
                            for v in old {
                                out.known.push((seed, report.replay.clone(), v.clone()));
                            }
                            if !new.is_empty() {
                                failed.fetch_add(1, Ordering::SeqCst);
                                out.failures.push(report);
                            }
                            done.fetch_add(1, Ordering::SeqCst);
                        }
                    })
                })
                .collect();
            let progress = self.progress.map(|every| {
                scope.spawn(move || loop {
                    std::thread::park_timeout(every);
                    if finished.load(Ordering::SeqCst) {
                        break;
                    }
                    let n = done.load(Ordering::SeqCst);
                    let secs = started.elapsed().as_secs_f64().max(1e-9);
                    eprintln!(
                        "simulation of the {} store: {n} of {} seeds in {secs:.0}s ({:.0}/s), {} failed",
                        self.backend.name(),
                        self.seeds.len(),
                        n as f64 / secs,
                        failed.load(Ordering::SeqCst)
                    );
                })
            });
            for worker in workers {
                if let Err(panic) = worker.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            finished.store(true, Ordering::SeqCst);
            if let Some(p) = progress {
                p.thread().unpark();
            }
        });
        let mut report = report.into_inner().unwrap_or_else(|p| p.into_inner());
        report.failures.sort_by_key(|r| r.seed);
        report.failures.truncate(self.max_failures);
        report.elapsed = started.elapsed();
        report
    }
}

impl std::fmt::Display for CampaignReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "simulation of the {} store: {} seeds in {:.1}s, {} failed",
            self.store,
            self.totals.runs,
            self.elapsed.as_secs_f64(),
            self.failures.len()
        )?;
        write!(f, "{}", self.totals)?;
        if !self.known.is_empty() {
            write!(
                f,
                "\n  known issues (tolerated, listed): {} violation(s)",
                self.known.len()
            )?;
            for (_, replay, v) in self.known.iter().take(5) {
                write!(f, "\n    {v}\n      replay: {replay}")?;
            }
        }
        for r in &self.failures {
            write!(f, "\n{r}")?;
        }
        Ok(())
    }
}
