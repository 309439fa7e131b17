//! The HTTP surface against the real app on port 0: authentication, isolation between users,
//! resumable run streams (across a restart), errors, and the service endpoints.

use crate::support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey, Header, encode};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply};
use support::{Backend, Home, ReceivedEvent, TestApp};

/// A fake LLM whose every answer is `words` words streamed slowly.
async fn slow_llm(words: usize, delay_ms: u64) -> (FakeLlm, String) {
    let llm = FakeLlm::start().await;
    let text: Vec<String> = (0..words).map(|index| format!("word{index}")).collect();
    let text = text.join(" ");
    llm.set_default(Reply::slow_text(&text, 6, delay_ms));
    (llm, text)
}

const SECRET: &str = "test-secret-0123456789abcdef-0123456789";
const AUDIENCE: &str = "mnemo-test";
const ISSUER: &str = "https://issuer.test";

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn hs256_env() -> Vec<(&'static str, &'static str)> {
    vec![
        ("MNEMO__AUTH__JWT__HS256_SECRET", SECRET),
        ("MNEMO__AUTH__JWT__AUDIENCE", AUDIENCE),
        ("MNEMO__AUTH__JWT__ISSUER", ISSUER),
    ]
}

fn hs256(claims: &Value, secret: &str) -> String {
    encode(
        &Header::new(Algorithm::HS256),
        claims,
        &EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("encode")
}

fn valid_claims(sub: &str) -> Value {
    json!({ "sub": sub, "aud": AUDIENCE, "iss": ISSUER, "exp": now_secs() + 600 })
}

/// A token with `alg: none` and no signature.
fn alg_none(claims: &Value) -> String {
    use base64::Engine;
    let engine = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = engine.encode(br#"{"alg":"none","typ":"JWT"}"#);
    let payload = engine.encode(claims.to_string());
    format!("{header}.{payload}.")
}

async fn status_with(app: &TestApp, token: Option<&str>) -> StatusCode {
    app.get("/v1/threads", token).await.0
}

#[tokio::test]
async fn api_keys_and_hs256_tokens_authenticate_and_every_bad_credential_is_401() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &hs256_env()).await;
    let key = app.user_key("alice").await;
    assert_eq!(status_with(&app, Some(&key)).await, StatusCode::OK);
    let token = hs256(&valid_claims("user-1"), SECRET);
    assert_eq!(status_with(&app, Some(&token)).await, StatusCode::OK);

    let mut expired = valid_claims("user-1");
    expired["exp"] = json!(now_secs() - 3600);
    let mut no_aud = valid_claims("user-1");
    no_aud.as_object_mut().unwrap().remove("aud");
    let mut wrong_aud = valid_claims("user-1");
    wrong_aud["aud"] = json!("someone-else");
    let mut wrong_iss = valid_claims("user-1");
    wrong_iss["iss"] = json!("https://evil.test");
    let mut no_sub = valid_claims("user-1");
    no_sub.as_object_mut().unwrap().remove("sub");
    let mut no_exp = valid_claims("user-1");
    no_exp.as_object_mut().unwrap().remove("exp");
    let bad_tokens = [
        ("expired", hs256(&expired, SECRET)),
        (
            "wrong key",
            hs256(
                &valid_claims("user-1"),
                "another-secret-0123456789abcdef-xx",
            ),
        ),
        ("alg none", alg_none(&valid_claims("user-1"))),
        ("missing aud", hs256(&no_aud, SECRET)),
        ("wrong aud", hs256(&wrong_aud, SECRET)),
        ("wrong iss", hs256(&wrong_iss, SECRET)),
        ("missing sub", hs256(&no_sub, SECRET)),
        ("missing exp", hs256(&no_exp, SECRET)),
        ("garbage", "not-a-token".to_string()),
        ("unknown key", format!("mnemo_{}", "ab".repeat(32))),
        ("tampered", format!("{token}x")),
    ];
    for (what, bad) in &bad_tokens {
        let (status, body) = app.get("/v1/threads", Some(bad)).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}: {body}");
        assert_eq!(body["error"]["code"], "unauthenticated", "{what}");
    }
    assert_eq!(status_with(&app, None).await, StatusCode::UNAUTHORIZED);

    // Revoking a key takes effect at once.
    app.state
        .store
        .accounts()
        .revoke_keys("alice")
        .await
        .unwrap();
    assert_eq!(
        status_with(&app, Some(&key)).await,
        StatusCode::UNAUTHORIZED
    );
    app.stop().await;
}

#[tokio::test]
async fn rs256_tokens_verify_and_algorithm_confusion_is_refused() {
    let home = Home::new(Backend::Sqlite).await;
    let public = include_str!("../fixtures/jwt-test-rsa.pub.pem");
    let private = include_str!("../fixtures/jwt-test-rsa.pem");
    let app = TestApp::spawn_with(
        &home,
        &[
            ("MNEMO__AUTH__JWT__RS256_PUBLIC_KEY", public),
            ("MNEMO__AUTH__JWT__AUDIENCE", AUDIENCE),
            ("MNEMO__AUTH__JWT__ISSUER", ISSUER),
        ],
    )
    .await;
    let signing = EncodingKey::from_rsa_pem(private.as_bytes()).expect("rsa key");
    let good = encode(
        &Header::new(Algorithm::RS256),
        &valid_claims("rs-user"),
        &signing,
    )
    .expect("encode");
    assert_eq!(status_with(&app, Some(&good)).await, StatusCode::OK);
    // Algorithm confusion: HS256 signed with the public key as the shared secret.
    let confused = hs256(&valid_claims("rs-user"), public);
    assert_eq!(
        status_with(&app, Some(&confused)).await,
        StatusCode::UNAUTHORIZED
    );
    let mut expired = valid_claims("rs-user");
    expired["exp"] = json!(now_secs() - 3600);
    let expired = encode(&Header::new(Algorithm::RS256), &expired, &signing).expect("encode");
    assert_eq!(
        status_with(&app, Some(&expired)).await,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        status_with(&app, Some(&alg_none(&valid_claims("rs-user")))).await,
        StatusCode::UNAUTHORIZED
    );
    app.stop().await;
}

/// `nbf` in the future and an oversized `sub` were accepted (the `sub` becoming a 20 KB user
/// name).
#[tokio::test]
async fn jwt_not_yet_valid_or_oversized_subjects_are_refused() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &hs256_env()).await;
    let mut early = valid_claims("early-bird");
    early["nbf"] = json!(now_secs() + 600);
    let long = valid_claims(&"s".repeat(20_000));
    let nul = valid_claims("a\u{0}b");
    for claims in [early, long, nul] {
        let (status, body) = app.get("/v1/threads", Some(&hs256(&claims, SECRET))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{body}");
    }
    let mut started = valid_claims("on-time");
    started["nbf"] = json!(now_secs() - 5);
    let (status, _) = app.get("/v1/threads", Some(&hs256(&started, SECRET))).await;
    assert_eq!(status, StatusCode::OK);
    app.stop().await;
}

