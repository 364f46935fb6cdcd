//! The throughput scenarios: cycle (acquire → release of distinct work
//! IDs, or over a fixed set of work IDs acquired again and again), renew
//! and checkpoint of held leases, each beside the store's baseline and,
//! where one runs here, its peer.

use async_trait::async_trait;
use bytes::Bytes;
use worklease::{AcquireOptions, Config, Leases, Token};

use crate::measure::{compare, Client, Contestant};
use crate::results::{OpRow, Variant};
use crate::stores::{Opened, PeerClient, Register};
use crate::{Plan, Result};

/// A holder handle of its own for client `n`.
fn leases(opened: &Opened, plan: &Plan, n: usize) -> Result<Leases> {
    Ok(Leases::new(
        opened.store.clone(),
        Config::new(format!("bench-{n}"), plan.ttl),
    )?)
}

/// The work IDs of a cycle figure.
#[derive(Clone, Copy)]
pub enum WorkSet<'a> {
    /// A fresh work ID for each cycle (each one a new row of the store).
    Fresh,
    /// This fixed set, partitioned among the clients (client `n` of `c`
    /// takes the IDs at `n`, `n + c`, `n + 2c`, ... in turn), so that no
    /// two clients ever want the same one.
    Reused(&'a [String]),
}

/// The work IDs (or peer keys) one cycling client goes through.
enum WorkIds {
    Fresh { prefix: String, i: u64 },
    Reused { ids: Vec<String>, i: usize },
}

impl WorkIds {
    /// Client `n`'s of `clients`, under `prefix` for fresh IDs.
    fn new(set: WorkSet<'_>, prefix: String, n: usize, clients: usize) -> Self {
        match set {
            WorkSet::Fresh => WorkIds::Fresh { prefix, i: 0 },
            WorkSet::Reused(ids) => WorkIds::Reused {
                ids: ids.iter().skip(n).step_by(clients).cloned().collect(),
                i: 0,
            },
        }
    }

    fn next(&mut self) -> String {
        match self {
            WorkIds::Fresh { prefix, i } => {
                *i += 1;
                format!("{prefix}{i}")
            }
            WorkIds::Reused { ids, i } => {
                let id = ids[*i].clone();
                *i = (*i + 1) % ids.len();
                id
            }
        }
    }
}

/// acquire → release of the client's next work ID.
struct Cycle {
    leases: Leases,
    ids: WorkIds,
}

#[async_trait]
impl Client for Cycle {
    async fn op(&mut self) -> Result<()> {
        let work = self.ids.next();
        let token = self.leases.acquire(&work, AcquireOptions::new()).await?;
        self.leases.release(token).await?;
        Ok(())
    }
}

/// `n` compare-and-sets on the client's register.
struct Cas {
    register: Box<dyn Register>,
    n: usize,
    data: Bytes,
}

#[async_trait]
impl Client for Cas {
    async fn op(&mut self) -> Result<()> {
        for _ in 0..self.n {
            self.register.cas(&self.data).await?;
        }
        Ok(())
    }
}

/// The peer's lock → unlock of the client's next key.
struct PeerCycle {
    client: Box<dyn PeerClient>,
    keys: WorkIds,
}

#[async_trait]
impl Client for PeerCycle {
    async fn op(&mut self) -> Result<()> {
        let key = self.keys.next();
        self.client.try_lock(&key).await?;
        self.client.unlock(&key).await
    }
}

/// Renew (no data) or checkpoint (with data) of a held lease.
struct Held {
    leases: Leases,
    token: Option<Token>,
    data: Option<Bytes>,
}

#[async_trait]
impl Client for Held {
    async fn op(&mut self) -> Result<()> {
        let token = self.token.as_ref().ok_or("the lease was lost")?;
        let next = match &self.data {
            None => self.leases.renew(token).await,
            Some(data) => self.leases.checkpoint(token, data.clone()).await,
        };
        // A failed renewal leaves the token as it was: the next try says
        // whether the lease is gone.
        if let Ok(t) = &next {
            self.token = Some(t.clone());
        }
        next.map(|_| ()).map_err(Into::into)
    }

    async fn finish(self: Box<Self>) -> Result<()> {
        if let Some(t) = self.token {
            self.leases.release(t).await?;
        }
        Ok(())
    }
}

