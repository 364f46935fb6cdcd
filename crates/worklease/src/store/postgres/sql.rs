//! The SQL statements of one table, and the verdict of a token check.

use super::TableName;

/// The SQL texts of one table.
pub(super) struct Sql {
    pub(super) acquire: String,
    pub(super) renew: String,
    pub(super) checkpoint: String,
    pub(super) release: String,
    pub(super) read: String,
    pub(super) inspect: String,
    pub(super) revoke: String,
    pub(super) inspect_checkpoint: String,
    pub(super) delete_ended: String,
    pub(super) lock_current: String,
    pub(super) acquire_many: String,
    pub(super) renew_many: String,
    pub(super) release_many: String,
}

/// The statement's one reading of the server's clock, `now.t`.
const NOW: &str = "WITH now AS MATERIALIZED (SELECT clock_timestamp() AS t)";
/// One millisecond, to turn a TTL in milliseconds into an interval.
const MS: &str = "interval '1 millisecond'";
/// The microseconds from `now.t` to the expiry of the row `l`.
const REMAINING_US: &str = "(EXTRACT(EPOCH FROM (l.expires_at - now.t)) * 1000000)::bigint";

/// The verdict of a token check, as SQL: `fenced` when the row `l` is
/// missing, names another acquisition than `holder` and `token` or was
/// revoked; `expired` when it is this acquisition but released or past its
/// expiry; else `ok`. The same rules as `record::check_current`.
fn verdict_sql(l: &str, holder: &str, token: &str) -> String {
    format!(
        "CASE WHEN {l}.holder_id IS NULL OR {l}.holder_id <> {holder} \
              OR {l}.fencing_token <> {token} OR {l}.phase = 'revoked' THEN 'fenced' \
         WHEN {l}.phase = 'released' OR NOT {l}.unexpired THEN 'expired' \
         ELSE 'ok' END"
    )
}

/// How many leases a renew, checkpoint or release statement names.
#[derive(Clone, Copy)]
enum Keys {
    /// One: `$1` work ID, `$2` holder ID, `$3` fencing token.
    One,
    /// Many: the arrays `$1`, `$2` and `$3`, one lease per index.
    Many,
}

impl Keys {
    /// The CTE `req` of the leases named: `work_id`, `holder_id`,
    /// `fencing_token` and `ord` (the index, from 1).
    fn req(self) -> &'static str {
        match self {
            Keys::One => {
                "req AS (SELECT $1::text AS work_id, $2::text AS holder_id, \
                                $3::bigint AS fencing_token, 1::bigint AS ord)"
            }
            Keys::Many => {
                "req AS MATERIALIZED (SELECT * FROM \
                    unnest($1::text[], $2::text[], $3::bigint[]) WITH ORDINALITY \
                    AS r(work_id, holder_id, fencing_token, ord))"
            }
        }
    }
}

/// The rows of the work IDs of `req`, each locked (`FOR UPDATE`) in
/// work-ID order, the order in which every statement that locks more than
/// one row locks them, so that two of them never wait for each other in a
/// cycle: `SELECT {cols} FROM {locked}` gives one row per `req` row, with
/// the `req` row as `r` and the lease row (all NULL when there is none)
/// as `l`, whose columns are `cols` (over the table as `l`, with `now`).
/// Each lease row is looked up by its key alone (a nested loop over
/// `req`), so the planner's estimates stay proportional to the batch.
fn locked(table: &str, cols: &str) -> String {
    format!(
        "(SELECT * FROM req ORDER BY req.work_id COLLATE \"C\") AS r \
         LEFT JOIN LATERAL (SELECT {cols} FROM {table} AS l, now \
                            WHERE l.work_id = r.work_id FOR UPDATE OF l) AS l ON true"
    )
}

