//! Typed checkpoints (Go: `checkpoint.Codec`, `Encode[T]`, `Decode[T]`,
//! `JSON()`): any `T: Serialize + DeserializeOwned` on top of the raw
//! checkpoint bytes, JSON by default ([`Json`]), the format pluggable
//! ([`Codec`]). Feature `serde` (on by default).
//!
//! ```
//! use std::{sync::Arc, time::Duration};
//! use worklease::{store::memory::MemoryStore, typed, AcquireOptions, Config, Leases};
//!
//! #[derive(serde::Serialize, serde::Deserialize, PartialEq, Debug)]
//! struct Progress { page: u64 }
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), typed::CheckpointError> {
//! let leases = Leases::new(Arc::new(MemoryStore::new()), Config::new("worker-1", Duration::from_secs(15)))?;
//! let token = leases.acquire("report", AcquireOptions::new()).await?;
//! let prior = typed::read_checkpoint::<Progress>(&leases, &token).await?;
//! assert!(prior.value.is_none());
//! let token = typed::checkpoint(&leases, &token, &Progress { page: 7 }).await?;
//! let now = typed::read_checkpoint::<Progress>(&leases, &token).await?;
//! assert_eq!(now.value, Some(Progress { page: 7 }));
//! # Ok(()) }
//! ```

use bytes::Bytes;
use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::Error;
use crate::lease::Leases;
use crate::store::{Checkpoint, Handoff};
use crate::token::Token;

/// The underlying error of a codec.
pub type CodecError = Box<dyn std::error::Error + Send + Sync>;

/// A format for checkpoints (Go: `checkpoint.Codec`).
pub trait Codec {
    /// The format's name, for error messages (`"JSON"`).
    fn name(&self) -> &'static str;

    /// Encodes `value` to bytes.
    ///
    /// # Errors
    /// When `value` cannot be represented in the format.
    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Bytes, CodecError>;

    /// Decodes bytes written by [`Codec::encode`].
    ///
    /// # Errors
    /// When `bytes` are not a valid `T` in the format.
    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError>;
}

/// JSON through `serde_json`: the default codec (Go: `checkpoint.JSON()`).
#[derive(Debug, Default, Clone, Copy)]
pub struct Json;

impl Codec for Json {
    fn name(&self) -> &'static str {
        "JSON"
    }

    fn encode<T: Serialize + ?Sized>(&self, value: &T) -> Result<Bytes, CodecError> {
        Ok(serde_json::to_vec(value)?.into())
    }

    fn decode<T: DeserializeOwned>(&self, bytes: &[u8]) -> Result<T, CodecError> {
        Ok(serde_json::from_slice(bytes)?)
    }
}

/// Why a typed checkpoint could not be written or read.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// The lease operation failed.
    #[error(transparent)]
    Lease(#[from] Error),
    /// The value could not be encoded; nothing was written.
    #[error("cannot encode the checkpoint of {work_id:?} as {format} ({type_name}): {source}")]
    Encode {
        /// The work ID.
        work_id: String,
        /// The Rust type, as [`std::any::type_name`] gives it.
        type_name: &'static str,
        /// The codec's name.
        format: &'static str,
        /// The codec's error.
        #[source]
        source: CodecError,
    },
    /// The stored checkpoint is not a valid value of the type (written by
    /// another version of the work, or as raw bytes).
    #[error(
        "the checkpoint of {work_id:?} ({len} bytes) is not a valid {format} {type_name}: {source}"
    )]
    Decode {
        /// The work ID.
        work_id: String,
        /// The Rust type, as [`std::any::type_name`] gives it.
        type_name: &'static str,
        /// The codec's name.
        format: &'static str,
        /// The stored checkpoint's size, in bytes.
        len: usize,
        /// The codec's error.
        #[source]
        source: CodecError,
    },
}

