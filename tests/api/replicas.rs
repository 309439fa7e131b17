//! Several replicas over one PostgreSQL database, each a `RunHub` with a pool of its own (as
//! separate processes would have): a replica's live runs survive another replica's start and
//! sweeps, a cancel or an input sent through one replica reaches the run where it executes,
//! and the runs of a replica that stopped renewing its leases are closed by another one.

use std::sync::Arc;
use std::time::{Duration, Instant};

use mnemo::runs::{
    Checkpoint, InputRefused, Leases, NotAdmitted, Resume, ResumedBody, RunEvent, RunFailure,
    RunHub, RunLimits,
};
use mnemo::store::{EventType, Run, RunKind, RunStatus, Store, StoredEvent, UserId, UserKind};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::databases::fresh_postgres_url;

/// Short leases, so an expiry is seen within seconds.
const LEASES: Leases = Leases {
    lease: Duration::from_millis(1500),
    heartbeat: Duration::from_millis(300),
    command_poll: Duration::from_millis(200),
};

/// The bound on every wait for something another replica does.
const PATIENCE: Duration = Duration::from_secs(15);

struct Replica {
    store: Arc<dyn Store>,
    hub: Arc<RunHub>,
}

async fn replica(url: &str) -> Replica {
    replica_abandoning(url, None).await
}

/// A replica that cancels a run nobody has followed for `abandon_after`.
async fn replica_abandoning(url: &str, abandon_after: Option<Duration>) -> Replica {
    replica_with(url, abandon_after, 8).await
}

/// A replica that admits `max_per_user` running runs per user.
async fn replica_with(url: &str, abandon_after: Option<Duration>, max_per_user: usize) -> Replica {
    replica_built(url, abandon_after, max_per_user, LEASES, None).await
}

/// A replica with its own lease settings, continuing runs with `resume` when given one.
async fn replica_leased(url: &str, leases: Leases, resume: Option<Continue>) -> Replica {
    replica_built(url, None, 8, leases, resume).await
}

async fn replica_built(
    url: &str,
    abandon_after: Option<Duration>,
    max_per_user: usize,
    leases: Leases,
    resume: Option<Continue>,
) -> Replica {
    let store = mnemo::store::connect(url, 4, Duration::from_secs(10))
        .await
        .unwrap();
    let hub = RunHub::new(
        store.clone(),
        CancellationToken::new(),
        abandon_after,
        RunLimits {
            max_per_user,
            run_tokens: None,
            daily_tokens: None,
        },
        leases,
    );
    let continues = resume.is_some();
    if let Some(resume) = resume {
        hub.set_resumer(Arc::new(resume));
    }
    let taken = hub.recover_interrupted(None).await.unwrap();
    if !continues {
        assert_eq!(taken, 0, "a starting replica closed a live run");
    }
    hub.spawn_control();
    Replica { store, hub }
}

/// The user "alice", created through `replica`.
async fn alice(replica: &Replica) -> UserId {
    replica
        .store
        .accounts()
        .create_user("alice", UserKind::Key)
        .await
        .unwrap()
        .id
}

/// Starts a run on `replica` that emits a `thinking` event every 50 ms until it is stopped.
async fn endless_run(replica: &Replica, user: UserId) -> Run {
    looping_run(replica, user, false).await
}

