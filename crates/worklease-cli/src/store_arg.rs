//! `--store`: which store a command uses, and `--require-shared-store`.
//!
//! The URL comes from `--store`, else `WORKLEASE_STORE`, else the
//! configuration files' `store` key ([`crate::config`]), else the per-host
//! SQLite default (`url::default_sqlite_path`). A default chosen that way,
//! with nothing configured, is said at the start of `run`, `elect` and
//! `pool` (cron's empty environment would otherwise pick it silently on
//! every host, and every host would run the job); with
//! `--require-shared-store` (or `require_shared_store = true`) those
//! commands refuse any per-host store, chosen or given (ADR 0024).

use std::path::PathBuf;
use std::sync::Arc;

use clap::Args;
use worklease::store::url::{self, StoreSpec};
use worklease::LeaseStore;

use crate::config;
use crate::exit::{self, Failure};
use crate::without_job_control;

/// The store option shared by every subcommand.
#[derive(Args, Debug, Clone)]
pub struct StoreArg {
    /// Store URL: postgres://..., mysql://..., redis://..., etcd://..., s3://..., dynamodb://..., azblob://..., sqlite:PATH or memory:
    /// [default: `store` in /etc/worklease/config.toml or the user's
    /// config.toml, else the per-host SQLite file leases.db under $WORKLEASE_HOME,
    /// $XDG_DATA_HOME/worklease, $HOME/.local/share/worklease or /var/lib/worklease]
    #[arg(
        long,
        value_name = "URL",
        env = "WORKLEASE_STORE",
        hide_env_values = true
    )]
    store: Option<String>,
}

/// `--require-shared-store`, of `run`, `elect` and `pool`.
#[derive(Args, Debug, Clone, Default)]
pub struct SharedStoreArg {
    /// Refuse to run on a per-host store (sqlite:, memory:), whether given or
    /// chosen by default: exit 78 instead of running where no other host
    /// would see the lease. Also `require_shared_store = true` in the
    /// configuration file; the variable takes true/false, 1/0, yes/no or on/off.
    #[arg(
        long,
        env = "WORKLEASE_REQUIRE_SHARED_STORE",
        value_parser = clap::builder::BoolishValueParser::new()
    )]
    require_shared_store: bool,
}

/// How the store's URL was chosen.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Origin {
    /// `--store` or `WORKLEASE_STORE`.
    Given,
    /// The `store` key of this configuration file.
    Config(PathBuf),
    /// Nothing named one: the per-host SQLite default.
    Implicit,
}

impl StoreArg {
    /// The URL in force and how it was chosen.
    fn url(&self) -> Result<(String, Origin), Failure> {
        if let Some(given) = &self.store {
            return Ok((given.clone(), Origin::Given));
        }
        if let Some(store) = &config::settings()?.store {
            return Ok((store.value.clone(), Origin::Config(store.file.clone())));
        }
        Ok((url::default_url(), Origin::Implicit))
    }

    /// Opens the store, creating a missing SQLite file (and its
    /// directories): for `run`, `elect` and `pool`, after the per-host
    /// check ([`SharedStoreArg`]). Returns the URL to hand to a child (a
    /// relative SQLite path made absolute; never to be printed: use
    /// [`url::redact`]) and the store.
    pub fn open(&self, shared: &SharedStoreArg) -> Result<(String, Arc<dyn LeaseStore>), Failure> {
        let (spec, for_child, origin) = self.spec()?;
        shared.check(&spec, &for_child, &origin)?;
        tracing::debug!(store = %url::redact(&for_child), "opening the store");
        let store = without_job_control(|| spec.open())?;
        Ok((for_child, store))
    }

    /// Opens a store that exists, creating nothing: for `status`,
    /// `release` and `checkpoint`. A SQLite file that does not exist is
    /// [`exit::UNAVAILABLE`] with a message naming the path.
    pub fn open_existing(&self) -> Result<(String, Arc<dyn LeaseStore>), Failure> {
        let (spec, for_child, _) = self.spec()?;
        tracing::debug!(store = %url::redact(&for_child), "opening the existing store");
        match without_job_control(|| spec.open_existing()) {
            Ok(store) => Ok((for_child, store)),
            Err(e) => {
                let mut failure = Failure::from(e);
                if let StoreSpec::Sqlite(path) = &spec {
                    if std::fs::symlink_metadata(path).is_err() {
                        failure.message.push_str(
                            " (`worklease run` and `worklease elect` create it; check --store, \
                             WORKLEASE_STORE and the configuration files)",
                        );
                    }
                }
                Err(failure)
            }
        }
    }

    /// The parsed URL, the URL for a child, and how it was chosen.
    fn spec(&self) -> Result<(StoreSpec, String, Origin), Failure> {
        let (given, origin) = self.url()?;
        let spec = url::parse(&given)?;
        let for_child = match spec.absolute() {
            StoreSpec::Sqlite(path) if path.to_str().is_some() => StoreSpec::Sqlite(path).to_url(),
            StoreSpec::Memory => StoreSpec::Memory.to_url(),
            _ => given.clone(),
        };
        Ok((spec, for_child, origin))
    }
}

impl SharedStoreArg {
    /// Refuses a per-host store when a shared one is required; warns of
    /// a per-host default nobody chose.
    fn check(&self, spec: &StoreSpec, url: &str, origin: &Origin) -> Result<(), Failure> {
        if let (StoreSpec::Sqlite(path), Origin::Config(file)) = (spec, origin) {
            if path.is_relative() {
                // Each command would resolve it against its own working
                // directory: two crons in two directories, two stores.
                return Err(Failure::new(
                    exit::CONFIG,
                    format!(
                        "{} names the relative SQLite path {}: each command would resolve it in \
                         its own working directory; write the absolute path (no ~ or $HOME: \
                         nothing expands them there)",
                        file.display(),
                        path.display()
                    ),
                ));
            }
        }
        let per_host = matches!(spec, StoreSpec::Sqlite(_) | StoreSpec::Memory);
        if !per_host {
            return Ok(());
        }
        let required = if self.require_shared_store {
            Some("--require-shared-store".to_string())
        } else {
            match &config::settings()?.require_shared_store {
                Some(r) if r.value => Some(format!("require_shared_store in {}", r.file.display())),
                _ => None,
            }
        };
        let shown = url::redact(url);
        let chosen = match origin {
            Origin::Given => "given by --store or WORKLEASE_STORE".to_string(),
            Origin::Config(file) => format!("named in {}", file.display()),
            Origin::Implicit => {
                "the default: no --store, WORKLEASE_STORE or configuration file names a store"
                    .to_string()
            }
        };
        if let Some(why) = required {
            return Err(Failure::new(
                exit::CONFIG,
                format!(
                    "the store {shown} ({chosen}) is per-host: a lease there excludes no other \
                     host, and a shared store is required ({why}); name the fleet's store with \
                     --store, WORKLEASE_STORE or `store = \"URL\"` in {}",
                    config::SYSTEM_FILE
                ),
            ));
        }
        if *origin == Origin::Implicit {
            tracing::warn!(
                "no store is configured: using this host's own store {shown}, which excludes only \
                 this host's processes (another host's worklease sees none of its leases). Name the \
                 fleet's store with --store, WORKLEASE_STORE or `store = \"URL\"` in {}; if a \
                 per-host store is meant, write `store = \"{shown}\"` there to say so",
                config::SYSTEM_FILE
            );
        }
        Ok(())
    }
}
