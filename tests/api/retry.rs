//! Edit-and-resend and regenerate: a user's message and what follows it are replaced by a new
//! turn in the same thread, and the memories they alone made go with them.

use crate::support;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Backend, Home, TestApp};

async fn say(app: &TestApp, key: &str, thread: &str, content: &str) {
    app.say(key, thread, content).await;
}

async fn retry(app: &TestApp, key: &str, thread: &str, message: &str, body: Value) -> Value {
    let (status, run) = app
        .post(
            &format!("/v1/threads/{thread}/messages/{message}/retry"),
            Some(key),
            Some(body),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{run}");
    app.events(key, run["id"].as_str().unwrap(), None)
        .await
        .collect()
        .await;
    app.wait_for_jobs().await;
    run
}

async fn messages(app: &TestApp, key: &str, thread: &str) -> Vec<(String, String, String)> {
    let (status, body) = app.get(&format!("/v1/threads/{thread}"), Some(key)).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["id"].as_str().unwrap().to_string(),
                m["role"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// The valid facts and the turns, as contents.
async fn memories(app: &TestApp, key: &str) -> (Vec<String>, Vec<String>) {
    let list = |query: &'static str| async move {
        let (status, body) = app
            .get(&format!("/v1/memories?limit=500{query}"), Some(key))
            .await;
        assert_eq!(status, StatusCode::OK, "{body}");
        let mut contents: Vec<String> = body["memories"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["content"].as_str().unwrap().to_string())
            .collect();
        contents.sort();
        contents
    };
    (list("&kinds=fact").await, list("&kinds=turn").await)
}

#[tokio::test]
async fn edit_and_regenerate_replace_the_turn_and_take_back_what_it_taught() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("alice").await;
    let thread = app.create_thread(&key, "t").await["id"]
        .as_str()
        .unwrap()
        .to_string();
    say(&app, &key, &thread, "Remember that my locker code is 4471.").await;
    say(&app, &key, &thread, "Remember that my locker code is 4472.").await;
    let (facts, _) = memories(&app, &key).await;
    assert_eq!(
        facts,
        ["My locker code is 4472"],
        "the second supersedes the first"
    );
    let before = messages(&app, &key, &thread).await;
    assert_eq!(before.len(), 4);
    let second = before[2].0.clone();

    // Refusals remove nothing: a reply is not the user's to edit, an empty text, a message
    // that is not there, another user's thread.
    let path = |message: &str| format!("/v1/threads/{thread}/messages/{message}/retry");
    let (status, _) = app
        .post(
            &path(&before[1].0),
            Some(&key),
            Some(json!({ "stream": false })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = app
        .post(
            &path(&second),
            Some(&key),
            Some(json!({ "content": "  ", "stream": false })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = app
        .post(
            &path("0190c0de-0000-7000-8000-000000000000"),
            Some(&key),
            Some(json!({ "stream": false })),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let bob = app.user_key("bob").await;
    let (status, _) = app
        .post(&path(&second), Some(&bob), Some(json!({ "stream": false })))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(messages(&app, &key, &thread).await, before);

    // Edit and resend: the second message and its reply are replaced, the fact it made is
    // gone, and the one it had superseded is valid again.
    retry(
        &app,
        &key,
        &thread,
        &second,
        json!({ "content": "Remember that my bike is a Brompton.", "stream": false }),
    )
    .await;
    let after = messages(&app, &key, &thread).await;
    assert_eq!(after.len(), 4, "{after:?}");
    assert_eq!(after[..2], before[..2], "what came before is untouched");
    assert_eq!(after[2].2, "Remember that my bike is a Brompton.");
    assert_eq!(after[3].1, "assistant");
    assert!(after.iter().all(|m| !m.2.contains("4472")), "{after:?}");
    let (facts, turns) = memories(&app, &key).await;
    assert_eq!(facts, ["My bike is a Brompton", "My locker code is 4471"]);
    assert!(turns.iter().all(|t| !t.contains("4472")), "{turns:?}");
    assert!(turns.iter().any(|t| t.contains("Brompton")), "{turns:?}");
    // The bystander: the first message's own turn stays.
    assert!(
        turns
            .iter()
            .any(|t| t == "User: Remember that my locker code is 4471."),
        "{turns:?}"
    );

    // Regenerate: the same text answered again, in a new turn; nothing learned twice.
    let run = retry(&app, &key, &thread, &after[2].0, json!({ "stream": false })).await;
    let again = messages(&app, &key, &thread).await;
    assert_eq!(again.len(), 4, "{again:?}");
    assert_eq!(again[2].2, after[2].2);
    assert_ne!(again[2].0, after[2].0, "a new message");
    assert_ne!(again[3].0, after[3].0, "a new reply");
    let (_, body) = app.get(&format!("/v1/threads/{thread}"), Some(&key)).await;
    assert_eq!(body["messages"][3]["run_id"], run["id"]);
    let (facts, turns) = memories(&app, &key).await;
    assert_eq!(facts, ["My bike is a Brompton", "My locker code is 4471"]);
    assert_eq!(
        turns.iter().filter(|t| t.contains("Brompton")).count(),
        1,
        "{turns:?}"
    );
    app.stop().await;
}
