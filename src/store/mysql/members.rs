//! The members a MySQL/MariaDB URL names: one server, or several members of a Galera
//! cluster, `mysql://user:pass@h1:3401,h2:3402,h3:3403/db` — hosts separated by commas,
//! each with its own optional port, the rest of the URL shared.
//!
//! With several, each new connection tries them in order (the first that accepts the
//! connection and is in the cluster's primary component wins: see `connect.rs`), or, with the
//! URL parameter `members=spread`, starting from the next member in turn, so a store's
//! connections spread over the cluster. `members=first` is the default.

/// How a store with several members chooses where a new connection goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Choice {
    /// The first member that answers and is primary: one writer, the others standbys.
    First,
    /// Each new connection starts from the next member in turn.
    Spread,
}

/// One member: a host and its port (the driver's default when `None`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) host: String,
    pub(crate) port: Option<u16>,
}

impl std::fmt::Display for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.port {
            Some(p) if self.host.contains(':') => write!(f, "[{}]:{p}", self.host),
            Some(p) => write!(f, "{}:{p}", self.host),
            None => f.write_str(&self.host),
        }
    }
}

/// A URL split into the URL of its first member (what the driver parses), the members, and
/// the choice among them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Members {
    /// The URL with only the first member and without `members=`.
    pub(crate) url: String,
    /// Every member, in the URL's order (one for a plain URL).
    pub(crate) list: Vec<Member>,
    pub(crate) choice: Choice,
}

/// Splits `url`. Errors name what was wrong and what was expected, and never quote the
/// URL's user information.
pub(crate) fn split(url: &str) -> Result<Members, String> {
    let (url, choice) = take_choice(url)?;
    let Some(scheme_end) = url.find("://") else {
        return Ok(single(url, choice));
    };
    let after = scheme_end + 3;
    let end = url[after..]
        .find(['/', '?'])
        .map_or(url.len(), |i| after + i);
    let authority = &url[after..end];
    let hosts_at = authority.rfind('@').map_or(after, |i| after + i + 1);
    let hosts = &url[hosts_at..end];
    if !hosts.contains(',') {
        return Ok(single(url, choice));
    }
    let mut list = Vec::new();
    for (i, raw) in hosts.split(',').enumerate() {
        list.push(member(raw.trim()).map_err(|why| {
            format!(
                "member {} of the host list {hosts:?}: {why}; expected \
                 host[:port],host[:port],… such as 127.0.0.1:3401,127.0.0.1:3402",
                i + 1
            )
        })?);
    }
    let first = list[0].to_string();
    let url = format!("{}{first}{}", &url[..hosts_at], &url[end..]);
    Ok(Members { url, list, choice })
}

fn single(url: String, choice: Choice) -> Members {
    Members {
        url,
        list: Vec::new(),
        choice,
    }
}

/// One `host[:port]` (IPv6 in brackets).
fn member(raw: &str) -> Result<Member, String> {
    if raw.is_empty() {
        return Err("it is empty".into());
    }
    let (host, port) = if let Some(rest) = raw.strip_prefix('[') {
        let Some((h, tail)) = rest.split_once(']') else {
            return Err(format!("{raw:?} opens '[' without closing it"));
        };
        match tail {
            "" => (h, None),
            t => match t.strip_prefix(':') {
                Some(p) => (h, Some(p)),
                None => return Err(format!("{raw:?} has {t:?} after its ']'")),
            },
        }
    } else {
        match raw.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (raw, None),
        }
    };
    if host.is_empty() {
        return Err(format!("{raw:?} has no host"));
    }
    if host.contains(['@', '/', ' ']) {
        return Err(format!("{raw:?} is not a host name or address"));
    }
    let port = match port {
        None => None,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => Some(n),
            _ => return Err(format!("port {p:?} is not a number from 1 to 65535")),
        },
    };
    Ok(Member {
        host: host.to_string(),
        port,
    })
}

/// Removes `members=…` from the query string, reading it.
fn take_choice(url: &str) -> Result<(String, Choice), String> {
    let Some((head, query)) = url.split_once('?') else {
        return Ok((url.to_string(), Choice::First));
    };
    let mut choice = Choice::First;
    let mut kept = Vec::new();
    for kv in query.split('&') {
        match kv.split_once('=') {
            Some(("members", v)) => {
                choice = match v {
                    "first" => Choice::First,
                    "spread" => Choice::Spread,
                    other => {
                        return Err(format!(
                            "URL parameter members={other:?} is not known; expected \
                             members=first or members=spread"
                        ))
                    }
                }
            }
            _ => kept.push(kv),
        }
    }
    Ok(if kept.is_empty() {
        (head.to_string(), choice)
    } else {
        (format!("{head}?{}", kept.join("&")), choice)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(host: &str, port: Option<u16>) -> Member {
        Member {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn a_plain_url_is_one_member() {
        let s = split("mysql://u:pw@h:3306/db?ssl-mode=x").unwrap();
        assert_eq!(s.url, "mysql://u:pw@h:3306/db?ssl-mode=x");
        assert!(s.list.is_empty());
        assert_eq!(s.choice, Choice::First);
    }

    #[test]
    fn a_host_list_is_split_in_order() {
        let s =
            split("mysql://u:p,w@127.0.0.1:3401, h2 ,[::1]:3403/test?a=1&members=spread").unwrap();
        assert_eq!(
            s.list,
            vec![
                m("127.0.0.1", Some(3401)),
                m("h2", None),
                m("::1", Some(3403))
            ]
        );
        assert_eq!(s.url, "mysql://u:p,w@127.0.0.1:3401/test?a=1");
        assert_eq!(s.choice, Choice::Spread);
        let s = split("mysql://a:1,b:2?members=first").unwrap();
        assert_eq!(s.url, "mysql://a:1");
        assert_eq!(s.list, vec![m("a", Some(1)), m("b", Some(2))]);
        assert_eq!(s.choice, Choice::First);
        assert_eq!(m("::1", Some(5)).to_string(), "[::1]:5");
    }

    #[test]
    fn malformed_lists_are_named_without_the_password() {
        for (url, want) in [
            (
                "mysql://u:hunter2@a,,b/db",
                "member 2 of the host list \"a,,b\": it is empty",
            ),
            ("mysql://u:hunter2@a:1,b:x/db", "port \"x\" is not a number"),
            ("mysql://u:hunter2@a,b:0/db", "port \"0\""),
            ("mysql://u:hunter2@a,b:70000/db", "port \"70000\""),
            ("mysql://u:hunter2@a,:5/db", "\":5\" has no host"),
            ("mysql://u:hunter2@a,[::1/db", "without closing"),
            (
                "mysql://u:hunter2@a/db?members=all",
                "members=\"all\" is not known",
            ),
        ] {
            let err = split(url).unwrap_err();
            assert!(err.contains(want), "{url}: {err}");
            assert!(!err.contains("hunter2"), "{err}");
        }
    }
}