#[tokio::test]
async fn jwt_subjects_are_distinct_users() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &hs256_env()).await;
    let first = hs256(&valid_claims("subject-a"), SECRET);
    let second = hs256(&valid_claims("subject-b"), SECRET);
    let thread = app.create_thread(&first, "a's thread").await;
    let id = thread["id"].as_str().unwrap();
    let (status, _) = app.get(&format!("/v1/threads/{id}"), Some(&second)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, body) = app.get(&format!("/v1/threads/{id}"), Some(&first)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["thread"]["title"], "a's thread");
    app.stop().await;
}

async fn users_cannot_touch_each_others_threads_or_runs(backend: Backend) {
    let home = Home::new(backend).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let thread = app.create_thread(&alice, "alice private").await;
    let thread_id = thread["id"].as_str().unwrap().to_string();
    let run = app.post_message(&alice, &thread_id, "secret plans").await;
    let run_id = run["id"].as_str().unwrap().to_string();

    let (status, listed) = app.get("/v1/threads", Some(&bob)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["threads"], json!([]));
    let forbidden = [
        (Method::GET, format!("/v1/threads/{thread_id}"), None),
        (Method::DELETE, format!("/v1/threads/{thread_id}"), None),
        (
            Method::POST,
            format!("/v1/threads/{thread_id}/messages"),
            Some(json!({ "content": "hi", "stream": false })),
        ),
        (Method::GET, format!("/v1/runs/{run_id}"), None),
        (Method::GET, format!("/v1/runs/{run_id}/events"), None),
        (Method::POST, format!("/v1/runs/{run_id}/cancel"), None),
    ];
    for (method, path, body) in forbidden {
        let (status, answer) = app.call(method.clone(), &path, Some(&bob), body).await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{method} {path}: {answer}");
        assert_eq!(answer["error"]["code"], "not_found");
        assert!(!answer.to_string().contains("secret plans"));
    }
    // A body field naming a user is not identity.
    let (status, _) = app
        .post(
            &format!("/v1/threads/{thread_id}/messages"),
            Some(&bob),
            Some(json!({ "content": "hi", "user_id": "alice" })),
        )
        .await;
    assert_ne!(status, StatusCode::OK);
    // Alice still sees everything, including the finished run's events.
    let events = app.events(&alice, &run_id, None).await.collect().await;
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
    let (status, body) = app
        .get(&format!("/v1/threads/{thread_id}"), Some(&alice))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["messages"][0]["content"], "secret plans");
    assert_eq!(body["messages"][1]["role"], "assistant");
    app.stop().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn isolation(#[case] backend: Backend) {
    users_cannot_touch_each_others_threads_or_runs(backend).await;
}

fn assert_contiguous(events: &[ReceivedEvent]) {
    for (index, event) in events.iter().enumerate() {
        assert_eq!(
            event.id,
            index as i64 + 1,
            "events out of order: {events:?}"
        );
        assert_eq!(event.data["seq"], event.id);
        assert_eq!(event.data["type"], event.event.as_str());
    }
}

fn reply_text(events: &[ReceivedEvent]) -> String {
    events
        .iter()
        .filter(|event| event.event == "message_delta")
        .map(|event| event.data["content"].as_str().unwrap_or_default())
        .collect()
}

async fn a_cut_stream_resumes_with_every_event_exactly_once(backend: Backend) {
    let home = Home::new(backend).await;
    let (llm, reply) = slow_llm(40, 15).await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "resume").await;
    let content = "tell me forty words";
    let response = app
        .client
        .post(app.url(&format!(
            "/v1/threads/{}/messages",
            thread["id"].as_str().unwrap()
        )))
        .bearer_auth(&key)
        .json(&json!({ "content": content }))
        .send()
        .await
        .unwrap();
    let mut reader = support::SseReader::new(response);
    assert_eq!(reader.status, StatusCode::OK);
    assert_eq!(
        reader.headers["content-type"].to_str().unwrap(),
        "text/event-stream"
    );
    assert_eq!(reader.headers["cache-control"], "no-cache");
    assert_eq!(reader.headers["x-accel-buffering"], "no");
    let run_id = reader.headers["x-run-id"].to_str().unwrap().to_string();
    let mut received = Vec::new();
    for _ in 0..6 {
        received.push(reader.next().await.expect("an event before the cut"));
    }
    drop(reader); // the client is cut off mid-run
    let run = app.get(&format!("/v1/runs/{run_id}"), Some(&key)).await.1;
    assert_eq!(run["status"], "running", "the run goes on without a reader");
    let last = received.last().unwrap().id;
    let rest = app.events(&key, &run_id, Some(last)).await.collect().await;
    received.extend(rest);
    assert_contiguous(&received);
    assert_eq!(received.first().unwrap().event, "session_start");
    assert_eq!(received.last().unwrap().event, "done");
    assert_eq!(received.last().unwrap().data["status"], "completed");
    let complete = received
        .iter()
        .find(|event| event.event == "message_complete")
        .expect("message_complete");
    assert_eq!(
        reply_text(&received),
        complete.data["content"].as_str().unwrap()
    );
    assert_eq!(reply_text(&received), reply);
    // `?after=` resumes the same way as the header, and a finished run replays in full.
    let (status, _) = app
        .get(&format!("/v1/runs/{run_id}/events?after=-1"), Some(&key))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let response = app
        .client
        .get(app.url(&format!("/v1/runs/{run_id}/events?after=3")))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap();
    let replay = support::SseReader::new(response).collect().await;
    assert_eq!(replay.first().unwrap().id, 4);
    assert_eq!(replay.len(), received.len() - 3);
    // From the end or past it the stream still ends with the run's `done` (it was empty).
    let done = received.last().unwrap().id;
    for cursor in [done, done + 50] {
        let tail = app
            .events(&key, &run_id, Some(cursor))
            .await
            .collect()
            .await;
        assert_eq!(tail.len(), 1, "after {cursor}: {tail:?}");
        assert_eq!(tail[0].event, "done");
        assert_eq!(tail[0].id, done);
        assert_eq!(tail[0].data["status"], "completed");
    }
    app.stop().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn resume(#[case] backend: Backend) {
    a_cut_stream_resumes_with_every_event_exactly_once(backend).await;
}