/// Renew, checkpoint or release (`set`, and a notification for a waiter
/// when `notify`, on the channel `$4`): the row is updated only for the
/// current, live acquisition. One answer row per lease named, in their
/// order: the verdict (from the locked row, so it is `ok` exactly when the
/// row is updated) and, with `notify`, the number of notifications sent.
/// Every row is locked before any is updated (`up` counts `cur` first): a
/// statement holds no update while it waits for a lock (see
/// [`acquire_many_sql`]).
fn update_sql(table: &str, keys: Keys, set: &str, notify: bool) -> String {
    let req = keys.req();
    let verdict = verdict_sql("l", "r.holder_id", "r.fencing_token");
    // The current rows, locked: the latest committed versions, also when a
    // concurrent statement changed them after this one began.
    let locked = locked(
        table,
        "l.holder_id, l.fencing_token, l.phase, l.wanted, (l.expires_at >= now.t) AS unexpired",
    );
    let (n_cte, n_col) = if notify {
        (
            ", n AS (SELECT pg_notify($4::text, up.work_id) FROM up WHERE up.wanted)",
            ", (SELECT count(*) FROM n) AS notified",
        )
    } else {
        ("", "")
    };
    format!(
        "{NOW}, {req}, \
         cur AS MATERIALIZED (SELECT r.work_id, r.ord, l.wanted, {verdict} AS verdict FROM {locked}), \
         up AS (\
            UPDATE {table} AS l SET {set} FROM now, cur \
            WHERE l.work_id = cur.work_id AND cur.verdict = 'ok' \
              AND (SELECT count(*) FROM cur) >= 0 \
            RETURNING l.work_id, cur.wanted){n_cte} \
         SELECT cur.verdict{n_col} FROM cur ORDER BY cur.ord"
    )
}

/// Acquires up to `$5` of the work IDs `$1` for the holder `$2` for `$3`
/// ms, trying them in order; `$4` says per work ID whether a waiter of
/// this store watches it (a held one is then marked `wanted`, as by the
/// single acquisition). One answer row per work ID tried, in order, with
/// the columns of the single acquisition: the grant (token and hand-off)
/// or the holder and its time left, or neither when a concurrent first
/// acquisition inserted the row after this statement began (it decided
/// nothing for that work ID then).
///
/// Locks: the existing rows first, all of them, in work-ID order (`cur`,
/// as every batch statement), then the missing rows are inserted in work-ID order
/// with `ON CONFLICT DO NOTHING` (which waits for a concurrent insertion
/// or update of the same key, never for a mere row lock), and only then
/// are the locked rows updated. So a statement never waits for a row lock
/// while it holds an insertion or an update, and no two statements wait
/// for each other in a cycle.
fn acquire_many_sql(t: &str, seq: &str) -> String {
    let locked = locked(
        t,
        &format!(
            "l.work_id, l.holder_id, (l.phase <> 'held' OR l.expires_at < now.t) AS free, \
             {REMAINING_US} AS remaining_us"
        ),
    );
    let won = "l.work_id, l.fencing_token, l.prev_holder_id, l.prev_fencing_token, l.prev_end";
    format!(
        "{NOW}, \
         req AS MATERIALIZED (SELECT * FROM unnest($1::text[], $4::boolean[]) WITH ORDINALITY \
                              AS r(work_id, waiting, ord)), \
         cur AS MATERIALIZED (\
            SELECT r.work_id, r.waiting, r.ord, l.work_id IS NOT NULL AS known, \
                   COALESCE(l.free, true) AS free, l.holder_id, l.remaining_us \
            FROM {locked}), \
         pick AS MATERIALIZED (\
            SELECT * FROM (\
                SELECT cur.*, count(*) FILTER (WHERE cur.free) OVER (\
                           ORDER BY cur.ord ROWS BETWEEN UNBOUNDED PRECEDING AND 1 PRECEDING\
                       ) AS free_before \
                FROM cur WHERE (SELECT count(*) FROM cur) >= 0) AS c \
            WHERE c.free_before < $5::bigint), \
         ins AS (\
            INSERT INTO {t} AS l (work_id, fencing_token, holder_id, ttl_ms, phase, acquired_at, expires_at) \
            SELECT p.work_id, nextval('{seq}'::regclass), $2::text, $3::bigint, 'held', now.t, \
                   now.t + $3::bigint * {MS} \
            FROM pick AS p, now WHERE p.free AND NOT p.known ORDER BY p.work_id COLLATE \"C\" \
            ON CONFLICT (work_id) DO NOTHING \
            RETURNING {won}), \
         up AS (\
            UPDATE {t} AS l SET holder_id = $2::text, \
                fencing_token = GREATEST(nextval('{seq}'::regclass), l.fencing_token + 1), \
                ttl_ms = $3::bigint, phase = 'held', acquired_at = now.t, \
                expires_at = now.t + $3::bigint * {MS}, \
                prev_holder_id = l.holder_id, prev_fencing_token = l.fencing_token, \
                prev_end = CASE WHEN l.phase = 'held' THEN 'expired' ELSE l.phase END, \
                wanted = false \
            FROM now, pick AS p \
            WHERE l.work_id = p.work_id AND p.free AND p.known \
              AND (l.phase <> 'held' OR l.expires_at < now.t) AND (SELECT count(*) FROM ins) >= 0 \
            RETURNING {won}), \
         mark AS (\
            UPDATE {t} AS l SET wanted = true FROM pick AS p \
            WHERE l.work_id = p.work_id AND NOT p.free AND p.waiting AND NOT l.wanted \
              AND (SELECT count(*) FROM ins) >= 0 \
            RETURNING 1), \
         won AS (SELECT * FROM ins UNION ALL SELECT * FROM up) \
         SELECT w.fencing_token, w.prev_holder_id, w.prev_fencing_token, w.prev_end, \
                CASE WHEN NOT p.free THEN p.holder_id END AS holder_id, \
                GREATEST(p.remaining_us, 0) AS remaining_us \
         FROM pick AS p LEFT JOIN won AS w ON w.work_id = p.work_id ORDER BY p.ord"
    )
}

