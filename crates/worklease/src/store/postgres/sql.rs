//! The SQL statements of one table, and the verdict of a token check.

use crate::error::{Error, Result, StoreError};
use crate::store::record;
use crate::store::LeaseRef;

use super::{TableName, KIND};

/// The SQL texts of one table.
pub(super) struct Sql {
    pub(super) acquire: String,
    pub(super) renew: String,
    pub(super) checkpoint: String,
    pub(super) release: String,
    pub(super) read: String,
    pub(super) inspect: String,
    pub(super) revoke: String,
    pub(super) lock_current: String,
}

/// The verdict of a token check, as SQL: `fenced` when the row is missing,
/// names another acquisition or was revoked; `expired` when it is this
/// acquisition but released or past its expiry; else `ok`. The same rules
/// as `record::check_current`.
fn verdict_sql(l: &str) -> String {
    format!(
        "CASE WHEN {l}.holder_id IS NULL OR {l}.holder_id <> $2::text \
              OR {l}.fencing_token <> $3::bigint OR {l}.phase = 'revoked' THEN 'fenced' \
         WHEN {l}.phase = 'released' OR NOT {l}.unexpired THEN 'expired' \
         ELSE 'ok' END"
    )
}

impl Sql {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let seq = table.sequence_quoted();
        let now = "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)";
        let ms = "interval '1 millisecond'";
        let remaining = "(EXTRACT(EPOCH FROM (l.expires_at - now.t)) * 1000000)::bigint";
        // The current row, locked: the latest committed version, also when
        // a concurrent statement changed it after this one began.
        let cur = format!(
            "cur AS MATERIALIZED (\
                SELECT l.holder_id, l.fencing_token, l.phase, l.wanted, \
                       (l.expires_at >= now.t) AS unexpired, {remaining} AS remaining_us \
                FROM {t} AS l, now WHERE l.work_id = $1::text FOR UPDATE OF l)"
        );
        let acquire = format!(
            "{now}, {cur}, \
             up AS (\
                INSERT INTO {t} AS l (work_id, holder_id, fencing_token, ttl_ms, phase, acquired_at, expires_at) \
                SELECT $1::text, $2::text, nextval('{seq}'::regclass), $3::bigint, 'held', now.t, \
                       now.t + $3::bigint * {ms} \
                FROM now WHERE (SELECT count(*) FROM cur) >= 0 \
                ON CONFLICT (work_id) DO UPDATE SET \
                    holder_id = EXCLUDED.holder_id, \
                    fencing_token = GREATEST(EXCLUDED.fencing_token, l.fencing_token + 1), \
                    ttl_ms = EXCLUDED.ttl_ms, phase = 'held', \
                    acquired_at = EXCLUDED.acquired_at, expires_at = EXCLUDED.expires_at, \
                    prev_holder_id = l.holder_id, prev_fencing_token = l.fencing_token, \
                    prev_end = CASE WHEN l.phase = 'held' THEN 'expired' ELSE l.phase END, \
                    wanted = false \
                WHERE l.phase <> 'held' OR l.expires_at < EXCLUDED.acquired_at \
                RETURNING l.fencing_token, l.prev_holder_id, l.prev_fencing_token, l.prev_end), \
             mark AS (\
                UPDATE {t} AS l SET wanted = true \
                WHERE l.work_id = $1::text AND $4::boolean AND NOT l.wanted \
                  AND NOT EXISTS (SELECT 1 FROM up) \
                RETURNING 1) \
             SELECT up.fencing_token, up.prev_holder_id, up.prev_fencing_token, up.prev_end, \
                    NULL::text AS holder_id, NULL::bigint AS remaining_us FROM up \
             UNION ALL \
             SELECT NULL, NULL, NULL, NULL, cur.holder_id, GREATEST(cur.remaining_us, 0) \
             FROM cur WHERE NOT EXISTS (SELECT 1 FROM up)"
        );
        // Renew, checkpoint and release: update the row only for the
        // current, live acquisition; the verdict comes from the locked row.
        let update = |set: &str, notify: bool| {
            let (n_cte, n_col) = if notify {
                (
                    ", n AS (SELECT pg_notify($4::text, $1::text) FROM up, cur WHERE cur.wanted)",
                    ", (SELECT count(*) FROM n) AS notified",
                )
            } else {
                ("", "")
            };
            let verdict = verdict_sql("cur");
            format!(
                "{now}, {cur}, \
                 up AS (\
                    UPDATE {t} AS l SET {set} FROM now \
                    WHERE l.work_id = $1::text AND l.holder_id = $2::text \
                      AND l.fencing_token = $3::bigint AND l.phase = 'held' \
                      AND l.expires_at >= now.t AND (SELECT count(*) FROM cur) >= 0 \
                    RETURNING l.work_id){n_cte} \
                 SELECT CASE WHEN EXISTS (SELECT 1 FROM up) THEN 'ok' ELSE {verdict} END AS verdict{n_col} \
                 FROM now LEFT JOIN cur ON true"
            )
        };
        let extend = format!("ttl_ms = $4::bigint, expires_at = now.t + $4::bigint * {ms}");
        let read_verdict = verdict_sql("r");
        let read = format!(
            "{now}, \
             r AS (SELECT l.*, (l.expires_at >= now.t) AS unexpired FROM {t} AS l, now \
                   WHERE l.work_id = $1::text), \
             v AS (SELECT {read_verdict} AS verdict, r.checkpoint, r.prev_holder_id, \
                          r.prev_fencing_token, r.prev_end \
                   FROM now LEFT JOIN r ON true) \
             SELECT verdict, CASE WHEN verdict = 'ok' THEN checkpoint END, \
                    prev_holder_id, prev_fencing_token, prev_end FROM v"
        );
        let info_cols = format!(
            "l.work_id, l.holder_id, l.fencing_token, l.phase, (l.expires_at >= now.t) AS unexpired, \
             {remaining} AS delta_us, COALESCE(octet_length(l.checkpoint), 0)::bigint AS checkpoint_bytes, \
             l.prev_holder_id, l.prev_fencing_token, l.prev_end"
        );
        let inspect = format!(
            "{now} SELECT {info_cols} FROM {t} AS l, now \
             WHERE cardinality($1::text[]) = 0 OR l.work_id = ANY($1::text[]) \
             ORDER BY l.work_id"
        );
        let revoke = format!(
            "{now}, \
             before AS MATERIALIZED (SELECT {info_cols} FROM {t} AS l, now \
                                     WHERE l.work_id = $1::text FOR UPDATE OF l), \
             up AS (\
                UPDATE {t} AS l SET phase = 'revoked', expires_at = now.t FROM now \
                WHERE l.work_id = $1::text AND l.phase = 'held' AND l.expires_at >= now.t \
                  AND (SELECT count(*) FROM before) >= 0 \
                RETURNING l.work_id), \
             n AS (SELECT pg_notify($2::text, $1::text) FROM up) \
             SELECT before.*, (SELECT count(*) FROM n) AS notified FROM before"
        );
        let lock_verdict = verdict_sql("cur");
        let lock_current = format!(
            "{now}, \
             cur AS MATERIALIZED (SELECT l.holder_id, l.fencing_token, l.phase, \
                                         (l.expires_at >= now.t) AS unexpired \
                                  FROM {t} AS l, now WHERE l.work_id = $1::text FOR SHARE OF l) \
             SELECT {lock_verdict} AS verdict FROM now LEFT JOIN cur ON true"
        );
        Self {
            acquire,
            renew: update(&extend, false),
            checkpoint: update(&format!("{extend}, checkpoint = $5::bytea"), false),
            release: update("phase = 'released', expires_at = now.t", true),
            read,
            inspect,
            revoke,
            lock_current,
        }
    }
}

fn expired(lease: LeaseRef<'_>) -> Error {
    Error::Expired {
        work_id: lease.work_id.to_string(),
        fencing_token: lease.fencing_token,
    }
}

/// Turns a verdict column into the lease outcome.
pub(super) fn check_verdict(verdict: &str, lease: LeaseRef<'_>) -> Result<()> {
    match verdict {
        "ok" => Ok(()),
        "fenced" => Err(record::fenced(lease)),
        "expired" => Err(expired(lease)),
        other => Err(StoreError::new(KIND, format!("unexpected verdict {other:?}")).into()),
    }
}