async fn a_turn_cut_by_a_restart_is_answered_again_after_it(backend: Backend) {
    let home = Home::new(backend).await;
    let (llm, _) = slow_llm(100, 200).await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "restart").await;
    let thread_id = thread["id"].as_str().unwrap().to_string();
    let run = app
        .post_message(&key, &thread_id, "a long answer please")
        .await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let mut reader = app.events(&key, &run_id, None).await;
    let mut received = Vec::new();
    for _ in 0..4 {
        received.push(reader.next().await.unwrap());
    }
    // The server shuts down mid-answer: the open stream ends without `done` (the run is left
    // for the next start to continue), then closes.
    let stop = tokio::spawn(app.stop());
    while let Some(event) = reader.next().await {
        received.push(event);
    }
    stop.await.unwrap();
    assert!(
        received.iter().all(|event| event.event != "done"),
        "{received:?}"
    );
    // The next start answers the turn again, from its start, as attempt 2.
    let (quick, answer) = slow_llm(5, 0).await;
    let app = TestApp::spawn_with_llm(&home, &quick, &[]).await;
    let cut_at = 3; // a client that only saw the first three events reconnects
    let rest = app
        .events(&key, &run_id, Some(cut_at))
        .await
        .collect()
        .await;
    let mut combined: Vec<ReceivedEvent> = received[..cut_at as usize].to_vec();
    combined.extend(rest);
    assert_contiguous(&combined);
    let resumed = combined
        .iter()
        .position(|event| event.event == "run_resumed")
        .expect("a run_resumed event");
    let data = &combined[resumed].data;
    assert_eq!(data["attempt"], 2);
    assert_eq!(
        data["superseded_after"], 0,
        "the whole first attempt is superseded"
    );
    assert_eq!(data["resumed_from"], Value::Null);
    let after: Vec<&str> = combined[resumed + 1..]
        .iter()
        .map(|event| event.event.as_str())
        .collect();
    assert_eq!(after.first(), Some(&"session_start"), "{after:?}");
    assert_eq!(after.last(), Some(&"done"));
    let complete = combined
        .iter()
        .filter(|event| event.event == "message_complete")
        .collect::<Vec<_>>();
    assert_eq!(complete.len(), 1);
    assert_eq!(complete[0].data["content"], answer.as_str());
    assert_eq!(combined.last().unwrap().data["status"], "completed");
    let state = app.get(&format!("/v1/runs/{run_id}"), Some(&key)).await.1;
    assert_eq!(state["status"], "completed");
    // One answer in the thread: the second attempt's.
    let messages = app
        .get(&format!("/v1/threads/{thread_id}"), Some(&key))
        .await
        .1;
    let answers: Vec<&Value> = messages["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|message| message["role"] == "assistant")
        .collect();
    assert_eq!(answers.len(), 1, "{messages}");
    assert_eq!(answers[0]["content"], answer.as_str());
    app.stop().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn restart_resume(#[case] backend: Backend) {
    a_turn_cut_by_a_restart_is_answered_again_after_it(backend).await;
}

/// A chat run of alice's (the holder of `key`) in a new thread, owned by `app`'s replica with a
/// lease of an hour, as a process that was killed leaves it.
async fn orphaned_turn(
    app: &TestApp,
    key: &str,
) -> (
    std::sync::Arc<dyn mnemo::store::Store>,
    mnemo::store::User,
    mnemo::store::ThreadId,
    mnemo::store::Run,
) {
    let thread = app.create_thread(key, "crash").await;
    let thread_id: mnemo::store::ThreadId = thread["id"].as_str().unwrap().parse().unwrap();
    let store = app.state.store.clone();
    let user = store
        .accounts()
        .user_by_name("alice")
        .await
        .unwrap()
        .unwrap();
    let run = store
        .user(user.id)
        .create_run(Some(thread_id), mnemo::store::RunKind::Chat, None)
        .await
        .unwrap();
    let lease_until = mnemo::store::now() + chrono::Duration::hours(1);
    assert!(
        store
            .maintenance()
            .claim_run(run.id, app.state.runs.replica(), lease_until)
            .await
            .unwrap()
    );
    (store, user, thread_id, run)
}

#[tokio::test]
async fn runs_left_running_by_a_crash_are_closed_at_start_and_stay_resumable() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    // What a killed process leaves behind: a running run it owned, with part of its log
    // (its lease still runs: only the lock on the data directory says that process is gone).
    let (store, user, _, run) = orphaned_turn(&app, &key).await;
    let replica = app.state.runs.replica();
    for seq in 1..=3 {
        store
            .user(user.id)
            .append_run_event(
                run.id,
                seq,
                mnemo::store::EventType::MessageDelta,
                &json!({ "seq": seq, "type": "message_delta", "content": "x " }),
                replica,
            )
            .await
            .unwrap();
    }
    app.stop().await;
    let app = TestApp::spawn(&home).await;
    let events = app
        .events(&key, &run.id.to_string(), Some(1))
        .await
        .collect()
        .await;
    let kinds: Vec<&str> = events.iter().map(|event| event.event.as_str()).collect();
    assert_eq!(kinds, ["message_delta", "message_delta", "error", "done"]);
    assert_eq!(
        events.iter().map(|event| event.id).collect::<Vec<_>>(),
        [2, 3, 4, 5]
    );
    assert_eq!(events[3].data["status"], "interrupted");
    app.stop().await;
}

#[tokio::test]
async fn a_turn_taken_over_after_its_answer_was_stored_keeps_that_answer() {
    let home = Home::new(Backend::Sqlite).await;
    let (llm, _) = slow_llm(5, 0).await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    // What a process killed right after storing its answer leaves: the turn's checkpoint, its
    // first event, and the answer in the thread, but no `done`.
    let (store, user, thread_id, run) = orphaned_turn(&app, &key).await;
    let scope = store.user(user.id);
    let asked = scope
        .append_message(
            thread_id,
            mnemo::store::Role::User,
            "what is my cat called?",
            None,
            mnemo::store::Trust::User,
        )
        .await
        .unwrap();
    let replica = app.state.runs.replica();
    scope
        .save_run_checkpoint(
            run.id,
            replica,
            &json!({ "attempt": 1, "seq": 0, "step": null,
                     "body": { "chat_turn": { "message_id": asked.id } } }),
        )
        .await
        .unwrap();
    scope
        .append_run_event(
            run.id,
            1,
            mnemo::store::EventType::SessionStart,
            &json!({ "seq": 1, "type": "session_start", "kind": "chat" }),
            replica,
        )
        .await
        .unwrap();
    let stored = scope
        .append_message(
            thread_id,
            mnemo::store::Role::Assistant,
            "Your cat is called Miso.",
            Some(run.id),
            mnemo::store::Trust::Assistant,
        )
        .await
        .unwrap();
    app.stop().await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let events = app
        .events(&key, &run.id.to_string(), None)
        .await
        .collect()
        .await;
    let kinds: Vec<&str> = events.iter().map(|event| event.event.as_str()).collect();
    assert_eq!(
        kinds,
        [
            "session_start",
            "run_resumed",
            "session_start",
            "message_complete",
            "done"
        ]
    );
    assert_eq!(events[3].data["content"], "Your cat is called Miso.");
    assert_eq!(events[3].data["message_id"], stored.id.to_string());
    assert_eq!(events[4].data["status"], "completed");
    let (_, body) = app
        .get(&format!("/v1/threads/{thread_id}"), Some(&key))
        .await;
    let answers: Vec<&Value> = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|message| message["role"] == "assistant")
        .collect();
    assert_eq!(answers.len(), 1, "{body}");
    assert!(llm.requests().is_empty(), "the model was not asked again");
    app.stop().await;
}

