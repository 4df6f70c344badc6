//! The `jobvisor` binary, run for real against each backend: every command's output, its
//! `--json` shape and exit code, bulk retry and cancel (a dry run changes nothing, an
//! unconfirmed bulk change changes nothing), and bad arguments and unreachable databases
//! giving clear errors with no password shown.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use assert_cmd::Command;
use jobvisor::testing::{ClaimParams, Finalize, FinalizeParams, StoreEngine as _, TestDb};
use jobvisor::{Backend, Client, JobFailure, JobId, JobState, NewJob, NodeId};
use serde_json::{json, Value};

/// The binary with `url` as `DATABASE_URL`.
fn jobvisor(url: &str) -> Command {
    let mut c = Command::cargo_bin("jobvisor").unwrap();
    c.env("DATABASE_URL", url).env_remove("RUST_LOG");
    c
}

/// Runs and parses stdout as JSON, asserting the exit code.
fn json_of(cmd: &mut Command, code: i32) -> Value {
    let out = cmd.output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn stderr_of(cmd: &mut Command, code: i32) -> String {
    let out = cmd.output().unwrap();
    assert_eq!(
        out.status.code(),
        Some(code),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Claims `id`'s job and ends it dead (as a handler that failed its last attempt would).
async fn make_dead(client: &Client, store: &jobvisor::Store) {
    let claimed = store
        .job_claim(ClaimParams {
            queue: "q".into(),
            owner: NodeId::new("cli-test").unwrap(),
            limit: 100,
            kinds: Some(vec!["mail".into()]),
            lease: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    let mut items = Vec::new();
    for c in claimed {
        let job = store.job_get(c.id).await.unwrap().unwrap();
        if job.unique_key.is_none() {
            items.push(Finalize::dead(
                c.id,
                c.token,
                JobFailure::new("boom", "it broke", 1),
            ));
        }
    }
    store
        .job_finalize_many(FinalizeParams { items, now: None })
        .await
        .unwrap();
    let _ = client;
}

async fn commands_do_what_they_say(backend: Backend) {
    let db = TestDb::create(backend).await;
    let store = db.store().await;
    let client = Client::new(store.clone());
    let url = db.url.clone();

    let v = json_of(jobvisor(&url).args(["migrate", "--status", "--json"]), 0);
    assert_eq!(v["up_to_date"], json!(true), "{v}");
    assert_eq!(v["applied"], v["expected"]);

    let mut mail = Vec::new();
    for i in 0..2 {
        let job = NewJob::new("mail", json!({ "to": i }))
            .queue("q")
            .max_attempts(1);
        mail.push(client.enqueue(job).await.unwrap().id);
    }
    let keyed = client
        .enqueue(NewJob::new("mail", json!({})).queue("q").unique_key("u1"))
        .await
        .unwrap()
        .id;
    let sms = client
        .enqueue(NewJob::new("sms", json!({})).queue("q"))
        .await
        .unwrap()
        .id;

    // status: counts and lag per queue, nodes.
    let v = json_of(jobvisor(&url).args(["status", "--json"]), 0);
    let q = &v["queues"][0];
    assert_eq!(q["queue"], "q");
    assert_eq!(q["states"]["pending"], 4, "{v}");
    assert_eq!(q["due"], 4);
    assert!(q["lag_seconds"].as_f64().unwrap() >= 0.0);
    assert_eq!(v["nodes"], json!([]));
    assert_eq!(v["leader"], Value::Null, "no scheduler, no leader");
    // No node serves q: its due jobs are unserved, by kind.
    let unserved: Vec<(String, u64, String)> = v["unserved"]
        .as_array()
        .unwrap()
        .iter()
        .map(|u| {
            (
                u["kind"].as_str().unwrap().to_string(),
                u["jobs"].as_u64().unwrap(),
                u["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(
        unserved,
        [
            (
                "mail".to_string(),
                3,
                "no live node serves the queue".to_string()
            ),
            (
                "sms".to_string(),
                1,
                "no live node serves the queue".to_string()
            )
        ],
        "{v}"
    );
    let text = jobvisor(&url).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("pending") && text.contains("leader: none"),
        "{text}"
    );
    // A column per state, `waiting` (jobs waiting on parents) first: q has none, 4 pending.
    let header: Vec<&str> = text.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(&header[..3], ["queue", "waiting", "pending"], "{text}");
    let row: Vec<&str> = text
        .lines()
        .find(|l| l.starts_with("q "))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(&row[..3], ["q", "0", "4"], "{text}");
    assert!(
        text.contains("unserved: 3 mail job(s) in queue q wait"),
        "{text}"
    );

    // list with filters, get.
    let v = json_of(jobvisor(&url).args(["list", "--kind", "mail", "--json"]), 0);
    assert_eq!(v["jobs"].as_array().unwrap().len(), 3, "{v}");
    let v = json_of(
        jobvisor(&url).args(["list", "--unique-key", "u1", "--json"]),
        0,
    );
    assert_eq!(v["jobs"][0]["id"], keyed.0);
    let v = json_of(
        jobvisor(&url).args(["list", "--newer-than", "1h", "--limit", "2", "--json"]),
        0,
    );
    assert_eq!(v["jobs"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["next_after"], v["jobs"][1]["id"],
        "a full page says where to go on"
    );
    // Newest first, page by page the other way.
    let all = json_of(jobvisor(&url).args(["list", "--json"]), 0);
    let ids: Vec<i64> = all["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    let v = json_of(
        jobvisor(&url).args(["list", "--newest-first", "--limit", "2", "--json"]),
        0,
    );
    let first: Vec<i64> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| j["id"].as_i64().unwrap())
        .collect();
    assert_eq!(first, ids.iter().rev().take(2).copied().collect::<Vec<_>>());
    let after = v["next_after"].as_i64().unwrap().to_string();
    let v = json_of(
        jobvisor(&url).args(["list", "--newest-first", "--after", &after, "--json"]),
        0,
    );
    assert_eq!(
        v["jobs"][0]["id"].as_i64(),
        ids.iter().rev().nth(2).copied(),
        "the next page goes on to older ids"
    );
    // Payload text, searched within a window of jobs.
    let v = json_of(
        jobvisor(&url).args(["list", "--payload-contains", "\"to\":1", "--json"]),
        0,
    );
    assert_eq!(v["jobs"].as_array().unwrap().len(), 1, "{v}");
    assert_eq!(v["jobs"][0]["id"], mail[1].0);
    assert_eq!(
        (v["scanned"].clone(), v["scan_window_ended"].clone()),
        (json!(4), json!(false))
    );
    let v = json_of(
        jobvisor(&url).args([
            "list",
            "--payload-contains",
            "\"to\":1",
            "--scan",
            "1",
            "--json",
        ]),
        0,
    );
    assert_eq!(
        v["jobs"],
        json!([]),
        "the one job looked at does not match: {v}"
    );
    assert_eq!(v["scan_window_ended"], true);
    assert_eq!(v["next_after"], mail[0].0, "go on after the job looked at");
    let v = json_of(
        jobvisor(&url).args([
            "list",
            "--payload-contains",
            "\"to\":1",
            "--after",
            &mail[0].0.to_string(),
            "--json",
        ]),
        0,
    );
    assert_eq!(v["jobs"][0]["id"], mail[1].0);
    let err = stderr_of(
        jobvisor(&url).args(["list", "--payload-contains", "x", "--scan", "0"]),
        2,
    );
    assert!(err.contains("--scan"), "{err}");
    let v = json_of(
        jobvisor(&url).args(["list", "--older-than", "1h", "--json"]),
        0,
    );
    assert_eq!(v["jobs"], json!([]), "nothing is an hour old");
    let v = json_of(
        jobvisor(&url).args(["get", &sms.0.to_string(), "--json"]),
        0,
    );
    assert_eq!(
        (v["kind"].clone(), v["state"].clone()),
        (json!("sms"), json!("pending"))
    );
    for field in ["payload", "errors", "lease", "created_at", "attempts"] {
        assert!(v.get(field).is_some(), "get --json has {field}: {v}");
    }
    // One JSON shape for a job: the command line prints `Job`'s serde form, the API's.
    let api = client.get(sms).await.unwrap();
    assert_eq!(v, serde_json::to_value(&api).unwrap());
    assert_eq!(serde_json::from_value::<jobvisor::Job>(v).unwrap(), api);
    let listed = json_of(jobvisor(&url).args(["list", "--kind", "sms", "--json"]), 0);
    assert_eq!(listed["jobs"][0], serde_json::to_value(&api).unwrap());
    let err = stderr_of(jobvisor(&url).args(["get", "987654321"]), 3);
    assert!(err.contains("987654321"), "{err}");

    // Two mail jobs die; a bulk retry shows, refuses unconfirmed, then applies.
    make_dead(&client, &store).await;
    for id in &mail {
        assert_eq!(client.get(*id).await.unwrap().state, JobState::Dead);
    }
    // `get` names who ran each claim and how it ended, as `Client::claims` does.
    let v = json_of(
        jobvisor(&url).args(["get", &mail[0].0.to_string(), "--json"]),
        0,
    );
    assert_eq!(v["claims"][0]["node"], json!("cli-test"), "{v}");
    assert_eq!(v["claims"][0]["outcome"], json!("failed"), "{v}");
    assert_eq!(v["claims"][0]["code"], json!("boom"), "{v}");
    assert_eq!(
        v["claims"],
        serde_json::to_value(client.claims(mail[0]).await.unwrap()).unwrap()
    );
    let out = jobvisor(&url)
        .args(["get", &mail[0].0.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("claims") && text.contains("cli-test") && text.contains("failed (boom)"),
        "{text}"
    );
    let v = json_of(
        jobvisor(&url).args(["retry", "--state", "dead", "--dry-run", "--json"]),
        0,
    );
    assert_eq!(v["would_change"].as_array().unwrap().len(), 2, "{v}");
    for id in &mail {
        assert_eq!(
            client.get(*id).await.unwrap().state,
            JobState::Dead,
            "a dry run changes nothing"
        );
    }
    let err = stderr_of(jobvisor(&url).args(["retry", "--state", "dead"]), 4);
    assert!(err.contains("--yes"), "{err}");
    for id in &mail {
        assert_eq!(
            client.get(*id).await.unwrap().state,
            JobState::Dead,
            "unconfirmed: nothing changed"
        );
    }
    let v = json_of(
        jobvisor(&url).args(["retry", "--state", "dead", "--yes", "--json"]),
        0,
    );
    assert_eq!(v["changed"].as_array().unwrap().len(), 2, "{v}");
    for id in &mail {
        assert_ne!(client.get(*id).await.unwrap().state, JobState::Dead);
    }

    // cancel one by id; a finished one cannot be.
    let v = json_of(
        jobvisor(&url).args(["cancel", &sms.0.to_string(), "--json"]),
        0,
    );
    assert_eq!(v["changed"][0]["outcome"], "cancelled", "{v}");
    assert_eq!(client.get(sms).await.unwrap().state, JobState::Cancelled);
    let err = stderr_of(jobvisor(&url).args(["cancel", &sms.0.to_string()]), 1);
    assert!(err.contains("cancelled"), "{err}");

    // archive and prune; nodes.
    let v = json_of(
        jobvisor(&url).args(["archive", "--older-than", "0s", "--json"]),
        0,
    );
    assert_eq!(v["archived"], 1, "the cancelled job: {v}");
    let v = json_of(jobvisor(&url).args(["list", "--archived", "--json"]), 0);
    assert_eq!(v["jobs"][0]["id"], sms.0);
    let v = json_of(
        jobvisor(&url).args(["prune", "--older-than", "0s", "--json"]),
        0,
    );
    assert_eq!(v["pruned"], 1);
    let v = json_of(jobvisor(&url).args(["nodes", "--json"]), 0);
    assert_eq!(v, json!([]));

    // Queue control: pause, limits, resume; a new queue flagged; bad limits change nothing.
    let v = json_of(jobvisor(&url).args(["queues", "--json"]), 0);
    assert_eq!(v, json!([]));
    let v = json_of(
        jobvisor(&url).args(["pause", "q", "--by", "alice: provider outage", "--json"]),
        0,
    );
    assert_eq!(
        (v["paused"].clone(), v["paused_by"].clone()),
        (json!(true), json!("alice: provider outage")),
        "{v}"
    );
    let v = json_of(
        jobvisor(&url).args([
            "limit",
            "q",
            "--concurrency",
            "4",
            "--rate",
            "100/1s",
            "--json",
        ]),
        0,
    );
    assert_eq!(v["concurrency"], 4, "{v}");
    assert_eq!(v["rate"], json!({"jobs": 100, "per_ms": 1000}), "{v}");
    assert_eq!(v["paused"], true, "a limit keeps the pause: {v}");
    let v = json_of(
        jobvisor(&url).args(["limit", "q", "--per-partition", "2", "--json"]),
        0,
    );
    assert_eq!(
        (v["concurrency"].clone(), v["per_partition"].clone()),
        (json!(4), json!(2)),
        "{v}"
    );
    let info = client.queue("q").await.unwrap().unwrap();
    assert_eq!(info.limits.per_partition, Some(2));
    let v = json_of(jobvisor(&url).args(["status", "--json"]), 0);
    let q = &v["queues"][0];
    assert_eq!(
        (q["paused"].clone(), q["settings"]["concurrency"].clone()),
        (json!(true), json!(4)),
        "{v}"
    );
    let text = jobvisor(&url).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("paused, concurrency 4, 2 per partition"),
        "{text}"
    );
    let text = jobvisor(&url).arg("queues").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("paused") && text.contains("alice"), "{text}");
    // A queue no node serves yet can be paused (for its first node); the name is flagged.
    let err = stderr_of(jobvisor(&url).args(["pause", "nosuch"]), 0);
    assert!(
        err.contains("queue \"nosuch\" is new here") && err.contains("known queues: q"),
        "{err}"
    );
    assert!(client.queue("nosuch").await.unwrap().unwrap().is_paused());
    let err = stderr_of(jobvisor(&url).args(["resume", "nosuch"]), 0);
    assert!(err.is_empty(), "known once it has settings: {err}");
    let err = stderr_of(jobvisor(&url).args(["limit", "q", "--concurrency", "0"]), 2);
    assert!(err.contains("positive number"), "{err}");
    let err = stderr_of(jobvisor(&url).args(["limit", "q", "--rate", "5/2d"]), 2);
    assert!(err.contains("rate"), "{err}");
    assert_eq!(
        client.queue("q").await.unwrap().unwrap().limits,
        info.limits
    );
    let v = json_of(jobvisor(&url).args(["resume", "q", "--json"]), 0);
    assert_eq!(v["paused"], false, "{v}");
    let v = json_of(
        jobvisor(&url).args([
            "limit",
            "q",
            "--concurrency",
            "none",
            "--per-partition",
            "none",
            "--rate",
            "none",
            "--json",
        ]),
        0,
    );
    assert_eq!(v["settings"], Value::Null, "{v}");
    assert_eq!(client.queues().await.unwrap(), vec![]);

    // A node killed a minute ago (its row left behind): marked gone, counted instead of
    // aged in the exported gauges, and forgotten on request.
    let minute_ago = (chrono::Utc::now() - chrono::Duration::seconds(60)).timestamp_micros();
    jobvisor::testing::exec_sql(
        &store,
        &format!(
            "INSERT INTO jobvisor_nodes (node, queues, kinds, started_at, heartbeat_at) \
             VALUES ('killed-1', '[\"q\"]', '[\"mail\"]', {minute_ago}, {minute_ago})"
        ),
    )
    .await
    .unwrap();
    let v = json_of(jobvisor(&url).args(["nodes", "--json"]), 0);
    let killed = v
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "killed-1")
        .unwrap_or_else(|| panic!("{v}"));
    assert_eq!(killed["gone"], json!(true), "{v}");
    let out = jobvisor(&url).args(["metrics", "--once"]).output().unwrap();
    let page = String::from_utf8_lossy(&out.stdout);
    assert!(page.contains("jobvisor_nodes_gone 1"), "{page}");
    assert!(
        !page.contains("node=\"killed-1\""),
        "a gone node's age is not exported: {page}"
    );
    let err = stderr_of(jobvisor(&url).args(["nodes", "--forget", "--json"]), 0);
    assert!(err.contains("forgot 1 gone node"), "{err}");
    let v = json_of(jobvisor(&url).args(["nodes", "--json"]), 0);
    assert!(
        v.as_array()
            .unwrap()
            .iter()
            .all(|n| n["node"] != "killed-1"),
        "{v}"
    );

    // The database-wide gauges, printed once: what the table holds.
    let out = jobvisor(&url).args(["metrics", "--once"]).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = String::from_utf8_lossy(&out.stdout);
    // Every series says what it is.
    for line in page.lines().filter(|l| l.starts_with("jobvisor_")) {
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(
            page.contains(&format!("# HELP {name} ")),
            "no HELP line for {name}: {page}"
        );
    }
    let counts = client.counts().await.unwrap();
    assert!(!counts.is_empty());
    for c in counts {
        let line = format!(
            "jobvisor_jobs{{queue=\"{}\",state=\"{}\"}} {}",
            c.queue, c.state, c.count
        );
        assert!(page.contains(&line), "{line} not in:\n{page}");
    }
    assert!(page.contains("jobvisor_gauges_refresh_seconds"), "{page}");

    // Refusals that change nothing.
    let err = stderr_of(jobvisor(&url).args(["retry"]), 2);
    assert!(err.contains("refusing"), "{err}");
    let err = stderr_of(jobvisor(&url).args(["retry", "1", "--state", "dead"]), 2);
    assert!(err.contains("not both"), "{err}");
    let _ = JobId(0);

    // A scheduler elects itself the leader; status says who leads, under which term.
    let node = jobvisor::Scheduler::builder(store.clone())
        .node_id(NodeId::new("cli-leader").unwrap())
        .queue("elsewhere", jobvisor::QueueConfig::default())
        .handler(
            "none",
            jobvisor::handler_fn(|_: Value, _ctx| async { jobvisor::JobOutcome::success(()) }),
        )
        .periodic(jobvisor::Schedule::cron(
            "cli-nightly",
            "0 3 * * *",
            NewJob::new("none", json!({})).queue("elsewhere"),
        ))
        .start()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while client.leader().await.unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "no leader elected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = json_of(jobvisor(&url).args(["status", "--json"]), 0);
    assert_eq!(
        (v["leader"]["node"].clone(), v["leader"]["term"].clone()),
        (json!("cli-leader"), json!(1)),
        "{v}"
    );
    let text = jobvisor(&url).arg("status").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("leader: cli-leader (term 1"), "{text}");

    // Schedules: listed, paused, resumed, triggered; an unknown name is refused.
    while client.schedules().await.unwrap().is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "schedule never stored"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let v = json_of(jobvisor(&url).args(["schedules", "--json"]), 0);
    assert_eq!(
        (
            v[0]["name"].clone(),
            v[0]["spec"].clone(),
            v[0]["missed"].clone()
        ),
        (json!("cli-nightly"), json!("0 3 * * *"), json!("latest")),
        "{v}"
    );
    assert!(v[0]["next_fire_at"].is_string(), "{v}");
    let v = json_of(
        jobvisor(&url).args(["schedule", "pause", "cli-nightly", "--json"]),
        0,
    );
    assert!(v["paused_at"].is_string(), "{v}");
    let text = jobvisor(&url).arg("schedules").output().unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.contains("cli-nightly") && text.contains("paused"),
        "{text}"
    );
    // The fire times are UTC beside the schedule's own zone: the header says so.
    assert!(
        text.contains("next fire (UTC)") && text.contains("last fire (UTC)"),
        "{text}"
    );
    let v = json_of(
        jobvisor(&url).args(["schedule", "resume", "cli-nightly", "--json"]),
        0,
    );
    assert_eq!(v["paused_at"], Value::Null, "{v}");
    let v = json_of(
        jobvisor(&url).args(["schedule", "trigger", "cli-nightly", "--json"]),
        0,
    );
    let job = client.get(JobId(v["job"].as_i64().unwrap())).await.unwrap();
    assert_eq!(
        (job.kind.as_str(), job.queue.as_str()),
        ("none", "elsewhere")
    );
    let err = stderr_of(jobvisor(&url).args(["schedule", "pause", "nope"]), 2);
    assert!(err.contains("\"nope\""), "{err}");

    // Run-time schedules: added (the running leader fires it, no deploy), changed,
    // removed; a name declared in code and a bad expression are refused.
    let v = json_of(
        jobvisor(&url).args([
            "schedule",
            "add",
            "cli-rt",
            "--every",
            "1s",
            "--kind",
            "none",
            "--queue",
            "elsewhere",
            "--payload",
            r#"{"n": 1}"#,
            "--json",
        ]),
        0,
    );
    assert_eq!(
        (v["origin"].clone(), v["spec"].clone()),
        (json!("runtime"), json!("every 1000000")),
        "{v}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let fired = client
            .list(jobvisor::ListParams {
                kind: Some("none".into()),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_iter()
            .find(|j| {
                j.unique_key
                    .as_deref()
                    .is_some_and(|k| k.starts_with("schedule:cli-rt@"))
            });
        if let Some(j) = fired {
            assert_eq!(j.payload, json!({"n": 1}));
            break;
        }
        assert!(std::time::Instant::now() < deadline, "cli-rt never fired");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let v = json_of(
        jobvisor(&url).args([
            "schedule",
            "change",
            "cli-rt",
            "--cron",
            "0 4 * * *",
            "--zone",
            "Europe/Berlin",
            "--kind",
            "none",
            "--missed",
            "skip",
            "--json",
        ]),
        0,
    );
    assert_eq!(
        (
            v["spec"].clone(),
            v["time_zone"].clone(),
            v["missed"].clone(),
            v["queue"].clone()
        ),
        (
            json!("0 4 * * *"),
            json!("Europe/Berlin"),
            json!("skip"),
            json!("default")
        ),
        "{v}"
    );
    let code_named = ["--cron", "0 5 * * *", "--kind", "none"];
    let err = stderr_of(
        jobvisor(&url)
            .args(["schedule", "add", "cli-nightly"])
            .args(code_named),
        2,
    );
    assert!(
        err.contains("\"cli-nightly\"") && err.contains("declared in code"),
        "{err}"
    );
    let err = stderr_of(
        jobvisor(&url).args(["schedule", "remove", "cli-nightly"]),
        2,
    );
    assert!(err.contains("declared in code"), "{err}");
    let err = stderr_of(
        jobvisor(&url).args([
            "schedule",
            "add",
            "bad",
            "--cron",
            "61 * * * *",
            "--kind",
            "x",
        ]),
        2,
    );
    assert!(
        err.contains("\"bad\"") && err.contains("invalid cron expression"),
        "{err}"
    );
    let err = stderr_of(
        jobvisor(&url).args(["schedule", "add", "bad", "--kind", "x"]),
        2,
    );
    assert!(err.contains("--every"), "{err}");
    let v = json_of(
        jobvisor(&url).args(["schedule", "remove", "cli-rt", "--json"]),
        0,
    );
    assert_eq!(v, json!({ "removed": "cli-rt" }));
    let v = json_of(jobvisor(&url).args(["schedules", "--json"]), 0);
    assert_eq!(v.as_array().unwrap().len(), 1, "{v}");
    let err = stderr_of(jobvisor(&url).args(["schedule", "remove", "cli-rt"]), 2);
    assert!(err.contains("\"cli-rt\""), "{err}");

    node.shutdown().await;
    assert_eq!(client.leader().await.unwrap(), None, "it resigned");
}

#[tokio::test]
async fn commands_on_postgres() {
    commands_do_what_they_say(Backend::Postgres).await;
}

#[tokio::test]
async fn commands_on_mysql() {
    commands_do_what_they_say(Backend::Mysql).await;
}

#[tokio::test]
async fn commands_on_sqlite() {
    commands_do_what_they_say(Backend::Sqlite).await;
}

/// `get` shows a job's parents and children; `cancel --cascade` reaches the descendants.
#[tokio::test]
async fn get_shows_dependencies_and_cancel_cascades() {
    let db = TestDb::create(Backend::Sqlite).await;
    let client = Client::new(db.store().await);
    let url = db.url.clone();
    let parent = client
        .enqueue(NewJob::new("p", json!({})))
        .await
        .unwrap()
        .id;
    let child = NewJob::new("c", json!({}))
        .after(&[parent])
        .on_parent_failure(jobvisor::ParentPolicy::Run);
    let child = client.enqueue(child).await.unwrap().id;
    let v = json_of(
        jobvisor(&url).args(["get", &child.0.to_string(), "--json"]),
        0,
    );
    assert_eq!(v["state"], json!("waiting"), "{v}");
    assert_eq!(v["parents"][0]["id"], json!(parent.0), "{v}");
    assert_eq!(v["parents"][0]["policy"], json!("run"), "{v}");
    let out = jobvisor(&url)
        .args(["get", &parent.0.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("children") && text.contains(&format!("{} (waiting, run)", child.0)),
        "{text}"
    );
    let out = jobvisor(&url)
        .args(["cancel", &parent.0.to_string(), "--cascade", "-y"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    // A `run` child would be released by a plain cancel; the cascade cancels it.
    assert_eq!(client.get(child).await.unwrap().state, JobState::Cancelled);
    assert_eq!(client.get(parent).await.unwrap().state, JobState::Cancelled);

    // A sequence member with a start-by deadline shows both, as text and as JSON.
    let by = chrono::Utc::now() + chrono::Duration::hours(3);
    let member = NewJob::new("m", json!({})).sequence("doc:7").start_by(by);
    let member = client.enqueue(member).await.unwrap().id;
    let v = json_of(
        jobvisor(&url).args(["get", &member.0.to_string(), "--json"]),
        0,
    );
    assert_eq!(v["sequence"], json!("doc:7"), "{v}");
    let shown: chrono::DateTime<chrono::Utc> =
        serde_json::from_value(v["start_by"].clone()).unwrap();
    assert_eq!(shown.timestamp_micros(), by.timestamp_micros(), "{v}");
    let out = jobvisor(&url)
        .args(["get", &member.0.to_string()])
        .output()
        .unwrap();
    let text = String::from_utf8(out.stdout).unwrap();
    let line = |k: &str| text.lines().find(|l| l.starts_with(k)).map(str::to_string);
    assert_eq!(
        line("sequence").as_deref(),
        Some("sequence       doc:7"),
        "{text}"
    );
    assert!(
        line("start by").is_some_and(|l| l.contains(&by.format("%Y-%m-%dT%H:%M:%S").to_string())),
        "{text}"
    );
}

#[test]
fn bad_arguments_and_unreachable_databases_are_clear_and_keep_secrets() {
    let mut c = Command::cargo_bin("jobvisor").unwrap();
    let err = stderr_of(c.env_remove("DATABASE_URL").arg("status"), 2);
    assert!(err.contains("DATABASE_URL"), "{err}");

    let url = "postgres://app:Sup3r-s3cret-pw@127.0.0.1:1/app";
    let err = stderr_of(jobvisor(url).arg("status"), 1);
    assert!(!err.contains("Sup3r-s3cret-pw"), "{err}");
    assert!(err.to_lowercase().contains("connection refused"), "{err}");

    let err = stderr_of(
        jobvisor("sqlite://x.db").args(["list", "--state", "sleeping"]),
        2,
    );
    assert!(err.contains("sleeping"), "{err}");
    let err = stderr_of(
        jobvisor("sqlite://x.db").args(["archive", "--older-than", "2w"]),
        2,
    );
    assert!(err.contains("unknown unit"), "{err}");
    let err = stderr_of(jobvisor("sqlite://x.db").args(["get", "abc"]), 2);
    assert!(err.contains("abc"), "{err}");
    let err = stderr_of(
        jobvisor("sqlite://x.db").args(["metrics", "--listen", "localhost"]),
        2,
    );
    assert!(
        err.contains("localhost") && err.contains("--listen"),
        "{err}"
    );
    let dir = tempfile::tempdir().unwrap();
    // Only `migrate` creates an SQLite file; other commands say there is none.
    let missing = dir.path().join("missing.db");
    let err = stderr_of(
        jobvisor(&format!("sqlite://{}", missing.display())).arg("status"),
        1,
    );
    assert!(err.contains("no SQLite database at"), "{err}");
    assert!(!missing.exists(), "status created {}", missing.display());
    let db = format!("sqlite://{}", dir.path().join("m.db").display());
    jobvisor(&db).arg("migrate").assert().success();
    let err = stderr_of(
        jobvisor(&db).args(["metrics", "--once", "--every", "0s"]),
        2,
    );
    assert!(err.contains("every") && err.contains("minimum"), "{err}");

    let out = Command::cargo_bin("jobvisor")
        .unwrap()
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("jobvisor"));
}

#[tokio::test]
async fn metrics_listen_serves_the_gauges_over_http() {
    let db = TestDb::create(Backend::Sqlite).await;
    let url = db.url.clone();
    let store = db.store().await;
    let client = Client::new(store.clone());
    client
        .enqueue(NewJob::new("k", json!(1)).queue("served"))
        .await
        .unwrap();
    // Two jobs ended by a node this exporter never sees: one succeeded, one dead. Their
    // outcomes reach the exporter through the database only.
    for n in [2, 3] {
        client
            .enqueue(NewJob::new("k", json!(n)).queue("ended"))
            .await
            .unwrap();
    }
    let claimed = store
        .job_claim(ClaimParams {
            queue: "ended".into(),
            owner: NodeId::new("elsewhere").unwrap(),
            limit: 2,
            kinds: None,
            lease: Duration::from_secs(30),
            now: None,
        })
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let items = vec![
        Finalize::succeeded(claimed[0].id, claimed[0].token.clone(), json!(null)),
        Finalize::dead(
            claimed[1].id,
            claimed[1].token.clone(),
            JobFailure::new("boom", "it broke", 1),
        ),
    ];
    store
        .job_finalize_many(FinalizeParams { items, now: None })
        .await
        .unwrap();
    // `get` names the node that ran the succeeded job (its claim kept on the job's row).
    let v = json_of(
        jobvisor(&url).args(["get", &claimed[0].id.0.to_string(), "--json"]),
        0,
    );
    assert_eq!(v["claims"][0]["node"], json!("elsewhere"), "{v}");
    assert_eq!(v["claims"][0]["outcome"], json!("succeeded"), "{v}");
    assert_eq!(v["claims"].as_array().map(Vec::len), Some(1), "{v}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("jobvisor"))
        .env("DATABASE_URL", &url)
        .args([
            "metrics",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "--every",
            "1s",
        ])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let want = [
        "jobvisor_jobs{queue=\"served\",state=\"pending\"} 1",
        "jobvisor_jobs_ended_recently{queue=\"ended\",kind=\"k\",state=\"succeeded\"} 1",
        "jobvisor_jobs_ended_recently{queue=\"ended\",kind=\"k\",state=\"dead\"} 1",
    ];
    let mut last = String::new();
    for _ in 0..100 {
        if let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) {
            use std::io::{Read, Write};
            s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
            last.clear();
            let _ = s.read_to_string(&mut last);
            if want.iter().all(|w| last.contains(w)) {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    child.kill().unwrap();
    let _ = child.wait();
    for w in want {
        assert!(last.contains(w), "{w} not served:\n{last}");
    }
    // Its HELP line says where it comes from.
    let help = last
        .lines()
        .find(|l| l.starts_with("# HELP jobvisor_jobs_ended_recently "))
        .unwrap_or_else(|| panic!("no HELP line:\n{last}"));
    assert!(help.contains("database-derived"), "{help}");
}

/// Splits a shell line into words: single and double quotes group, nothing else is special.
fn shell_words(line: &str) -> Vec<String> {
    let (mut words, mut word, mut quote, mut any) = (Vec::new(), String::new(), None, false);
    for ch in line.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                any = true;
            }
            (None, c) if c.is_whitespace() => {
                if any || !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
                any = false;
            }
            (None, c) => word.push(c),
        }
    }
    if any || !word.is_empty() {
        words.push(word);
    }
    words
}

/// The arguments of every `jobvisor …` command the README prints (in its shell blocks, or
/// after `cargo run … --bin jobvisor --` in its text), comments and redirections cut off.
fn readme_commands() -> Vec<Vec<String>> {
    let readme = include_str!("../README.md");
    let mut out = Vec::new();
    let mut in_sh = false;
    for line in readme.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_sh = t == "```sh";
            continue;
        }
        let cmd = if in_sh {
            t.strip_prefix("jobvisor ")
        } else {
            t.split("--bin jobvisor -- ")
                .nth(1)
                .and_then(|r| r.split('`').next())
        };
        // (`<command>` is a placeholder in the prose, not a command.)
        let Some(cmd) = cmd.filter(|c| !c.starts_with('<')) else {
            continue;
        };
        let cmd = cmd.split("  #").next().unwrap_or(cmd);
        let cmd = cmd.split(" >").next().unwrap_or(cmd);
        out.push(shell_words(cmd));
    }
    out
}

/// Every command the README prints parses and runs (on a fresh SQLite database: exit 0, or
/// 3 for a job id that does not exist), and so does the one the missing-schema error prints.
/// A command that only serves (`--listen`) is checked for its arguments alone.
#[test]
fn every_command_the_readme_and_the_errors_print_works() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("readme.db").display());

    // The error of a store opened on a database with no schema names the command to run.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let err = rt
        .block_on(jobvisor::Store::connect_with(
            &url,
            jobvisor::StoreOptions::default().migrate(false),
        ))
        .unwrap_err()
        .to_string();
    let printed = err
        .split('`')
        .find(|s| s.starts_with("jobvisor migrate"))
        .unwrap_or_else(|| panic!("no command in {err}"));
    let args = shell_words(printed.strip_prefix("jobvisor ").unwrap());
    let mut c = Command::cargo_bin("jobvisor").unwrap();
    c.env_remove("DATABASE_URL").args(&args).assert().success();

    // The README's own `--database-url sqlite://jobs.db` is the quickstart's file, in the
    // working directory: a migrated one there.
    Command::cargo_bin("jobvisor")
        .unwrap()
        .current_dir(dir.path())
        .env_remove("DATABASE_URL")
        .args(["migrate", "--database-url", "sqlite://jobs.db"])
        .assert()
        .success();
    let commands = readme_commands();
    assert!(commands.len() >= 15, "the README's commands: {commands:?}");
    for args in commands {
        if args.iter().any(|a| a == "--listen") {
            let mut c = Command::cargo_bin("jobvisor").unwrap();
            let help = c.args(&args).arg("--help").output().unwrap();
            assert!(help.status.success(), "{args:?} is refused: {help:?}");
            continue;
        }
        let out = jobvisor(&url)
            .current_dir(dir.path())
            .args(&args)
            .output()
            .unwrap();
        assert!(
            matches!(out.status.code(), Some(0 | 3)),
            "the README's `jobvisor {}` exits {:?}: {}",
            args.join(" "),
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// `jobvisor dashboard`: refuses to start without a token, or without authentication on a
/// non-loopback address; with a token it serves the login page with its security headers,
/// and the pages need a login.
#[tokio::test]
async fn dashboard_is_secure_by_default() {
    let db = TestDb::create(Backend::Sqlite).await;
    let _ = db.store().await;
    let url = db.url.clone();
    let err = stderr_of(
        jobvisor(&url)
            // A dashboard that wrongly starts serving fails here rather than hanging.
            .timeout(Duration::from_secs(20))
            .env_remove("JOBVISOR_DASHBOARD_TOKEN")
            .args(["dashboard", "--listen", "127.0.0.1:0"]),
        2,
    );
    assert!(err.contains("JOBVISOR_DASHBOARD_TOKEN"), "{err}");
    let err = stderr_of(
        jobvisor(&url)
            // A dashboard that wrongly starts serving fails here rather than hanging.
            .timeout(Duration::from_secs(20))
            .env_remove("JOBVISOR_DASHBOARD_TOKEN")
            .args(["dashboard", "--no-auth", "--listen", "0.0.0.0:0"]),
        2,
    );
    assert!(err.contains("loopback"), "{err}");
    let err = stderr_of(
        jobvisor(&url)
            .env("JOBVISOR_DASHBOARD_TOKEN", "short")
            .args(["dashboard", "--listen", "127.0.0.1:0"])
            .timeout(Duration::from_secs(20)),
        2,
    );
    assert!(
        err.contains("at least 16 characters") && !err.contains("short"),
        "{err}"
    );

    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = std::process::Command::new(assert_cmd::cargo::cargo_bin("jobvisor"))
        .env("DATABASE_URL", &url)
        .env("JOBVISOR_DASHBOARD_TOKEN", "a-long-enough-dashboard-token")
        .args(["dashboard", "--listen", &format!("127.0.0.1:{port}")])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let get = |path: &str| {
        use std::io::{Read, Write};
        let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
        write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n").ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).ok()?;
        Some(out)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let login = loop {
        if let Some(page) = get("/login") {
            break page;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the dashboard never answered"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let jobs = get("/jobs").unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        login.starts_with("HTTP/1.0 200") || login.starts_with("HTTP/1.1 200"),
        "{login}"
    );
    let lower = login.to_ascii_lowercase();
    assert!(
        lower.contains("content-security-policy: default-src 'none'"),
        "{login}"
    );
    assert!(lower.contains("httponly; samesite=strict"), "{login}");
    assert!(
        jobs.contains(" 303 ") && jobs.to_ascii_lowercase().contains("location: /login"),
        "{jobs}"
    );
}

/// `--no-advisory-locks --no-notifications` (PostgreSQL-compatible engines): `migrate`
/// finishes while another session holds the advisory lock a default migration waits for,
/// under the row lock, which it frees; and the other commands connect with the switches too.
#[tokio::test]
async fn migrate_without_advisory_locks_takes_the_row_lock() {
    use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};
    let db = TestDb::create(Backend::Postgres).await;
    let mut holder = AsyncPgConnection::establish(&db.url).await.unwrap();
    // The key the default migration's advisory lock takes (store/postgres/mod.rs).
    holder
        .batch_execute("SELECT pg_advisory_lock(7669456951150079858)")
        .await
        .unwrap();
    let url = db.url.clone();
    let out = tokio::task::spawn_blocking(move || {
        jobvisor(&url)
            .args(["--no-advisory-locks", "--no-notifications", "migrate"])
            .timeout(Duration::from_secs(30))
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let url = db.url.clone();
    let status = tokio::task::spawn_blocking(move || {
        json_of(
            jobvisor(&url).args(["--no-notifications", "--json", "migrate", "--status"]),
            0,
        )
    })
    .await
    .unwrap();
    assert_eq!(status["up_to_date"], json!(true), "{status}");
    holder
        .batch_execute(
            "SELECT pg_advisory_unlock(7669456951150079858); \
             DO $$ BEGIN IF (SELECT holder FROM jobvisor_migrate_lock) IS NOT NULL \
             THEN RAISE 'the row lock is still held'; END IF; END $$",
        )
        .await
        .unwrap();
}
