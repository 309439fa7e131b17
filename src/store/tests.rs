//! The `Store` conformance suite, run against SQLite and PostgreSQL alike.

use std::sync::Arc;

use serde_json::json;

use super::*;

macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = super::connect(&crate::testing::sqlite_url(dir.path()), 4).await.unwrap();
                    super::$name(store).await;
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    let url = crate::testing::fresh_postgres_url().await;
                    let store = super::connect(&url, 4).await.unwrap();
                    super::$name(store).await;
                }
            )*
        }
    };
}

conformance!(
    users_and_keys,
    threads_are_private_and_paginated,
    messages_keep_order_and_owner,
    deleting_a_thread_removes_its_messages_and_runs,
    run_events_append_in_sequence_and_replay_after_a_cursor,
    runs_finish_once,
    timestamps_round_trip_exactly,
);

async fn two_users(store: &Arc<dyn Store>) -> (User, User) {
    let alice = store.create_user("alice", UserKind::Key).await.unwrap();
    let bob = store.create_user("bob", UserKind::Key).await.unwrap();
    (alice, bob)
}

async fn users_and_keys(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    assert!(matches!(
        store.create_user("alice", UserKind::Key).await,
        Err(StoreError::Conflict(_))
    ));
    store
        .add_api_key(alice.id, "hash-a", "mnemo_aaa")
        .await
        .unwrap();
    store
        .add_api_key(bob.id, "hash-b", "mnemo_bbb")
        .await
        .unwrap();
    let found = store.user_by_key_hash("hash-a").await.unwrap().unwrap();
    assert_eq!(found.id, alice.id);
    assert_eq!(found.active_keys, 1);
    assert!(store.user_by_key_hash("nope").await.unwrap().is_none());
    assert_eq!(store.revoke_keys("alice").await.unwrap(), 1);
    assert!(store.user_by_key_hash("hash-a").await.unwrap().is_none());
    assert_eq!(
        store.user_by_key_hash("hash-b").await.unwrap().unwrap().id,
        bob.id
    );
    assert!(matches!(
        store.revoke_keys("carol").await,
        Err(StoreError::NotFound(_))
    ));
    let ensured = store
        .ensure_user("jwt|iss|sub", UserKind::Jwt)
        .await
        .unwrap();
    let again = store
        .ensure_user("jwt|iss|sub", UserKind::Jwt)
        .await
        .unwrap();
    assert_eq!(ensured.id, again.id);
    assert_eq!(again.kind, UserKind::Jwt);
    let names: Vec<String> = store
        .list_users()
        .await
        .unwrap()
        .into_iter()
        .map(|user| user.name)
        .collect();
    assert_eq!(names, ["alice", "bob", "jwt|iss|sub"]);
}

async fn threads_are_private_and_paginated(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let mut created = Vec::new();
    for index in 0..5 {
        created.push(
            store
                .create_thread(alice.id, &format!("thread {index}"))
                .await
                .unwrap(),
        );
    }
    let bobs = store.create_thread(bob.id, "bob's").await.unwrap();
    let first = store.list_threads(alice.id, 2, None).await.unwrap();
    assert_eq!(
        first.iter().map(|t| t.title.as_str()).collect::<Vec<_>>(),
        ["thread 4", "thread 3"]
    );
    let second = store
        .list_threads(alice.id, 10, Some(first[1].id))
        .await
        .unwrap();
    assert_eq!(
        second.iter().map(|t| t.title.as_str()).collect::<Vec<_>>(),
        ["thread 2", "thread 1", "thread 0"]
    );
    assert!(matches!(
        store.get_thread(alice.id, bobs.id).await,
        Err(StoreError::NotFound("thread"))
    ));
    assert!(matches!(
        store.delete_thread(alice.id, bobs.id).await,
        Err(StoreError::NotFound("thread"))
    ));
    assert_eq!(
        store.get_thread(bob.id, bobs.id).await.unwrap().title,
        "bob's"
    );
    assert_eq!(store.list_threads(bob.id, 10, None).await.unwrap().len(), 1);
}

