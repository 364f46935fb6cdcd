//! The SQL of one table: its schema, its stored procedures (one per
//! operation that writes, so that each costs one round trip: a `CALL`)
//! and the plain statements of the reads.
//!
//! Every procedure runs one READ COMMITTED transaction (no gap locks: two
//! first acquisitions of different new work IDs never block each other),
//! reads the server's clock (`UTC_TIMESTAMP(6)`, independent of the
//! session's time zone) after it has locked the rows it decides on, and
//! rolls back and re-raises on any error. Parameters are bound by the
//! server (the binary protocol); only the checked table name is spliced.

use crate::store::sql_rows::COMMENT_PREFIX;

use super::TableName;

/// The schema version this code writes, recorded in the table's comment
/// and in the names of its procedures (`<table>_v1_acquire`).
pub const SCHEMA_VERSION: u32 = 1;

/// The type of a work ID (byte-exact, no collation, no trailing-space
/// padding): [`crate::limits::MAX_WORK_ID_BYTES`].
const WORK: &str = "VARBINARY(1024)";
/// The type of a holder ID: [`crate::limits::MAX_HOLDER_ID_BYTES`].
const HOLDER: &str = "VARBINARY(256)";

/// The verdict of a token check, as SQL: `fenced` when the row (its
/// holder `h` NULL when missing) names another acquisition than `holder`
/// and `token` or was revoked; `expired` when it is this acquisition but
/// released or past its expiry at `now`; else `ok`. The same rules as
/// `record::check_current`.
fn verdict(
    (h, t, phase, expires): (&str, &str, &str, &str),
    holder: &str,
    token: &str,
    now: &str,
) -> String {
    format!(
        "CASE WHEN {h} IS NULL OR {h} <> {holder} OR {t} <> {token} OR {phase} = 'revoked' \
              THEN 'fenced' \
         WHEN {phase} = 'released' OR {expires} < {now} THEN 'expired' ELSE 'ok' END"
    )
}

/// The columns [`verdict`] reads of the lease table aliased `l`.
const LEASE_ROW: (&str, &str, &str, &str) =
    ("l.holder_id", "l.fencing_token", "l.phase", "l.expires_at");

/// The leases of a batch, from the JSON array `p` of `[work_id, holder_id,
/// fencing_token]`, with their position `ord` (from 1).
fn leases_json(p: &str) -> String {
    format!(
        "JSON_TABLE({p}, '$[*]' COLUMNS (ord FOR ORDINALITY, work_id {WORK} PATH '$[0]', \
         holder_id {HOLDER} PATH '$[1]', fencing_token BIGINT UNSIGNED PATH '$[2]')) AS j"
    )
}

/// The start of every procedure body after its declarations: a READ
/// COMMITTED transaction that is rolled back on any error.
const BEGIN_TX: &str = "DECLARE EXIT HANDLER FOR SQLEXCEPTION BEGIN ROLLBACK; RESIGNAL; END; \
     SET TRANSACTION ISOLATION LEVEL READ COMMITTED; \
     START TRANSACTION;";

/// The columns of a lease's description (see `ops::info_from`): work ID,
/// holder, token, phase, unexpired, microseconds to expiry, checkpoint
/// bytes, previous holder, its token, how it ended.
fn info_cols(now: &str) -> String {
    format!(
        "l.work_id, l.holder_id, l.fencing_token, CAST(l.phase AS CHAR), \
         l.expires_at >= {now}, TIMESTAMPDIFF(MICROSECOND, {now}, l.expires_at), \
         COALESCE(LENGTH(l.checkpoint), 0), l.prev_holder_id, l.prev_fencing_token, \
         CAST(l.prev_end AS CHAR)"
    )
}

/// The SQL of one table.
pub(super) struct Sql {
    /// `CREATE TABLE` statements: the leases, the fencing sequence.
    pub(super) create: [String; 2],
    /// `(name, CREATE PROCEDURE ...)` of every procedure, the internal
    /// one first.
    pub(super) procedures: Vec<(String, String)>,
    pub(super) acquire: String,
    pub(super) update: String,
    pub(super) read: String,
    pub(super) inspect: String,
    pub(super) revoke: String,
    /// The lease columns of `inspect` and the checkpoint of one work ID.
    pub(super) inspect_checkpoint: String,
    /// Deletes one ended row (work ID, token), judged by the server's
    /// clock; the fencing sequence stays, the floor of new tokens.
    pub(super) delete_ended: String,
    pub(super) lock_current: String,
    pub(super) acquire_many: String,
    pub(super) update_many: String,
}

