//! Runs that outlive the process executing them: the real binary is killed with SIGKILL in the
//! middle of a research and restarted on the same data directory; the research goes on from
//! its last checkpoint under the same run id — no answered model request is sent again, the
//! client's stream (resumed with `Last-Event-ID`) gets every event once, in order, and `done`.

use crate::support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::binary::{
    Server, add_user, add_user_with, assistant_messages, call, get_json, read_log,
    start_server_with,
};
use support::fake_llm::{FakeLlm, Reply, last_user_text, prompt_text};
use support::research_site::ResearchSite;
use support::{ReceivedEvent, SseReader, collect, follow_to_done};

const TOPICS: [&str; 2] = ["tides moon", "lighthouse lens"];

/// The fake model of a two-topic research whose second researcher's first request hangs until
/// `released` (the moment the test kills the server).
async fn model(released: Arc<AtomicBool>) -> FakeLlm {
    let script = crate::research::research_script(
        TOPICS.to_vec(),
        "# Tides and lights\n\nTides follow the Moon [1].",
    );
    let llm_handler = move |request: &Value| {
        let prompt = prompt_text(request);
        let second_researcher = prompt.contains("You are a researcher")
            && request["messages"][1]["content"]
                .as_str()
                .is_some_and(|topic| topic.contains(TOPICS[1]))
            && !request["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["role"] == "tool");
        if second_researcher && !released.load(Ordering::SeqCst) {
            return Some(Reply::Hang);
        }
        script(request)
    };
    let llm = FakeLlm::start().await;
    llm.set_handler(llm_handler);
    llm
}

fn env_of(pairs: &[(String, String)]) -> Vec<(&str, &str)> {
    pairs
        .iter()
        .map(|(key, value)| (key.as_str(), value.as_str()))
        .collect()
}

/// Starts a research (one researcher at a time, no clarification) through `base`; its stream.
async fn start_research(
    client: &reqwest::Client,
    base: &str,
    key: &str,
    query: &str,
) -> reqwest::Response {
    let response = client
        .post(format!("{base}/research/stream"))
        .bearer_auth(key)
        .json(&json!({
            "query": query,
            "max_concurrent_research_units": 1,
            "allow_clarification": false,
        }))
        .send()
        .await
        .expect("research request");
    assert_eq!(response.status(), StatusCode::OK);
    response
}

async fn wait_until(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !ready() {
        assert!(Instant::now() < deadline, "timed out waiting: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_research_killed_mid_way_finishes_from_its_checkpoint_after_a_restart() {
    let dir = tempfile::tempdir().expect("temp dir");
    let data_dir = dir.path().join("data");
    let site = ResearchSite::start(Duration::ZERO).await;
    let released = Arc::new(AtomicBool::new(false));
    let llm = model(released.clone()).await;
    let mut pairs = site.env();
    pairs.extend(llm.env());
    let env = env_of(&pairs);
    let key = add_user(&data_dir, "ria").await;
    let first_log = dir.path().join("serve-1.log");
    let mut server = start_server_with(&data_dir, &first_log, &env).await;
    let client = reqwest::Client::new();
    let response = start_research(&client, &server.base, &key, "tides and lighthouses").await;
    let received = Arc::new(std::sync::Mutex::new(Vec::new()));
    let reading = tokio::spawn(collect(SseReader::new(response), received.clone()));

    // The first researcher finished (its findings checkpointed); the second one waits on the
    // model when the server is killed.
    let hung = |llm: &FakeLlm| {
        llm.requests().iter().any(|request| {
            prompt_text(request).contains("You are a researcher")
                && request["messages"][1]["content"]
                    .as_str()
                    .is_some_and(|topic| topic.contains(TOPICS[1]))
        })
    };
    wait_until("the second researcher's request", || hung(&llm)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    server.kill().await;
    let _ = reading.await;
    let before_kill = llm.requests();
    let received: Vec<ReceivedEvent> = received.lock().expect("events").clone();
    let run_id = received[0].data["run_id"]
        .as_str()
        .expect("run id")
        .to_string();
    let last_seen = received.last().expect("some events").id;
    released.store(true, Ordering::SeqCst);

    let second_log = dir.path().join("serve-2.log");
    let server = start_server_with(&data_dir, &second_log, &env).await;
    let rest = resume_stream(&client, &server, &key, &run_id, last_seen).await;
    let mut events = received.clone();
    events.extend(rest);

    // Every event once, in order, ending with a completed `done`.
    let seqs: Vec<i64> = events.iter().map(|event| event.id).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "contiguous"
    );
    let last = events.last().expect("events");
    assert_eq!(last.event, "done");
    assert_eq!(last.data["status"], "completed", "{events:#?}");
    let resumed: Vec<&ReceivedEvent> = events.iter().filter(|e| e.event == "run_resumed").collect();
    assert_eq!(resumed.len(), 1, "one takeover");
    assert_eq!(resumed[0].data["attempt"], 2);
    assert_eq!(resumed[0].data["resumed_from"], "researcher.1");
    assert_eq!(resumed[0].data["run_id"], run_id.as_str());
    let superseded_after = resumed[0].data["superseded_after"].as_i64().expect("seq");
    assert!(superseded_after < resumed[0].id);
    // No finished stage was announced or done again.
    let mut announced: BTreeMap<String, usize> = BTreeMap::new();
    for event in events.iter().filter(|e| e.event == "stage_update") {
        *announced
            .entry(event.data["stage"].as_str().unwrap_or_default().to_string())
            .or_default() += 1;
    }
    assert!(announced.values().all(|count| *count == 1), "{announced:?}");
    assert_eq!(
        events.iter().filter(|e| e.event == "session_start").count(),
        1
    );
    // The model was asked nothing twice, except the request cut short by the kill.
    let after_kill = &llm.requests()[before_kill.len()..];
    for request in &before_kill {
        let prompt = prompt_text(request);
        let again = after_kill
            .iter()
            .filter(|later| prompt_text(later) == prompt)
            .count();
        let was_hung = prompt.contains("You are a researcher") && prompt.contains(TOPICS[1]);
        if was_hung {
            assert_eq!(again, 1, "the interrupted researcher starts over once");
        } else {
            assert_eq!(again, 0, "a finished step was done again: {prompt:.200}");
        }
    }
    assert!(
        after_kill
            .iter()
            .all(|request| !prompt_text(request).contains("You write the research brief")),
        "the brief was not written again"
    );
    assert_eq!(
        after_kill
            .iter()
            .filter(|request| prompt_text(request).contains("You write the final report"))
            .count(),
        1
    );
    // The research is recorded as completed, with its report, under the same id.
    let (status, record) = call(
        &client,
        &server.base,
        &key,
        "GET",
        &format!("/research/{run_id}"),
        Value::Null,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!(record["status"], "completed");
    assert!(
        record["report"]
            .as_str()
            .is_some_and(|report| report.contains("Tides follow the Moon"))
    );
    let logs = read_log(&first_log) + &read_log(&second_log);
    assert!(!logs.contains("panicked"), "{logs}");
    assert!(
        logs.contains("continuing a run whose owner is gone"),
        "{logs}"
    );
}

/// The rest of the run's events after `after`, read through `server` until `done`.
async fn resume_stream(
    client: &reqwest::Client,
    server: &Server,
    key: &str,
    run: &str,
    after: i64,
) -> Vec<ReceivedEvent> {
    let response = client
        .get(format!("{}/v1/runs/{run}/events", server.base))
        .bearer_auth(key)
        .header("Last-Event-ID", after.to_string())
        .send()
        .await
        .expect("events request");
    assert_eq!(response.status(), StatusCode::OK);
    let into = Arc::new(std::sync::Mutex::new(Vec::new()));
    collect(SseReader::new(response), into.clone()).await;
    into.lock().expect("events").clone()
}

// --- three replicas -------------------------------------------------------------------------

/// The number in `study-<n>` within `text`.
fn study(text: &str) -> Option<usize> {
    let start = text.find("study-")? + "study-".len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The number in `chat-<n>` within `text`.
fn chat_number(text: &str) -> Option<usize> {
    let start = text.find("chat-")? + "chat-".len();
    let digits: String = text[start..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

/// The fake model of the replica test: researches `study-<n>` with two researchers each, the
/// second one's first request held until `released` (research 9's forever); chat turns
/// `chat-<n>` answered slowly.
fn replica_model(
    released: Arc<AtomicBool>,
) -> impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static {
    move |request: &Value| {
        let prompt = prompt_text(request);
        let tools = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .count();
        let last_user = last_user_text(request);
        if last_user.starts_with("chat-")
            && let Some(n) = chat_number(last_user)
        {
            return Some(Reply::slow_text(
                &format!("Answer {n}: the tide turns twice a day, every day, at the harbour."),
                4,
                40,
            ));
        }
        if let Some(n) = study(&prompt) {
            if prompt.contains("You write the research brief") {
                return Some(Reply::text(&format!(
                    r#"{{"brief": "Explain tides and lighthouses for study-{n}."}}"#
                )));
            }
            if prompt.contains("You are the research supervisor") {
                if tools > 0 {
                    return Some(Reply::tool("research_complete", json!({})));
                }
                return Some(Reply::ToolCalls(
                    ["tides moon", "lighthouse lens"]
                        .iter()
                        .map(|topic| {
                            (
                                "conduct_research".to_string(),
                                json!({ "research_topic": format!("study-{n} {topic}") }),
                            )
                        })
                        .collect(),
                ));
            }
            if prompt.contains("You are a researcher") {
                let topic = request["messages"][1]["content"].as_str().unwrap_or("");
                return Some(match tools {
                    0 => {
                        let search = Reply::tool("web_search", json!({ "query": "tides" }));
                        if topic.contains("lighthouse") && n == 9 {
                            Reply::Hang
                        } else if topic.contains("lighthouse") {
                            Reply::After(released.clone(), Box::new(search))
                        } else {
                            search
                        }
                    }
                    1 => {
                        let url = request["messages"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .filter(|m| m["role"] == "tool")
                            .filter_map(|m| m["content"].as_str())
                            .flat_map(str::split_whitespace)
                            .find(|word| word.starts_with("http://"))
                            .unwrap_or("http://127.0.0.1:9/none")
                            .to_string();
                        Reply::tool("fetch_url", json!({ "url": url }))
                    }
                    _ => Reply::text(&format!("The findings of study-{n}.")),
                });
            }
            if prompt.contains("You compress") {
                return Some(Reply::text(&format!(
                    "- Tides follow the Moon [source] (study-{n})"
                )));
            }
            if prompt.contains("You score the sources") {
                return Some(Reply::text(r#"{"sources": []}"#));
            }
            if prompt.contains("You write the final report") {
                return Some(Reply::slow_text(
                    &format!("# Study {n}\n\nTides follow the Moon [1]."),
                    8,
                    2,
                ));
            }
            return Some(Reply::text(r#"{"conclusions": []}"#));
        }
        None
    }
}

fn assert_once_in_order(events: &[ReceivedEvent], what: &str) {
    let seqs: Vec<i64> = events.iter().map(|event| event.id).collect();
    assert_eq!(
        seqs,
        (1..=seqs.len() as i64).collect::<Vec<_>>(),
        "{what}: every event once, in order"
    );
    let last = events.last().expect("events");
    assert_eq!(last.event, "done", "{what}");
}

/// The events a client keeps: each `run_resumed` voids the events before it that came after
/// its `superseded_after`.
fn standing(events: &[ReceivedEvent]) -> Vec<&ReceivedEvent> {
    let mut kept: Vec<&ReceivedEvent> = Vec::new();
    for event in events {
        if event.event == "run_resumed" {
            let after = event.data["superseded_after"].as_i64().unwrap_or(i64::MAX);
            kept.retain(|earlier| earlier.id <= after);
        }
        kept.push(event);
    }
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_replicas_lose_one_and_every_run_ends_once_on_the_others() {
    let Ok(qdrant) = std::env::var("QDRANT_URL") else {
        println!("skipped: QDRANT_URL is not set, no Qdrant server to share");
        return;
    };
    let database_url = support::databases::fresh_postgres_url().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let site = ResearchSite::start(Duration::ZERO).await;
    let released = Arc::new(AtomicBool::new(false));
    let llm = FakeLlm::start().await;
    llm.set_handler(replica_model(released.clone()));
    let collection = format!(
        "takeover_{}",
        dir.path()
            .file_name()
            .and_then(|name| name.to_str())
            .unwrap_or("x")
            .replace(|c: char| !c.is_ascii_alphanumeric(), "")
    );
    let mut pairs = site.env();
    pairs.extend(llm.env());
    pairs.extend([
        ("MNEMO__DATABASE__URL".to_string(), database_url.clone()),
        ("MNEMO__QDRANT__URL".to_string(), qdrant.clone()),
        ("MNEMO__QDRANT__COLLECTION".to_string(), collection),
        (
            "MNEMO__SERVER__RUN_LEASE_MS".to_string(),
            "1500".to_string(),
        ),
        (
            "MNEMO__SERVER__RUN_HEARTBEAT_MS".to_string(),
            "300".to_string(),
        ),
        (
            "MNEMO__SERVER__REQUESTS_PER_MINUTE".to_string(),
            "0".to_string(),
        ),
    ]);
    let env = env_of(&pairs);
    let dirs: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|name| dir.path().join(name))
        .collect();
    let mut keys = Vec::new();
    for user in 0..5 {
        keys.push(add_user_with(&dirs[0], &format!("user{user}"), &env).await);
    }
    let logs: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|name| dir.path().join(format!("{name}.log")))
        .collect();
    let mut servers = Vec::new();
    for (data, log) in dirs.iter().zip(&logs) {
        servers.push(start_server_with(data, log, &env).await);
    }
    let bases: Vec<String> = servers.iter().map(|server| server.base.clone()).collect();
    let client = reqwest::Client::new();

    // Five researches over the three replicas: each one's second researcher waits.
    let mut researches = Vec::new();
    for n in 0..5 {
        let base = &bases[n % 3];
        let key = keys[n].clone();
        let query = format!("study-{n} tides and lighthouses");
        let response = start_research(&client, base, &key, &query).await;
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut others = bases.clone();
        others.rotate_left(n % 3 + 1);
        let (client, seen_too) = (client.clone(), seen.clone());
        let follower = tokio::spawn(async move {
            // The run id comes with the first event.
            let mut reader = SseReader::new(response);
            let first = reader.next().await.expect("first event");
            let run = first.data["run_id"].as_str().expect("run id").to_string();
            seen_too.lock().expect("events").push(first);
            let rest = async {
                while let Some(event) = reader.next().await {
                    let done = event.event == "done";
                    seen_too.lock().expect("events").push(event);
                    if done {
                        break;
                    }
                }
            };
            rest.await;
            follow_to_done(client, others, key, run.clone(), None, seen_too).await;
            run
        });
        researches.push((n, seen, follower));
    }
    let held = |llm: &FakeLlm| {
        llm.requests()
            .iter()
            .filter(|request| {
                let prompt = prompt_text(request);
                prompt.contains("You are a researcher")
                    && request["messages"][1]["content"]
                        .as_str()
                        .is_some_and(|topic| topic.contains("lighthouse"))
            })
            .count()
    };
    wait_until("every research's second researcher", || held(&llm) == 5).await;

    // Twenty chat turns over the three replicas, each followed by its client.
    let mut chats = Vec::new();
    for n in 0..20 {
        let base = bases[n % 3].clone();
        let key = keys[n % 5].clone();
        let (status, thread) = call(
            &client,
            &base,
            &key,
            "POST",
            "/v1/threads",
            json!({ "title": format!("chat {n}") }),
        )
        .await;
        assert_eq!(status, StatusCode::CREATED, "{thread}");
        let thread = thread["id"].as_str().expect("thread id").to_string();
        let (status, run) = call(
            &client,
            &base,
            &key,
            "POST",
            &format!("/v1/threads/{thread}/messages"),
            json!({ "content": format!("chat-{n}: when does the tide turn?"), "stream": false }),
        )
        .await;
        assert_eq!(status, StatusCode::ACCEPTED, "{run}");
        let run = run["id"].as_str().expect("run id").to_string();
        let mut order = bases.clone();
        order.rotate_left(n % 3);
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let follower = tokio::spawn(follow_to_done(
            client.clone(),
            order,
            key,
            run.clone(),
            None,
            seen.clone(),
        ));
        chats.push((n, run, thread, seen, follower));
    }
    // Every turn has begun (its client saw events) when replica A dies.
    wait_until("every chat turn under way", || {
        chats
            .iter()
            .all(|(_, _, _, seen, _)| seen.lock().expect("events").len() >= 2)
    })
    .await;
    let before_kill = llm.requests().len();
    servers[0].kill().await;
    released.store(true, Ordering::SeqCst);

    // A cancel sent to a replica that does not execute the run stops it.
    let response = start_research(
        &client,
        &bases[1],
        &keys[0],
        "study-9 tides and lighthouses",
    )
    .await;
    let mut reader = SseReader::new(response);
    let first = reader.next().await.expect("first event");
    let doomed = first.data["run_id"].as_str().expect("run id").to_string();
    let cancel_reader = tokio::spawn(async move {
        let mut events = vec![first];
        while let Some(event) = reader.next().await {
            events.push(event);
        }
        events
    });
    wait_until("research 9 under way", || {
        llm.requests().iter().any(|request| {
            study(&prompt_text(request)) == Some(9)
                && prompt_text(request).contains("You are a researcher")
                && request["messages"][1]["content"]
                    .as_str()
                    .is_some_and(|topic| topic.contains("lighthouse"))
        })
    })
    .await;
    let asked = Instant::now();
    let (status, body) = call(
        &client,
        &bases[2],
        &keys[0],
        "POST",
        &format!("/v1/runs/{doomed}/cancel"),
        Value::Null,
    )
    .await;
    assert!(status.is_success(), "{status} {body}");
    let stopped = loop {
        let state = get_json(&client, &bases[2], &keys[0], &format!("/v1/runs/{doomed}")).await;
        if state["status"] != "running" {
            break state;
        }
        assert!(asked.elapsed() < Duration::from_secs(10), "never stopped");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let took = asked.elapsed();
    assert_eq!(stopped["status"], "cancelled");
    assert!(
        took <= Duration::from_secs(1),
        "a cancel through another replica took {took:?}"
    );
    let cancelled = cancel_reader.await.expect("cancelled stream");
    assert_eq!(
        cancelled.last().expect("events").data["status"],
        "cancelled"
    );

    // A memory written through B is recalled through C within the index-lag bound.
    let (status, written) = call(
        &client,
        &bases[1],
        &keys[1],
        "POST",
        "/v1/memories",
        json!({ "content": "My storage unit code is 4417.", "kind": "fact" }),
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{written}");
    let written_at = Instant::now();
    loop {
        let (_, found) = call(
            &client,
            &bases[2],
            &keys[1],
            "POST",
            "/v1/memories/search",
            json!({ "query": "storage unit code", "k": 5 }),
        )
        .await;
        if found["results"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|result| result["memory"]["id"] == written["id"])
        {
            break;
        }
        assert!(
            written_at.elapsed() < Duration::from_secs(5),
            "a memory written through B was not recalled through C within 5 s"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Every research completes, those of A on another replica from their last checkpoint:
    // nothing the model answered before the kill is asked again.
    let mut finished = Vec::new();
    for (n, seen, follower) in researches {
        let run = follower.await.expect("research client");
        finished.push((n, seen, run));
    }
    let requests = llm.requests();
    let (earlier, later) = requests.split_at(before_kill);
    let was_held = |request: &Value| {
        prompt_text(request).contains("You are a researcher")
            && request["messages"][1]["content"]
                .as_str()
                .is_some_and(|topic| topic.contains("lighthouse"))
            && !request["messages"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|m| m["role"] == "tool")
    };
    for (n, seen, run) in finished {
        let events = seen.lock().expect("events").clone();
        assert_once_in_order(&events, &format!("research {n}"));
        assert_eq!(
            events.last().expect("events").data["status"],
            "completed",
            "research {n}"
        );
        let resumed: Vec<&ReceivedEvent> =
            events.iter().filter(|e| e.event == "run_resumed").collect();
        let on_a = n % 3 == 0;
        if on_a {
            assert_eq!(resumed.len(), 1, "research {n} was taken over once");
            assert_eq!(resumed[0].data["resumed_from"], "researcher.1");
        } else {
            assert!(resumed.is_empty(), "research {n} stayed where it was");
        }
        for request in earlier.iter().filter(|r| study(&prompt_text(r)) == Some(n)) {
            let prompt = prompt_text(request);
            let again = later.iter().filter(|r| prompt_text(r) == prompt).count();
            let expected = usize::from(on_a && was_held(request));
            if again != expected {
                let similar: Vec<String> = later
                    .iter()
                    .map(prompt_text)
                    .filter(|p| study(p) == Some(n) && p.contains("You are a researcher"))
                    .collect();
                panic!(
                    "research {n}: asked again {again} times, not {expected}: {prompt}\n\nlater: {similar:#?}"
                );
            }
        }
        let state = get_json(&client, &bases[1], &keys[n], &format!("/v1/runs/{run}")).await;
        assert_eq!(state["status"], "completed", "research {n}: {state}");
        let record = get_json(&client, &bases[2], &keys[n], &format!("/research/{run}")).await;
        assert_eq!(record["status"], "completed", "research {n}: {record}");
        assert!(
            record["report"]
                .as_str()
                .is_some_and(|report| report.contains(&format!("Study {n}"))),
            "{record}"
        );
    }
    // Every chat turn ends once with one answer; those cut short on A started over elsewhere.
    let mut retried = 0;
    for (n, run, thread, _, follower) in chats {
        let events = follower.await.expect("chat client");
        assert_once_in_order(&events, &format!("chat {n}"));
        assert_eq!(
            events.last().expect("events").data["status"],
            "completed",
            "chat {n}: {events:?}"
        );
        let answer = format!("Answer {n}: the tide turns twice a day, every day, at the harbour.");
        // A turn cut short may have sent its answer before the kill: `run_resumed` voids the
        // cut-short attempt's events (those after `superseded_after`), as a client does.
        let complete: Vec<&ReceivedEvent> = standing(&events)
            .into_iter()
            .filter(|e| e.event == "message_complete")
            .collect();
        assert_eq!(complete.len(), 1, "chat {n}: {events:?}");
        assert_eq!(complete[0].data["content"], answer.as_str());
        if let Some(resumed) = events.iter().find(|e| e.event == "run_resumed") {
            assert_eq!(n % 3, 0, "only A's turns are taken over");
            assert_eq!(resumed.data["superseded_after"], 0);
            assert_eq!(resumed.data["attempt"], 2);
            retried += 1;
        }
        let state = get_json(&client, &bases[2], &keys[n % 5], &format!("/v1/runs/{run}")).await;
        assert_eq!(state["status"], "completed", "chat {n}");
        let answers = assistant_messages(&client, &bases[1], &keys[n % 5], &thread).await;
        assert_eq!(answers.len(), 1, "chat {n}: {answers:?}");
        assert_eq!(answers[0]["content"], answer.as_str());
    }
    assert!(retried > 0, "some turn was cut short on A and retried");
    for server in &mut servers[1..] {
        server.kill().await;
    }
    let logs_text: String = logs.iter().map(|log| read_log(log)).collect();
    assert!(!logs_text.contains("panicked"), "{logs_text}");
    assert!(
        logs_text.contains("continuing a run whose owner is gone"),
        "{logs_text}"
    );
}