#[tokio::test]
async fn cancel_stops_a_run_and_a_second_cancel_conflicts() {
    let home = Home::new(Backend::Sqlite).await;
    let (llm, _) = slow_llm(200, 200).await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "cancel").await;
    let run = app
        .post_message(&key, thread["id"].as_str().unwrap(), "go on and on")
        .await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let mut reader = app.events(&key, &run_id, None).await;
    reader.next().await.unwrap();
    let started = std::time::Instant::now();
    let (status, body) = app
        .post(&format!("/v1/runs/{run_id}/cancel"), Some(&key), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let rest = reader.collect().await;
    assert!(started.elapsed() < Duration::from_secs(2));
    let done = rest.last().unwrap();
    assert_eq!(done.event, "done");
    assert_eq!(done.data["status"], "cancelled");
    assert!(rest.iter().all(|event| event.event != "message_complete"));
    let (status, body) = app
        .post(&format!("/v1/runs/{run_id}/cancel"), Some(&key), None)
        .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("cancelled")
    );
    app.stop().await;
}

/// Deleting a thread during its live run answered 204 but cut the stream without `done`, let
/// the model call run on, and left a memory job retried against a missing thread.
#[tokio::test]
async fn deleting_a_thread_stops_its_run_first() {
    let home = Home::new(Backend::Sqlite).await;
    let (llm, _) = slow_llm(200, 200).await;
    let app = TestApp::spawn_with_llm(&home, &llm, &[]).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "to be deleted").await;
    let thread_id = thread["id"].as_str().unwrap().to_string();
    let run = app.post_message(&key, &thread_id, "go on and on").await;
    let run_id = run["id"].as_str().unwrap().to_string();
    let mut reader = app.events(&key, &run_id, None).await;
    reader.next().await.unwrap();
    let requests_before = llm.requests().len();
    let started = std::time::Instant::now();
    let status = app
        .delete(&format!("/v1/threads/{thread_id}"), Some(&key))
        .await
        .0;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let rest = reader.collect().await;
    assert!(started.elapsed() < Duration::from_secs(5));
    let done = rest.last().expect("events after the delete");
    assert_eq!(done.event, "done", "{rest:?}");
    assert_eq!(done.data["status"], "cancelled");
    let (status, _) = app
        .get(&format!("/v1/threads/{thread_id}"), Some(&key))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    // No memory job fails against the missing thread, and no new model call starts.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (_, health) = app.health().await;
    assert_eq!(
        health["components"]["memory_writer"]["failed"], 0,
        "{health}"
    );
    assert_eq!(llm.requests().len(), requests_before);
    app.stop().await;
}