/// The peer's extension of a held lock.
struct PeerExtend {
    client: Box<dyn PeerClient>,
    key: String,
}

#[async_trait]
impl Client for PeerExtend {
    async fn op(&mut self) -> Result<()> {
        self.client
            .extend(&self.key)
            .await
            .unwrap_or_else(|| Err("the peer has no extension".into()))
    }

    async fn finish(mut self: Box<Self>) -> Result<()> {
        self.client.unlock(&self.key).await
    }
}

/// `clients` baseline clients, each doing `n` compare-and-sets of `bytes`
/// bytes per operation on a register of its own.
pub async fn cas_clients(
    opened: &Opened,
    clients: usize,
    n: usize,
    bytes: usize,
) -> Result<Vec<Box<dyn Client>>> {
    let data = Bytes::from(vec![0x5a; bytes]);
    let mut v: Vec<Box<dyn Client>> = Vec::new();
    for _ in 0..clients {
        v.push(Box::new(Cas {
            register: opened.baseline.register().await?,
            n,
            data: data.clone(),
        }));
    }
    Ok(v)
}

/// A fixed set of `n` work IDs for [`WorkSet::Reused`], each acquired and
/// released once (in batches) so that every one has its row before the
/// figures are measured.
pub async fn reused_ids(opened: &Opened, plan: &Plan, n: usize) -> Result<Vec<String>> {
    let ids: Vec<String> = (0..n).map(|i| format!("job-{i}")).collect();
    let leases = Leases::new(opened.store.clone(), Config::new("bench-seed", plan.ttl))?;
    let tokens = leases.acquire_many(&ids, n).await?;
    if tokens.len() != n {
        return Err(format!(
            "only {} of the {n} reused work IDs were granted",
            tokens.len()
        )
        .into());
    }
    // A lease that ran out before its release (acquiring many work IDs on
    // a slow store, such as S3 on moto, can take longer than the TTL) has
    // its row all the same: that is all the seeding is for.
    for outcome in leases.release_many(tokens).await? {
        match outcome {
            Err(e) if e.is_lease_lost() => {}
            other => other?,
        }
    }
    Ok(ids)
}

/// `clients` clients of ours' cycle (acquire → release) over `set`, each
/// with a holder handle of its own, as [`cycle`] measures them.
pub fn cycle_clients(
    opened: &Opened,
    plan: &Plan,
    clients: usize,
    set: WorkSet<'_>,
) -> Result<Vec<Box<dyn Client>>> {
    let mut ours: Vec<Box<dyn Client>> = Vec::new();
    for n in 0..clients {
        ours.push(Box::new(Cycle {
            leases: leases(opened, plan, n)?,
            ids: WorkIds::new(set, format!("cycle-{clients}-{n}-"), n, clients),
        }));
    }
    Ok(ours)
}

/// Cycle figures at `clients` concurrent clients over `set`: ours, the
/// baseline (two compare-and-sets: one for the acquire, one for the
/// release) and the peer (lock → unlock of the same names as keys).
pub async fn cycle(
    opened: &Opened,
    plan: &Plan,
    clients: usize,
    set: WorkSet<'_>,
) -> Result<Vec<OpRow>> {
    let what = match set {
        WorkSet::Fresh => "a fresh work ID".to_string(),
        WorkSet::Reused(ids) => {
            if ids.len() < clients {
                return Err(format!(
                    "{} reused work IDs cannot be shared by {clients} clients",
                    ids.len()
                )
                .into());
            }
            format!(
                "one of {} reused work IDs (at least {} per client, in turn)",
                ids.len(),
                ids.len() / clients
            )
        }
    };
    let ids = |n: usize| WorkIds::new(set, format!("cycle-{clients}-{n}-"), n, clients);
    let mut contestants = vec![
        Contestant::new(
            Variant::Ours,
            format!("acquire + release of {what}"),
            cycle_clients(opened, plan, clients, set)?,
        ),
        Contestant::new(
            Variant::Baseline,
            "2 compare-and-sets",
            cas_clients(opened, clients, 2, 0).await?,
        ),
    ];
    if let Some(peer) = &opened.peer {
        let mut v: Vec<Box<dyn Client>> = Vec::new();
        for n in 0..clients {
            v.push(Box::new(PeerCycle {
                client: peer.client(false).await?,
                keys: ids(n),
            }));
        }
        let key = match set {
            WorkSet::Fresh => "a fresh key".to_string(),
            WorkSet::Reused(ids) => format!("one of {} reused keys", ids.len()),
        };
        contestants.push(Contestant::new(
            Variant::Peer,
            format!("lock + unlock of {key}"),
            v,
        ));
    }
    compare(&mut contestants, plan.timing).await?;
    Ok(rows(&contestants, opened, clients, None))
}

