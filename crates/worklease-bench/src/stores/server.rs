//! The skeleton every store on a server shares: an [`Entry`] whose
//! connect makes the store's [`Server`], and one [`Bench`] for all of
//! them ([`OnServer`]) that names a fresh namespace per scenario, puts it
//! in the store URL and hands that URL to [`Server::open`]. A store file keeps only its own client calls: how to
//! reach the server, how to open ours with the baseline and the peer
//! beside it, and how to clean up.

use std::sync::Arc;

use async_trait::async_trait;
use futures_util::future::BoxFuture;
use worklease::store::url;
use worklease::LeaseStore;

use super::{Baseline, Bench, Entry, Opened, Peer, Settings};
use crate::Result;

/// What a store on a server does its own way.
#[async_trait]
pub trait Server: Send + Sync + Sized + 'static {
    /// The store's name (as in [`Entry::name`]), also its URL scheme.
    const NAME: &'static str;
    /// The server's URL among the settings.
    fn url(settings: &Settings) -> &str;

    /// Reaches the server (checks that it answers) and keeps what the
    /// scenarios need of it.
    async fn connect(settings: &Settings) -> Result<Self>;

    /// The server's name and version.
    fn describe(&self) -> String;

    /// The namespace (a table, a key prefix) of scenario `tag` in run
    /// `run`.
    fn namespace(&self, run: &str, tag: &str) -> String;

    /// The store URL of ours on `namespace`.
    fn namespace_url(&self, settings: &Settings, namespace: &str) -> Result<String>;

    /// Opens ours from `url` (of [`Server::namespace_url`], parsed by the
    /// store's own URL type, as `worklease::store::url::parse` does), with
    /// the baseline and the peer on the same client and pool.
    async fn open(&self, settings: &Settings, url: &str, namespace: &str) -> Result<Parts>;

    /// Removes every namespace [`Server::open`] made.
    async fn cleanup(&self, settings: &Settings) -> Result<()>;
}

/// What [`Server::open`] opens: ours, the baseline and the peer (every
/// server store has one).
pub struct Parts {
    /// Ours.
    pub store: Arc<dyn LeaseStore>,
    /// The baseline on the same client library and pool.
    pub baseline: Arc<dyn Baseline>,
    /// The peer lock.
    pub peer: Arc<dyn Peer>,
}

/// The entry of the server store `S`.
pub const fn entry<S: Server>() -> Entry {
    Entry {
        name: S::NAME,
        scheme: S::NAME,
        connect: Ok(connect::<S>),
    }
}

fn connect<S: Server>(settings: &Settings) -> BoxFuture<'_, Result<Arc<dyn Bench>>> {
    Box::pin(async move {
        let server = S::connect(settings).await?;
        Ok(Arc::new(OnServer {
            settings: settings.clone(),
            server,
        }) as Arc<dyn Bench>)
    })
}

/// The server URL from the flag, else the environment variable (when set
/// and not empty), else the default.
pub fn server_url(flag: Option<String>, var: &str, default: &str) -> String {
    flag.or_else(|| std::env::var(var).ok())
        .filter(|u| !u.trim().is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// `base` with the query parameter `key=value` added.
pub fn with_param(base: &str, key: &str, value: &str) -> String {
    let sep = if base.contains('?') { '&' } else { '?' };
    format!("{base}{sep}{key}={value}")
}

/// A server store under test, connected.
struct OnServer<S> {
    settings: Settings,
    server: S,
}

#[async_trait]
impl<S: Server> Bench for OnServer<S> {
    fn name(&self) -> &'static str {
        S::NAME
    }

    fn shown_url(&self) -> String {
        url::redact(S::url(&self.settings))
    }

    async fn server(&self) -> Option<String> {
        Some(self.server.describe())
    }

    async fn open(&self, tag: &str) -> Result<Opened> {
        let namespace = self.server.namespace(&self.settings.run, tag);
        let url = self.server.namespace_url(&self.settings, &namespace)?;
        let parts = self.server.open(&self.settings, &url, &namespace).await?;
        Ok(Opened {
            url,
            store: parts.store,
            baseline: parts.baseline,
            peer: Some(parts.peer),
        })
    }

    async fn cleanup(&self) -> Result<()> {
        self.server.cleanup(&self.settings).await
    }
}