impl Sql {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let seq = table.sequence_quoted();
        // The current row, locked: the latest committed version, also when
        // a concurrent statement changed it after this one began.
        let cur = format!(
            "cur AS MATERIALIZED (\
                SELECT l.holder_id, l.fencing_token, l.phase, l.wanted, \
                       (l.expires_at >= now.t) AS unexpired, {REMAINING_US} AS remaining_us \
                FROM {t} AS l, now WHERE l.work_id = $1::text FOR UPDATE OF l)"
        );
        let acquire = format!(
            "{NOW}, {cur}, \
             up AS (\
                INSERT INTO {t} AS l (work_id, holder_id, fencing_token, ttl_ms, phase, acquired_at, expires_at) \
                SELECT $1::text, $2::text, nextval('{seq}'::regclass), $3::bigint, 'held', now.t, \
                       now.t + $3::bigint * {MS} \
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
        let extend = format!("ttl_ms = $4::bigint, expires_at = now.t + $4::bigint * {MS}");
        let released = "phase = 'released', expires_at = now.t";
        let read_verdict = verdict_sql("r", "$2::text", "$3::bigint");
        let read = format!(
            "{NOW}, \
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
             {REMAINING_US} AS delta_us, COALESCE(octet_length(l.checkpoint), 0)::bigint AS checkpoint_bytes, \
             l.prev_holder_id, l.prev_fencing_token, l.prev_end"
        );
        let inspect = format!(
            "{NOW} SELECT {info_cols} FROM {t} AS l, now \
             WHERE cardinality($1::text[]) = 0 OR l.work_id = ANY($1::text[]) \
             ORDER BY l.work_id"
        );
        let revoke = format!(
            "{NOW}, \
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
        // The lease columns of `inspect`, then the checkpoint bytes.
        let inspect_checkpoint = format!(
            "{NOW} SELECT {info_cols}, l.checkpoint FROM {t} AS l, now WHERE l.work_id = $1::text"
        );
        // Not live by the acquisition's own rule (`acquire`'s WHERE), and
        // still the acquisition judged. A concurrent acquisition's UPDATE
        // makes this DELETE wait and judge the new row version, whose token
        // differs; the sequence, untouched, stays the floor of new tokens.
        let delete_ended = format!(
            "{NOW} DELETE FROM {t} AS l USING now              WHERE l.work_id = $1::text AND l.fencing_token = $2::bigint                AND (l.phase <> 'held' OR l.expires_at < now.t)              RETURNING l.fencing_token"
        );
        let lock_verdict = verdict_sql("cur", "$2::text", "$3::bigint");
        let lock_current = format!(
            "{NOW}, \
             cur AS MATERIALIZED (SELECT l.holder_id, l.fencing_token, l.phase, \
                                         (l.expires_at >= now.t) AS unexpired \
                                  FROM {t} AS l, now WHERE l.work_id = $1::text FOR SHARE OF l) \
             SELECT {lock_verdict} AS verdict FROM now LEFT JOIN cur ON true"
        );
        Self {
            acquire,
            renew: update_sql(&t, Keys::One, &extend, false),
            checkpoint: update_sql(
                &t,
                Keys::One,
                &format!("{extend}, checkpoint = $5::bytea"),
                false,
            ),
            release: update_sql(&t, Keys::One, released, true),
            read,
            inspect,
            revoke,
            inspect_checkpoint,
            delete_ended,
            lock_current,
            acquire_many: acquire_many_sql(&t, &seq),
            renew_many: update_sql(&t, Keys::Many, &extend, false),
            release_many: update_sql(&t, Keys::Many, released, true),
        }
    }
}