/// Renew figures at `clients` clients, each renewing a lease of its own:
/// ours, one compare-and-set, and the peer's extension where it has one.
pub async fn renew(opened: &Opened, plan: &Plan, clients: usize) -> Result<Vec<OpRow>> {
    let mut contestants = vec![
        Contestant::new(
            Variant::Ours,
            "renew of a held lease",
            held(opened, plan, clients, "renew", None).await?,
        ),
        Contestant::new(
            Variant::Baseline,
            "1 compare-and-set",
            cas_clients(opened, clients, 1, 0).await?,
        ),
    ];
    if let Some(peer) = &opened.peer {
        let mut v: Vec<Box<dyn Client>> = Vec::new();
        for n in 0..clients {
            let mut client = peer.client(false).await?;
            let key = format!("renew-{clients}-{n}");
            client.try_lock(&key).await?;
            match client.extend(&key).await {
                Some(r) => r?,
                None => {
                    // A session lock has nothing to renew: no peer figure.
                    client.unlock(&key).await?;
                    v.clear();
                    break;
                }
            }
            v.push(Box::new(PeerExtend { client, key }));
        }
        if !v.is_empty() {
            contestants.push(Contestant::new(Variant::Peer, "extend of a held lock", v));
        }
    }
    compare(&mut contestants, plan.timing).await?;
    Ok(rows(&contestants, opened, clients, None))
}

/// Checkpoint figures of `bytes` bytes at `clients` clients: ours (which
/// also renews) and one compare-and-set writing as many bytes. No peer
/// keeps data with its lock.
pub async fn checkpoint(
    opened: &Opened,
    plan: &Plan,
    clients: usize,
    bytes: usize,
) -> Result<Vec<OpRow>> {
    let data = Bytes::from(vec![0xa5; bytes]);
    let mut contestants = vec![
        Contestant::new(
            Variant::Ours,
            format!("checkpoint of {bytes} bytes (also renews)"),
            held(opened, plan, clients, &format!("ckpt{bytes}"), Some(data)).await?,
        ),
        Contestant::new(
            Variant::Baseline,
            format!("1 compare-and-set writing {bytes} bytes"),
            cas_clients(opened, clients, 1, bytes).await?,
        ),
    ];
    compare(&mut contestants, plan.timing).await?;
    Ok(rows(&contestants, opened, clients, Some(bytes)))
}

/// One client per lease, each holding a lease of its own.
async fn held(
    opened: &Opened,
    plan: &Plan,
    clients: usize,
    what: &str,
    data: Option<Bytes>,
) -> Result<Vec<Box<dyn Client>>> {
    let mut v: Vec<Box<dyn Client>> = Vec::new();
    for n in 0..clients {
        let leases = leases(opened, plan, n)?;
        let token = leases
            .acquire(&format!("{what}-{clients}-{n}"), AcquireOptions::new())
            .await?;
        v.push(Box::new(Held {
            leases,
            token: Some(token),
            data: data.clone(),
        }));
    }
    Ok(v)
}

/// The rows of a figure, with what each variant is.
pub fn rows(
    contestants: &[Contestant],
    opened: &Opened,
    clients: usize,
    bytes: Option<usize>,
) -> Vec<OpRow> {
    contestants
        .iter()
        .map(|c| {
            let what = match c.variant {
                Variant::Ours => c.what.clone(),
                Variant::Baseline => format!("{}: {}", c.what, opened.baseline.describe()),
                Variant::Peer => match &opened.peer {
                    Some(p) => format!("{}: {}", c.what, p.describe()),
                    None => c.what.clone(),
                },
            };
            c.tally
                .row(opened.store.kind(), clients, bytes, c.variant, &what)
        })
        .collect()
}
