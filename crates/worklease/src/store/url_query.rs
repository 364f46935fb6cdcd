//! The one parser of store URL query parameters, [`QueryParams`]: every
//! store with parameters (all but SQLite) reads its query with it, so a
//! parameter given twice and an unknown one are refused in one place.
//! Shared by the stores as `url_parts.rs` is (its
//! companion, a file of its own for its length).
#![cfg(any(
    feature = "redis",
    feature = "etcd",
    feature = "object-store",
    feature = "dynamodb",
    feature = "postgres",
    feature = "mysql"
))]

/// The query parameters of a store URL, each given once: the store takes
/// the ones it reads by name ([`QueryParams::take`]) and passes the rest on
/// to its client library (the SQL stores) or has them refused up front
/// ([`QueryParams::parse`]). A parameter given twice is always refused:
/// "last one wins" would let a copy-paste slip put two fleets under two
/// prefixes or on two tables.
pub(crate) struct QueryParams<V> {
    /// The parameters not taken yet, in the order given: name and value.
    given: Vec<(String, V)>,
    /// The setting a name stands for: two spellings of one setting are
    /// one parameter (MySQL's `ssl-mode` and `ssl_mode`).
    setting: fn(&str) -> String,
}

impl<V> QueryParams<V> {
    /// The parameters `pairs` (name, value; decoded as the store's URL
    /// syntax wants), each one of `known`.
    ///
    /// # Errors
    /// The reason, for a URL error: a parameter given twice, or one not in
    /// `known` (the reason lists `known`).
    #[cfg(any(
        feature = "redis",
        feature = "etcd",
        feature = "object-store",
        feature = "dynamodb"
    ))]
    pub(crate) fn parse<K: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
        known: &[&str],
    ) -> std::result::Result<Self, String> {
        let params = Self::once_each(pairs, str::to_owned)?;
        match params
            .given
            .iter()
            .find(|(name, _)| !known.contains(&name.as_str()))
        {
            Some((name, _)) => Err(format!(
                "unknown parameter {name:?}: the accepted ones are {}",
                known.join(", ")
            )),
            None => Ok(params),
        }
    }

    /// The parameters `pairs`, any names, for a store that passes the ones
    /// it does not read on to its client library; `setting` maps a name to
    /// the setting it stands for.
    ///
    /// # Errors
    /// The reason, for a URL error: a setting given twice.
    #[cfg(any(feature = "postgres", feature = "mysql"))]
    pub(crate) fn passing_on<K: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
        setting: fn(&str) -> String,
    ) -> std::result::Result<Self, String> {
        Self::once_each(pairs, setting)
    }

    /// `pairs` with no setting given twice.
    fn once_each<K: Into<String>>(
        pairs: impl IntoIterator<Item = (K, V)>,
        setting: fn(&str) -> String,
    ) -> std::result::Result<Self, String> {
        let mut params = Self {
            given: Vec::new(),
            setting,
        };
        for (name, value) in pairs {
            let name = name.into();
            if params.position(&name).is_some() {
                return Err(format!("the parameter {name:?} appears twice"));
            }
            params.given.push((name, value));
        }
        Ok(params)
    }

    /// Where the parameter for the setting `name` stands.
    fn position(&self, name: &str) -> Option<usize> {
        let setting = (self.setting)(name);
        self.given
            .iter()
            .position(|(given, _)| (self.setting)(given) == setting)
    }

    /// The value of the parameter `name` (or another spelling of its
    /// setting), taken out; `None` when the URL does not give it.
    #[cfg(any(
        feature = "redis",
        feature = "etcd",
        feature = "postgres",
        feature = "mysql"
    ))]
    pub(crate) fn take(&mut self, name: &str) -> Option<V> {
        self.position(name).map(|i| self.given.remove(i).1)
    }
}

/// The parameters not taken, in the order given.
impl<V> IntoIterator for QueryParams<V> {
    type Item = (String, V);
    type IntoIter = std::vec::IntoIter<(String, V)>;

    fn into_iter(self) -> Self::IntoIter {
        self.given.into_iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(any(
        feature = "redis",
        feature = "etcd",
        feature = "object-store",
        feature = "dynamodb"
    ))]
    #[test]
    fn query_params_are_known_and_given_once() {
        let known = ["prefix", "region"];
        let mut params = QueryParams::parse([("region", 1), ("prefix", 2)], &known).unwrap();
        assert_eq!(
            (params.take("prefix"), params.take("prefix")),
            (Some(2), None)
        );
        assert_eq!(
            params.into_iter().collect::<Vec<_>>(),
            [("region".into(), 1)]
        );
        let twice = QueryParams::parse([("prefix", 1), ("prefix", 2)], &known);
        assert_eq!(
            twice.err().unwrap(),
            "the parameter \"prefix\" appears twice"
        );
        let unknown = QueryParams::parse([("prefx", 1)], &known);
        assert_eq!(
            unknown.err().unwrap(),
            "unknown parameter \"prefx\": the accepted ones are prefix, region"
        );
    }
}