#[tokio::test]
async fn client_mistakes_are_clear_json_4xx() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &[("MNEMO__SERVER__MAX_BODY_BYTES", "4096")]).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "errors").await;
    let messages = format!("/v1/threads/{}/messages", thread["id"].as_str().unwrap());
    let raw = |body: &'static str| {
        app.client
            .post(app.url(&messages))
            .bearer_auth(&key)
            .header("content-type", "application/json")
            .body(body)
    };
    let cases = [
        ("bad json", raw("{\"content\": "), StatusCode::BAD_REQUEST),
        (
            "wrong type",
            raw("{\"content\": 42}"),
            StatusCode::BAD_REQUEST,
        ),
        ("missing field", raw("{}"), StatusCode::BAD_REQUEST),
        (
            "unknown field",
            raw("{\"content\": \"x\", \"nope\": 1}"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "empty content",
            raw("{\"content\": \"   \"}"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "no content type",
            app.client
                .post(app.url(&messages))
                .bearer_auth(&key)
                .body("{}"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "oversized",
            app.client
                .post(app.url(&messages))
                .bearer_auth(&key)
                .json(&json!({ "content": "x".repeat(10_000) })),
            StatusCode::PAYLOAD_TOO_LARGE,
        ),
        (
            "unknown thread",
            app.client
                .post(app.url("/v1/threads/0190a4f6-7d2e-7c3b-8a00-000000000000/messages"))
                .bearer_auth(&key)
                .json(&json!({ "content": "x" })),
            StatusCode::NOT_FOUND,
        ),
        (
            "malformed id",
            app.client
                .get(app.url("/v1/threads/not-a-uuid"))
                .bearer_auth(&key),
            StatusCode::BAD_REQUEST,
        ),
        (
            "bad limit",
            app.client
                .get(app.url("/v1/threads?limit=0"))
                .bearer_auth(&key),
            StatusCode::BAD_REQUEST,
        ),
        (
            "bad last-event-id",
            app.client
                .get(app.url("/v1/runs/0190a4f6-7d2e-7c3b-8a00-000000000000/events"))
                .bearer_auth(&key)
                .header("Last-Event-ID", "abc"),
            StatusCode::BAD_REQUEST,
        ),
        (
            "unknown run",
            app.client
                .get(app.url("/v1/runs/0190a4f6-7d2e-7c3b-8a00-000000000000"))
                .bearer_auth(&key),
            StatusCode::NOT_FOUND,
        ),
        (
            "unknown route",
            app.client.get(app.url("/v2/nothing")),
            StatusCode::NOT_FOUND,
        ),
        (
            "wrong method",
            app.client.put(app.url("/v1/threads")).bearer_auth(&key),
            StatusCode::METHOD_NOT_ALLOWED,
        ),
    ];
    for (what, request, expected) in cases {
        let response = request.send().await.unwrap();
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        assert_eq!(status, expected, "{what}: {body}");
        assert!(
            body["error"]["code"].is_string() && body["error"]["message"].is_string(),
            "{what}: {body}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn threads_list_paginates_and_delete_removes_messages() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    for index in 0..3 {
        app.create_thread(&key, &format!("t{index}")).await;
    }
    let (_, page) = app.get("/v1/threads?limit=2", Some(&key)).await;
    assert_eq!(page["threads"][0]["title"], "t2");
    assert_eq!(page["threads"][1]["title"], "t1");
    let cursor = page["next_before"].as_str().unwrap();
    let (_, page) = app
        .get(&format!("/v1/threads?limit=2&before={cursor}"), Some(&key))
        .await;
    assert_eq!(page["threads"].as_array().unwrap().len(), 1);
    assert_eq!(page["threads"][0]["title"], "t0");
    assert!(page["next_before"].is_null());
    let id = page["threads"][0]["id"].as_str().unwrap().to_string();
    let (status, _) = app.delete(&format!("/v1/threads/{id}"), Some(&key)).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = app.get(&format!("/v1/threads/{id}"), Some(&key)).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

#[tokio::test]
async fn service_endpoints_report_health_metrics_and_docs() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    app.create_thread(&key, "x").await;
    let (status, root) = app.get("/", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(root["name"], "mnemo");
    let (status, health) = app.get("/health", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["status"], "ok");
    assert_eq!(health["components"]["database"]["status"], "ok");
    assert!(
        health["components"]["database"]["backend"].is_null(),
        "{health}"
    );
    // Without an administrator's key, states only: the writer's failures quote users' words.
    let (_, as_user) = app.get("/health", Some(&key)).await;
    for body in [&health, &as_user] {
        assert_eq!(
            body["components"]["memory_writer"],
            json!({ "status": "ok" })
        );
        assert!(body["uptime_secs"].is_null(), "{body}");
        assert!(!body.to_string().contains("recent_failures"), "{body}");
    }
    let (status, health) = app.health().await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(health["components"]["database"]["backend"], "sqlite");
    let head = app.client.head(app.url("/health")).send().await.unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    let head = app.client.head(app.url("/")).send().await.unwrap();
    assert_eq!(head.status(), StatusCode::OK);
    let metrics = app
        .client
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(metrics.contains("mnemo_http_requests_total"), "{metrics}");
    assert!(metrics.contains("route=\"/v1/threads\""), "{metrics}");
    assert!(metrics.contains("mnemo_http_request_duration_seconds"));
    // Latencies are histograms with buckets: the request above falls in a finite bucket, so
    // some `le` bucket below +Inf counts it (summaries showed every quantile as 0).
    let counted_bucket = metrics.lines().any(|line| {
        line.starts_with("mnemo_http_request_duration_seconds_bucket{")
            && line.contains("route=\"/v1/threads\"")
            && !line.contains("le=\"+Inf\"")
            && line
                .rsplit(' ')
                .next()
                .and_then(|count| count.parse::<f64>().ok())
                .is_some_and(|count| count >= 1.0)
    });
    assert!(counted_bucket, "{metrics}");
    assert!(!metrics.contains("quantile="), "{metrics}");
    // GET on a POST-only route is 405 with its own code.
    let (status, body) = app.get("/v1/memories/search", Some(&key)).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_eq!(body["error"]["code"], "method_not_allowed", "{body}");
    let (status, spec) = app.get("/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    for path in [
        "/v1/threads",
        "/v1/threads/{id}",
        "/v1/threads/{id}/messages",
        "/v1/runs/{id}/events",
        "/v1/runs/{id}/cancel",
        "/health",
    ] {
        assert!(spec["paths"][path].is_object(), "openapi lacks {path}");
    }
    // A research request's own key is documented (it is only never stored).
    assert!(
        spec["components"]["schemas"]["ResearchRequest"]["properties"]["api_key"].is_object(),
        "{}",
        spec["components"]["schemas"]["ResearchRequest"]
    );
    // Statuses any authenticated operation may answer are documented on each.
    let post = &spec["paths"]["/v1/threads"]["post"]["responses"];
    for status in ["401", "429", "503"] {
        assert!(
            post[status].is_object(),
            "POST /v1/threads lacks {status}: {post}"
        );
    }
    assert!(spec["paths"]["/health"]["get"]["responses"]["401"].is_null());
    // Operation ids are unique (handlers of several resources share a name: `get`, `list`),
    // and the run events, read from SSE, are in the document with their envelope.
    let mut ids: Vec<&str> = spec["paths"]
        .as_object()
        .into_iter()
        .flat_map(|paths| paths.values())
        .filter_map(|item| item.as_object())
        .flat_map(|item| item.values())
        .filter_map(|operation| operation["operationId"].as_str())
        .collect();
    let count = ids.len();
    ids.sort_unstable();
    ids.dedup();
    assert_eq!(ids.len(), count, "duplicate operation ids: {ids:?}");
    assert!(
        ids.contains(&"memories_get") && ids.contains(&"research_get"),
        "{ids:?}"
    );
    let variants = spec["components"]["schemas"]["RunEvent"]["oneOf"]
        .as_array()
        .map_or(0, Vec::len);
    assert_eq!(variants, 17, "one schema per event type");
    assert!(spec["components"]["schemas"]["Envelope"]["properties"]["seq"].is_object());
    assert!(spec["components"]["schemas"]["StepMeta"]["properties"]["researcher"].is_object());
    // The schema states the bounds the server enforces (schemathesis sent schema-valid
    // requests the server refused: empty content, importance 0 or 8192).
    let schemas = &spec["components"]["schemas"];
    let add = &schemas["AddBody"]["properties"];
    assert_eq!(add["content"]["minLength"], 1, "{add}");
    assert_eq!(add["content"]["maxLength"], 8000, "{add}");
    assert_eq!(add["importance"]["minimum"], 1, "{add}");
    assert_eq!(add["importance"]["maximum"], 5, "{add}");
    assert_eq!(schemas["SearchBody"]["properties"]["query"]["minLength"], 1);
    assert_eq!(
        schemas["PostMessage"]["properties"]["content"]["maxLength"],
        1_000_000
    );
    assert_eq!(
        schemas["ResearchRequest"]["properties"]["query"]["maxLength"],
        4000
    );
    // Every schema a path refers to is in the document (schemathesis could not resolve the
    // export's `format`).
    let text = spec.to_string();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("#/components/schemas/") {
        let name: String = rest[at + 21..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        assert!(
            schemas[&name].is_object(),
            "{name} is referred to but missing"
        );
        rest = &rest[at + 21..];
    }
    let docs = app.client.get(app.url("/docs")).send().await.unwrap();
    assert_eq!(docs.status(), StatusCode::OK);
    let html = docs.text().await.unwrap();
    assert!(html.contains("/openapi.json") && html.contains("Try it"));
    assert!(
        !html.contains("https://"),
        "the docs page must work offline"
    );
    app.stop().await;
}

#[tokio::test]
async fn dev_mode_serves_a_local_user_and_is_refused_off_loopback() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &[("MNEMO__SERVER__DEV", "true")]).await;
    let (status, body) = app.get("/v1/threads", None).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let (_, health) = app.get("/health", None).await;
    assert_eq!(health["components"]["auth"]["dev_mode"], true);
    app.stop().await;
    let settings = support::test_settings(
        &home,
        &[
            ("MNEMO__SERVER__DEV", "true"),
            ("MNEMO__SERVER__ADDR", "0.0.0.0:0"),
        ],
    );
    let refused = mnemo::startup::build_state(settings, Default::default()).await;
    let message = refused
        .err()
        .expect("dev mode off loopback is refused")
        .to_string();
    assert!(message.contains("loopback"), "{message}");
}

/// A streamed run whose client went away is cancelled after the grace period (its model call
/// stops); a run started with `stream: false` runs in the background to its end (it was
/// cancelled like an abandoned stream).
#[tokio::test]
async fn a_run_nobody_follows_is_cancelled_after_the_grace_period() {
    let home = Home::new(Backend::Sqlite).await;
    // 20 words in chunks of 6 characters, 100 ms apart: about 2 s per answer, longer than
    // the grace.
    let (llm, _) = slow_llm(20, 100).await;
    let app = TestApp::spawn_with_llm(
        &home,
        &llm,
        &[("MNEMO__SERVER__ABANDON_RUN_AFTER_SECS", "1")],
    )
    .await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "abandoned").await;
    let thread_id = thread["id"].as_str().unwrap().to_string();
    let response = app
        .client
        .post(app.url(&format!("/v1/threads/{thread_id}/messages")))
        .bearer_auth(&key)
        .json(&json!({ "content": "talk for a while" }))
        .send()
        .await
        .unwrap();
    let mut reader = support::SseReader::new(response);
    let streamed = reader.headers["x-run-id"].to_str().unwrap().to_string();
    reader.next().await.expect("a first event");
    drop(reader); // the client goes away
    let background = app
        .post_message(&key, &thread_id, "and in the background")
        .await;
    let background = background["id"].as_str().unwrap().to_string();
    let status_of = |run: String| {
        let app = &app;
        let key = key.clone();
        async move {
            let mut status = Value::Null;
            for _ in 0..300 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                status = app.get(&format!("/v1/runs/{run}"), Some(&key)).await.1["status"].clone();
                if status != "running" {
                    break;
                }
            }
            status
        }
    };
    assert_eq!(status_of(streamed.clone()).await, "cancelled");
    let events = app.events(&key, &streamed, None).await.collect().await;
    assert_eq!(events.last().unwrap().data["status"], "cancelled");
    assert!(events.iter().all(|event| event.event != "message_complete"));
    assert_eq!(status_of(background).await, "completed");
    app.stop().await;
}

/// NUL in text is refused at the edge with one rule for both backends (PostgreSQL answered
/// 500 for it, and its message reached a research `error` event); an escaped backslash
/// before `u0000` is text, and a NUL byte inside an uploaded text document is dropped.
async fn nul_characters_are_refused_at_the_edge(backend: Backend) {
    let home = Home::new(backend).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("nina").await;
    let thread = app.create_thread(&key, "plain").await;
    let thread_id = thread["id"].as_str().expect("thread id").to_string();
    let nul = "before\u{0}after";
    let refused = [
        ("/v1/threads", json!({ "title": nul })),
        ("/v1/memories", json!({ "content": nul })),
        (
            "/v1/memories",
            json!({ "content": "fine", "source_refs": [nul] }),
        ),
        (
            &format!("/v1/threads/{thread_id}/messages"),
            json!({ "content": nul }),
        ),
        (
            &format!("/v1/threads/{thread_id}/import"),
            json!({ "messages": [{ "role": "user", "content": nul }] }),
        ),
        ("/v1/documents", json!({ "content": nul, "title": "t" })),
        ("/v1/memories/search", json!({ "query": nul })),
        ("/research/stream", json!({ "query": nul })),
    ];
    for (path, body) in refused {
        let (status, answer) = app.post(path, Some(&key), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {answer}");
        assert!(
            answer["error"]["message"]
                .as_str()
                .unwrap_or("")
                .contains("NUL"),
            "{path}: {answer}"
        );
    }
    let client = reqwest::Client::new();
    let response = client
        .post(app.url("/v1/memories/import"))
        .bearer_auth(&key)
        .body("{\"content\":\"a\\u0000b\",\"kind\":\"fact\"}\n")
        .send()
        .await
        .expect("import");
    assert_eq!(response.status(), StatusCode::BAD_REQUEST);
    let (status, _) = app.get("/v1/memories?kind=%00", Some(&key)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    // Nothing of the refused requests was stored.
    let (_, stored) = app
        .get(&format!("/v1/threads/{thread_id}"), Some(&key))
        .await;
    assert_eq!(
        stored["messages"].as_array().map(Vec::len),
        Some(0),
        "{stored}"
    );
    let (_, memories) = app.get("/v1/memories", Some(&key)).await;
    assert_eq!(
        memories["memories"].as_array().map(Vec::len),
        Some(0),
        "{memories}"
    );

    // `\\u0000` in JSON is a backslash and text.
    let (status, memory) = app
        .post(
            "/v1/memories",
            Some(&key),
            Some(json!({ "content": "path C:\\u0000x" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{memory}");
    assert_eq!(memory["content"], "path C:\\u0000x");
    // A text document with a NUL byte is stored without it.
    let (status, document) = app
        .upload_document(
            &key,
            Some("text/plain"),
            b"tidal\0 notes about kelp".to_vec(),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    app.stop_and_release().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn nul_characters_are_refused(#[case] backend: Backend) {
    nul_characters_are_refused_at_the_edge(backend).await;
}

/// Slowloris: connections that sent a partial request line stayed open (300 of them after
/// 75 s). A connection without a whole request head within the header-read timeout is
/// closed, and past the connection cap new clients wait for a free slot instead of failing.
#[tokio::test]
async fn slow_clients_are_cut_off_and_connections_are_capped() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            ("MNEMO__SERVER__HEADER_READ_TIMEOUT_SECS", "1"),
            ("MNEMO__SERVER__MAX_CONNECTIONS", "20"),
        ],
    )
    .await;
    let addr = app
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string();
    // More slow clients than the cap: the last ones wait in the listen queue.
    let mut slow = Vec::new();
    for _ in 0..30 {
        let mut stream = tokio::net::TcpStream::connect(&addr)
            .await
            .expect("connect");
        stream
            .write_all(b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            .await
            .expect("partial request");
        slow.push(stream);
    }
    // A real client gets its answer once the slow ones are cut off.
    let (status, health) = app.get("/health", None).await;
    assert_eq!(status, StatusCode::OK, "{health}");
    for (index, mut stream) in slow.into_iter().enumerate() {
        let mut rest = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut rest))
            .await
            .unwrap_or_else(|_| panic!("slow connection {index} is still open"));
        // Closed: at the end of the stream, or reset.
        let _ = read;
        assert!(
            !String::from_utf8_lossy(&rest).contains("\"status\":\"ok\""),
            "a partial request was never answered"
        );
    }
    app.stop().await;
}

/// A user may have only so many runs at once: one more is refused with 429 and
/// `Retry-After` before its message is stored (a retry later does not duplicate it), and
/// other users are not affected.
#[tokio::test]
async fn runs_per_user_are_capped() {
    let home = Home::new(Backend::Sqlite).await;
    let (llm, _) = slow_llm(200, 200).await;
    let app =
        TestApp::spawn_with_llm(&home, &llm, &[("MNEMO__SERVER__MAX_RUNS_PER_USER", "1")]).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let thread = app.create_thread(&alice, "busy").await;
    let thread_id = thread["id"].as_str().unwrap().to_string();
    let first = app
        .post_message(&alice, &thread_id, "talk for a long while")
        .await;
    let response = app
        .client
        .post(app.url(&format!("/v1/threads/{thread_id}/messages")))
        .bearer_auth(&alice)
        .json(&json!({ "content": "and another thing", "stream": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "5");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let (status, research) = app
        .post(
            "/research/stream",
            Some(&alice),
            Some(json!({ "query": "tides" })),
        )
        .await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{research}");
    let (_, stored) = app
        .get(&format!("/v1/threads/{thread_id}"), Some(&alice))
        .await;
    let said: Vec<&Value> = stored["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .collect();
    assert_eq!(said.len(), 1, "{stored}");
    // Bob is not held back by Alice's run.
    let bobs = app.create_thread(&bob, "free").await;
    app.post_message(&bob, bobs["id"].as_str().unwrap(), "hello there")
        .await;
    let first_id = first["id"].as_str().unwrap();
    app.post(&format!("/v1/runs/{first_id}/cancel"), Some(&alice), None)
        .await;
    app.events(&alice, first_id, None).await.collect().await;
    // The run's slot frees just after its `done` is written.
    let mut status = StatusCode::TOO_MANY_REQUESTS;
    for _ in 0..100 {
        status = app
            .post(
                &format!("/v1/threads/{thread_id}/messages"),
                Some(&alice),
                Some(json!({ "content": "now it is my turn again", "stream": false })),
            )
            .await
            .0;
        if status != StatusCode::TOO_MANY_REQUESTS {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, StatusCode::ACCEPTED);
    app.stop().await;
}

/// Requests are limited per authenticated user (not per address): past the quota the answer
/// is 429 with `Retry-After`, and another user is not held back.
#[tokio::test]
async fn requests_are_rate_limited_per_user() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(&home, &[("MNEMO__SERVER__REQUESTS_PER_MINUTE", "5")]).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    for _ in 0..5 {
        let (status, body) = app.get("/v1/threads", Some(&alice)).await;
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    let response = app
        .client
        .get(app.url("/v1/threads"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    let wait: u64 = response.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&wait), "Retry-After {wait}");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "rate_limited", "{body}");
    let (status, _) = app.get("/v1/threads", Some(&bob)).await;
    assert_eq!(status, StatusCode::OK);
    // Unauthenticated service endpoints are not counted.
    let (status, _) = app.get("/health", None).await;
    assert_eq!(status, StatusCode::OK);
    app.stop().await;
}

/// Posts a message with an `Idempotency-Key`; returns status and body.
async fn post_keyed(
    app: &TestApp,
    token: &str,
    thread: &str,
    key: &str,
    content: &str,
) -> (StatusCode, Value) {
    let response = app
        .client
        .post(app.url(&format!("/v1/threads/{thread}/messages")))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({ "content": content, "stream": false }))
        .send()
        .await
        .expect("request");
    let status = response.status();
    (status, response.json().await.unwrap_or(Value::Null))
}

fn user_messages(thread: &Value) -> Vec<String> {
    thread["messages"]
        .as_array()
        .expect("messages")
        .iter()
        .filter(|message| message["role"] == "user")
        .map(|message| message["content"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A retried message with the same `Idempotency-Key` stores nothing and gets the first run
/// (also when the copies arrive at once); the key with other content is a conflict; without a
/// key every post is a new message; the same key of another user is theirs alone.
#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn a_retry_with_the_same_idempotency_key_is_the_same_turn(#[case] backend: Backend) {
    let home = Home::new(backend).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let thread = app.create_thread(&alice, "retries").await;
    let thread = thread["id"].as_str().unwrap().to_string();
    let attempts = futures::future::join_all(
        (0..4).map(|_| post_keyed(&app, &alice, &thread, "k-1", "my boat is the Heron")),
    )
    .await;
    let first = attempts[0].1["id"].as_str().expect("run id").to_string();
    for (status, run) in &attempts {
        assert_eq!(*status, StatusCode::ACCEPTED, "{run}");
        assert_eq!(run["id"], first.as_str(), "{run}");
    }
    let (status, again) = post_keyed(&app, &alice, &thread, "k-1", "my boat is the Heron").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{again}");
    assert_eq!(again["id"], first.as_str());
    let (status, body) = post_keyed(&app, &alice, &thread, "k-1", "my boat is the Osprey").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("Idempotency-Key"),
        "{body}"
    );
    let (status, body) = post_keyed(&app, &alice, &thread, " ", "blank key").await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    // The replayed run's stream is the first run's, from its start to its end.
    let events = app.events(&alice, &first, None).await.collect().await;
    assert_eq!(
        events.first().map(|e| e.event.as_str()),
        Some("session_start")
    );
    assert_eq!(events.last().map(|e| e.event.as_str()), Some("done"));
    let (_, stored) = app
        .get(&format!("/v1/threads/{thread}"), Some(&alice))
        .await;
    assert_eq!(user_messages(&stored), ["my boat is the Heron"], "{stored}");
    // Keys are per user: Bob's "k-1" starts his own turn.
    let bobs = app.create_thread(&bob, "his").await;
    let bobs = bobs["id"].as_str().unwrap().to_string();
    let (status, his) = post_keyed(&app, &bob, &bobs, "k-1", "my boat is the Heron").await;
    assert_eq!(status, StatusCode::ACCEPTED, "{his}");
    assert_ne!(his["id"], first.as_str());
    // Without a key, the same content twice is two messages.
    app.events(&bob, his["id"].as_str().unwrap(), None)
        .await
        .collect()
        .await;
    for _ in 0..2 {
        let run = app.post_message(&bob, &bobs, "again").await;
        app.events(&bob, run["id"].as_str().unwrap(), None)
            .await
            .collect()
            .await;
    }
    let (_, stored) = app.get(&format!("/v1/threads/{bobs}"), Some(&bob)).await;
    assert_eq!(
        user_messages(&stored),
        ["my boat is the Heron", "again", "again"]
    );
    app.stop().await;
}

/// With every database connection taken, a request waits `database.acquire_timeout_ms` and is
/// refused with 429, code `busy` and `Retry-After: 1` — not a slow 503 — and nothing of it is
/// stored; the request holding the connection completes once the database lets it go.
#[tokio::test]
async fn an_exhausted_pool_answers_busy_and_stores_nothing() {
    use sqlx::Connection;
    let home = Home::new(Backend::Postgres).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            ("MNEMO__DATABASE__MAX_CONNECTIONS", "1"),
            ("MNEMO__DATABASE__ACQUIRE_TIMEOUT_MS", "300"),
            ("MNEMO__MEMORY__WRITER_WORKERS", "0"),
        ],
    )
    .await;
    let alice = app.user_key("alice").await;
    let thread = app.create_thread(&alice, "crowded").await;
    let thread = thread["id"].as_str().unwrap().to_string();
    // Another client holds a lock on threads: the next turn's transaction waits on it while
    // holding the pool's only connection.
    let mut locker = sqlx::PgConnection::connect(&home.database_url)
        .await
        .expect("connect");
    sqlx::query("BEGIN").execute(&mut locker).await.unwrap();
    sqlx::query("LOCK TABLE threads IN EXCLUSIVE MODE")
        .execute(&mut locker)
        .await
        .unwrap();
    let holder = {
        let app_client = app.client.clone();
        let url = app.url(&format!("/v1/threads/{thread}/messages"));
        let alice = alice.clone();
        tokio::spawn(async move {
            app_client
                .post(url)
                .bearer_auth(alice)
                .json(&json!({ "content": "the first word", "stream": false }))
                .send()
                .await
                .expect("request")
                .status()
        })
    };
    // Wait until the first turn waits on the lock.
    let mut waiting = false;
    for _ in 0..100 {
        let (count,): (i64,) = sqlx::query_as(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' \
             AND datname = current_database()",
        )
        .fetch_one(&mut locker)
        .await
        .unwrap();
        if count > 0 {
            waiting = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(waiting, "the first turn never reached the lock");
    let response = app
        .client
        .post(app.url(&format!("/v1/threads/{thread}/messages")))
        .bearer_auth(&alice)
        .json(&json!({ "content": "the second word", "stream": false }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(response.headers()["retry-after"], "1");
    let body: Value = response.json().await.unwrap();
    assert_eq!(body["error"]["code"], "busy", "{body}");
    assert!(
        !body.to_string().contains("pool"),
        "database details leak: {body}"
    );
    sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
    assert_eq!(holder.await.unwrap(), StatusCode::ACCEPTED);
    let (_, stored) = app
        .get(&format!("/v1/threads/{thread}"), Some(&alice))
        .await;
    assert_eq!(user_messages(&stored), ["the first word"], "{stored}");
    app.stop().await;
}

/// `/` answers a browser with the web app (or, in a binary built before the app, a page that
/// says how to build it) and any other client with JSON; the page and its files carry the
/// strict Content-Security-Policy, and content-hashed files are cached for good.
#[tokio::test]
async fn the_api_reference_is_served_from_the_binary_under_the_strict_policy() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let (_, root) = app.get("/", None).await;
    assert_eq!(root["reference"], "/redoc");
    for (path, content_type, holds) in [
        ("/redoc", "text/html; charset=utf-8", "/redoc/reference.js"),
        (
            "/redoc/reference.js",
            "text/javascript; charset=utf-8",
            "/openapi.json",
        ),
        (
            "/redoc/reference.css",
            "text/css; charset=utf-8",
            "prefers-color-scheme",
        ),
    ] {
        let response = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        let headers = response.headers().clone();
        assert_eq!(headers["content-type"], content_type, "{path}");
        let policy = headers["content-security-policy"].to_str().unwrap();
        assert!(policy.contains("script-src 'self'"), "{policy}");
        assert!(!policy.contains("unsafe-inline"), "{policy}");
        let text = response.text().await.unwrap();
        assert!(text.contains(holds), "{path}");
        // Nothing inline for the policy to refuse.
        assert!(
            !text.contains("<script>") && !text.contains("<style"),
            "{path}"
        );
    }
    app.stop().await;
}

#[tokio::test]
async fn the_web_app_is_served_to_browsers_under_a_strict_policy() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let page = app
        .client
        .get(app.url("/"))
        .header("accept", "text/html,application/xhtml+xml,*/*;q=0.8")
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), StatusCode::OK);
    let headers = page.headers().clone();
    assert_eq!(headers["content-type"], "text/html; charset=utf-8");
    assert_eq!(headers["cache-control"], "no-cache");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    let policy = headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'self'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "object-src 'none'",
    ] {
        assert!(policy.contains(directive), "{policy}");
    }
    assert!(!policy.contains("unsafe-inline") && !policy.contains("unsafe-eval"));
    let html = page.text().await.unwrap();
    let (_, root) = app.get("/", None).await;
    assert_eq!(
        root["name"], "mnemo",
        "JSON for a client that does not ask for HTML"
    );

    let dist = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("web/dist");
    match std::fs::read_to_string(dist.join("index.html")) {
        Ok(built) => {
            assert_eq!(html, built, "the page is the built index.html");
            assert_eq!(root["app"], "/");
            // Every script and stylesheet the page names is served, with its type, cached.
            let assets: Vec<&str> = html
                .split('"')
                .filter(|part| part.starts_with("/assets/"))
                .collect();
            assert!(assets.iter().any(|asset| asset.ends_with(".js")), "{html}");
            for asset in assets {
                let response = app.client.get(app.url(asset)).send().await.unwrap();
                assert_eq!(response.status(), StatusCode::OK, "{asset}");
                let expected = if asset.ends_with(".js") {
                    "text/javascript; charset=utf-8"
                } else {
                    "text/css; charset=utf-8"
                };
                assert_eq!(response.headers()["content-type"], expected, "{asset}");
                assert_eq!(
                    response.headers()["cache-control"],
                    "public, max-age=31536000, immutable"
                );
                assert!(response.headers().contains_key("content-security-policy"));
                let etag = response.headers()["etag"].clone();
                let bytes = response.bytes().await.unwrap();
                let on_disk = std::fs::read(dist.join(asset.trim_start_matches('/'))).unwrap();
                assert_eq!(bytes.as_ref(), on_disk.as_slice(), "{asset}");
                let again = app
                    .client
                    .get(app.url(asset))
                    .header("if-none-match", etag)
                    .send()
                    .await
                    .unwrap();
                assert_eq!(again.status(), StatusCode::NOT_MODIFIED);
            }
            let icon = app
                .client
                .get(app.url("/favicon.svg"))
                .send()
                .await
                .unwrap();
            assert_eq!(icon.status(), StatusCode::OK);
            assert_eq!(icon.headers()["content-type"], "image/svg+xml");
        }
        Err(_) => {
            assert!(html.contains("web app was not built"), "{html}");
            assert!(html.contains("npm run build"), "{html}");
            assert_eq!(root["app"], "not built");
        }
    }
    let (status, body) = app.get("/assets/no-such-file.js", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_eq!(body["error"]["code"], "not_found");
    let (status, _) = app.get("/assets/..%2F..%2FCargo.toml", None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    app.stop().await;
}

/// `PATCH /v1/threads/{id}` renames a thread of the caller; an empty or too long title is a
/// 400, another user's thread a 404.
#[tokio::test]
async fn me_names_the_user_of_the_credential() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let (status, me) = app.get("/v1/me", Some(&alice)).await;
    assert_eq!(status, StatusCode::OK, "{me}");
    assert_eq!(me["name"], "alice");
    let (_, other) = app.get("/v1/me", Some(&bob)).await;
    assert_eq!(other["name"], "bob");
    assert_ne!(me["id"], other["id"]);
    let (status, _) = app.get("/v1/me", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn a_thread_is_renamed_by_its_owner_only() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let thread = app.create_thread(&alice, "First title").await;
    let id = thread["id"].as_str().unwrap();
    let path = format!("/v1/threads/{id}");
    let (status, renamed) = app
        .patch(
            &path,
            Some(&alice),
            Some(json!({ "title": "  Trip to Graz  " })),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{renamed}");
    assert_eq!(renamed["title"], "Trip to Graz");
    assert_eq!(renamed["id"], id);
    let (_, listed) = app.get("/v1/threads", Some(&alice)).await;
    assert_eq!(listed["threads"][0]["title"], "Trip to Graz");
    for bad in [
        json!({ "title": "   " }),
        json!({ "title": "x".repeat(201) }),
        json!({}),
    ] {
        let (status, body) = app.patch(&path, Some(&alice), Some(bad)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    }
    let (status, _) = app
        .patch(&path, Some(&bob), Some(json!({ "title": "Mine now" })))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, still) = app.get(&path, Some(&alice)).await;
    assert_eq!(still["thread"]["title"], "Trip to Graz");
    app.stop().await;
}
