//! The least privilege of the store's Redis user: the commands it runs
//! and the key and channel patterns of its prefix, as `ACL SETUSER` rules.

use super::keys;
use super::RedisConfig;

/// Every command the store runs, as ACL rules: connecting (`HELLO`,
/// `AUTH`, `SELECT`; the client's `CLIENT SETINFO` may fail, it ignores
/// the answer), the scripts (`EVALSHA`,
/// `SCRIPT LOAD`) and the commands they call, listing (`SCAN`), the
/// replica wait (`WAIT`), the release subscription (`SUBSCRIBE`, `PING`)
/// and the role check of a Sentinel-managed primary (`ROLE`).
/// `CONFIG GET` is optional: without it the store cannot warn about an
/// eviction policy or a server without persistence, and says so only in a
/// debug log.
pub const ACL_COMMANDS: &str = "-@all +hello +auth +select +ping +role \
     +evalsha +script|load +scan +wait +subscribe \
     +pttl +hget +hmget +incr +get +set +hset +hdel +pexpire +del +exists +publish +time +strlen \
     +config|get";

impl RedisConfig {
    /// The `ACL SETUSER` rules of a user that may do exactly what a store
    /// of this configuration does: its keys and release channel (both
    /// start with the prefix, glob characters escaped) and
    /// [`ACL_COMMANDS`]. For `ACL SETUSER NAME on >PASSWORD RULES`.
    pub fn acl_rules(&self) -> String {
        let prefix = keys::glob_escape(&self.prefix);
        format!("resetkeys ~{prefix}* resetchannels &{prefix}* {ACL_COMMANDS}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_line_gives_the_default_rules() {
        let rules = RedisConfig::from_url("redis://h/0")
            .expect("URL")
            .acl_rules();
        let line = format!("//! ACL SETUSER worklease on >PASSWORD {rules}\n");
        assert!(include_str!("mod.rs").contains(&line), "{line}");
        let rules = RedisConfig::from_url("redis://h/0?prefix=a*b%3A")
            .expect("URL")
            .acl_rules();
        assert!(
            rules.starts_with("resetkeys ~a\\*b:* resetchannels &a\\*b:* -@all"),
            "{rules}"
        );
    }
}
