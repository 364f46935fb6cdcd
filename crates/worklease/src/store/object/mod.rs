//! The object-storage store (feature `object-store`): one object per work
//! ID in S3 or any store of the [`object_store`] crate that has conditional
//! writes, used as a compare-and-swap register ([`ObjectRegister`]) through
//! the generic register adapter ([`RegisterStore`]).
//!
//! With conditional writes an object is exactly the `hoplock` backend:
//! `If-None-Match: *` creates it only where there is none
//! ([`PutMode::Create`]), `If-Match: <ETag>` replaces it only while it is
//! the version read ([`PutMode::Update`]). Amazon S3 has both since 2024;
//! so do Cloudflare R2, MinIO, Google Cloud Storage (features `gcp`) and
//! Azure Blob Storage (feature `azure`).
//!
//! * **Key layout.** The lease of a work ID is the object
//!   `<prefix>/<escaped work ID>` (default prefix [`DEFAULT_PREFIX`]). The
//!   escaping percent-encodes every byte except ASCII letters, digits, `-`,
//!   `_` and `.` (and the dots of a work ID that is `.` or `..`), so a work
//!   ID is always one path segment: `jobs/a` is `<prefix>/jobs%2Fa`, never
//!   a key in a sub-folder, and no work ID names anything outside the
//!   prefix. A key may be at most [`MAX_KEY_BYTES`] long (S3's, GCS's and
//!   Azure's limit): a longer one fails with a store error naming the limit,
//!   and nothing is written. Objects under the prefix that are not ours
//!   (other names, sub-folders) are left alone.
//! * **Value and its encoding.** The object holds the adapter's lease
//!   record: holder, fencing generation (token), TTL, phase (held,
//!   released, revoked), checkpoint and previous holder, in the versioned
//!   binary `WLR1` encoding documented in [`crate::store::register`]; the
//!   version is in its magic, so a future `WLR2` is told apart, and an
//!   object that does not decode fails every operation on its work ID with
//!   a store error naming the work ID (nothing is overwritten). Objects are
//!   written with content type `application/octet-stream`.
//! * **Handle.** The version a conditional write names is the object's
//!   ETag together with its version (S3 version ID, GCS generation) where
//!   the store reports one; every write changes the bytes (the record
//!   carries a write counter), so every write changes the ETag.
//! * **Expiry by observation, not by clocks.** An object store has no
//!   clock to judge expiry by, and the wall clocks of two hosts are never
//!   compared: a contender counts a held lease expired only after it has
//!   seen the same version (handle) unchanged for a full TTL on its own
//!   monotonic clock, and a holder counts its lease lost at the send of its
//!   last successful write plus the TTL (the crate docs' "Clocks"; the
//!   proof is in [`crate::store::register`]). So an abandoned lease is
//!   taken over no sooner than one TTL after the contender first saw its
//!   version, and no later than a TTL plus a poll interval.
//! * **Release writes a tombstone.** Release (and an operator's revoke)
//!   writes the record with phase `released` (`revoked`) instead of
//!   deleting the object, so the fencing generation is kept and never goes
//!   backwards. Deleting old tombstones is garbage collection
//!   ([`crate::gc::collect`], `worklease gc`): it raises the prefix's
//!   fencing floor (the object `<prefix>/worklease=fencing-floor`) to the
//!   tombstone's token, then deletes the tombstone with `If-Match`; an
//!   acquisition of a work ID without an object reads the floor after the
//!   object and starts above it, so tokens never go back
//!   (`docs/adr/0023-gc-and-the-token-floor.md`).
//!
//! # Error mapping
//!
//! | the store answers | [`object_store::Error`] | meaning |
//! |---|---|---|
//! | 412 Precondition Failed to `If-Match` / `If-None-Match` | `Precondition`, `AlreadyExists` | the compare-and-swap was lost ([`RegisterError::Conflict`]): the adapter reads again and decides |
//! | 409 Conflict (a concurrent conditional request) | `AlreadyExists` (after `object_store`'s own retries) | the same: read again and decide |
//! | 404 Not Found to a conditional replace | `Precondition` (S3, memory) | the object is gone, so is the lease: the adapter's re-read finds no record and answers `Fenced` |
//! | 404 to a read | `NotFound` | no lease yet |
//! | 404 `NoSuchBucket` to anything | `NotFound` or `Generic` | a store error naming the missing bucket (never "no lease yet", never a lost compare-and-swap) |
//! | a timeout, a reset, a 5xx after the request was sent | anything else | outcome unknown: reconciled below |
//!
//! A lost compare-and-swap is not always a loss: `object_store` retries a
//! request whose reply was lost, and the retry of a conditional write that
//! had been applied meets its own new version and gets 412. So after every
//! failed write the register reads the object back and decides by what is
//! there: the very bytes it wrote (which name this holder and the new
//! generation, and no other write produces) mean the write was applied,
//! and it succeeds with the handle read; another version means it lost
//! ([`RegisterError::Conflict`]); the version it wrote over, still in
//! place after a timeout, means the write may yet land, and it fails with
//! a store error (the adapter's next read decides again). A holder whose
//! acquisition reply was dropped therefore holds the lease, and never two
//! holders do.
//!
//! # URL
//!
//! `s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION]` ([`S3Config`]):
//! the prefix is the URL's path (percent-decoded; default
//! [`DEFAULT_PREFIX`]); `endpoint` selects an S3-compatible server (an
//! `http://` endpoint allows plain HTTP); `region` is optional (else
//! `AWS_REGION`, else `us-east-1`). Credentials, and settings the URL
//! leaves out, come from the usual `AWS_*` environment variables
//! (`AWS_REGION`, `AWS_ENDPOINT`, ...; see [`AmazonS3Builder::from_env`]),
//! never from the URL.
//!
//! # Credentials
//!
//! `object_store` takes the first of: `AWS_ACCESS_KEY_ID` and
//! `AWS_SECRET_ACCESS_KEY` (with `AWS_SESSION_TOKEN` for temporary ones);
//! `AWS_WEB_IDENTITY_TOKEN_FILE` with `AWS_ROLE_ARN` (EKS IRSA);
//! `AWS_CONTAINER_CREDENTIALS_RELATIVE_URI` (ECS tasks);
//! `AWS_CONTAINER_CREDENTIALS_FULL_URI` with
//! `AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE` (EKS Pod Identity); else the
//! EC2 instance metadata service (`169.254.169.254`, or
//! `AWS_METADATA_ENDPOINT`). `AWS_SKIP_SIGNATURE=true` sends unsigned
//! requests. `AWS_PROFILE` and the files in `~/.aws` are not read.
//!
//! Instance metadata only gives credentials for AWS itself, so with an
//! endpoint that is not AWS's (not under `amazonaws.com`) and none of the
//! sources above, [`S3Config::register`] (and so opening an `s3://` URL)
//! fails at once, naming the variables to set, instead of failing at the
//! first request with an instance-metadata error. Without an endpoint (or
//! with AWS's own) instance metadata stays the last resort, as in the AWS
//! SDKs, for hosts on EC2; off EC2 its failure is reported the same way,
//! as missing credentials. Each request may
//! take [`DEFAULT_REQUEST_TIMEOUT`]; `object_store` retries a failed one at
//! most [`RETRIES`] times within [`RETRY_TIMEOUT`]. Google Cloud Storage
//! is used through [`ObjectRegister::new`] with a store built by
//! `object_store` (feature `gcp`); Azure has a URL of its own (below).
//!
//! # Azure Blob Storage
//!
//! `azblob://CONTAINER[/PREFIX][?endpoint=URL&account=NAME]` (feature
//! `azure`; `AzureConfig`): one block blob per work ID in CONTAINER, laid
//! out as above. `account` is the storage account (else
//! `AZURE_STORAGE_ACCOUNT_NAME`); `endpoint` the account's blob endpoint
//! when it is not `https://ACCOUNT.blob.core.windows.net`, for an
//! emulator: Azurite's is `http://HOST:PORT/ACCOUNT` (the account in the
//! path; `http://` allows plain HTTP). Credentials come from the standard
//! Azure variables read by `object_store`'s `MicrosoftAzureBuilder::from_env`
//! (`AZURE_STORAGE_ACCOUNT_KEY`, `AZURE_STORAGE_SAS_KEY`,
//! `AZURE_STORAGE_TOKEN`, a service principal or workload identity through
//! `AZURE_CLIENT_ID` / `AZURE_CLIENT_SECRET` / `AZURE_TENANT_ID` /
//! `AZURE_FEDERATED_TOKEN_FILE`, else a managed identity), never from the
//! URL: a URL or endpoint with user info is refused, errors name variables,
//! never values, and with an `endpoint` and no key or token in the
//! environment opening fails at once, naming the variables. The container
//! must exist (`object_store` cannot make one): a missing container fails
//! every operation with a store error.
//!
//! What Azure's conditional writes give: `Put Blob` with
//! `If-None-Match: *` creates the blob only where there is none, and with
//! `If-Match: <ETag>` replaces it only while its ETag is the one read; a
//! failed condition is 412 (or 409 for a create that met a concurrent one),
//! nothing written. Every write gives the blob a new ETag, and reads after
//! a write see it (Azure Blob Storage is strongly consistent on the
//! account's primary endpoint). That is the whole compare-and-swap register
//! the adapter needs, so the store keeps the same contract as on S3, and is
//! checked by the whole conformance suite on Azurite (`tests/azure_blob.rs`,
//! started by `.ci/services/azurite.sh`).
//!
//! What it does not guarantee, beyond "Not supported" below: reads from a
//! geo-replicated account's secondary endpoint (`-secondary`, RA-GRS) are
//! eventually consistent and must never be the `endpoint`; blob leases
//! (Azure's own lock on a blob) are not used, and a blob leased by another
//! tool refuses every write of the store (a store error, not `Held`);
//! garbage collection ([`crate::gc`]) is refused (no conditional delete in `object_store`
//! for Azure, and an unconditional one could delete a lease acquired
//! meanwhile); and Azurite is an emulator: it persists to its data
//! directory, but its conformance is only as good as its emulation of the
//! conditional headers, which the suite checks.
//!
//! # Not supported, by the nature of an object store
//!
//! No notifications (waiters poll), fencing tokens per work ID only (not
//! across work IDs), and a takeover of an abandoned lease that waits a full
//! observed TTL, as for every [`RegisterStore`]. The store must be strongly
//! consistent (read-after-write and list-after-write, as S3 is since 2020).
//!
//! ```no_run
//! # async fn demo() -> worklease::Result<()> {
//! use std::time::Duration;
//! use worklease::gc::{collect, GcOptions};
//! use worklease::store::object::S3Config;
//!
//! let store = S3Config::from_url("s3://my-bucket/leases?region=eu-west-1")?.open()?;
//! // Operator: delete the tombstones of leases released over 30 days ago.
//! let report = collect(&store, &GcOptions::older_than(Duration::from_secs(30 * 24 * 3600))).await?;
//! println!("deleted {} ended leases", report.collected.len());
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

