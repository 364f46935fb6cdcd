//! Finding the primary of a Sentinel-managed deployment: ask each sentinel
//! in turn for the primary's address (`SENTINEL get-master-addr-by-name`),
//! then check with `ROLE` that the server there is a primary (a sentinel
//! may still name the old one while a failover is under way).

use std::time::Duration;

use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, RedisConnectionInfo, RedisError, Value,
};

/// The address of a server, with the TLS settings of `template`'s.
fn at(template: &ConnectionAddr, host: &str, port: u16) -> ConnectionAddr {
    match template {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_string(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_string(), port),
    }
}

fn failed(what: String) -> RedisError {
    RedisError::from(std::io::Error::new(std::io::ErrorKind::NotConnected, what))
}

/// The sentinels of a primary, and how to reach the servers.
#[derive(Clone)]
pub(super) struct Sentinels {
    /// `host:port` of each sentinel.
    pub(super) sentinels: Vec<(String, u16)>,
    /// The name the sentinels know the primary by.
    pub(super) master: String,
    /// The primary's connection settings (credentials, database,
    /// protocol, TLS), at a placeholder address.
    pub(super) template: ConnectionInfo,
    /// How long one connection or command may take.
    pub(super) timeout: Duration,
}

impl Sentinels {
    /// The client of the current primary.
    ///
    /// # Errors
    /// The last error met when no sentinel names a server that answers
    /// `ROLE` as a primary.
    pub(super) async fn primary(&self) -> redis::RedisResult<redis::Client> {
        let mut last = failed(format!(
            "no sentinel answered for the primary {:?}",
            self.master
        ));
        for (host, port) in &self.sentinels {
            match self.ask(host, *port).await {
                Ok(client) => return Ok(client),
                Err(e) => {
                    tracing::debug!(sentinel = %format!("{host}:{port}"), error = %e, "no primary from this sentinel");
                    last = e;
                }
            }
        }
        Err(last)
    }

    fn config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
    }

    /// The primary that the sentinel at `host:port` names, checked.
    async fn ask(&self, host: &str, port: u16) -> redis::RedisResult<redis::Client> {
        // Sentinels are reached without the primary's credentials.
        let sentinel = self
            .template
            .clone()
            .set_addr(at(self.template.addr(), host, port))
            .set_redis_settings(RedisConnectionInfo::default());
        let mut conn = redis::Client::open(sentinel)?
            .get_multiplexed_async_connection_with_config(&self.config())
            .await?;
        let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query_async(&mut conn)
            .await?;
        let (host, port) =
            addr.ok_or_else(|| failed(format!("the sentinel knows no {:?}", self.master)))?;
        let client = redis::Client::open(self.template.clone().set_addr(at(
            self.template.addr(),
            &host,
            port,
        )))?;
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&self.config())
            .await?;
        let role: Vec<Value> = redis::cmd("ROLE").query_async(&mut conn).await?;
        match role.first() {
            Some(Value::BulkString(r)) if r == b"master" => Ok(client),
            Some(Value::SimpleString(r)) if r == "master" => Ok(client),
            _ => Err(failed(format!(
                "{host}:{port}, named by a sentinel, is not a primary (yet)"
            ))),
        }
    }
}