/// `endless_run`, saving a checkpoint first when `checkpoint` (another replica can continue it).
async fn looping_run(replica: &Replica, user: UserId, checkpoint: bool) -> Run {
    replica
        .hub
        .start(user, None, RunKind::Research, move |context| async move {
            if checkpoint {
                context.checkpoint(None, json!({ "test": true })).await?;
            }
            for n in 0.. {
                context
                    .emit(RunEvent::thinking(
                        "research_execution",
                        format!("step {n}"),
                        None,
                    ))
                    .await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Ok::<(), RunFailure>(())
        })
        .await
        .unwrap()
}

async fn run_state(store: &Arc<dyn Store>, user: UserId, run: &Run) -> Run {
    store.user(user).get_run(run.id).await.unwrap()
}

/// Waits (at most `PATIENCE`) until `ready` holds for the run's row.
async fn wait_for(
    store: &Arc<dyn Store>,
    user: UserId,
    run: &Run,
    what: &str,
    ready: impl Fn(&Run) -> bool,
) -> Run {
    let started = Instant::now();
    loop {
        let state = run_state(store, user, run).await;
        if ready(&state) {
            return state;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "run {} never became {what}: {state:?}",
            run.id
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn events(store: &Arc<dyn Store>, user: UserId, run: &Run) -> Vec<StoredEvent> {
    store
        .user(user)
        .run_events_after(run.id, 0, 10_000)
        .await
        .unwrap()
}

fn assert_contiguous_and_done(events: &[StoredEvent], status: &str) {
    let seqs: Vec<i64> = events.iter().map(|event| event.seq).collect();
    let expected: Vec<i64> = (1..=events.len() as i64).collect();
    assert_eq!(seqs, expected, "sequence numbers have gaps or repeats");
    let last = events.last().unwrap();
    assert_eq!(last.event_type, EventType::Done);
    assert_eq!(last.data["status"], status);
    assert_eq!(
        events
            .iter()
            .filter(|event| event.event_type == EventType::Done)
            .count(),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_per_user_run_cap_counts_runs_on_every_replica() {
    let url = fresh_postgres_url().await;
    let a = replica_with(&url, None, 1).await;
    let b = replica_with(&url, None, 1).await;
    let user = alice(&a).await;
    let bob = a
        .store
        .accounts()
        .create_user("bob", UserKind::Key)
        .await
        .unwrap()
        .id;
    a.hub.admit(user).await.unwrap();
    let live = endless_run(&a, user).await;
    // B runs nothing of alice's, yet her one allowed run is executing on A.
    let refused = b.hub.admit(user).await;
    assert!(
        matches!(refused, Err(NotAdmitted::TooManyRuns(1))),
        "{refused:?}"
    );
    b.hub.admit(bob).await.unwrap();
    assert!(b.hub.request_cancel(user, live.id).await.unwrap());
    wait_for(&a.store, user, &live, "cancelled", |run| {
        run.status != RunStatus::Running
    })
    .await;
    b.hub.admit(user).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_runs_through_leases_and_commands() {
    let url = fresh_postgres_url().await;
    let a = replica(&url).await;
    let user = alice(&a).await;

    // A run executing on A survives B's start and B's sweeps, for longer than a lease.
    let live = endless_run(&a, user).await;
    wait_for(&a.store, user, &live, "under way", |run| run.last_seq >= 3).await;
    let b = replica(&url).await;
    let watched_from = Instant::now();
    let seq_at_start = run_state(&b.store, user, &live).await.last_seq;
    while watched_from.elapsed() < LEASES.lease * 2 {
        assert_eq!(b.hub.sweep().await.unwrap(), 0, "B closed A's live run");
        tokio::time::sleep(LEASES.heartbeat).await;
    }
    let state = run_state(&b.store, user, &live).await;
    assert_eq!(state.status, RunStatus::Running);
    assert!(
        state.last_seq > seq_at_start + 5,
        "A's run stopped writing: {state:?}"
    );
    assert!(!b.hub.cancel(live.id), "the run executes on A, not on B");

    // A cancel sent through B stops the run on A, which writes its end itself.
    let sent_at = Instant::now();
    assert!(b.hub.request_cancel(user, live.id).await.unwrap());
    let cancelled = wait_for(&b.store, user, &live, "cancelled", |run| {
        run.status.is_terminal()
    })
    .await;
    eprintln!(
        "a cancel through B ended A's run in {:?}",
        sent_at.elapsed()
    );
    assert_eq!(cancelled.status, RunStatus::Cancelled);
    let written = events(&b.store, user, &live).await;
    assert_contiguous_and_done(&written, "cancelled");
    assert!(
        written
            .iter()
            .all(|event| event.event_type != EventType::Error),
        "a cancel is not an error: {written:?}"
    );
    // An ended run takes no more commands.
    assert!(!b.hub.request_cancel(user, live.id).await.unwrap());

    // Input sent through B reaches a run waiting on A; before it waits, B answers as A would.
    let gate = Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let asking = a
        .hub
        .start(user, None, RunKind::Research, |context| async move {
            context
                .emit(RunEvent::thinking("research_execution", "working", None))
                .await?;
            opened.notified().await;
            // Input is expected before the question is out: a client answering the moment it
            // sees the question is accepted, however long the run takes to start listening.
            let wait = context.expect_input().await;
            context
                .emit(RunEvent::thinking("research_execution", "asking", None))
                .await?;
            tokio::time::sleep(Duration::from_millis(300)).await;
            let answer = wait.recv().await.unwrap_or_default();
            context
                .emit(RunEvent::thinking(
                    "research_execution",
                    format!("answered {}", answer["content"]),
                    None,
                ))
                .await?;
            Ok::<(), RunFailure>(())
        })
        .await
        .unwrap();
    wait_for(&b.store, user, &asking, "under way", |run| {
        run.last_seq >= 1
    })
    .await;
    let early = b
        .hub
        .request_input(user, asking.id, json!({ "content": "too early" }))
        .await
        .unwrap();
    assert_eq!(early, Err(InputRefused::NotAwaiting));
    gate.notify_one();
    wait_for(&b.store, user, &asking, "asking", |run| run.last_seq >= 2).await;
    // Accepted at once: the run recorded that it waits before it asked.
    assert_eq!(
        b.hub
            .request_input(user, asking.id, json!({ "content": "tides" }))
            .await
            .unwrap(),
        Ok(())
    );
    let answered = wait_for(&b.store, user, &asking, "completed", |run| {
        run.status.is_terminal()
    })
    .await;
    assert_eq!(answered.status, RunStatus::Completed);
    let written = events(&b.store, user, &asking).await;
    assert_contiguous_and_done(&written, "completed");
    assert_eq!(written[2].data["content"], "answered \"tides\"");
    assert_eq!(
        b.hub
            .request_input(user, asking.id, json!({ "content": "late" }))
            .await
            .unwrap(),
        Err(InputRefused::NotLive)
    );

    // Deleting a thread through B first stops the thread's run executing on A.
    let thread = a.store.user(user).create_thread("t", false).await.unwrap();
    let threaded = a
        .hub
        .start(user, Some(thread.id), RunKind::Chat, |context| async move {
            loop {
                context
                    .emit(RunEvent::thinking("chat", "still here", None))
                    .await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            #[allow(unreachable_code)]
            Ok::<(), RunFailure>(())
        })
        .await
        .unwrap();
    wait_for(&b.store, user, &threaded, "under way", |run| {
        run.last_seq >= 2
    })
    .await;
    b.hub.cancel_thread(user, thread.id, PATIENCE).await;
    let state = run_state(&b.store, user, &threaded).await;
    assert_eq!(state.status, RunStatus::Cancelled);
    assert_contiguous_and_done(&events(&b.store, user, &threaded).await, "cancelled");

    // C loses the database while its run is in progress (as a replica that dies does): its
    // lease runs out, and B's sweeper closes the run as interrupted. A's runs stay alone.
    let c = replica(&url).await;
    let orphan = endless_run(&c, user).await;
    wait_for(&b.store, user, &orphan, "under way", |run| {
        run.last_seq >= 3
    })
    .await;
    let bystander = endless_run(&a, user).await;
    c.store.close().await;
    let closed = wait_for(&b.store, user, &orphan, "closed", |run| {
        run.status.is_terminal()
    })
    .await;
    assert_eq!(closed.status, RunStatus::Interrupted);
    let written = events(&b.store, user, &orphan).await;
    assert_contiguous_and_done(&written, "interrupted");
    let error = &written[written.len() - 2];
    assert_eq!(error.event_type, EventType::Error);
    assert_eq!(error.data["retryable"], true);
    assert!(
        written[..written.len() - 2]
            .iter()
            .all(|event| event.event_type == EventType::Thinking),
        "only C's own events come before the taker's end: {written:?}"
    );
    let state = run_state(&a.store, user, &bystander).await;
    assert_eq!(state.status, RunStatus::Running, "A's run was closed too");

    a.hub.shutdown(Duration::from_secs(5)).await;
    b.hub.shutdown(Duration::from_secs(5)).await;
    let ended = run_state(&b.store, user, &bystander).await;
    assert_eq!(ended.status, RunStatus::Interrupted);
    a.store.close().await;
    b.store.close().await;
}

/// An append of a cancelled body's that was still in flight can commit after the run re-read
/// its log (it did so in CI, under a cancel sent through another replica): the event takes a
/// number behind the run's back. The run's closing events then skip that number, so its log
/// still ends with its one `done` rather than only a status.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_committed_behind_a_runs_back_does_not_cost_it_its_done() {
    let url = fresh_postgres_url().await;
    let a = replica(&url).await;
    let user = alice(&a).await;
    let gate = Arc::new(tokio::sync::Notify::new());
    let opened = gate.clone();
    let run = a
        .hub
        .start(user, None, RunKind::Research, |context| async move {
            context
                .emit(RunEvent::thinking("research_execution", "working", None))
                .await?;
            opened.notified().await;
            Ok::<(), RunFailure>(())
        })
        .await
        .unwrap();
    wait_for(&a.store, user, &run, "under way", |run| run.last_seq >= 1).await;
    a.store
        .user(user)
        .append_run_event(
            run.id,
            2,
            EventType::Thinking,
            &json!({ "seq": 2, "type": "thinking", "content": "late" }),
            a.hub.replica(),
        )
        .await
        .unwrap();
    gate.notify_one();
    let ended = wait_for(&a.store, user, &run, "completed", |run| {
        run.status.is_terminal()
    })
    .await;
    assert_eq!(ended.status, RunStatus::Completed);
    let written = events(&a.store, user, &run).await;
    assert_eq!(written.len(), 3, "{written:?}");
    assert_eq!(written[1].data["content"], "late");
    assert_contiguous_and_done(&written, "completed");
    a.hub.shutdown(Duration::from_secs(5)).await;
    a.store.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_on_another_replica_gets_the_events_and_keeps_the_run_alive() {
    use futures::StreamExt as _;
    let url = fresh_postgres_url().await;
    let grace = Duration::from_millis(1000);
    let a = replica_abandoning(&url, Some(grace)).await;
    let b = replica_abandoning(&url, Some(grace)).await;
    let user = alice(&a).await;
    let run = endless_run(&a, user).await;
    // Nobody reads it on A; the only reader follows it through B, for three grace periods.
    let mut followed = Box::pin(b.hub.follow(user, run.id, 0, CancellationToken::new()));
    let mut received = Vec::new();
    let started = Instant::now();
    while started.elapsed() < grace * 3 {
        let event = tokio::time::timeout(PATIENCE, followed.next())
            .await
            .expect("no event reached B's follower")
            .expect("B's follower ended early");
        received.push(event);
    }
    let state = run_state(&b.store, user, &run).await;
    assert_eq!(
        state.status,
        RunStatus::Running,
        "A cancelled a run followed through B"
    );
    assert!(received.len() >= 10, "{} events", received.len());
    let seqs: Vec<i64> = received.iter().map(|event| event.seq).collect();
    let expected: Vec<i64> = (1..=received.len() as i64).collect();
    assert_eq!(seqs, expected);
    assert!(
        received
            .iter()
            .all(|event| event.event_type == EventType::Thinking)
    );
    // Once B's reader goes away, A's watchdog cancels the run.
    drop(followed);
    let ended = wait_for(&a.store, user, &run, "abandoned", |run| {
        run.status.is_terminal()
    })
    .await;
    assert_eq!(ended.status, RunStatus::Cancelled);
    a.hub.shutdown(Duration::from_secs(5)).await;
    b.hub.shutdown(Duration::from_secs(5)).await;
    a.store.close().await;
    b.store.close().await;
}

/// Two servers over one PostgreSQL database (each with its own data directory): a chat turn
/// started on A is followed and cancelled through B's HTTP API.
#[tokio::test]
async fn a_turn_started_on_one_server_is_followed_and_cancelled_through_another() {
    use crate::support::fake_llm::{FakeLlm, Reply};
    use crate::support::{Backend, Home, TestApp};
    use reqwest::StatusCode;

    let home_a = Home::new(Backend::Postgres).await;
    let home_b = Home {
        dir: tempfile::tempdir().unwrap(),
        database_url: home_a.database_url.clone(),
    };
    let llm = FakeLlm::start().await;
    let words: Vec<String> = (0..200).map(|index| format!("word{index}")).collect();
    llm.set_default(Reply::slow_text(&words.join(" "), 6, 200));
    let a = TestApp::spawn_with_llm(&home_a, &llm, &[]).await;
    let b = TestApp::spawn_with_llm(&home_b, &llm, &[]).await;
    assert_ne!(a.state.runs.replica(), b.state.runs.replica());
    let key = a.user_key("alice").await;
    let thread = a.create_thread(&key, "two servers").await;
    let run = a
        .post_message(&key, thread["id"].as_str().unwrap(), "go on and on")
        .await;
    let run_id = run["id"].as_str().unwrap().to_string();
    assert_eq!(a.state.runs.active(), 1);
    assert_eq!(b.state.runs.active(), 0);
    let mut reader = b.events(&key, &run_id, None).await;
    let first = reader.next().await.expect("an event through B");
    assert_eq!(first.id, 1);
    let (status, body) = b
        .post(&format!("/v1/runs/{run_id}/cancel"), Some(&key), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let rest = tokio::time::timeout(PATIENCE, reader.collect())
        .await
        .expect("B's stream ended");
    let done = rest.last().expect("events after the cancel");
    assert_eq!(done.event, "done", "{rest:?}");
    assert_eq!(done.data["status"], "cancelled");
    assert!(rest.iter().all(|event| event.event != "message_complete"));
    let (status, body) = b
        .post(&format!("/v1/runs/{run_id}/cancel"), Some(&key), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let (status, body) = b
        .post(
            &format!("/v1/runs/{run_id}/input"),
            Some(&key),
            Some(json!({ "approve": true })),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    b.stop().await;
    a.stop().await;
}

/// Continues every run it is asked to with a body that emits `steps` `thinking` events.
struct Continue {
    steps: usize,
}

#[async_trait::async_trait]
impl Resume for Continue {
    async fn resume(
        &self,
        _user: UserId,
        _run: &Run,
        _checkpoint: &Checkpoint,
    ) -> Result<ResumedBody, String> {
        let steps = self.steps;
        Ok(Box::new(move |context| {
            Box::pin(async move {
                for n in 0..steps {
                    context
                        .emit(RunEvent::thinking(
                            "research_execution",
                            format!("resumed step {n}"),
                            None,
                        ))
                        .await?;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Ok::<(), RunFailure>(())
            })
        }))
    }
}

/// A replica that stopped renewing its leases (a long pause): its runs expire after a second.
const STALLED: Leases = Leases {
    lease: Duration::from_millis(1000),
    heartbeat: Duration::from_secs(600),
    command_poll: Duration::from_millis(200),
};

/// A replica A that stalls (renews nothing) while its checkpointed run goes on, and a replica B
/// that continues taken-over runs for `steps` events; the database's URL, A, B, the user and
/// A's run.
async fn stalled_with_a_taker(steps: usize) -> (String, Replica, Replica, UserId, Run) {
    let url = fresh_postgres_url().await;
    let a = replica_leased(&url, STALLED, None).await;
    let b = replica_leased(&url, LEASES, Some(Continue { steps })).await;
    let user = a
        .store
        .accounts()
        .create_user("ada", UserKind::Key)
        .await
        .unwrap()
        .id;
    let run = looping_run(&a, user, true).await;
    (url, a, b, user, run)
}

fn resumed_at(events: &[StoredEvent]) -> Vec<i64> {
    events
        .iter()
        .filter(|event| event.event_type == EventType::RunResumed)
        .map(|event| event.seq)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_run_was_taken_over_leaves_it_to_the_taker() {
    let (_, a, b, user, run) = stalled_with_a_taker(30).await;
    // A keeps going but renews nothing: B takes the run over and continues it; A's next write
    // is refused, and A must not end (or fail) the run B is executing.
    let ended = wait_for(&b.store, user, &run, "ended", |run| {
        run.status.is_terminal()
    })
    .await;
    assert_eq!(ended.status, RunStatus::Completed, "{ended:?}");
    let written = events(&b.store, user, &run).await;
    assert_contiguous_and_done(&written, "completed");
    let resumed = resumed_at(&written);
    assert_eq!(resumed.len(), 1);
    let at = resumed[0];
    let resumed_event = &written[at as usize - 1];
    assert_eq!(resumed_event.data["attempt"], 2);
    assert!(
        written[at as usize..written.len() - 1]
            .iter()
            .all(|event| event.data["content"]
                .as_str()
                .is_some_and(|content| content.starts_with("resumed step"))),
        "only the taker writes after run_resumed: {written:?}"
    );
    assert_eq!(a.hub.active(), 0, "A let go of the run");
    a.hub.shutdown(Duration::from_secs(5)).await;
    b.hub.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        run_state(&b.store, user, &run).await.status,
        RunStatus::Completed
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_taken_over_is_handed_over_again_at_shutdown() {
    let (url, a, b, user, run) = stalled_with_a_taker(100_000).await;
    let started = Instant::now();
    while resumed_at(&events(&b.store, user, &run).await).is_empty() {
        assert!(started.elapsed() < PATIENCE, "B never took the run over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    a.hub.shutdown(Duration::from_secs(5)).await;
    // B stops while executing attempt 2: the run is let go, not ended, and C continues it.
    b.hub.shutdown(Duration::from_secs(5)).await;
    let state = run_state(&b.store, user, &run).await;
    assert_eq!(state.status, RunStatus::Running, "{state:?}");
    // C continues it and is shut down in turn; handovers do not use up the run's attempts
    // (three starts ended by a crash would), so D continues it once more and ends it.
    let c = replica_leased(&url, LEASES, Some(Continue { steps: 100_000 })).await;
    let started = Instant::now();
    while resumed_at(&events(&c.store, user, &run).await).len() < 2 {
        assert!(started.elapsed() < PATIENCE, "C never took the run over");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.hub.shutdown(Duration::from_secs(5)).await;
    assert_eq!(
        run_state(&c.store, user, &run).await.status,
        RunStatus::Running
    );
    let d = replica_leased(&url, LEASES, Some(Continue { steps: 3 })).await;
    let started = Instant::now();
    let ended = loop {
        let state = run_state(&d.store, user, &run).await;
        if state.status.is_terminal() {
            break state;
        }
        assert!(
            started.elapsed() < PATIENCE,
            "D never ended the run: {state:?}, checkpoint {:?}, events {:?}",
            d.store.user(user).run_checkpoint(run.id).await,
            events(&d.store, user, &run)
                .await
                .iter()
                .map(|event| (event.seq, event.event_type, event.data["content"].clone()))
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(ended.status, RunStatus::Completed);
    let written = events(&d.store, user, &run).await;
    assert_contiguous_and_done(&written, "completed");
    let resumed = resumed_at(&written);
    assert_eq!(resumed.len(), 3, "attempts 2, 3 and 4");
    assert_eq!(written[resumed[2] as usize - 1].data["attempt"], 4);
    d.hub.shutdown(Duration::from_secs(5)).await;
}