#[cfg(doc)]
use object_store::aws::AmazonS3Builder;
#[cfg(doc)]
use object_store::PutMode;

#[cfg(doc)]
use crate::store::register::RegisterError;
use crate::store::register::RegisterStore;

#[cfg(feature = "azure")]
mod azure;
mod config;
mod credentials;
mod diagnose;
mod floor;
mod keys;
mod register;

#[cfg(feature = "azure")]
pub use azure::AzureConfig;
pub use config::S3Config;
pub use register::ObjectRegister;

/// The prefix of the lease objects when none is given.
pub const DEFAULT_PREFIX: &str = "worklease";
/// The longest prefix accepted, in bytes (leaving room for work IDs in a
/// key of [`MAX_KEY_BYTES`]).
pub const MAX_PREFIX_BYTES: usize = 256;
/// The longest object key, in bytes: the limit of S3, GCS and Azure.
pub const MAX_KEY_BYTES: usize = 1024;
/// How long one request to the store may take (connecting included).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often `object_store` retries a request that failed in transit or
/// with a 5xx, at most.
pub const RETRIES: usize = 2;
/// How long after its first attempt `object_store` may still retry a request.
pub const RETRY_TIMEOUT: Duration = Duration::from_secs(5);

/// The leases of an object store: the generic register adapter over an
/// [`ObjectRegister`].
pub type ObjectLeaseStore = RegisterStore<ObjectRegister>;

/// The fuzz target of object keys (`crate::fuzz::object_key`): a segment
/// that unescapes to a work ID is that work ID's own escaping.
#[cfg(feature = "fuzzing")]
pub(crate) fn fuzz_key(data: &[u8]) {
    let Ok(segment) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(id) = keys::unescape(segment) {
        assert_eq!(
            keys::escape(id.as_str()),
            segment,
            "only the canonical escaping is ours"
        );
    }
}