/// A checkpoint read as a `T`, with the hand-off facts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TypedCheckpoint<T> {
    /// The last acknowledged checkpoint; `None` when none was ever written.
    pub value: Option<T>,
    /// How this holder's acquisition followed the previous one.
    pub handoff: Handoff,
}

impl<T> TypedCheckpoint<T> {
    /// True exactly when the previous holder released (S5 in the crate docs).
    pub fn clean_handoff(&self) -> bool {
        self.handoff.is_clean()
    }
}

/// Encodes `value` with `codec` for the checkpoint of `work_id` (for
/// example as the final state of [`crate::runner::Runner::run`]).
///
/// # Errors
/// [`CheckpointError::Encode`] naming the work ID, the type and the format.
pub fn encode_with<C: Codec, T: Serialize + ?Sized>(
    codec: &C,
    work_id: &str,
    value: &T,
) -> Result<Bytes, CheckpointError> {
    codec
        .encode(value)
        .map_err(|source| CheckpointError::Encode {
            work_id: work_id.to_string(),
            type_name: std::any::type_name::<T>(),
            format: codec.name(),
            source,
        })
}

/// Decodes a raw checkpoint of `work_id` (for example
/// [`crate::runner::RunContext::prior`]) with `codec`.
///
/// # Errors
/// [`CheckpointError::Decode`] naming the work ID, the type and the format.
pub fn decode_with<C: Codec, T: DeserializeOwned>(
    codec: &C,
    work_id: &str,
    checkpoint: &Checkpoint,
) -> Result<TypedCheckpoint<T>, CheckpointError> {
    let value = match &checkpoint.data {
        None => None,
        Some(bytes) => Some(
            codec
                .decode(bytes)
                .map_err(|source| CheckpointError::Decode {
                    work_id: work_id.to_string(),
                    type_name: std::any::type_name::<T>(),
                    format: codec.name(),
                    len: bytes.len(),
                    source,
                })?,
        ),
    };
    Ok(TypedCheckpoint {
        value,
        handoff: checkpoint.handoff.clone(),
    })
}

/// Writes `value` as the checkpoint with `codec` and extends the lease, as
/// [`Leases::checkpoint`]; returns the extended token.
///
/// # Errors
/// [`CheckpointError::Encode`] (nothing is written), or
/// [`CheckpointError::Lease`] with [`Leases::checkpoint`]'s error.
pub async fn checkpoint_with<C: Codec, T: Serialize + ?Sized>(
    codec: &C,
    leases: &Leases,
    token: &Token,
    value: &T,
) -> Result<Token, CheckpointError> {
    let bytes = encode_with(codec, token.work_id().as_str(), value)?;
    Ok(leases.checkpoint(token, bytes).await?)
}

/// Reads the checkpoint as a `T` with `codec`, as
/// [`Leases::read_checkpoint`].
///
/// # Errors
/// [`CheckpointError::Lease`] with [`Leases::read_checkpoint`]'s error, or
/// [`CheckpointError::Decode`] naming the work ID and the type.
pub async fn read_checkpoint_with<C: Codec, T: DeserializeOwned>(
    codec: &C,
    leases: &Leases,
    token: &Token,
) -> Result<TypedCheckpoint<T>, CheckpointError> {
    let raw = leases.read_checkpoint(token).await?;
    decode_with(codec, token.work_id().as_str(), &raw)
}

/// [`checkpoint_with`] in JSON.
///
/// # Errors
/// As [`checkpoint_with`].
pub async fn checkpoint<T: Serialize + ?Sized>(
    leases: &Leases,
    token: &Token,
    value: &T,
) -> Result<Token, CheckpointError> {
    checkpoint_with(&Json, leases, token, value).await
}

/// [`read_checkpoint_with`] in JSON.
///
/// # Errors
/// As [`read_checkpoint_with`].
pub async fn read_checkpoint<T: DeserializeOwned>(
    leases: &Leases,
    token: &Token,
) -> Result<TypedCheckpoint<T>, CheckpointError> {
    read_checkpoint_with(&Json, leases, token).await
}
