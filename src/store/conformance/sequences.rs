//! Ordered sequences: members of one key run one at a time in enqueue order under random
//! retries and concurrent claimers; a failed member holds, lets through or cancels the rest
//! by the members' policy; concurrent enqueuers of one key form one chain in commit order;
//! a tail ending while the next member is enqueued never strands it; batches keep their
//! order; keys run in parallel; unique keys and bad input; an archived tail's row is pruned.

use std::collections::HashMap;
use std::sync::Mutex;

use super::*;
use crate::dependency::ParentPolicy;
use crate::job::OnDuplicate;

/// Repetitions of the racing case.
const RACE_REPS: usize = 30;

fn member(key: &str, n: i64) -> NewJob {
    NewJob::new("s", json!(n)).queue("seq").sequence(key)
}

async fn state(t: &Bundle, id: JobId) -> JobState {
    t.get(id).await.state
}

/// The due jobs of queue `seq` at `at`, given back at once (nothing is changed but their
/// version): what a claim would run now.
async fn due(t: &Bundle, at: i64) -> Vec<JobId> {
    let got = t.claim("seq", "peek", 100, at).await;
    let mut ids = Vec::with_capacity(got.len());
    for c in got {
        ids.push(c.id);
        t.finalize(Finalize::requeue(c.id, c.token, Duration::ZERO), at)
            .await;
    }
    ids.sort();
    ids
}

/// Claims `id` (it must be the one due member of its sequence) and ends it with `outcome`.
async fn run(t: &Bundle, id: JobId, at: i64, outcome: JobState) {
    let got = t.claim("seq", "n1", 100, at).await;
    let mut mine = None;
    for c in got {
        if c.id == id {
            mine = Some(c);
        } else {
            t.finalize(Finalize::requeue(c.id, c.token, Duration::ZERO), at)
                .await;
        }
    }
    let c = mine.unwrap_or_else(|| panic!("job {id} is not claimable at {at}"));
    let f = match outcome {
        JobState::Succeeded => Finalize::succeeded(id, c.token, json!("ok")),
        JobState::Dead => Finalize::dead(id, c.token, err("boom", 1)),
        JobState::Retrying => Finalize::retry(id, c.token, err("flaky", 1), Duration::ZERO),
        _ => Finalize::cancelled(id, c.token, err("stop", 1)),
    };
    assert_eq!(t.finalize(f, at).await, Guarded::Applied(outcome));
}

/// The one parent of each job (the member before it), by job.
async fn predecessors(t: &Bundle, ids: &[JobId]) -> HashMap<JobId, Option<JobId>> {
    let mut out = HashMap::new();
    for &id in ids {
        let d = t.store.job_dependencies(id).await.unwrap();
        assert!(d.parents.len() <= 1, "job {id} waits for {:?}", d.parents);
        out.insert(id, d.parents.first().map(|l| l.id));
    }
    out
}

/// A small deterministic generator (xorshift64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

/// 50 members of one sequence (and 10 of another), three claimers taking several jobs at a
/// time, about a third of the attempts failing into a retry due at once: each sequence's
/// members succeed in enqueue order, and no claim ever holds two members of one sequence.
pub async fn a_sequence_runs_in_enqueue_order_one_at_a_time_under_retries(b: Backend) {
    let t = Arc::new(Bundle::new(b).await);
    let mut want: HashMap<&'static str, Vec<JobId>> = HashMap::new();
    for n in 0..50 {
        want.entry("main")
            .or_default()
            .push(t.enqueue(member("main", n), 0).await);
        if n % 5 == 0 {
            want.entry("side")
                .or_default()
                .push(t.enqueue(member("side", n), 0).await);
        }
    }
    let key_of: HashMap<JobId, &'static str> = want
        .iter()
        .flat_map(|(k, ids)| ids.iter().map(move |id| (*id, *k)))
        .collect();
    let total = key_of.len();
    // Per key: the member claimed and not yet handed to its finalize; the successes in order.
    let running: Arc<Mutex<HashMap<&'static str, JobId>>> = Arc::default();
    let order: Arc<Mutex<HashMap<&'static str, Vec<JobId>>>> = Arc::default();
    let retries = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut claimers = Vec::new();
    for node in 0..3u64 {
        let (t, key_of, running, order, retries) = (
            t.clone(),
            key_of.clone(),
            running.clone(),
            order.clone(),
            retries.clone(),
        );
        claimers.push(tokio::spawn(async move {
            let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (node + 1));
            let name = format!("n{node}");
            loop {
                let done: usize = order.lock().unwrap().values().map(Vec::len).sum();
                if done == total {
                    break;
                }
                let got = t.claim("seq", &name, 4, 10).await;
                if got.is_empty() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                    continue;
                }
                for c in &got {
                    let key = key_of[&c.id];
                    let before = running.lock().unwrap().insert(key, c.id);
                    assert_eq!(before, None, "{key}: {} claimed while {before:?} ran", c.id);
                }
                for c in got {
                    let key = key_of[&c.id];
                    running.lock().unwrap().remove(key);
                    let f = if rng.next().is_multiple_of(3) {
                        retries.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        Finalize::retry(c.id, c.token, err("flaky", 1), Duration::ZERO)
                    } else {
                        // Recorded before the finalize: the next member is released by it.
                        order.lock().unwrap().entry(key).or_default().push(c.id);
                        Finalize::succeeded(c.id, c.token, json!("ok"))
                    };
                    let ended = t.finalize(f, 10).await;
                    assert!(matches!(ended, Guarded::Applied(_)), "{ended:?}");
                }
            }
        }));
    }
    for c in claimers {
        c.await.unwrap();
    }
    let order = order.lock().unwrap();
    for (key, ids) in &want {
        assert_eq!(&order[key], ids, "sequence {key} ran out of enqueue order");
    }
    assert!(retries.load(std::sync::atomic::Ordering::Relaxed) > 5);
}

