//! The DynamoDB store (feature `dynamodb`): one item per work ID in a
//! DynamoDB table, written only with conditional writes, through the
//! generic register adapter ([`RegisterStore`]) over the official AWS SDK
//! (`aws-sdk-dynamodb`, configured by `aws-config`).
//!
//! DynamoDB has conditional writes but no clock a condition can read (a
//! `ConditionExpression` compares attributes with values the client sends,
//! so "expired" could only be judged by the writer's wall clock, which the
//! crate never trusts). So the store is a compare-and-swap register
//! ([`DynamoRegister`]) and expiry follows the register adapter's
//! observation rule, as for S3 (the crate docs' "Clocks";
//! `docs/adr/0017-dynamodb.md` has the reasons and the alternatives).
//!
//! # Items
//!
//! One table with a string partition key `pk` and nothing else declared;
//! several stores share a table under different prefixes.
//!
//! * **The lease item** `pk = "<prefix>#lease#<work ID>"`: `v`, a version
//!   (128 random bits as hex, new on every write), and `rec`, the lease
//!   record (holder, fencing token, TTL, phase, checkpoint, previous holder)
//!   in the register's binary `WLR1` encoding ([`crate::store::register`]).
//!   Every write is a `PutItem` with `ConditionExpression`
//!   `attribute_not_exists(pk)` (create) or `v = :read` (replace), so a
//!   write lands only on the version it was decided on. A work ID is data:
//!   it follows the second `#` verbatim, and a prefix cannot contain `#`,
//!   so no work ID names another prefix's items.
//! * **The fencing floor** `pk = "<prefix>#fence#<work ID>"`: `fence`, the
//!   highest token an acquisition of the work ID ever wrote. Each
//!   acquisition reads the lease item, then the floor, takes a token above
//!   both, raises the floor (`UpdateItem`, `SET fence = :t` on condition
//!   `attribute_not_exists(fence) OR fence <= :t`), and only once that
//!   succeeded writes the lease item. So deleting a lease item (by hand,
//!   or by an operator's purge through
//!   [`crate::store::register::Register::delete`]) never restarts its
//!   tokens (S2). A raise whose write then loses leaves the floor ahead of
//!   the record: harmless, tokens may skip numbers. The two steps are not
//!   one transaction on purpose: dynalite has
//!   no `TransactWriteItems`, and a transaction costs twice the write
//!   units of both items (the ADR).
//!
//! Release and revoke write the record with phase `released`/`revoked`
//! (a tombstone); nothing deletes in normal operation.
//!
//! # Lost replies
//!
//! The SDK retries a request whose reply was lost, and the retry of a
//! conditional write that was applied meets its own new version and fails
//! its condition. So every failed write (other than a missing table or a
//! request refused outright) is decided by reading the item back
//! (strongly consistent): the version this write chose means it was
//! applied (the write succeeds); another version, or none where one was
//! named, means it lost ([`RegisterError::Conflict`]: the adapter reads
//! and decides again); the version written over, still in place after a
//! timeout, means the outcome is unknown (a store error; the adapter's next
//! read decides). A holder whose acquisition reply was dropped holds the
//! lease, and never two holders do.
//!
//! # Errors
//!
//! * A missing table is a store error that names the table, its region and
//!   endpoint, and prints the one-line `aws dynamodb create-table ...`
//!   command that makes it; `?create=true` makes it instead (development
//!   and tests: on-demand capacity, waiting until it is active).
//! * Throttling (`ProvisionedThroughputExceededException`,
//!   `ThrottlingException`, `RequestLimitExceeded`) and transaction
//!   conflicts, after the SDK's own retries, are store errors, which the
//!   lease layer retries (a renewal within its lease window): never `Held`.
//! * Each request attempt may take [`DEFAULT_REQUEST_TIMEOUT`]; the SDK's
//!   standard retry mode makes at most [`MAX_ATTEMPTS`] attempts within
//!   [`OPERATION_TIMEOUT`] (a retry after a TTL is worthless; the renewal
//!   loop has its own backoff).
//!
//! # Limits
//!
//! * **Checkpoints**: at most [`MAX_CHECKPOINT_BYTES`] (384 KiB): an item
//!   holds at most 400 KiB, and the key, the version and the record's
//!   other fields (holder IDs of up to 256 bytes, a work ID of up to 1024)
//!   take under 2 KiB of it. A larger checkpoint is bad input naming the
//!   limit ([`crate::error::InvalidInput::CheckpointTooLarge`]), and
//!   nothing is written.
//! * **Batches**: a batch is one wave of
//!   [`crate::store::batch::EACH_CONCURRENCY`] single calls, as for every
//!   register. DynamoDB's batch calls do not fit a lease batch:
//!   `BatchGetItem` (up to 100 keys, 16 MB) reads without conditions, and
//!   `TransactWriteItems` (up to 100 items, 4 MB) fails as a whole when one
//!   lease's condition fails, while each lease of a batch must fail alone.
//!
//! # Cost
//!
//! In capacity units (on-demand: request units), for a record of `S` KiB
//! (about 0.6 KiB without a checkpoint, plus the checkpoint); a strongly
//! consistent read costs 1 RCU per 4 KiB, a write 1 WCU per 1 KiB of the
//! larger of the old and the new item:
//!
//! | operation | requests | RCU | WCU |
//! |---|---|---|---|
//! | acquire | `GetItem` ×2 (item, floor), `UpdateItem` (floor), `PutItem` | ⌈S/4⌉ + 1 | 1 + ⌈S⌉ |
//! | renew | `GetItem`, `PutItem` | ⌈S/4⌉ | ⌈S⌉ |
//! | checkpoint | `GetItem`, `PutItem` | ⌈S/4⌉ | ⌈S'⌉, S' the larger record (before, after) |
//! | read checkpoint | `GetItem` | ⌈S/4⌉ | 0 |
//! | release | `GetItem`, `PutItem` | ⌈S/4⌉ | ⌈S⌉ |
//!
//! So a lease without a checkpoint costs 1 RCU + 1 WCU per renewal (every
//! TTL/3: a 15 s TTL is 17,280 renewals a day), and a checkpoint makes
//! every later renewal of the lease cost its size too, since a renewal
//! rewrites the item. A failed write costs its units as well, and one
//! reconciled by reading back costs another read.
//!
//! # URL
//!
//! `dynamodb://TABLE[?region=R&endpoint=URL&prefix=P&create=true]`
//! ([`DynamoConfig`]): `region` (else the AWS environment's: `AWS_REGION`,
//! the profile's; a store error names the parameter when there is none);
//! `endpoint` only for a local or DynamoDB-compatible server (dynalite,
//! moto, DynamoDB Local); `prefix` of the keys (default
//! [`DEFAULT_PREFIX`]); `create=true` to make a missing table.
//!
//! # Credentials
//!
//! From the standard AWS sources, as every AWS SDK takes them (the default
//! chain of `aws-config`): `AWS_ACCESS_KEY_ID` / `AWS_SECRET_ACCESS_KEY`
//! (`AWS_SESSION_TOKEN`), `AWS_PROFILE` and the files in `~/.aws`
//! (static keys, assumed roles; without SSO and `credential_process`,
//! which this build leaves out), a web identity (EKS IRSA), ECS and EKS
//! container credentials, and the EC2 instance metadata service. Never
//! from the URL: a URL (or an endpoint) with user info is refused, and no
//! error or log line carries a credential.
//!
//! # What this store does not guarantee
//!
//! * **No clock**: a contender takes over an abandoned lease only after
//!   it has itself seen the same version unchanged for a full TTL, so a
//!   contender that first looks late waits longer than the holder's own
//!   deadline ([`RegisterStore`]'s docs); `Held` carries this process's
//!   upper bound, not a countdown.
//! * **No notifications**: waiters poll (DynamoDB Streams would need a
//!   stream per table and a reader per process: not used).
//! * **Fencing per work ID**, not across work IDs; deleting both items of
//!   a work ID (or the table) restarts its tokens at 1.
//! * **One region**: global tables replicate asynchronously with
//!   last-writer-wins across regions, which breaks every conditional
//!   write's guarantee: use a table in one region only, and every process
//!   of a fleet in that region's endpoint.
//! * **Durability** is DynamoDB's (or the local server's: dynalite and moto
//!   in memory forget everything on restart, and then tokens restart).
//!
//! ```no_run
//! # async fn demo() -> worklease::Result<()> {
//! use std::time::Duration;
//! use worklease::store::dynamodb::DynamoConfig;
//! use worklease::{AcquireOptions, Config, Leases};
//!
//! let store = DynamoConfig::from_url("dynamodb://leases?region=eu-west-1")?.open();
//! let leases = Leases::new(std::sync::Arc::new(store), Config::new("worker-1", Duration::from_secs(15)))?;
//! let token = leases.acquire("jobs/nightly", AcquireOptions::default()).await?;
//! leases.release(token).await?;
//! # Ok(())
//! # }
//! ```

