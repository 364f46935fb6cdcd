//! Which Redis deployment a store talks to: one server, or a primary that
//! Sentinel manages (`redis+sentinel://`). A Sentinel URL names several
//! hosts, which `url` cannot parse: it is rewritten to a one-server URL
//! (the first sentinel's address as a placeholder) that carries the
//! credentials, database, TLS and parameters through the one parser, and
//! the sentinels and primary name are kept here.

/// The store's deployment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) enum Topology {
    /// One server, at the URL's address.
    #[default]
    Server,
    /// The primary that the sentinels at `sentinels` (`host:port`) name
    /// `master`, looked up again after a failure.
    Sentinel {
        sentinels: Vec<(String, u16)>,
        master: String,
    },
    /// A Redis Cluster, reached first through `nodes` (`host:port`).
    Cluster { nodes: Vec<(String, u16)> },
}

/// The port of a sentinel given without one.
pub(super) const SENTINEL_PORT: u16 = 26379;
/// The port of a Cluster node given without one.
pub(super) const CLUSTER_PORT: u16 = 6379;

/// For a `redis+sentinel://`, `rediss+sentinel://`, `redis+cluster://`
/// or `rediss+cluster://` URL, its topology and the one-server URL (`redis://` or `rediss://`)
/// of its other parts; `None` for any other scheme.
///
/// # Errors
/// The reason, for a URL without hosts or with a bad port, a Sentinel URL
/// without the primary's name, a Cluster URL with a database other than
/// 0.
pub(super) fn split(url: &str) -> Option<Result<(Topology, String), String>> {
    let (scheme, rest) = url.split_once("://")?;
    let (plain, cluster) = match scheme.to_ascii_lowercase().as_str() {
        "redis+sentinel" => ("redis", false),
        "rediss+sentinel" => ("rediss", false),
        "redis+cluster" => ("redis", true),
        "rediss+cluster" => ("rediss", true),
        _ => return None,
    };
    Some(split_hosts(plain, rest, cluster))
}

/// `host[:port]` of each of the comma-separated `hosts`.
fn host_list(hosts: &str, default_port: u16) -> Result<Vec<(String, u16)>, String> {
    let mut out = Vec::new();
    for host in hosts.split(',') {
        let (name, port) = match host.rsplit_once(':') {
            Some((name, port)) if !name.ends_with(']') || name.starts_with('[') => {
                let port = port
                    .parse::<u16>()
                    .map_err(|_| format!("the host {host:?} has a bad port"))?;
                (name, port)
            }
            _ => (host, default_port),
        };
        if name.is_empty() {
            return Err("write HOST:PORT,HOST:PORT,... (a host is empty)".to_string());
        }
        out.push((name.to_string(), port));
    }
    Ok(out)
}

fn split_hosts(plain: &str, rest: &str, cluster: bool) -> Result<(Topology, String), String> {
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (user, hosts) = match authority.rfind('@') {
        Some(at) => (&authority[..=at], &authority[at + 1..]),
        None => ("", authority),
    };
    let (path, query) = match tail.find(['?', '#']) {
        Some(i) => tail.split_at(i),
        None => (tail, ""),
    };
    if cluster {
        let nodes = host_list(hosts, CLUSTER_PORT)?;
        if !matches!(path.trim_matches('/'), "" | "0") {
            return Err("a Redis Cluster has database 0 only".to_string());
        }
        let (host, port) = &nodes[0];
        let url = format!("{plain}://{user}{host}:{port}/0{query}");
        return Ok((Topology::Cluster { nodes }, url));
    }
    let sentinels = host_list(hosts, SENTINEL_PORT)?;
    let mut parts = path.trim_start_matches('/').splitn(2, '/');
    let master = parts.next().unwrap_or_default();
    if master.is_empty() {
        return Err(
            "the primary's name is missing: write redis+sentinel://HOST:PORT,.../PRIMARY_NAME[/DB]"
                .to_string(),
        );
    }
    let master = percent_encoding::percent_decode_str(master)
        .decode_utf8()
        .map_err(|_| "the primary's name is not UTF-8".to_string())?
        .into_owned();
    let db = parts.next().unwrap_or("0");
    let (host, port) = &sentinels[0];
    let url = format!("{plain}://{user}{host}:{port}/{db}{query}");
    Ok((Topology::Sentinel { sentinels, master }, url))
}

/// The URL of `topology` from the one-server URL `server_url` (what
/// [`split`] made of it, parameters added).
pub(super) fn join(topology: &Topology, server_url: &str) -> String {
    let (hosts, kind) = match topology {
        Topology::Server => return server_url.to_string(),
        Topology::Sentinel { sentinels, .. } => (sentinels, "sentinel"),
        Topology::Cluster { nodes } => (nodes, "cluster"),
    };
    let Some((scheme, rest)) = server_url.split_once("://") else {
        return server_url.to_string();
    };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let user = authority.rfind('@').map_or("", |at| &authority[..=at]);
    let hosts: Vec<String> = hosts.iter().map(|(h, p)| format!("{h}:{p}")).collect();
    let (db, query) = match tail.find(['?', '#']) {
        Some(i) => tail.split_at(i),
        None => (tail, ""),
    };
    let db = match db.trim_start_matches('/') {
        "" | "0" => String::new(),
        db => format!("/{db}"),
    };
    let path = match topology {
        Topology::Sentinel { master, .. } => format!(
            "/{}{db}",
            percent_encoding::utf8_percent_encode(master, percent_encoding::NON_ALPHANUMERIC)
        ),
        _ => "/".to_string(),
    };
    format!("{scheme}+{kind}://{user}{}{path}{query}", hosts.join(","))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sentinel_urls_split_and_join() {
        let url = "redis+sentinel://app:pw@s1:26380,s2,10.0.0.3:5000/my%20primary/2?prefix=p%3A";
        let (topology, server) = split(url).expect("a Sentinel URL").expect("valid");
        assert_eq!(server, "redis://app:pw@s1:26380/2?prefix=p%3A");
        assert_eq!(
            topology,
            Topology::Sentinel {
                sentinels: vec![
                    ("s1".into(), 26380),
                    ("s2".into(), SENTINEL_PORT),
                    ("10.0.0.3".into(), 5000)
                ],
                master: "my primary".into(),
            }
        );
        assert_eq!(
            join(&topology, &server),
            "redis+sentinel://app:pw@s1:26380,s2:26379,10.0.0.3:5000/my%20primary/2?prefix=p%3A"
        );
        assert!(split("redis://h/0").is_none());
        assert!(split("redis+sentinel://s1,s2").expect("Sentinel").is_err());
        assert!(split("redis+sentinel://s1:x/m").expect("Sentinel").is_err());
        assert!(split("rediss+sentinel://,s2/m").expect("Sentinel").is_err());
        let url = "redis+cluster://:pw@h1:7000,h2:7001,h3/?prefix=p";
        let (topology, server) = split(url).expect("Cluster").expect("valid");
        assert_eq!(server, "redis://:pw@h1:7000/0?prefix=p");
        assert_eq!(join(&topology, &server), url.replace("h3", "h3:6379"));
        assert!(split("redis+cluster://h1/2").expect("Cluster").is_err());
        let (_, server) = split("rediss+cluster://h1/?cacert=c")
            .expect("Cluster")
            .expect("valid");
        assert_eq!(server, "rediss://h1:6379/0?cacert=c");
    }
}
