//! The throughput scenarios: cycle (acquire → release of distinct work
//! IDs), renew and checkpoint of held leases, each beside the store's
//! baseline and, where one runs here, its peer.

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

/// acquire → release of a fresh work ID each time.
struct Cycle {
    leases: Leases,
    prefix: String,
    i: u64,
}

#[async_trait]
impl Client for Cycle {
    async fn op(&mut self) -> Result<()> {
        self.i += 1;
        let work = format!("{}{}", self.prefix, self.i);
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

/// The peer's lock → unlock of a fresh key each time.
struct PeerCycle {
    client: Box<dyn PeerClient>,
    prefix: String,
    i: u64,
}

#[async_trait]
impl Client for PeerCycle {
    async fn op(&mut self) -> Result<()> {
        self.i += 1;
        let key = format!("{}{}", self.prefix, self.i);
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

async fn cas_clients(
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

/// Cycle figures at `clients` concurrent clients: ours, the baseline (two
/// compare-and-sets: one for the acquire, one for the release) and the
/// peer (lock → unlock).
pub async fn cycle(opened: &Opened, plan: &Plan, clients: usize) -> Result<Vec<OpRow>> {
    let mut ours: Vec<Box<dyn Client>> = Vec::new();
    for n in 0..clients {
        ours.push(Box::new(Cycle {
            leases: leases(opened, plan, n)?,
            prefix: format!("cycle-{clients}-{n}-"),
            i: 0,
        }));
    }
    let mut contestants = vec![
        Contestant::new(Variant::Ours, "acquire + release of a fresh work ID", ours),
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
                prefix: format!("cycle-{clients}-{n}-"),
                i: 0,
            }));
        }
        contestants.push(Contestant::new(
            Variant::Peer,
            "lock + unlock of a fresh key",
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

fn rows(
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