use std::time::Duration;

#[cfg(doc)]
use crate::store::register::RegisterError;
use crate::store::register::RegisterStore;

mod client;
mod config;
mod errors;
mod keys;
mod register;

pub use config::DynamoConfig;
pub use register::DynamoRegister;

/// [`crate::store::register::Register::kind`] of the DynamoDB register.
pub(crate) const KIND: &str = "dynamodb";
/// The key prefix of the items when none is given.
pub const DEFAULT_PREFIX: &str = "worklease";
/// The longest prefix accepted, in bytes.
pub const MAX_PREFIX_BYTES: usize = 256;
/// The largest checkpoint the DynamoDB store holds, in bytes (384 KiB:
/// the item limit is 400 KiB; see the module docs, "Limits").
pub const MAX_CHECKPOINT_BYTES: usize = 384 * 1024;
/// How long one request attempt may take (connecting included).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How many attempts the SDK makes of one request, at most (its standard
/// retry mode, with backoff; throttling included).
pub const MAX_ATTEMPTS: u32 = 3;
/// How long one request may take with its retries.
pub const OPERATION_TIMEOUT: Duration = Duration::from_secs(10);

/// The leases of a DynamoDB table: the register adapter over a
/// [`DynamoRegister`].
pub type DynamoLeaseStore = RegisterStore<DynamoRegister>;