/// A member waiting to retry holds the next; one that ends dead or cancelled applies the
/// next member's policy: `wait` (the default) holds it, and a member enqueued after it, until
/// the failed one is retried and succeeds; `run` lets it run; `cancel` cancels it and the
/// rest.
pub async fn a_failed_member_holds_the_sequence_by_its_policy(b: Backend) {
    let t = Bundle::new(b).await;
    // Retrying holds; dead holds (the default `wait`); a later member holds too.
    let a = t.enqueue(member("w", 1), 0).await;
    let b2 = t.enqueue(member("w", 2), 0).await;
    assert_eq!(due(&t, 1).await, vec![a]);
    assert_eq!(state(&t, b2).await, JobState::Waiting);
    run(&t, a, 1, JobState::Retrying).await;
    assert_eq!(
        due(&t, 2).await,
        vec![a],
        "a retrying member holds the next"
    );
    run(&t, a, 2, JobState::Dead).await;
    assert_eq!(state(&t, b2).await, JobState::Waiting);
    let c = t.enqueue(member("w", 3), 3).await;
    assert_eq!(state(&t, c).await, JobState::Waiting);
    assert!(due(&t, 4).await.is_empty(), "the sequence holds");
    let retried = t
        .store
        .job_retry(RetryParams {
            id: a,
            expected_version: None,
            now: t.at(5),
        })
        .await
        .unwrap();
    assert!(matches!(retried, Guarded::Applied(_)));
    run(&t, a, 6, JobState::Succeeded).await;
    assert_eq!(due(&t, 7).await, vec![b2]);
    run(&t, b2, 7, JobState::Succeeded).await;
    assert_eq!(due(&t, 8).await, vec![c]);

    // `run`: the next runs after a dead member.
    let p = t.enqueue(member("r", 1), 10).await;
    let q = t
        .enqueue(member("r", 2).on_sequence_failure(ParentPolicy::Run), 10)
        .await;
    run(&t, c, 11, JobState::Succeeded).await;
    run(&t, p, 11, JobState::Dead).await;
    assert_eq!(due(&t, 12).await, vec![q]);

    // `cancel`: a cancelled member cancels the rest.
    let x = t.enqueue(member("h", 1), 20).await;
    let y = t
        .enqueue(member("h", 2).on_sequence_failure(ParentPolicy::Cancel), 20)
        .await;
    let z = t
        .enqueue(member("h", 3).on_sequence_failure(ParentPolicy::Cancel), 20)
        .await;
    t.store
        .job_cancel(CancelParams {
            id: x,
            now: t.at(21),
        })
        .await
        .unwrap();
    assert_eq!(state(&t, y).await, JobState::Cancelled);
    assert_eq!(state(&t, z).await, JobState::Cancelled);
    // A member enqueued after a cancelled tail, with `cancel`, is cancelled at once.
    let w = t
        .enqueue(member("h", 4).on_sequence_failure(ParentPolicy::Cancel), 22)
        .await;
    assert_eq!(state(&t, w).await, JobState::Cancelled);
}

