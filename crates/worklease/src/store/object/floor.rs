//! The fencing floor of an object register: one object beside the lease
//! objects, `<prefix>/worklease=fencing-floor`, holding a decimal token.
//! No work ID's key can be that name: the escaping of a work ID encodes
//! `=` (`%3D`), and the listing skips it (not a canonical escaping).
//!
//! Garbage collection raises it ([`Register::raise_fencing_floor`], a
//! compare-and-swap on the floor object) before it deletes a lease object;
//! an acquisition reads it after reading the lease object (absent), so its
//! token is above every token of a deleted object
//! (`docs/adr/0023-gc-and-the-token-floor.md`).

use bytes::Bytes;
use object_store::path::Path;
use object_store::{GetOptions, PutMode, PutOptions, UpdateVersion};

use super::diagnose::diagnose;
use super::ObjectRegister;
use crate::error::StoreError;
use crate::store::register::RegisterError;

/// The floor object's name under the prefix.
const FLOOR_NAME: &str = "worklease=fencing-floor";
/// How many compare-and-swaps a raise tries before it gives up.
const ATTEMPTS: usize = 5;

impl ObjectRegister {
    fn floor_path(&self) -> Result<Path, RegisterError> {
        Path::parse(format!("{}/{FLOOR_NAME}", self.prefix)).map_err(|e| {
            StoreError::with_source(self.kind, "no valid key for the fencing floor", e).into()
        })
    }

    /// The floor and the version it was read at (`None`: no floor object).
    pub(super) async fn read_floor(&self) -> Result<(u64, Option<UpdateVersion>), RegisterError> {
        let path = self.floor_path()?;
        let got = match self.store.get_opts(&path, GetOptions::default()).await {
            Ok(got) => got,
            Err(e @ object_store::Error::NotFound { .. }) if diagnose(&e).is_none() => {
                return Ok((0, None))
            }
            Err(e) => return Err(self.explain("reading the fencing floor".into(), e).into()),
        };
        let version = UpdateVersion {
            e_tag: got.meta.e_tag.clone(),
            version: got.meta.version.clone(),
        };
        let bytes = got
            .bytes()
            .await
            .map_err(|e| self.explain("reading the fencing floor".into(), e))?;
        let floor = std::str::from_utf8(&bytes)
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .ok_or_else(|| {
                StoreError::new(
                    self.kind,
                    format!("the fencing floor object {FLOOR_NAME:?} holds no decimal token"),
                )
            })?;
        Ok((floor, Some(version)))
    }

    /// Raises the floor to at least `token` by compare-and-swap.
    pub(super) async fn raise_floor(&self, token: u64) -> Result<bool, RegisterError> {
        let path = self.floor_path()?;
        for _ in 0..ATTEMPTS {
            let (floor, version) = self.read_floor().await?;
            if floor >= token {
                return Ok(true);
            }
            let mode = match version {
                None => PutMode::Create,
                Some(v) => PutMode::Update(v),
            };
            let options = PutOptions {
                mode,
                ..PutOptions::default()
            };
            let value = Bytes::from(token.to_string());
            match self.store.put_opts(&path, value.into(), options).await {
                Ok(_) => return Ok(true),
                // Another raise won: read again.
                Err(
                    object_store::Error::Precondition { .. }
                    | object_store::Error::AlreadyExists { .. },
                ) => {}
                // Unknown outcome: the caller deletes nothing.
                Err(e) => return Err(self.explain("raising the fencing floor".into(), e).into()),
            }
        }
        Err(StoreError::new(
            self.kind,
            format!("the fencing floor kept changing under {ATTEMPTS} raises"),
        )
        .into())
    }
}
