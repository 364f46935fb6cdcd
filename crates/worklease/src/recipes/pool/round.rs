//! One round of a pool: keep the membership lease, read the members, take
//! this process's fair share of the free work IDs and hand back the
//! surplus (as KCL does), start and reap the slots' tasks.

use super::*;

impl Pool {
    /// Keeps the membership lease: (re)acquires it when it is missing or
    /// lost.
    pub(super) async fn keep_membership(&self, membership: Option<Renewal>) -> Option<Renewal> {
        if let Some(m) = membership {
            if m.lost_cause().is_none() {
                return Some(m);
            }
        }
        let id = self.member_work_id();
        match self.leases.acquire(&id, AcquireOptions::new()).await {
            Ok(token) => match self
                .leases
                .start_renewal(token, self.options.renewal.clone())
            {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(error = %e, "could not renew the pool membership");
                    None
                }
            },
            Err(e) => {
                tracing::debug!(error = %e, member = %id, "could not acquire the pool membership");
                None
            }
        }
    }

    /// One balancing round: list the store, note the finished work IDs,
    /// compute the share, stop the surplus or start slots on free work IDs
    /// (see the module docs' rules).
    pub(super) async fn round<F, Fut>(
        &self,
        slots: &mut HashMap<String, Slot>,
        finished: &mut HashSet<String>,
        tasks: &mut JoinSet<(String, SlotOutcome)>,
        runner: &Runner,
        work: &Arc<F>,
    ) where
        F: Fn(RunContext) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = std::result::Result<Option<Bytes>, SlotError>> + Send + 'static,
    {
        let infos = match self.leases.store().inspect(&[]).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(error = %e, "pool round: could not list the store");
                return;
            }
        };
        if let Some(done_ids) = &self.done_ids {
            let listed: HashSet<&str> = infos.iter().map(|i| i.work_id.as_str()).collect();
            for (w, record) in self.work_ids.iter().zip(done_ids.iter()) {
                if listed.contains(record.as_str()) {
                    finished.insert(w.to_string());
                }
            }
        }
        // The work IDs still to do, in the configured order.
        let open: Vec<&str> = self
            .work_ids
            .iter()
            .map(WorkId::as_str)
            .filter(|w| !finished.contains(*w))
            .collect();
        let w = open.len();
        if w == 0 {
            return;
        }
        let open_set: HashSet<&str> = open.iter().copied().collect();

        let me = self.leases.holder_id().to_string();
        let mut members: Vec<String> = infos
            .iter()
            .filter(|i| !i.expired)
            .filter_map(|i| i.work_id.as_str().strip_prefix(&self.member_prefix))
            .map(str::to_string)
            .collect();
        if !members.contains(&me) {
            members.push(me.clone());
        }
        members.sort();
        members.dedup();
        let n = members.len();
        let rank = members.iter().position(|m| *m == me).unwrap_or(0);
        let floor = w / n;
        let ceil = floor + usize::from(!w.is_multiple_of(n));
        let quota = floor + usize::from(rank < w % n);

        // Drop finished back-offs.
        let now = Instant::now();
        slots.retain(|_, s| !matches!(s, Slot::Backoff(t) if *t <= now));

        // Live leases of the other holders on open work IDs, and how many
        // each holds. A work ID is free when neither another holder's live
        // lease nor a slot of this pool has it (a lease of this holder
        // without a slot was lost: it is taken again at once).
        let mut elsewhere: HashSet<&str> = HashSet::new();
        let mut others: HashMap<&str, usize> = HashMap::new();
        for i in infos
            .iter()
            .filter(|i| !i.expired && i.holder_id != me && open_set.contains(i.work_id.as_str()))
        {
            elsewhere.insert(i.work_id.as_str());
            *others.entry(i.holder_id.as_str()).or_default() += 1;
        }

        let mut held: Vec<String> = slots
            .iter()
            .filter(|(k, s)| {
                open_set.contains(k.as_str())
                    && matches!(
                        s,
                        Slot::Running {
                            stopping: false,
                            ..
                        }
                    )
            })
            .map(|(k, _)| k.clone())
            .collect();
        let h = held.len();
        let free = |slots: &HashMap<String, Slot>, id: &str| {
            !elsewhere.contains(id) && !slots.contains_key(id)
        };
        let any_free = open.iter().any(|id| free(slots, id));
        let starved = members
            .iter()
            .any(|m| *m != me && others.get(m.as_str()).copied().unwrap_or(0) < floor);
        let surplus = if h > ceil {
            h - ceil
        } else if h == ceil && h > quota && starved && !any_free {
            1
        } else {
            0
        };
        if surplus > 0 {
            held.sort();
            for id in held.iter().skip(h - surplus) {
                if let Some(Slot::Running { stop, stopping }) = slots.get_mut(id) {
                    stop.cancel();
                    *stopping = true;
                }
            }
            return;
        }
        let room = quota.saturating_sub(h);
        if room == 0 {
            return;
        }
        // Each member scans from its own offset, so members that look at
        // once do not all race for the same free work IDs; one batch call
        // takes up to `room` of the free ones, in that order.
        let start = rank * w / n;
        let candidates: Vec<&str> = (0..w)
            .filter_map(|i| open.get((start + i) % w).copied())
            .filter(|id| free(slots, id))
            .collect();
        if candidates.is_empty() {
            return;
        }
        let tokens = match self.leases.acquire_many(&candidates, room).await {
            Ok(t) => t,
            Err(e) => {
                tracing::warn!(error = %e, "pool round: could not acquire free work IDs");
                return;
            }
        };
        for token in tokens {
            let stop = CancellationToken::new();
            let work_id = token.work_id().to_string();
            slots.insert(
                work_id.clone(),
                Slot::Running {
                    stop: stop.clone(),
                    stopping: false,
                },
            );
            let runner = runner.clone().cancel_on(stop);
            let work = work.clone();
            let pool = self.clone();
            tasks.spawn(async move {
                let outcome = pool.run_slot(&runner, token, work).await;
                (work_id, outcome)
            });
        }
    }
}