impl Sql {
    pub(super) fn new(table: &TableName) -> Self {
        let t = table.quoted();
        let f = table.fencing_quoted();
        let proc_name = |op: &str| table.procedure(op);
        let create = [
            format!(
                "CREATE TABLE IF NOT EXISTS {t} (\
                    work_id {WORK} NOT NULL PRIMARY KEY, \
                    holder_id {HOLDER} NOT NULL, \
                    fencing_token BIGINT UNSIGNED NOT NULL, \
                    ttl_ms BIGINT NOT NULL, \
                    phase ENUM('held', 'released', 'revoked') NOT NULL, \
                    acquired_at DATETIME(6) NOT NULL, \
                    expires_at DATETIME(6) NOT NULL, \
                    checkpoint LONGBLOB NULL, \
                    prev_holder_id {HOLDER} NULL, \
                    prev_fencing_token BIGINT UNSIGNED NULL, \
                    prev_end ENUM('released', 'expired', 'revoked') NULL\
                 ) ENGINE=InnoDB COMMENT='{COMMENT_PREFIX}{SCHEMA_VERSION}'"
            ),
            format!(
                "CREATE TABLE IF NOT EXISTS {f} (\
                    id BIGINT UNSIGNED NOT NULL AUTO_INCREMENT PRIMARY KEY\
                 ) ENGINE=InnoDB COMMENT='worklease fencing sequence of {table}'"
            ),
        ];
        let take = proc_name("take");
        let expires = "v_now + INTERVAL p_ttl * 1000 MICROSECOND";
        // Decides one acquisition inside the caller's transaction: locks
        // the row, reads the clock, grants (a token from the sequence, at
        // least the row's + 1) or answers the holder and its time left. A
        // concurrent first acquisition that inserted the row first makes
        // the insertion fail (duplicate key): the row is read again.
        let take_sql = format!(
            "CREATE PROCEDURE `{take}`(IN p_work {WORK}, IN p_holder {HOLDER}, IN p_ttl BIGINT, \
                OUT o_token BIGINT UNSIGNED, OUT o_prev_holder {HOLDER}, \
                OUT o_prev_token BIGINT UNSIGNED, OUT o_prev_end VARCHAR(8), \
                OUT o_holder {HOLDER}, OUT o_remaining_us BIGINT) \
             MODIFIES SQL DATA SQL SECURITY INVOKER \
             BEGIN \
                DECLARE v_holder {HOLDER}; DECLARE v_token BIGINT UNSIGNED; \
                DECLARE v_phase VARCHAR(8); DECLARE v_expires DATETIME(6); \
                DECLARE v_now DATETIME(6); DECLARE v_next BIGINT UNSIGNED; \
                DECLARE v_dup INT DEFAULT 0; DECLARE v_try INT DEFAULT 0; \
                DECLARE CONTINUE HANDLER FOR 1062 SET v_dup = 1; \
                SET o_token = NULL, o_prev_holder = NULL, o_prev_token = NULL, \
                    o_prev_end = NULL, o_holder = NULL, o_remaining_us = NULL; \
                take: LOOP \
                    SET v_try = v_try + 1, v_dup = 0, v_holder = NULL; \
                    SELECT holder_id, fencing_token, phase, expires_at \
                        INTO v_holder, v_token, v_phase, v_expires \
                        FROM {t} WHERE work_id = p_work FOR UPDATE; \
                    SET v_now = UTC_TIMESTAMP(6); \
                    IF v_holder IS NOT NULL AND v_phase = 'held' AND v_expires >= v_now THEN \
                        SET o_holder = v_holder, \
                            o_remaining_us = TIMESTAMPDIFF(MICROSECOND, v_now, v_expires); \
                        LEAVE take; \
                    END IF; \
                    INSERT INTO {f} () VALUES (); \
                    SET v_next = LAST_INSERT_ID(); \
                    DELETE FROM {f} WHERE id = v_next; \
                    IF v_holder IS NULL THEN \
                        INSERT INTO {t} (work_id, holder_id, fencing_token, ttl_ms, phase, \
                                         acquired_at, expires_at) \
                            VALUES (p_work, p_holder, v_next, p_ttl, 'held', v_now, {expires}); \
                        IF v_dup = 1 THEN \
                            IF v_try < 3 THEN ITERATE take; END IF; \
                            SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = \
                                'worklease: the acquisition kept racing concurrent first acquisitions'; \
                        END IF; \
                        SET o_token = v_next; \
                    ELSE \
                        SET o_token = GREATEST(v_next, v_token + 1), o_prev_holder = v_holder, \
                            o_prev_token = v_token, \
                            o_prev_end = IF(v_phase = 'held', 'expired', v_phase); \
                        UPDATE {t} SET holder_id = p_holder, fencing_token = o_token, \
                            ttl_ms = p_ttl, phase = 'held', acquired_at = v_now, \
                            expires_at = {expires}, prev_holder_id = v_holder, \
                            prev_fencing_token = v_token, prev_end = o_prev_end \
                            WHERE work_id = p_work; \
                    END IF; \
                    LEAVE take; \
                END LOOP; \
             END"
        );
        let outs = "DECLARE o_token BIGINT UNSIGNED; DECLARE o_prev_holder VARBINARY(256); \
             DECLARE o_prev_token BIGINT UNSIGNED; DECLARE o_prev_end VARCHAR(8); \
             DECLARE o_holder VARBINARY(256); DECLARE o_remaining_us BIGINT;";
        let call_take = format!(
            "CALL `{take}`(p_work, p_holder, p_ttl, o_token, o_prev_holder, o_prev_token, \
                           o_prev_end, o_holder, o_remaining_us);"
        );
        let acquire = proc_name("acquire");
        let acquire_sql = format!(
            "CREATE PROCEDURE `{acquire}`(IN p_work {WORK}, IN p_holder {HOLDER}, IN p_ttl BIGINT) \
             MODIFIES SQL DATA SQL SECURITY INVOKER \
             BEGIN {outs} {BEGIN_TX} {call_take} COMMIT; \
                SELECT o_token, o_prev_holder, o_prev_token, o_prev_end, o_holder, o_remaining_us; \
             END"
        );
        // The work IDs of `p_ids` (a JSON array of strings) in order, until
        // `p_max` are granted: one transaction; the outcomes as one JSON
        // array of the single call's columns (the IDs as text: MySQL would
        // write binary strings into JSON as base64).
        let acquire_many = proc_name("acquire_many");
        let acquire_many_sql = format!(
            "CREATE PROCEDURE `{acquire_many}`(IN p_ids JSON, IN p_holder {HOLDER}, \
                IN p_ttl BIGINT, IN p_max INT) \
             MODIFIES SQL DATA SQL SECURITY INVOKER \
             BEGIN {outs} \
                DECLARE p_work {WORK}; DECLARE v_i INT DEFAULT 0; DECLARE v_n INT; \
                DECLARE v_granted INT DEFAULT 0; DECLARE v_out LONGTEXT DEFAULT '[]'; \
                {BEGIN_TX} \
                SET v_n = JSON_LENGTH(p_ids); \
                WHILE v_i < v_n AND v_granted < p_max DO \
                    SET p_work = JSON_UNQUOTE(JSON_EXTRACT(p_ids, CONCAT('$[', v_i, ']'))); \
                    {call_take} \
                    SET v_out = JSON_ARRAY_APPEND(v_out, '$', JSON_ARRAY(o_token, \
                        CONVERT(o_prev_holder USING utf8mb4), o_prev_token, o_prev_end, \
                        CONVERT(o_holder USING utf8mb4), o_remaining_us)); \
                    IF o_token IS NOT NULL THEN SET v_granted = v_granted + 1; END IF; \
                    SET v_i = v_i + 1; \
                END WHILE; \
                COMMIT; \
                SELECT v_out; \
             END"
        );
        // Renew (`p_op` 'renew'), checkpoint ('checkpoint', `p_data`) or
        // release ('release') of one lease: its verdict, and the update
        // when it is `ok`.
        let update = proc_name("update");
        let one_verdict = verdict(
            ("v_holder", "v_token", "v_phase", "v_expires"),
            "p_holder",
            "p_token",
            "v_now",
        );
        let update_sql = format!(
            "CREATE PROCEDURE `{update}`(IN p_work {WORK}, IN p_holder {HOLDER}, \
                IN p_token BIGINT UNSIGNED, IN p_ttl BIGINT, IN p_op VARCHAR(10), IN p_data LONGBLOB) \
             MODIFIES SQL DATA SQL SECURITY INVOKER \
             BEGIN \
                DECLARE v_holder {HOLDER}; DECLARE v_token BIGINT UNSIGNED; \
                DECLARE v_phase VARCHAR(8); DECLARE v_expires DATETIME(6); \
                DECLARE v_now DATETIME(6); DECLARE v_verdict VARCHAR(8); \
                {BEGIN_TX} \
                SET v_holder = NULL; \
                SELECT holder_id, fencing_token, phase, expires_at \
                    INTO v_holder, v_token, v_phase, v_expires \
                    FROM {t} WHERE work_id = p_work FOR UPDATE; \
                SET v_now = UTC_TIMESTAMP(6); \
                SET v_verdict = {one_verdict}; \
                IF v_verdict = 'ok' AND p_op = 'release' THEN \
                    UPDATE {t} SET phase = 'released', expires_at = v_now WHERE work_id = p_work; \
                ELSEIF v_verdict = 'ok' THEN \
                    UPDATE {t} SET ttl_ms = p_ttl, expires_at = {expires}, \
                        checkpoint = IF(p_op = 'checkpoint', p_data, checkpoint) \
                        WHERE work_id = p_work; \
                END IF; \
                COMMIT; \
                SELECT v_verdict; \
             END"
        );
        // Renew or release of many leases (`p_leases`, sorted by work ID
        // by the caller, so that rows are locked in work-ID order): one
        // locking read, one verdict read and ONE update over all of them;
        // the verdicts as one string, a letter per lease in order.
        let update_many = proc_name("update_many");
        let many_verdict = verdict(LEASE_ROW, "j.holder_id", "j.fencing_token", "v_now");
        let live = "l.holder_id = j.holder_id AND l.fencing_token = j.fencing_token \
                    AND l.phase = 'held' AND l.expires_at >= v_now";
        let j = leases_json("p_leases");
        let update_many_sql = format!(
            "CREATE PROCEDURE `{update_many}`(IN p_leases JSON, IN p_ttl BIGINT, IN p_op VARCHAR(10)) \
             MODIFIES SQL DATA SQL SECURITY INVOKER \
             BEGIN \
                DECLARE v_now DATETIME(6); DECLARE v_n INT; DECLARE v_verdicts LONGTEXT; \
                {BEGIN_TX} \
                SELECT COUNT(l.work_id) INTO v_n FROM {j} JOIN {t} AS l ON l.work_id = j.work_id \
                    FOR UPDATE; \
                SET v_now = UTC_TIMESTAMP(6); \
                SELECT GROUP_CONCAT(LEFT({many_verdict}, 1) ORDER BY j.ord SEPARATOR '') \
                    INTO v_verdicts FROM {j} LEFT JOIN {t} AS l ON l.work_id = j.work_id; \
                IF p_op = 'release' THEN \
                    UPDATE {t} AS l JOIN {j} ON l.work_id = j.work_id \
                        SET l.phase = 'released', l.expires_at = v_now WHERE {live}; \
                ELSE \
                    UPDATE {t} AS l JOIN {j} ON l.work_id = j.work_id \
                        SET l.ttl_ms = p_ttl, l.expires_at = {expires} WHERE {live}; \
                END IF; \
                COMMIT; \
                SELECT v_verdicts; \
             END"
        );
        // Ends the current lease whoever holds it; answers the lease as it
        // was (no row when there is none).
        let revoke = proc_name("revoke");
        let revoke_sql = format!(
            "CREATE PROCEDURE `{revoke}`(IN p_work {WORK}) \
             MODIFIES SQL DATA SQL SECURITY INVOKER \
             BEGIN \
                DECLARE v_holder {HOLDER}; DECLARE v_token BIGINT UNSIGNED; \
                DECLARE v_phase VARCHAR(8); DECLARE v_expires DATETIME(6); \
                DECLARE v_now DATETIME(6); DECLARE v_bytes BIGINT; \
                DECLARE v_prev_holder {HOLDER}; DECLARE v_prev_token BIGINT UNSIGNED; \
                DECLARE v_prev_end VARCHAR(8); \
                {BEGIN_TX} \
                SET v_holder = NULL; \
                SELECT holder_id, fencing_token, phase, expires_at, \
                       COALESCE(LENGTH(checkpoint), 0), prev_holder_id, prev_fencing_token, prev_end \
                    INTO v_holder, v_token, v_phase, v_expires, v_bytes, v_prev_holder, \
                         v_prev_token, v_prev_end \
                    FROM {t} WHERE work_id = p_work FOR UPDATE; \
                SET v_now = UTC_TIMESTAMP(6); \
                IF v_holder IS NOT NULL AND v_phase = 'held' AND v_expires >= v_now THEN \
                    UPDATE {t} SET phase = 'revoked', expires_at = v_now WHERE work_id = p_work; \
                END IF; \
                COMMIT; \
                SELECT p_work, v_holder, v_token, v_phase, v_expires >= v_now, \
                       TIMESTAMPDIFF(MICROSECOND, v_now, v_expires), v_bytes, v_prev_holder, \
                       v_prev_token, v_prev_end \
                    FROM DUAL WHERE v_holder IS NOT NULL; \
             END"
        );
        let now = "UTC_TIMESTAMP(6)";
        // The verdict of the lease named by the statement's parameters
        // (holder, token), read and locked alike.
        let named_verdict = verdict(LEASE_ROW, "?", "?", now);
        let read = format!(
            "SELECT {named_verdict}, l.checkpoint, l.prev_holder_id, l.prev_fencing_token, \
                    CAST(l.prev_end AS CHAR) \
             FROM (SELECT 1 AS one) AS d LEFT JOIN {t} AS l ON l.work_id = ?"
        );
        let inspect = format!(
            "SELECT {} FROM {t} AS l \
             WHERE JSON_LENGTH(?) = 0 OR l.work_id IN (\
                SELECT j.work_id FROM JSON_TABLE(?, '$[*]' COLUMNS (work_id {WORK} PATH '$')) AS j) \
             ORDER BY l.work_id",
            info_cols(now)
        );
        let inspect_checkpoint = format!(
            "SELECT {}, l.checkpoint FROM {t} AS l WHERE l.work_id = ?",
            info_cols(now)
        );
        // The row lock taken by the DELETE orders it with a concurrent
        // acquisition's locking read: it judges the latest committed row.
        let delete_ended = format!(
            "DELETE FROM {t} WHERE work_id = ? AND fencing_token = ? \
             AND (phase <> 'held' OR expires_at < {now})"
        );
        let lock_current = format!(
            "SELECT {named_verdict} FROM (SELECT 1 AS one) AS d LEFT JOIN {t} AS l \
             ON l.work_id = ? LOCK IN SHARE MODE"
        );
        let call = |name: &str, n: usize| {
            let marks = vec!["?"; n].join(", ");
            format!("CALL `{name}`({marks})")
        };
        Self {
            create,
            acquire: call(&acquire, 3),
            update: call(&update, 6),
            acquire_many: call(&acquire_many, 4),
            update_many: call(&update_many, 3),
            revoke: call(&revoke, 1),
            procedures: vec![
                (take, take_sql),
                (acquire, acquire_sql),
                (acquire_many, acquire_many_sql),
                (update, update_sql),
                (update_many, update_many_sql),
                (revoke, revoke_sql),
            ],
            read,
            inspect,
            inspect_checkpoint,
            delete_ended,
            lock_current,
        }
    }
}