/// 16 tasks enqueue 4 members each into one sequence at once: the members form one chain
/// (each waits for exactly the one before it), every task's members are in the order it
/// enqueued them, the key's row names the chain's end, and the chain runs in its order.
pub async fn concurrent_enqueuers_of_one_sequence_form_one_chain_in_commit_order(b: Backend) {
    let t = Bundle::new(b).await;
    let gate = Arc::new(tokio::sync::Barrier::new(16));
    let mut tasks = Vec::new();
    for task in 0..16i64 {
        let (store, gate, now) = (t.store.clone(), gate.clone(), t.at(0));
        tasks.push(tokio::spawn(async move {
            gate.wait().await;
            let mut mine = Vec::new();
            for n in 0..4 {
                let e = store
                    .job_enqueue(member("one", task * 10 + n), now)
                    .await
                    .unwrap();
                mine.push(e.id);
            }
            mine
        }));
    }
    let mut per_task = Vec::new();
    for task in tasks {
        per_task.push(task.await.unwrap());
    }
    let all: Vec<JobId> = per_task.iter().flatten().copied().collect();
    let pred = predecessors(&t, &all).await;
    let firsts: Vec<JobId> = all.iter().copied().filter(|i| pred[i].is_none()).collect();
    assert_eq!(
        firsts.len(),
        1,
        "one chain has one first member: {firsts:?}"
    );
    let mut next: HashMap<JobId, JobId> = HashMap::new();
    for (&child, parent) in &pred {
        if let Some(p) = parent {
            assert!(next.insert(*p, child).is_none(), "{p} has two successors");
        }
    }
    let mut chain = vec![firsts[0]];
    while let Some(n) = next.get(chain.last().unwrap()) {
        chain.push(*n);
    }
    assert_eq!(chain.len(), all.len(), "the chain covers every member once");
    let pos: HashMap<JobId, usize> = chain.iter().enumerate().map(|(i, id)| (*id, i)).collect();
    for mine in &per_task {
        assert!(mine.windows(2).all(|w| pos[&w[0]] < pos[&w[1]]), "{mine:?}");
    }
    assert_eq!(
        t.store.sequence_last("one").await.unwrap(),
        Some(chain.last().unwrap().0)
    );
    for (i, id) in chain.iter().enumerate() {
        let at = 1 + i as i64;
        assert_eq!(due(&t, at).await, vec![*id], "member {i}");
        run(&t, *id, at, JobState::Succeeded).await;
    }
}

/// The tail of a sequence ending while the next member is enqueued (each of `RACE_REPS`
/// times started together): the new member is never left waiting for a tail that ended.
pub async fn a_tail_ending_while_the_next_member_is_enqueued_never_strands_it(b: Backend) {
    let t = Bundle::new(b).await;
    for rep in 0..RACE_REPS {
        let key = format!("race{rep}");
        let tail = t.enqueue(member(&key, 1), 0).await;
        let c = t.claim("seq", "n1", 1, 1).await.pop().unwrap();
        assert_eq!(c.id, tail);
        let gate = Arc::new(tokio::sync::Barrier::new(2));
        let fin = {
            let (store, gate, now) = (t.store.clone(), gate.clone(), t.at(2));
            tokio::spawn(async move {
                gate.wait().await;
                store
                    .job_finalize_many(FinalizeParams {
                        items: vec![Finalize::succeeded(tail, c.token, json!(1))],
                        now,
                    })
                    .await
                    .unwrap()
            })
        };
        let enq = {
            let (store, gate, now, key) = (t.store.clone(), gate.clone(), t.at(2), key.clone());
            tokio::spawn(async move {
                gate.wait().await;
                store.job_enqueue(member(&key, 2), now).await.unwrap()
            })
        };
        fin.await.unwrap();
        let next = enq.await.unwrap().id;
        assert_eq!(state(&t, next).await, JobState::Pending, "rep {rep}");
        run(&t, next, 3, JobState::Succeeded).await;
    }
}

