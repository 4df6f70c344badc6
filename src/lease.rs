//! Lease identities: the node that holds a lease and the random token every write by the
//! holder must present (ARCHITECTURE.md §6, invariant 1).
//!
//! A [`LeaseToken`] is a bearer secret for one claim of one job: its `Debug` output is redacted
//! so it never lands in logs.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::job::check_name;

/// Longest node id: **255** characters.
pub const MAX_NODE_ID_LEN: usize = 255;

/// One process's identity, stored in `lease_owner`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct NodeId(String);

impl NodeId {
    /// A node id from a name (host name, pod name, …).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `node_id` when it is empty, too long or has control
    /// characters.
    pub fn new(name: impl Into<String>) -> Result<Self> {
        let name = name.into();
        check_name("node_id", &name, MAX_NODE_ID_LEN)?;
        Ok(NodeId(name))
    }

    /// A fresh random node id (`node-` and 12 hex digits).
    pub fn random() -> Self {
        NodeId(format!(
            "node-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ))
    }

    /// The stored form.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    pub(crate) fn from_stored(s: String) -> Self {
        NodeId(s)
    }
}

impl fmt::Display for NodeId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The random token of one claim. Every renew and finalize by the holder presents it; a
/// holder whose token no longer matches (its lease expired and the job was reclaimed) is told
/// `LeaseLost`.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct LeaseToken(String);

impl LeaseToken {
    /// A fresh random token (128 bits, 32 hex digits).
    pub fn generate() -> Self {
        LeaseToken(uuid::Uuid::new_v4().simple().to_string())
    }

    /// Parses a stored token.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `lease_token` unless it is 32 lowercase hex digits.
    pub fn parse(s: &str) -> Result<Self> {
        if s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(LeaseToken(s.to_string()))
        } else {
            Err(Error::invalid(
                "lease_token",
                format!(
                    "expected 32 lowercase hex digits, got {} characters",
                    s.len()
                ),
            ))
        }
    }

    /// The stored form; only the store and the holder should ever need it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for LeaseToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Enough to tell two tokens apart in a log, not enough to forge a write.
        write!(f, "LeaseToken({}…)", &self.0[..4.min(self.0.len())])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_debug_is_redacted() {
        let t = LeaseToken::generate();
        let dbg = format!("{t:?}");
        assert!(!dbg.contains(t.as_str()), "{dbg}");
        assert!(dbg.len() < 20);
    }

    #[test]
    fn token_parse_accepts_only_its_own_format() {
        let t = LeaseToken::generate();
        assert_eq!(LeaseToken::parse(t.as_str()).unwrap(), t);
        assert!(LeaseToken::parse("xyz").is_err());
        assert!(LeaseToken::parse(&"G".repeat(32)).is_err());
    }

    #[test]
    fn node_ids_are_validated() {
        assert!(NodeId::new("web-1").is_ok());
        assert!(NodeId::new("").is_err());
        assert!(NodeId::random().as_str().starts_with("node-"));
    }
}