async fn messages_keep_order_and_owner(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t").await.unwrap();
    for index in 0..20 {
        let role = if index % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        store
            .append_message(alice.id, thread.id, role, &format!("message {index}"), None)
            .await
            .unwrap();
    }
    let messages = store.list_messages(alice.id, thread.id).await.unwrap();
    let contents: Vec<String> = messages.iter().map(|m| m.content.clone()).collect();
    let expected: Vec<String> = (0..20).map(|index| format!("message {index}")).collect();
    assert_eq!(contents, expected);
    assert_eq!(messages[1].role, Role::Assistant);
    assert!(matches!(
        store
            .append_message(bob.id, thread.id, Role::User, "intrusion", None)
            .await,
        Err(StoreError::NotFound("thread"))
    ));
    assert!(matches!(
        store.list_messages(bob.id, thread.id).await,
        Err(StoreError::NotFound("thread"))
    ));
    assert_eq!(
        store
            .list_messages(alice.id, thread.id)
            .await
            .unwrap()
            .len(),
        20
    );
}

async fn deleting_a_thread_removes_its_messages_and_runs(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t").await.unwrap();
    store
        .append_message(alice.id, thread.id, Role::User, "hello", None)
        .await
        .unwrap();
    let run = store
        .create_run(alice.id, Some(thread.id), RunKind::Chat)
        .await
        .unwrap();
    store
        .append_run_event(run.id, 1, "done", &json!({"status": "completed"}))
        .await
        .unwrap();
    store.delete_thread(alice.id, thread.id).await.unwrap();
    assert!(matches!(
        store.get_thread(alice.id, thread.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.get_run(alice.id, run.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(
        store
            .run_events_after(alice.id, run.id, 0, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn run_events_append_in_sequence_and_replay_after_a_cursor(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let run = store
        .create_run(alice.id, None, RunKind::Research)
        .await
        .unwrap();
    for seq in 1..=10 {
        store
            .append_run_event(
                run.id,
                seq,
                "thinking",
                &json!({ "n": seq, "text": "日本語 ok" }),
            )
            .await
            .unwrap();
    }
    assert!(matches!(
        store
            .append_run_event(run.id, 3, "thinking", &json!({}))
            .await,
        Err(StoreError::Conflict(_))
    ));
    let after = store
        .run_events_after(alice.id, run.id, 6, 100)
        .await
        .unwrap();
    assert_eq!(
        after.iter().map(|e| e.seq).collect::<Vec<_>>(),
        [7, 8, 9, 10]
    );
    assert_eq!(after[0].data["n"], 7);
    assert_eq!(after[0].data["text"], "日本語 ok");
    let limited = store
        .run_events_after(alice.id, run.id, 0, 3)
        .await
        .unwrap();
    assert_eq!(limited.len(), 3);
    assert!(
        store
            .run_events_after(bob.id, run.id, 0, 100)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.get_run(bob.id, run.id).await,
        Err(StoreError::NotFound("run"))
    ));
    let state = store.get_run(alice.id, run.id).await.unwrap();
    assert_eq!(state.last_seq, 10);
    assert_eq!(state.kind, RunKind::Research);
    let listed = store
        .list_runs(alice.id, RunKind::Research, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 1);
    assert!(
        store
            .list_runs(bob.id, RunKind::Research, 10)
            .await
            .unwrap()
            .is_empty()
    );
}

async fn runs_finish_once(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let run = store
        .create_run(alice.id, None, RunKind::Chat)
        .await
        .unwrap();
    assert_eq!(store.running_runs().await.unwrap(), vec![(run.id, 0)]);
    store
        .finish_run(run.id, RunStatus::Failed, Some("boom"))
        .await
        .unwrap();
    store
        .finish_run(run.id, RunStatus::Completed, None)
        .await
        .unwrap();
    let state = store.get_run(alice.id, run.id).await.unwrap();
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error.as_deref(), Some("boom"));
    assert!(state.finished_at.is_some());
    assert!(store.running_runs().await.unwrap().is_empty());
}

async fn timestamps_round_trip_exactly(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t").await.unwrap();
    let read = store.get_thread(alice.id, thread.id).await.unwrap();
    assert_eq!(read.created_at, thread.created_at);
    assert_eq!(read.id, thread.id);
}