/// Members enqueued in one call (`enqueue_many`, a batch's members) are chained in input
/// order; keys run in parallel; a duplicate of a member's unique key is not appended again;
/// a replacing duplicate policy and a bad key are refused, naming the field.
pub async fn batches_keep_their_order_and_keys_run_in_parallel(b: Backend) {
    let t = Bundle::new(b).await;
    let got = t
        .store
        .job_enqueue_many(
            EnqueueParams::many((0..5).map(|n| member("many", n)).collect()).at(t.at(0)),
        )
        .await
        .unwrap();
    let ids: Vec<JobId> = got.iter().map(|e| e.id).collect();
    let pred = predecessors(&t, &ids).await;
    assert_eq!(pred[&ids[0]], None);
    for w in ids.windows(2) {
        assert_eq!(pred[&w[1]], Some(w[0]));
    }
    let (batch, _) = t
        .store
        .enqueue_batch(
            &[member("batch", 1), member("batch", 2), member("other", 3)],
            NewJob::new("s", json!("cb")).queue("seq"),
            t.at(0),
        )
        .await
        .unwrap();
    let m: Vec<JobId> = batch.members.iter().map(|e| e.id).collect();
    assert_eq!(predecessors(&t, &m[1..2]).await[&m[1]], Some(m[0]));
    // One member of each key is due: the first of each sequence.
    assert_eq!(due(&t, 1).await, vec![ids[0], m[0], m[2]]);

    // A duplicate keeps its holder's place and appends nothing.
    let keyed = member("u", 1).unique_key("dup");
    let first = t.enqueue(keyed.clone(), 2).await;
    let again = t.store.job_enqueue(keyed, t.at(3)).await.unwrap();
    assert_eq!((again.id, again.duplicate), (first, true));
    assert_eq!(t.store.sequence_last("u").await.unwrap(), Some(first.0));

    let refused = [
        (
            member("u", 2)
                .unique_key("dup")
                .on_duplicate(OnDuplicate::Replace),
            "on_duplicate",
        ),
        (NewJob::new("s", json!(1)).sequence(""), "sequence"),
        (
            NewJob::new("s", json!(1)).sequence("x".repeat(256)),
            "sequence",
        ),
        (NewJob::new("s", json!(1)).sequence(" pad"), "sequence"),
    ];
    for (job, field) in refused {
        match t.store.job_enqueue(job, t.at(4)).await {
            Err(Error::InvalidInput { field: f, reason }) => {
                assert_eq!(f, field, "{reason}");
            }
            other => panic!("expected a refusal naming {field}, got {other:?}"),
        }
    }
    assert_eq!(t.store.sequence_last("u").await.unwrap(), Some(first.0));
}

/// The archiver deletes a key's row with its last job; the next member then finds an empty
/// sequence and is due at once. A row whose last job moved on is kept.
pub async fn an_archived_tail_takes_its_sequence_row_with_it(b: Backend) {
    let t = Bundle::new(b).await;
    let a = t.enqueue(member("p", 1), 0).await;
    let keep = t.enqueue(member("k", 1), 0).await;
    run(&t, a, 1, JobState::Succeeded).await;
    run(&t, keep, 1, JobState::Succeeded).await;
    let later = t.enqueue(member("k", 2), 2).await;
    assert_eq!(
        state(&t, later).await,
        JobState::Pending,
        "its tail succeeded"
    );
    let moved = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::ZERO,
            dead_older_than: Duration::ZERO,
            limit: 100,
            now: t.at(10),
        })
        .await
        .unwrap();
    assert_eq!(moved, 2);
    assert_eq!(t.store.sequence_last("p").await.unwrap(), None);
    assert_eq!(t.store.sequence_last("k").await.unwrap(), Some(later.0));
    let b2 = t.enqueue(member("p", 2), 11).await;
    assert_eq!(state(&t, b2).await, JobState::Pending);
    assert_eq!(t.store.sequence_last("p").await.unwrap(), Some(b2.0));
}

/// A member's job reads back its sequence key, live and archived (the job page and
/// `Client::get` show it), and a job outside a sequence reads back none; the key is the
/// enqueue's even for a member that joined a sequence already holding others.
pub async fn a_members_sequence_key_is_read_back_live_and_archived(b: Backend) {
    let t = Bundle::new(b).await;
    let first = t.enqueue(member("acct:1", 1), 0).await;
    let second = t.enqueue(member("acct:1", 2), 0).await;
    let plain = t.enqueue(NewJob::new("s", json!(0)).queue("seq"), 0).await;
    for (id, key) in [
        (first, Some("acct:1")),
        (second, Some("acct:1")),
        (plain, None),
    ] {
        assert_eq!(t.get(id).await.sequence.as_deref(), key, "live job {id}");
    }
    run(&t, first, 1, JobState::Succeeded).await;
    run(&t, second, 2, JobState::Succeeded).await;
    run(&t, plain, 3, JobState::Succeeded).await;
    let moved = t
        .store
        .job_archive(ArchiveParams {
            older_than: Duration::ZERO,
            dead_older_than: Duration::ZERO,
            limit: 100,
            now: t.at(10),
        })
        .await
        .unwrap();
    assert_eq!(moved, 3);
    for (id, key) in [
        (first, Some("acct:1")),
        (second, Some("acct:1")),
        (plain, None),
    ] {
        let j = t.get(id).await;
        assert!(j.archived_at.is_some(), "job {id} archived");
        assert_eq!(j.sequence.as_deref(), key, "archived job {id}");
    }
}
