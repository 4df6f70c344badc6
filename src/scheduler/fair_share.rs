//! The fair share: how many of a queue's global concurrency limit one node may hold when
//! several nodes serve the queue (ARCHITECTURE.md §7.5, *Fair share*).
//!
//! Without it, a binding limit's slots went to whoever claimed first: with a limit of 5 over
//! three nodes, one drain split 86 / 0 / 514. The database-side limit stays the authority
//! (no claim ever takes the queue past it); the share is only a node-local bound on top.
//!
//! **The rule.** A queue with a global limit `L`, served by the `n` live nodes `N₀ < N₁ <
//! … < Nₙ₋₁` (by node id, from the node registry), gives node `Nᵢ` at the wall-clock second
//! `t` the cap
//!
//! ```text
//! cap(i, t) = ⌊L / n⌋ + (1 if (i − t) mod n < L mod n else 0)
//! ```
//!
//! A node whose cap is at or above its own concurrency is not capped ([`node_cap`]): its
//! workers bound its starts already, and its prefetch is what hides the claim's round trips.
//!
//! **Why it holds.** (1) *Never above the limit*: at any one second the remainder bonus goes
//! to exactly `L mod n` of the `n` ranks (`i ↦ (i − t) mod n` is a bijection), so the caps
//! sum to `n⌊L/n⌋ + L mod n = L`; and the claim itself is still bounded by the database's
//! count, so even nodes that disagree on `n` or `t` for a moment (a heartbeat not yet seen,
//! clocks a little apart) cannot take the queue past `L`. (2) *Fair*: over `n` consecutive
//! seconds every rank gets the bonus exactly `L mod n` times, so each node's cap averages
//! `L/n`; a node below its cap while the limit binds claims again within
//! [`SHARE_RETRY_MAX`] (the slot a capped node frees is not taken by that node, whose cap
//! holds it back, so it waits for the node below its cap). (3) *No starvation*: every live
//! node's cap is at least 1 whenever `L ≥ n`, and otherwise at least 1 for `L` seconds in
//! every `n`; a node that dies stops being live (its heartbeat ages past three heartbeat
//! intervals, or at once when it shuts down gracefully), after which `n` drops and its
//! share is spread over the others. While a dead node still counts, the others hold back
//! at most its share — the limit is honoured, never exceeded.

use std::time::Duration;

/// How soon a node below its share claims again when the limit held its claim back:
/// doubling from [`SHARE_RETRY_MIN`] up to this, **100 ms**.
pub(crate) const SHARE_RETRY_MAX: Duration = Duration::from_millis(100);
/// The first such retry: **10 ms** after the held-back claim.
pub(crate) const SHARE_RETRY_MIN: Duration = Duration::from_millis(10);
/// Such retries stop after **2 s** without a job (the queue may be empty rather than held
/// back); the poll and freed slots wake the fetcher as before.
pub(crate) const SHARE_RETRY_FOR: Duration = Duration::from_secs(2);

/// The share of `limit` of the node of `rank` among `nodes` live ones at wall-clock second
/// `second`: see the module docs. `None` when no share applies (one node, or none known).
pub(crate) fn fair_cap(limit: u32, nodes: u32, rank: u32, second: u64) -> Option<u32> {
    if nodes < 2 || rank >= nodes {
        return None;
    }
    let turn = u32::try_from(second % u64::from(nodes)).unwrap_or(0);
    let bonus = u32::from((rank + nodes - turn) % nodes < limit % nodes);
    Some(limit / nodes + bonus)
}

/// The cap a node of `concurrency` workers holds itself to: its [`fair_cap`], unless that is
/// at or above its concurrency. Then its workers already bound its starts to its share, and
/// capping its claimed jobs too would only forbid its prefetch — which hides the claim's
/// round trips while a slot turns over, and which the prefetch window already shrinks (it
/// halves whenever the limit holds a claim back) so that prefetched jobs do not keep the
/// other nodes' workers idle. With a limit equal to the nodes' total concurrency the cap cost
/// MariaDB drains a tenth of their throughput and bought nothing a worker count does not.
pub(crate) fn node_cap(cap: Option<u32>, concurrency: u32) -> Option<u32> {
    cap.filter(|c| *c < concurrency)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caps_of_any_second_sum_to_the_limit() {
        for limit in 1..=40 {
            for nodes in 2..=9 {
                for second in 0..30 {
                    let sum: u32 = (0..nodes)
                        .map(|r| fair_cap(limit, nodes, r, second).unwrap())
                        .sum();
                    assert_eq!(sum, limit, "L={limit} n={nodes} t={second}");
                }
            }
        }
    }

    #[test]
    fn over_n_seconds_each_node_averages_an_even_split() {
        for limit in 1..=40 {
            for nodes in 2..=9 {
                for rank in 0..nodes {
                    let total: u32 = (0..u64::from(nodes))
                        .map(|t| fair_cap(limit, nodes, rank, 1_000 + t).unwrap())
                        .sum();
                    assert_eq!(total, limit, "L={limit} n={nodes} rank {rank}");
                }
            }
        }
    }

    #[test]
    fn a_share_at_or_above_the_workers_leaves_the_node_uncapped() {
        // A limit of 30 over three nodes of 10 workers: each share is 10, the workers bound.
        assert_eq!(node_cap(fair_cap(30, 3, 0, 0), 10), None);
        assert_eq!(node_cap(fair_cap(40, 3, 0, 0), 10), None);
        // A limit of 5 over three nodes of 6 workers: the share binds.
        assert_eq!(node_cap(fair_cap(5, 3, 0, 0), 6), Some(2));
        assert_eq!(node_cap(fair_cap(29, 3, 2, 0), 10), Some(9));
        assert_eq!(node_cap(None, 10), None);
    }

    #[test]
    fn one_node_or_an_unknown_rank_has_no_cap() {
        assert_eq!(fair_cap(5, 1, 0, 7), None);
        assert_eq!(fair_cap(5, 0, 0, 7), None);
        assert_eq!(fair_cap(5, 3, 3, 7), None);
        assert_eq!(fair_cap(5, 3, 0, 0), Some(2));
        assert_eq!(fair_cap(5, 3, 2, 0), Some(1));
        assert_eq!(
            fair_cap(5, 3, 2, 1),
            Some(2),
            "the remainder moves on each second"
        );
    }
}
