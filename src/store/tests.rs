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
                    let store = super::connect(&crate::testing::sqlite_url(dir.path()), 4, std::time::Duration::from_secs(10)).await.unwrap();
                    super::$name(store).await;
                }
            )*
        }
        mod postgres_backend {
            $(
                #[tokio::test]
                async fn $name() {
                    let url = crate::testing::fresh_postgres_url().await;
                    let store = super::connect(&url, 4, std::time::Duration::from_secs(10)).await.unwrap();
                    super::$name(store).await;
                }
            )*
        }
    };
}

conformance!(
    jobs_whose_worker_keeps_dying_fail_for_good,
    a_turn_job_records_what_it_did_and_is_found_from_its_run,
    users_and_keys,
    accounts_passwords_and_the_first_admin,
    sessions_end_when_deleted_expired_or_their_user_is_disabled,
    failed_sign_ins_count_lock_and_clear,
    threads_are_private_and_paginated,
    temporary_threads_and_the_memory_switch,
    a_conversation_key_names_one_thread_per_user,
    messages_keep_order_and_owner,
    imported_messages_given_one_time_keep_their_order_in_time,
    deleting_a_thread_removes_its_messages_and_runs,
    run_events_append_in_sequence_and_replay_after_a_cursor,
    runs_finish_once,
    runs_are_taken_over_only_when_their_lease_expired,
    checkpoints_are_saved_by_the_owner_and_a_released_run_is_taken_at_once,
    run_commands_reach_the_owner_once,
    timestamps_round_trip_exactly,
    memories_round_trip_with_history_and_log,
    forgotten_memories_come_back_whole_until_purged,
    memories_are_private,
    memories_read_by_id_carry_every_field,
    memory_lists_filter_and_paginate,
    archiving_unused_memories_is_deterministic,
    accesses_recorded_at_once_by_many_replicas_all_count,
    reembedding_finds_other_models,
    earlier_embedder_ids_are_relabelled_in_place,
    research_records_are_private_and_finish_once,
    documents_are_private_and_find_their_chunks,
    documents_have_one_row_per_source_or_content_claimed_once_per_generation,
);

async fn two_users(store: &Arc<dyn Store>) -> (User, User) {
    let alice = store.create_user("alice", UserKind::Key).await.unwrap();
    let bob = store.create_user("bob", UserKind::Key).await.unwrap();
    (alice, bob)
}

async fn accounts_passwords_and_the_first_admin(store: Arc<dyn Store>) {
    // A server with only key users (made before accounts existed) can still be set up.
    let old = store.create_user("old", UserKind::Key).await.unwrap();
    assert!(!old.is_admin && !old.has_password && old.disabled_at.is_none());
    assert!(store.setup_open().await.unwrap());
    // A name that is taken is a conflict, and setup stays open.
    assert!(matches!(
        store.create_first_admin("old", "$argon2id$x").await,
        Err(StoreError::Conflict(message)) if message.contains("already exists")
    ));
    assert!(store.setup_open().await.unwrap());
    let admin = store
        .create_first_admin("root", "$argon2id$root")
        .await
        .unwrap();
    assert!(admin.is_admin && admin.has_password);
    assert_eq!(admin.kind, UserKind::Key);
    assert!(!store.setup_open().await.unwrap());
    assert!(matches!(
        store.create_first_admin("second", "$argon2id$x").await,
        Err(StoreError::Conflict(message)) if message.contains("first administrator")
    ));
    assert!(store.user_by_name("second").await.unwrap().is_none());

    let carol = store
        .create_account(NewAccount {
            name: "carol",
            password_hash: Some("$argon2id$carol"),
            is_admin: false,
        })
        .await
        .unwrap();
    assert!(!carol.is_admin && carol.has_password);
    assert!(matches!(
        store
            .create_account(NewAccount {
                name: "carol",
                password_hash: None,
                is_admin: false
            })
            .await,
        Err(StoreError::Conflict(_))
    ));
    let login = store.password_login("carol").await.unwrap().unwrap();
    assert_eq!(login.user.id, carol.id);
    assert_eq!(login.password_hash.as_deref(), Some("$argon2id$carol"));
    assert_eq!(login.locked_until, None);
    assert!(store.password_login("nobody").await.unwrap().is_none());
    let old_login = store.password_login("old").await.unwrap().unwrap();
    assert_eq!(old_login.password_hash, None);

    // An administrator changes flags and the password; the user is found by id.
    let changed = store
        .update_user(
            carol.id,
            UserUpdate {
                is_admin: Some(true),
                password_hash: Some("$argon2id$new".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(changed.is_admin);
    assert_eq!(
        store
            .password_login("carol")
            .await
            .unwrap()
            .unwrap()
            .password_hash
            .as_deref(),
        Some("$argon2id$new")
    );
    let found = store.user_by_id(carol.id.as_uuid()).await.unwrap().unwrap();
    assert_eq!((found.name.as_str(), found.is_admin), ("carol", true));
    assert!(
        store
            .user_by_id(uuid::Uuid::now_v7())
            .await
            .unwrap()
            .is_none()
    );
    let missing = store.user_by_id(uuid::Uuid::now_v7()).await.unwrap();
    assert!(missing.is_none());
    let listed = store.list_users().await.unwrap();
    let names: Vec<_> = listed
        .iter()
        .map(|user| (user.name.as_str(), user.is_admin))
        .collect();
    assert_eq!(names, [("carol", true), ("old", false), ("root", true)]);
}

async fn sessions_end_when_deleted_expired_or_their_user_is_disabled(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let at = now();
    let later = at + chrono::Duration::days(30);
    store
        .create_session(alice.id, "session-a", later)
        .await
        .unwrap();
    store
        .create_session(bob.id, "session-b", later)
        .await
        .unwrap();
    store
        .add_api_key(bob.id, "key-b", "mnemo_bbb")
        .await
        .unwrap();
    let found = store.session_user("session-a", at).await.unwrap().unwrap();
    assert_eq!(found.user.id, alice.id);
    assert_eq!(found.expires_at, later);
    assert!(store.session_user("unknown", at).await.unwrap().is_none());
    // Past its expiry: not found.
    assert!(
        store
            .session_user("session-a", later + chrono::Duration::seconds(1))
            .await
            .unwrap()
            .is_none()
    );
    // Touching slides the expiry.
    let touched_at = at + chrono::Duration::days(1);
    let new_expiry = touched_at + chrono::Duration::days(30);
    store
        .touch_session("session-a", touched_at, new_expiry)
        .await
        .unwrap();
    let found = store
        .session_user("session-a", later + chrono::Duration::seconds(1))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (found.last_seen_at, found.expires_at),
        (touched_at, new_expiry)
    );
    assert_eq!(
        store
            .delete_expired_sessions(later + chrono::Duration::hours(1))
            .await
            .unwrap(),
        1,
        "bob's session expired, alice's was renewed"
    );
    store
        .create_session(bob.id, "session-b", later)
        .await
        .unwrap();

    // Disabling bob ends his session and refuses his key at once; enabling does not bring
    // the session back.
    let disabled = store
        .update_user(
            bob.id,
            UserUpdate {
                disabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(disabled.disabled_at.is_some());
    assert!(store.session_user("session-b", at).await.unwrap().is_none());
    assert!(store.user_by_key_hash("key-b").await.unwrap().is_none());
    let enabled = store
        .update_user(
            bob.id,
            UserUpdate {
                disabled: Some(false),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(enabled.disabled_at.is_none());
    assert!(store.session_user("session-b", at).await.unwrap().is_none());
    assert_eq!(
        store.user_by_key_hash("key-b").await.unwrap().unwrap().id,
        bob.id
    );
    assert!(matches!(
        store
            .update_user(
                UserId::from_trusted(uuid::Uuid::now_v7()),
                UserUpdate::default()
            )
            .await,
        Err(StoreError::NotFound(_))
    ));

    // Sign-out deletes the one session.
    assert!(store.delete_session("session-a").await.unwrap());
    assert!(!store.delete_session("session-a").await.unwrap());
    assert!(store.session_user("session-a", at).await.unwrap().is_none());
}

async fn failed_sign_ins_count_lock_and_clear(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    for expected in 1..=3 {
        assert_eq!(store.count_failed_login(alice.id).await.unwrap(), expected);
    }
    assert_eq!(
        store.count_failed_login(bob.id).await.unwrap(),
        1,
        "counted per user"
    );
    let until = now() + chrono::Duration::minutes(15);
    store.lock_login(alice.id, until).await.unwrap();
    let login = store.password_login("alice").await.unwrap().unwrap();
    assert_eq!(login.locked_until, Some(until));
    assert_eq!(
        store.count_failed_login(alice.id).await.unwrap(),
        1,
        "counting starts again"
    );
    store.clear_failed_logins(alice.id).await.unwrap();
    assert_eq!(
        store
            .password_login("alice")
            .await
            .unwrap()
            .unwrap()
            .locked_until,
        None
    );
    assert_eq!(store.count_failed_login(alice.id).await.unwrap(), 1);
    assert!(matches!(
        store
            .count_failed_login(UserId::from_trusted(uuid::Uuid::now_v7()))
            .await,
        Err(StoreError::NotFound(_))
    ));
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
    // Rotation after a revoke: a new key works, the revoked one stays revoked.
    assert_eq!(
        store
            .rotate_key("alice", "hash-a2", "mnemo_a2", true)
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store.user_by_key_hash("hash-a2").await.unwrap().unwrap().id,
        alice.id
    );
    // Keeping the old key, then replacing both.
    store
        .rotate_key("alice", "hash-a3", "mnemo_a3", false)
        .await
        .unwrap();
    assert!(store.user_by_key_hash("hash-a2").await.unwrap().is_some());
    assert_eq!(
        store
            .rotate_key("alice", "hash-a4", "mnemo_a4", true)
            .await
            .unwrap(),
        2
    );
    assert!(store.user_by_key_hash("hash-a2").await.unwrap().is_none());
    assert!(store.user_by_key_hash("hash-a3").await.unwrap().is_none());
    let listed = store.api_keys("alice").await.unwrap();
    let prefixes: Vec<_> = listed.iter().map(|key| key.prefix.as_str()).collect();
    assert_eq!(prefixes, ["mnemo_a4", "mnemo_a3", "mnemo_a2", "mnemo_aaa"]);
    assert_eq!(
        listed
            .iter()
            .map(|key| key.revoked_at.is_none())
            .collect::<Vec<_>>(),
        [true, false, false, false]
    );
    assert!(matches!(
        store.api_keys("carol").await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.api_keys("bob").await.unwrap()[0].prefix, "mnemo_bbb");
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

async fn temporary_threads_and_the_memory_switch(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let scope = store.user(alice.id);
    let temporary = scope.create_thread("off the record", true).await.unwrap();
    let kept = scope.create_thread("on the record", false).await.unwrap();
    assert!(scope.get_thread(temporary.id).await.unwrap().temporary);
    assert!(!scope.get_thread(kept.id).await.unwrap().temporary);
    let listed = scope.list_threads(10, None).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|t| (t.title.as_str(), t.temporary))
            .collect::<Vec<_>>(),
        [("on the record", false), ("off the record", true)]
    );
    assert!(scope.memory_enabled().await.unwrap(), "on by default");
    scope.set_memory_enabled(false).await.unwrap();
    assert!(!scope.memory_enabled().await.unwrap());
    assert!(
        store.user(bob.id).memory_enabled().await.unwrap(),
        "one user's switch"
    );
    let listed = store.list_users().await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|u| (u.name.as_str(), u.memory_enabled))
            .collect::<Vec<_>>(),
        [("alice", false), ("bob", true)]
    );
    scope.set_memory_enabled(true).await.unwrap();
    assert!(scope.memory_enabled().await.unwrap());
}

async fn threads_are_private_and_paginated(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let mut created = Vec::new();
    for index in 0..5 {
        created.push(
            store
                .create_thread(alice.id, &format!("thread {index}"), false)
                .await
                .unwrap(),
        );
    }
    let bobs = store.create_thread(bob.id, "bob's", false).await.unwrap();
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

async fn a_conversation_key_names_one_thread_per_user(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    // Concurrent first requests of one conversation make one thread.
    let (first, second) = tokio::join!(
        store.conversation_thread(alice.id, "key-1", "hello"),
        store.conversation_thread(alice.id, "key-1", "hello"),
    );
    let first = first.unwrap();
    assert_eq!(first.id, second.unwrap().id);
    assert_eq!(first.title, "hello");
    let again = store
        .conversation_thread(alice.id, "key-1", "another title")
        .await
        .unwrap();
    assert_eq!((again.id, again.title.as_str()), (first.id, "hello"));
    let other = store
        .conversation_thread(alice.id, "key-2", "other")
        .await
        .unwrap();
    assert_ne!(other.id, first.id);
    // The same key is another thread for another user.
    let bobs = store
        .conversation_thread(bob.id, "key-1", "hello")
        .await
        .unwrap();
    assert_ne!(bobs.id, first.id);
    assert_eq!(
        store.list_threads(alice.id, 10, None).await.unwrap().len(),
        2
    );
}

async fn messages_keep_order_and_owner(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t", false).await.unwrap();
    for index in 0..20 {
        let role = if index % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        store
            .append_message(
                alice.id,
                thread.id,
                role,
                &format!("message {index}"),
                None,
                Message::trust_of(role),
            )
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
            .append_message(
                bob.id,
                thread.id,
                Role::User,
                "intrusion",
                None,
                Trust::User
            )
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

async fn imported_messages_given_one_time_keep_their_order_in_time(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t", false).await.unwrap();
    let day = |d: u32| {
        chrono::NaiveDate::from_ymd_opt(2024, 3, d)
            .unwrap()
            .and_hms_opt(0, 0, 0)
            .unwrap()
            .and_utc()
    };
    let message = |text: &str, at: Option<DateTime<Utc>>| NewMessage {
        role: Role::User,
        content: text.to_string(),
        author: None,
        created_at: at,
    };
    // A session dated by its day, then a later day, then a time before it (kept as given).
    let stored = store
        .import_messages(
            alice.id,
            thread.id,
            vec![
                message("the deadline is April 1", Some(day(15))),
                message("sprint one covers the layout", Some(day(15))),
                message("the deadline moved to April 5", Some(day(15))),
                message("next day", Some(day(16))),
                message("a note from before", Some(day(2))),
            ],
        )
        .await
        .unwrap();
    let times: Vec<DateTime<Utc>> = stored.iter().map(|m| m.created_at).collect();
    let micro = chrono::Duration::microseconds(1);
    assert_eq!(
        times,
        [
            day(15),
            day(15) + micro,
            day(15) + micro * 2,
            day(16),
            day(2)
        ]
    );
    let listed = store.list_messages(alice.id, thread.id).await.unwrap();
    let read: Vec<DateTime<Utc>> = listed.iter().map(|m| m.created_at).collect();
    assert_eq!(
        read, times,
        "the stored times are the ones returned, in order"
    );
    // Messages without a time are stamped now, still one after another.
    let undated = store
        .import_messages(
            alice.id,
            thread.id,
            vec![
                message("one", None),
                message("two", None),
                message("three", None),
            ],
        )
        .await
        .unwrap();
    assert!(
        undated
            .windows(2)
            .all(|pair| pair[0].created_at < pair[1].created_at)
    );
}

async fn deleting_a_thread_removes_its_messages_and_runs(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t", false).await.unwrap();
    store
        .append_message(alice.id, thread.id, Role::User, "hello", None, Trust::User)
        .await
        .unwrap();
    let run = store
        .create_run(alice.id, Some(thread.id), RunKind::Chat, None)
        .await
        .unwrap();
    store
        .create_run(alice.id, None, RunKind::Chat, None)
        .await
        .unwrap();
    assert_eq!(
        store
            .running_runs_of_thread(alice.id, thread.id)
            .await
            .unwrap(),
        [run.id]
    );
    assert_eq!(store.running_run_count(alice.id).await.unwrap(), 2);
    let carol = store.create_user("carol", UserKind::Key).await.unwrap();
    assert_eq!(store.running_run_count(carol.id).await.unwrap(), 0);
    assert!(
        store
            .running_runs_of_thread(carol.id, thread.id)
            .await
            .unwrap()
            .is_empty()
    );
    store
        .append_run_event(
            alice.id,
            run.id,
            1,
            EventType::Done,
            &json!({"status": "completed"}),
            ReplicaId::new(),
        )
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
        .create_run(alice.id, None, RunKind::Research, None)
        .await
        .unwrap();
    for seq in 1..=10 {
        store
            .append_run_event(
                alice.id,
                run.id,
                seq,
                EventType::Thinking,
                &json!({ "n": seq, "text": "日本語 ok" }),
                ReplicaId::new(),
            )
            .await
            .unwrap();
    }
    assert!(matches!(
        store
            .append_run_event(
                alice.id,
                run.id,
                3,
                EventType::Thinking,
                &json!({}),
                ReplicaId::new()
            )
            .await,
        Err(StoreError::Conflict(_))
    ));
    // Another user cannot write into the run's log.
    assert!(matches!(
        store
            .append_run_event(
                bob.id,
                run.id,
                11,
                EventType::Thinking,
                &json!({}),
                ReplicaId::new()
            )
            .await,
        Err(StoreError::NotFound("run"))
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
    let (alice, bob) = two_users(&store).await;
    let run = store
        .create_run(alice.id, None, RunKind::Chat, None)
        .await
        .unwrap();
    // Another user's finish changes nothing.
    store
        .finish_run(bob.id, run.id, RunStatus::Cancelled, None)
        .await
        .unwrap();
    assert_eq!(
        store.get_run(alice.id, run.id).await.unwrap().status,
        RunStatus::Running
    );
    store
        .finish_run(alice.id, run.id, RunStatus::Failed, Some("boom"))
        .await
        .unwrap();
    store
        .finish_run(alice.id, run.id, RunStatus::Completed, None)
        .await
        .unwrap();
    let state = store.get_run(alice.id, run.id).await.unwrap();
    assert_eq!(state.status, RunStatus::Failed);
    assert_eq!(state.error.as_deref(), Some("boom"));
    assert!(state.finished_at.is_some());
}

async fn checkpoints_are_saved_by_the_owner_and_a_released_run_is_taken_at_once(
    store: Arc<dyn Store>,
) {
    let (alice, bob) = two_users(&store).await;
    let (a, b) = (ReplicaId::new(), ReplicaId::new());
    let start = now();
    let hour = chrono::Duration::hours(1);
    let run = store
        .create_run(alice.id, None, RunKind::Research, None)
        .await
        .unwrap();
    assert_eq!(store.run_checkpoint(alice.id, run.id).await.unwrap(), None);
    let first = json!({ "attempt": 1, "seq": 0, "step": null, "body": { "research": 1 } });
    // Only the owner saves: before the claim nobody owns the run.
    assert!(matches!(
        store.save_run_checkpoint(alice.id, run.id, a, &first).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(store.claim_run(run.id, a, start + hour).await.unwrap());
    store
        .save_run_checkpoint(alice.id, run.id, a, &first)
        .await
        .unwrap();
    assert!(matches!(
        store
            .save_run_checkpoint(alice.id, run.id, b, &json!({}))
            .await,
        Err(StoreError::Conflict(_))
    ));
    assert!(matches!(
        store
            .save_run_checkpoint(bob.id, run.id, a, &json!({}))
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.run_checkpoint(bob.id, run.id).await,
        Err(StoreError::NotFound(_))
    ));
    let second = json!({ "attempt": 1, "seq": 4, "step": "brief", "body": { "journal": [1, 2] } });
    store
        .save_run_checkpoint(alice.id, run.id, a, &second)
        .await
        .unwrap();
    assert_eq!(
        store.run_checkpoint(alice.id, run.id).await.unwrap(),
        Some(second.clone())
    );
    // Its lease runs for an hour, but the owner lets go (a shutdown): the next sweep takes it.
    let sweep = Sweep {
        now: now() + chrono::Duration::seconds(1),
        unclaimed_before: start - chrono::Duration::seconds(15),
        predecessor: None,
    };
    assert_eq!(store.expired_runs(&sweep).await.unwrap(), vec![]);
    store.release_run(run.id, b).await.unwrap();
    assert_eq!(
        store.expired_runs(&sweep).await.unwrap(),
        vec![],
        "only the owner lets go"
    );
    store.release_run(run.id, a).await.unwrap();
    let expired = store.expired_runs(&sweep).await.unwrap();
    assert_eq!(
        expired,
        vec![ExpiredRun {
            run: run.id,
            user: alice.id,
            owner: Some(a)
        }]
    );
    assert_eq!(
        store
            .take_over_run(&expired[0], &sweep, b, start + hour)
            .await
            .unwrap(),
        Some(0)
    );
    // The new owner reads the checkpoint and saves the next; the old one is fenced out.
    assert_eq!(
        store.run_checkpoint(alice.id, run.id).await.unwrap(),
        Some(second)
    );
    assert!(matches!(
        store.save_run_checkpoint(alice.id, run.id, a, &first).await,
        Err(StoreError::Conflict(_))
    ));
    store
        .save_run_checkpoint(alice.id, run.id, b, &first)
        .await
        .unwrap();
    // An ended run keeps no more checkpoints.
    store
        .finish_run(alice.id, run.id, RunStatus::Completed, None)
        .await
        .unwrap();
    assert!(matches!(
        store.save_run_checkpoint(alice.id, run.id, b, &first).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn runs_are_taken_over_only_when_their_lease_expired(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let (a, b, c) = (ReplicaId::new(), ReplicaId::new(), ReplicaId::new());
    let start = now();
    let hour = chrono::Duration::hours(1);
    let held = store
        .create_run(alice.id, None, RunKind::Research, None)
        .await
        .unwrap();
    assert!(store.claim_run(held.id, a, start + hour).await.unwrap());
    assert!(!store.claim_run(held.id, b, start + hour).await.unwrap());
    // Replica A appends under its lease.
    store
        .append_run_event(alice.id, held.id, 1, EventType::Thinking, &json!({}), a)
        .await
        .unwrap();
    let unclaimed = store
        .create_run(alice.id, None, RunKind::Chat, None)
        .await
        .unwrap();
    // A sweep now finds nothing: A's lease runs, the unclaimed run is too young.
    let sweep_now = Sweep {
        now: start,
        unclaimed_before: start - chrono::Duration::seconds(15),
        predecessor: None,
    };
    assert_eq!(store.expired_runs(&sweep_now).await.unwrap(), vec![]);
    // An unclaimed run is takeable once it has not been touched for a lease.
    let later = Sweep {
        unclaimed_before: now() + chrono::Duration::seconds(1),
        ..sweep_now
    };
    assert_eq!(
        store.expired_runs(&later).await.unwrap(),
        vec![ExpiredRun {
            run: unclaimed.id,
            user: alice.id,
            owner: None
        }]
    );
    // The previous process of a data directory is known to be gone: its runs are takeable
    // at once.
    let after_restart = Sweep {
        predecessor: Some(a),
        ..sweep_now
    };
    assert_eq!(
        store
            .expired_runs(&after_restart)
            .await
            .unwrap()
            .iter()
            .map(|run| run.run)
            .collect::<Vec<_>>(),
        [held.id]
    );
    // Past A's lease, B takes the run over; C, which found it expired too, gets nothing.
    let expired_sweep = Sweep {
        now: start + hour * 2,
        ..sweep_now
    };
    let found = store.expired_runs(&expired_sweep).await.unwrap();
    let expired = found
        .iter()
        .find(|run| run.run == held.id)
        .cloned()
        .unwrap();
    assert_eq!(expired.owner, Some(a));
    assert_eq!(
        store
            .take_over_run(&expired, &expired_sweep, b, start + hour * 3)
            .await
            .unwrap(),
        Some(1)
    );
    assert_eq!(
        store
            .take_over_run(&expired, &expired_sweep, c, start + hour * 3)
            .await
            .unwrap(),
        None
    );
    // A may append no more (fenced); B continues the sequence.
    assert!(matches!(
        store
            .append_run_event(alice.id, held.id, 2, EventType::Thinking, &json!({}), a)
            .await,
        Err(StoreError::Conflict(_))
    ));
    store
        .append_final_run_event(
            alice.id,
            held.id,
            2,
            &json!({ "status": "interrupted" }),
            RunStatus::Interrupted,
            Some("gone"),
            b,
        )
        .await
        .unwrap();
    let closed = store.get_run(alice.id, held.id).await.unwrap();
    assert_eq!(closed.status, RunStatus::Interrupted);
    assert_eq!(closed.last_seq, 2);
    assert_eq!(store.renew_leases(a, start + hour).await.unwrap(), 0);
    // A run whose owner renews its lease after a sweep saw it expired is left alone.
    let renewed = store
        .create_run(alice.id, None, RunKind::Chat, None)
        .await
        .unwrap();
    assert!(store.claim_run(renewed.id, a, start + hour).await.unwrap());
    let stale_view = store
        .expired_runs(&expired_sweep)
        .await
        .unwrap()
        .into_iter()
        .find(|run| run.run == renewed.id)
        .unwrap();
    assert_eq!(store.renew_leases(a, start + hour * 4).await.unwrap(), 1);
    assert_eq!(
        store
            .take_over_run(&stale_view, &expired_sweep, b, start + hour * 4)
            .await
            .unwrap(),
        None
    );
    store
        .append_run_event(alice.id, renewed.id, 1, EventType::Thinking, &json!({}), a)
        .await
        .unwrap();
    // Researches of a run that ended long ago but were left running are closed; those of a
    // running run are not.
    let research = |id: RunId| NewResearch {
        id,
        run_id: id,
        thread_id: None,
        query: "tides".into(),
        model: None,
        config: json!({}),
    };
    store
        .create_research(alice.id, &research(held.id))
        .await
        .unwrap();
    store
        .create_research(alice.id, &research(renewed.id))
        .await
        .unwrap();
    assert_eq!(store.interrupt_orphaned_research(start).await.unwrap(), 0);
    assert_eq!(
        store
            .interrupt_orphaned_research(now() + chrono::Duration::seconds(1))
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store.get_research(alice.id, held.id).await.unwrap().status,
        RunStatus::Interrupted
    );
    assert_eq!(
        store
            .get_research(alice.id, renewed.id)
            .await
            .unwrap()
            .status,
        RunStatus::Running
    );
}

async fn run_commands_reach_the_owner_once(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let (a, b) = (ReplicaId::new(), ReplicaId::new());
    let until = now() + chrono::Duration::hours(1);
    let run = store
        .create_run(alice.id, None, RunKind::Research, None)
        .await
        .unwrap();
    assert!(store.claim_run(run.id, a, until).await.unwrap());
    assert!(matches!(
        store
            .send_run_command(bob.id, run.id, &RunCommand::Cancel)
            .await,
        Err(StoreError::NotFound("run"))
    ));
    let approve = json!({ "approve": true, "topics": null, "content": null });
    assert_eq!(
        store
            .send_run_command(alice.id, run.id, &RunCommand::Input(approve.clone()))
            .await
            .unwrap(),
        CommandSent::NotAwaiting
    );
    store
        .set_awaiting_input(alice.id, run.id, true)
        .await
        .unwrap();
    assert_eq!(
        store
            .send_run_command(alice.id, run.id, &RunCommand::Input(approve.clone()))
            .await
            .unwrap(),
        CommandSent::Sent
    );
    assert_eq!(
        store
            .send_run_command(alice.id, run.id, &RunCommand::Cancel)
            .await
            .unwrap(),
        CommandSent::Sent
    );
    // Only the owner gets them, in the order they were sent, once.
    assert!(store.take_run_commands(b).await.unwrap().is_empty());
    assert_eq!(
        store.take_run_commands(a).await.unwrap(),
        vec![
            (run.id, RunCommand::Input(approve.clone())),
            (run.id, RunCommand::Cancel)
        ]
    );
    assert!(store.take_run_commands(a).await.unwrap().is_empty());
    // Readers on other replicas push `read_until` forward, never back; another user's touch
    // changes nothing.
    assert_eq!(store.remote_readers_until(run.id).await.unwrap(), None);
    let read_until = now() + chrono::Duration::seconds(30);
    store
        .touch_run_reader(alice.id, run.id, read_until)
        .await
        .unwrap();
    store
        .touch_run_reader(alice.id, run.id, read_until - chrono::Duration::seconds(10))
        .await
        .unwrap();
    store
        .touch_run_reader(bob.id, run.id, read_until + chrono::Duration::hours(1))
        .await
        .unwrap();
    assert_eq!(
        store.remote_readers_until(run.id).await.unwrap(),
        Some(read_until)
    );
    // The run's end clears its wait for input; an ended run takes no commands.
    store
        .append_final_run_event(
            alice.id,
            run.id,
            1,
            &json!({ "status": "cancelled" }),
            RunStatus::Cancelled,
            None,
            a,
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .send_run_command(alice.id, run.id, &RunCommand::Cancel)
            .await
            .unwrap(),
        CommandSent::NotRunning
    );
    // A command for a run nobody claimed waits; once stale it is deleted.
    let unclaimed = store
        .create_run(alice.id, None, RunKind::Chat, None)
        .await
        .unwrap();
    assert_eq!(
        store
            .send_run_command(alice.id, unclaimed.id, &RunCommand::Cancel)
            .await
            .unwrap(),
        CommandSent::Sent
    );
    assert_eq!(
        store
            .drop_stale_run_commands(now() - chrono::Duration::minutes(10))
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .drop_stale_run_commands(now() + chrono::Duration::seconds(1))
            .await
            .unwrap(),
        1
    );
    assert!(store.claim_run(unclaimed.id, b, until).await.unwrap());
    assert!(store.take_run_commands(b).await.unwrap().is_empty());
}

async fn research_records_are_private_and_finish_once(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let run = store
        .create_run(alice.id, None, RunKind::Research, None)
        .await
        .unwrap();
    let new = NewResearch {
        id: run.id,
        run_id: run.id,
        thread_id: None,
        query: "how do lighthouses work".into(),
        model: Some("m".into()),
        config: json!({ "max_researcher_iterations": 2 }),
    };
    store.create_research(alice.id, &new).await.unwrap();
    let running = store.get_research(alice.id, run.id).await.unwrap();
    assert_eq!(running.status, "running");
    assert_eq!(running.config["max_researcher_iterations"], 2);
    assert!(matches!(
        store.get_research(bob.id, run.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(store.list_research(bob.id, 10).await.unwrap().is_empty());
    let outcome = ResearchOutcome {
        status: RunStatus::Completed,
        report: Some("# Lighthouses [1]".into()),
        sources: json!([{ "n": 1, "url": "https://example.org/l" }]),
        usage: json!({ "total_tokens": 10 }),
        stage_timings: json!({ "final_report_generation": 0.5 }),
        word_count: 2,
        source_count: 1,
        duration_ms: Some(1500),
        error: None,
    };
    // Another user's finish changes nothing; a second finish neither.
    store
        .finish_research(bob.id, run.id, &outcome)
        .await
        .unwrap();
    assert_eq!(
        store.get_research(alice.id, run.id).await.unwrap().status,
        "running"
    );
    store
        .finish_research(alice.id, run.id, &outcome)
        .await
        .unwrap();
    let failed = ResearchOutcome::ended(RunStatus::Failed);
    store
        .finish_research(alice.id, run.id, &failed)
        .await
        .unwrap();
    let done = store.get_research(alice.id, run.id).await.unwrap();
    assert_eq!(done.status, "completed");
    assert_eq!(done.report.as_deref(), Some("# Lighthouses [1]"));
    assert_eq!(done.sources[0]["url"], "https://example.org/l");
    assert_eq!(done.duration_ms, Some(1500));
    assert!(done.finished_at.is_some());
    let listed = store.list_research(alice.id, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    let second = store
        .create_run(alice.id, None, RunKind::Research, None)
        .await
        .unwrap();
    store
        .create_research(
            alice.id,
            &NewResearch {
                id: second.id,
                run_id: second.id,
                ..new.clone()
            },
        )
        .await
        .unwrap();
    // The taker of an abandoned run closes its researches, and only those.
    assert_eq!(store.interrupt_research_of_run(second.id).await.unwrap(), 1);
    assert_eq!(store.interrupt_research_of_run(second.id).await.unwrap(), 0);
    assert_eq!(
        store
            .get_research(alice.id, second.id)
            .await
            .unwrap()
            .status,
        "interrupted"
    );
    assert!(matches!(
        store.delete_research(bob.id, run.id).await,
        Err(StoreError::NotFound(_))
    ));
    store.delete_research(alice.id, run.id).await.unwrap();
    assert_eq!(store.list_research(alice.id, 10).await.unwrap().len(), 1);
}

async fn timestamps_round_trip_exactly(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t", false).await.unwrap();
    let read = store.get_thread(alice.id, thread.id).await.unwrap();
    assert_eq!(read.created_at, thread.created_at);
    assert_eq!(read.id, thread.id);
}

fn embedded(seed: f32) -> Embedded {
    Embedded {
        vector: vec![seed, 1.0 - seed, 0.5],
        model: "model-a".into(),
    }
}

fn new_memory(kind: MemoryKind, content: &str, importance: u8) -> (NewMemory, Embedded) {
    (
        NewMemory::from_user(kind, content, importance),
        embedded(0.25),
    )
}

async fn memories_round_trip_with_history_and_log(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let head = store.memory_log_head().await.unwrap();
    let mut new = NewMemory::from_user(MemoryKind::Fact, "uses PostgreSQL 16 at work", 3);
    new.source_refs = vec!["D1:3".into(), "https://example.org/a".into()];
    let written = store
        .insert_memories(alice.id, vec![(new, embedded(0.75))])
        .await
        .unwrap();
    let memory = store.get_memory(alice.id, written[0].id).await.unwrap();
    assert_eq!(memory.content, "uses PostgreSQL 16 at work");
    assert_eq!(memory.kind, MemoryKind::Fact);
    assert_eq!(memory.source, MemorySource::User);
    assert_eq!(memory.trust, Trust::User);
    assert_eq!(memory.source_refs, ["D1:3", "https://example.org/a"]);
    assert_eq!(memory.embedding, vec![0.75, 0.25, 0.5]);
    assert_eq!(memory.embedding_model, "model-a");
    assert_eq!(memory.created_at, written[0].created_at);

    let updated = store
        .update_memory(
            alice.id,
            memory.id,
            MemoryPatch {
                content: Some(("uses PostgreSQL 17 at work".into(), embedded(0.5))),
                importance: Some(4),
                ..MemoryPatch::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(updated.version, 2);
    let archived = store
        .update_memory(
            alice.id,
            memory.id,
            MemoryPatch {
                archived: Some(true),
                ..MemoryPatch::default()
            },
        )
        .await
        .unwrap();
    assert!(archived.archived_at.is_some());
    let history = store.memory_history(alice.id, memory.id).await.unwrap();
    let changes: Vec<&str> = history.iter().map(|v| v.change.as_str()).collect();
    assert_eq!(changes, ["created", "updated", "archived"]);
    assert_eq!(history[0].snapshot["content"], "uses PostgreSQL 16 at work");
    assert_eq!(history[1].snapshot["content"], "uses PostgreSQL 17 at work");
    assert!(history[0].snapshot.get("embedding").is_none());
    let invalid = MemoryPatch {
        importance: Some(9),
        ..MemoryPatch::default()
    };
    assert!(matches!(
        store.update_memory(alice.id, memory.id, invalid).await,
        Err(StoreError::BadRequest(_))
    ));

    store.delete_memory(alice.id, memory.id).await.unwrap();
    assert!(matches!(
        store.get_memory(alice.id, memory.id).await,
        Err(StoreError::NotFound("memory"))
    ));
    let log = store.memory_log_after(head, 100).await.unwrap();
    let ops: Vec<LogOp> = log.iter().map(|entry| entry.op).collect();
    assert_eq!(
        ops,
        [LogOp::Upsert, LogOp::Upsert, LogOp::Upsert, LogOp::Delete]
    );
    assert!(log.windows(2).all(|pair| pair[0].seq < pair[1].seq));
    assert!(log.iter().all(|entry| entry.user == alice.id));
    assert_eq!(store.memory_log_head().await.unwrap(), log[3].seq);
    assert!(store.owned_memories(&[memory.id]).await.unwrap().is_empty());
    store.set_watermark("keyword", log[1].seq).await.unwrap();
    assert_eq!(store.watermark("keyword").await.unwrap(), log[1].seq);
    assert_eq!(store.watermark("vector").await.unwrap(), 0);
}

/// A forgotten memory leaves the user's memories (logged as a delete), can be listed and
/// restored with its id, vector and history by its owner only, and after its purge time only
/// the record of it remains.
async fn forgotten_memories_come_back_whole_until_purged(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let written = store
        .insert_memories(
            alice.id,
            vec![
                new_memory(MemoryKind::Fact, "my passport number is X1234567", 3),
                new_memory(MemoryKind::Fact, "my sister lives in Lisbon", 3),
            ],
        )
        .await
        .unwrap();
    let (passport, sister) = (written[0].clone(), written[1].id);
    store
        .update_memory(
            alice.id,
            passport.id,
            MemoryPatch {
                importance: Some(4),
                ..MemoryPatch::default()
            },
        )
        .await
        .unwrap();
    let head = store.memory_log_head().await.unwrap();
    let until = now() + chrono::Duration::days(30);
    // Another user's id is skipped, not forgotten.
    let gone = store
        .forget_memories(bob.id, &[passport.id], "my passport", ForgetVia::Api, until)
        .await
        .unwrap();
    assert!(gone.is_empty());
    let gone = store
        .forget_memories(
            alice.id,
            &[passport.id],
            "my passport",
            ForgetVia::Mcp,
            until,
        )
        .await
        .unwrap();
    assert_eq!(gone.len(), 1);
    assert!(matches!(
        store.get_memory(alice.id, passport.id).await,
        Err(StoreError::NotFound(_))
    ));
    store.get_memory(alice.id, sister).await.unwrap();
    let log = store.memory_log_after(head, 10).await.unwrap();
    assert_eq!(log.len(), 1);
    assert_eq!(
        (log[0].op, log[0].memory),
        (LogOp::Delete, Some(passport.id))
    );

    let listed = store.forgotten_memories(alice.id, 10).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].memory.content, "my passport number is X1234567");
    assert_eq!(listed[0].via, ForgetVia::Mcp);
    assert_eq!(listed[0].request.as_deref(), Some("my passport"));
    assert!(
        store
            .forgotten_memories(bob.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.restore_forgotten(bob.id, passport.id).await,
        Err(StoreError::NotFound(_))
    ));

    let restored = store
        .restore_forgotten(alice.id, passport.id)
        .await
        .unwrap();
    assert_eq!(restored.id, passport.id);
    let back = store.get_memory(alice.id, passport.id).await.unwrap();
    assert_eq!(back.embedding, passport.embedding);
    assert_eq!(back.importance, 4);
    let history = store.memory_history(alice.id, passport.id).await.unwrap();
    let changes: Vec<&str> = history.iter().map(|v| v.change.as_str()).collect();
    assert_eq!(changes, ["created", "updated", "restored"]);
    assert!(
        store
            .forgotten_memories(alice.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.restore_forgotten(alice.id, passport.id).await,
        Err(StoreError::NotFound(_))
    ));

    // Forgotten again, then purged: the content is gone for good.
    store
        .forget_memories(
            alice.id,
            &[passport.id],
            "my passport",
            ForgetVia::Api,
            until,
        )
        .await
        .unwrap();
    assert_eq!(store.purge_forgotten(now()).await.unwrap(), 0, "not yet");
    assert_eq!(
        store
            .purge_forgotten(until + chrono::Duration::seconds(1))
            .await
            .unwrap(),
        1
    );
    assert!(
        store
            .forgotten_memories(alice.id, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store.restore_forgotten(alice.id, passport.id).await,
        Err(StoreError::NotFound(_))
    ));
}

/// Recall's read by id (on SQLite straight from the file, see `sqlite_rows`) gives the same
/// memory as `get_memory`, field for field: a turn of a thread, a fact with sources and past
/// accesses, a memory superseded by another (`invalid_at`) and its successor (`supersedes`);
/// each id once however often it is asked for; nothing of another user's or unknown.
async fn memories_read_by_id_carry_every_field(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t", false).await.unwrap();
    let mut turn = NewMemory::from_user(MemoryKind::Turn, "我们周六去爬山 — hiking on Saturday", 2);
    turn.thread_id = Some(thread.id);
    turn.created_at = Some("2024-05-01T10:00:00.123456Z".parse().unwrap());
    let mut fact = NewMemory::from_user(MemoryKind::Fact, "works at a bakery", 4);
    fact.source_refs = vec!["D1:3".into(), "https://example.org/a".into()];
    fact.source = MemorySource::Assistant;
    fact.trust = Trust::Assistant;
    let written = store
        .insert_memories(
            alice.id,
            vec![
                (turn, embedded(0.125)),
                (fact, embedded(0.5)),
                new_memory(MemoryKind::Preference, "likes green tea", 3),
            ],
        )
        .await
        .unwrap();
    store
        .record_access(alice.id, &[written[1].id], 2, now())
        .await
        .unwrap();
    let successor = store
        .supersede_memory(
            alice.id,
            written[2].id,
            NewMemory::from_user(MemoryKind::Preference, "likes black tea now", 3),
            embedded(0.875),
        )
        .await
        .unwrap();
    let theirs = store
        .insert_memories(bob.id, vec![new_memory(MemoryKind::Fact, "bob's", 3)])
        .await
        .unwrap();
    let mut ids: Vec<MemoryId> = written.iter().map(|memory| memory.id).collect();
    ids.extend([successor.id, written[0].id, theirs[0].id, MemoryId::new()]);
    let mut read = store.memories_by_ids(alice.id, &ids).await.unwrap();
    read.sort_by_key(|memory| memory.id);
    let mut want = Vec::new();
    for id in [written[0].id, written[1].id, written[2].id, successor.id] {
        let mut memory = store.get_memory(alice.id, id).await.unwrap();
        memory.superseded_by = None;
        want.push(memory);
    }
    want.sort_by_key(|memory| memory.id);
    assert_eq!(read.len(), want.len(), "{read:?}");
    for (read, want) in read.iter().zip(&want) {
        assert_eq!(
            serde_json::to_value(read).unwrap(),
            serde_json::to_value(want).unwrap()
        );
        assert_eq!(read.embedding, want.embedding);
        assert_eq!(read.embedding_model, want.embedding_model);
    }
    let by_id = |id: MemoryId| read.iter().find(|memory| memory.id == id).unwrap();
    assert_eq!(by_id(written[0].id).thread_id, Some(thread.id));
    assert_eq!(by_id(written[1].id).access_count, 2);
    assert!(by_id(written[1].id).last_accessed_at.is_some());
    assert!(by_id(written[2].id).invalid_at.is_some());
    assert_eq!(by_id(successor.id).supersedes, Some(written[2].id));
    assert_eq!(by_id(successor.id).embedding, vec![0.875, 0.125, 0.5]);
}

async fn memories_are_private(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let mine = store
        .insert_memories(
            alice.id,
            vec![new_memory(MemoryKind::Preference, "likes tea", 2)],
        )
        .await
        .unwrap();
    let id = mine[0].id;
    assert!(matches!(
        store.get_memory(bob.id, id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(store.memory_history(bob.id, id).await.unwrap().is_empty());
    assert!(
        store
            .memories_by_ids(bob.id, &[id])
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_memories(bob.id, &MemoryFilter::default(), 10, None)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(matches!(
        store
            .update_memory(
                bob.id,
                id,
                MemoryPatch {
                    importance: Some(1),
                    ..MemoryPatch::default()
                }
            )
            .await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.delete_memory(bob.id, id).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.delete_all_memories(bob.id).await.unwrap(), 0);
    store.record_access(bob.id, &[id], 1, now()).await.unwrap();
    let untouched = store.get_memory(alice.id, id).await.unwrap();
    assert_eq!(untouched.access_count, 0);
    store
        .record_access(alice.id, &[id], 1, now())
        .await
        .unwrap();
    assert_eq!(
        store.get_memory(alice.id, id).await.unwrap().access_count,
        1
    );
    store
        .record_access(alice.id, &[id], 3, now())
        .await
        .unwrap();
    assert_eq!(
        store.get_memory(alice.id, id).await.unwrap().access_count,
        4
    );
    let owned = store.owned_memories(&[id]).await.unwrap();
    assert_eq!(owned[0].user, alice.id);
    assert_eq!(store.delete_all_memories(alice.id).await.unwrap(), 1);
    let last = store.memory_log_after(0, 100).await.unwrap();
    assert_eq!(last.last().unwrap().op, LogOp::DeleteUser);
    assert_eq!(last.last().unwrap().user, alice.id);
}

async fn memory_lists_filter_and_paginate(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let day = chrono::Duration::days(1);
    let base = now() - day * 10;
    let mut batch = Vec::new();
    for index in 0..6i64 {
        let kind = if index % 2 == 0 {
            MemoryKind::Fact
        } else {
            MemoryKind::Event
        };
        let (mut new, embedded) = new_memory(kind, &format!("memory {index}"), 3);
        new.created_at = Some(base + day * index as i32);
        batch.push((new, embedded));
    }
    let written = store.insert_memories(alice.id, batch).await.unwrap();
    store
        .update_memory(
            alice.id,
            written[5].id,
            MemoryPatch {
                archived: Some(true),
                ..MemoryPatch::default()
            },
        )
        .await
        .unwrap();
    store
        .update_memory(
            alice.id,
            written[4].id,
            MemoryPatch {
                invalid_at: Some(Some(now())),
                ..MemoryPatch::default()
            },
        )
        .await
        .unwrap();
    let contents =
        |memories: Vec<Memory>| memories.into_iter().map(|m| m.content).collect::<Vec<_>>();
    let all = store
        .list_memories(alice.id, &MemoryFilter::default(), 10, None)
        .await
        .unwrap();
    assert_eq!(
        contents(all),
        ["memory 3", "memory 2", "memory 1", "memory 0"]
    );
    let everything = MemoryFilter {
        include_archived: true,
        include_invalid: true,
        ..MemoryFilter::default()
    };
    let page = store
        .list_memories(alice.id, &everything, 4, None)
        .await
        .unwrap();
    assert_eq!(page.len(), 4);
    let rest = store
        .list_memories(alice.id, &everything, 4, Some(page[3].id))
        .await
        .unwrap();
    assert_eq!(contents(rest), ["memory 1", "memory 0"]);
    let facts = MemoryFilter {
        kinds: Some(vec![MemoryKind::Fact]),
        include_archived: true,
        ..MemoryFilter::default()
    };
    assert_eq!(
        contents(
            store
                .list_memories(alice.id, &facts, 10, None)
                .await
                .unwrap()
        ),
        ["memory 2", "memory 0"]
    );
    let window = MemoryFilter {
        since: Some(base + day),
        until: Some(base + day * 2),
        ..MemoryFilter::default()
    };
    assert_eq!(
        contents(
            store
                .list_memories(alice.id, &window, 10, None)
                .await
                .unwrap()
        ),
        ["memory 2", "memory 1"]
    );
    let archived_too = MemoryFilter {
        include_archived: true,
        ..MemoryFilter::default()
    };
    let listed = store
        .list_memories(alice.id, &archived_too, 10, None)
        .await
        .unwrap();
    assert!(listed.iter().any(|m| m.content == "memory 5"));
    assert!(listed.iter().all(|m| m.content != "memory 4"));
}

async fn accesses_recorded_at_once_by_many_replicas_all_count(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let batch: Vec<_> = (0..40)
        .map(|n| new_memory(MemoryKind::Fact, &format!("fact number {n}"), 3))
        .collect();
    let written = store.insert_memories(alice.id, batch).await.unwrap();
    let mut ids: Vec<MemoryId> = written.iter().map(|memory| memory.id).collect();
    ids.sort();
    // Eight recorders (replicas' access writers) update overlapping sets of rows at once, as
    // many recalls of one user through several replicas do.
    let mut tasks = Vec::new();
    for task in 0..8usize {
        let (store, ids) = (store.clone(), ids.clone());
        tasks.push(tokio::spawn(async move {
            for round in 0..25usize {
                let picked: Vec<MemoryId> = ids
                    .iter()
                    .enumerate()
                    .filter(|(index, _)| (index * 7 + task * 3 + round) % 3 != 0)
                    .map(|(_, id)| *id)
                    .collect();
                store.record_access(alice.id, &picked, 1, now()).await?;
            }
            Ok::<usize, StoreError>(25)
        }));
    }
    for task in tasks {
        assert_eq!(task.await.unwrap().expect("no recorder failed"), 25);
    }
    let mut expected = vec![0i64; ids.len()];
    for task in 0..8usize {
        for round in 0..25usize {
            for (index, count) in expected.iter_mut().enumerate() {
                if (index * 7 + task * 3 + round) % 3 != 0 {
                    *count += 1;
                }
            }
        }
    }
    for (id, count) in ids.iter().zip(expected) {
        let memory = store.get_memory(alice.id, *id).await.unwrap();
        assert_eq!(memory.access_count, count);
    }
}

async fn archiving_unused_memories_is_deterministic(store: Arc<dyn Store>) {
    let (alice, _) = two_users(&store).await;
    let day = chrono::Duration::days(1);
    let long_ago = now() - day * 100;
    let mut batch = Vec::new();
    for (content, importance, created) in [
        ("old trivia", 1, long_ago),
        ("old but important", 4, long_ago),
        ("recent trivia", 1, now() - day),
    ] {
        let (mut new, embedded) = new_memory(MemoryKind::Fact, content, importance);
        new.created_at = Some(created);
        batch.push((new, embedded));
    }
    let written = store.insert_memories(alice.id, batch).await.unwrap();
    let at = now();
    let archived = store.archive_unused(at, day * 30, 2).await.unwrap();
    assert_eq!(archived, vec![written[0].id]);
    let first = store.get_memory(alice.id, written[0].id).await.unwrap();
    assert_eq!(first.archived_at, Some(written[0].created_at + day * 30));
    // A rerun (e.g. after a crash) changes nothing.
    assert!(
        store
            .archive_unused(at, day * 30, 2)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .get_memory(alice.id, written[0].id)
            .await
            .unwrap()
            .archived_at,
        first.archived_at
    );
    let history = store.memory_history(alice.id, written[0].id).await.unwrap();
    assert_eq!(history.last().unwrap().change, "decayed");
    // Restoring brings it back into default lists.
    store
        .update_memory(
            alice.id,
            written[0].id,
            MemoryPatch {
                archived: Some(false),
                ..MemoryPatch::default()
            },
        )
        .await
        .unwrap();
    assert!(
        store
            .get_memory(alice.id, written[0].id)
            .await
            .unwrap()
            .archived_at
            .is_none()
    );
}

async fn reembedding_finds_other_models(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let written = store
        .insert_memories(
            alice.id,
            vec![
                new_memory(MemoryKind::Fact, "a", 3),
                new_memory(MemoryKind::Fact, "b", 3),
            ],
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .count_memories_not_embedded_by("model-b")
            .await
            .unwrap(),
        2
    );
    let stale = store.memories_not_embedded_by("model-b", 1).await.unwrap();
    assert_eq!(stale.len(), 1);
    let head = store.memory_log_head().await.unwrap();
    let vector = Embedded {
        vector: vec![1.0, 2.0],
        model: "model-b".into(),
    };
    assert_eq!(stale[0].user, alice.id);
    // Under another user the memory is not there to change.
    store
        .set_embeddings(&[(bob.id, stale[0].memory.id, vector.clone())])
        .await
        .unwrap();
    assert_eq!(
        store
            .count_memories_not_embedded_by("model-b")
            .await
            .unwrap(),
        2
    );
    store
        .set_embeddings(&[(alice.id, stale[0].memory.id, vector.clone())])
        .await
        .unwrap();
    assert_eq!(
        store
            .count_memories_not_embedded_by("model-b")
            .await
            .unwrap(),
        1
    );
    assert_eq!(store.memory_log_after(head, 10).await.unwrap().len(), 1);
    let scanned = store.scan_memories(None, 10).await.unwrap();
    assert_eq!(scanned.len(), 2);
    assert_eq!(
        store
            .scan_memories(Some(scanned[0].memory.id), 10)
            .await
            .unwrap()
            .len(),
        1
    );
    assert_eq!(store.count_memories().await.unwrap(), 2);
    let _ = written;
}

/// Vectors recorded under an earlier id of the same model and arithmetic (`model-a`) are
/// recorded as `model-a@int8`, memories and context views, leaving the vectors, the other
/// models' rows and the log alone.
async fn earlier_embedder_ids_are_relabelled_in_place(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let mut written = store
        .insert_memories(
            alice.id,
            vec![
                new_memory(MemoryKind::Turn, "a", 3),
                new_memory(MemoryKind::Fact, "b", 3),
            ],
        )
        .await
        .unwrap();
    written.extend(
        store
            .insert_memories(bob.id, vec![new_memory(MemoryKind::Fact, "c", 3)])
            .await
            .unwrap(),
    );
    let other = Embedded {
        vector: vec![0.0, 0.0, 1.0],
        model: "model-b".into(),
    };
    store
        .set_embeddings(&[(bob.id, written[2].id, other)])
        .await
        .unwrap();
    store
        .set_context_embeddings(alice.id, vec![(written[0].id, embedded(0.75))])
        .await
        .unwrap();
    let head = store.memory_log_head().await.unwrap();

    assert_eq!(
        store
            .relabel_embeddings("model-a", "model-a@int8")
            .await
            .unwrap(),
        3
    );
    assert_eq!(store.memory_log_head().await.unwrap(), head);
    let mine = store.get_memory(alice.id, written[0].id).await.unwrap();
    assert_eq!(
        (mine.embedding_model.as_str(), mine.embedding),
        ("model-a@int8", embedded(0.25).vector)
    );
    let contexts = store.context_embeddings(&[written[0].id]).await.unwrap();
    assert_eq!(contexts.len(), 1);
    assert_eq!(contexts[0].1.model, "model-a@int8");
    assert_eq!(contexts[0].1.vector, embedded(0.75).vector);
    let theirs = store.get_memory(bob.id, written[2].id).await.unwrap();
    assert_eq!(theirs.embedding_model, "model-b");
    assert_eq!(
        store
            .count_memories_not_embedded_by("model-a@int8")
            .await
            .unwrap(),
        1
    );
    // Done once: nothing is left under the earlier id.
    assert_eq!(
        store
            .relabel_embeddings("model-a", "model-a@int8")
            .await
            .unwrap(),
        0
    );
}

fn chunk_of(document: DocumentId, index: usize, content: &str) -> (NewMemory, Embedded) {
    let mut new = NewMemory::from_user(MemoryKind::Document, content, 4);
    new.source = MemorySource::Import;
    new.source_refs = vec![format!("doc:{document}"), format!("doc:{document}#{index}")];
    (new, embedded(0.5))
}

async fn documents_are_private_and_find_their_chunks(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let new = |title: &str| NewDocument {
        title: title.into(),
        source: Some(format!("/home/alice/{title}.md")),
        content_type: "text/markdown".into(),
        content_hash: Some(format!("hash-of-{title}")),
        chars: 1234,
        chunks: 2,
    };
    let first = store.insert_document(alice.id, new("first")).await.unwrap();
    let second = store
        .insert_document(alice.id, new("second"))
        .await
        .unwrap();
    let bobs = store.insert_document(bob.id, new("bobs")).await.unwrap();
    assert_eq!(store.get_document(alice.id, first.id).await.unwrap(), first);
    assert_eq!(first.chars, 1234);
    assert_eq!(first.source.as_deref(), Some("/home/alice/first.md"));

    // Newest first, paginated with a cursor, and only the owner's.
    let listed = store.list_documents(alice.id, 10, None).await.unwrap();
    assert_eq!(
        listed.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![second.id, first.id]
    );
    let page = store
        .list_documents(alice.id, 1, Some(second.id))
        .await
        .unwrap();
    assert_eq!(
        page.iter().map(|d| d.id).collect::<Vec<_>>(),
        vec![first.id]
    );
    assert_eq!(
        store.list_documents(bob.id, 10, None).await.unwrap(),
        vec![bobs.clone()]
    );
    assert!(matches!(
        store.get_document(bob.id, first.id).await,
        Err(StoreError::NotFound(_))
    ));

    // Chunks are found by their `doc:<id>` reference, for their owner only.
    let chunks = store
        .insert_memories(
            alice.id,
            vec![
                chunk_of(first.id, 0, "first part"),
                chunk_of(first.id, 1, "second part"),
                chunk_of(second.id, 0, "another document"),
            ],
        )
        .await
        .unwrap();
    let mut noise = NewMemory::from_user(MemoryKind::Fact, "mentions a document", 3);
    noise.source_refs = vec![format!("doc:{first}#0", first = first.id)];
    store
        .insert_memories(alice.id, vec![(noise, embedded(0.1))])
        .await
        .unwrap();
    let found = store.document_chunk_ids(alice.id, first.id).await.unwrap();
    assert_eq!(found, vec![chunks[0].id, chunks[1].id]);
    assert!(
        store
            .document_chunk_ids(bob.id, first.id)
            .await
            .unwrap()
            .is_empty()
    );

    assert!(matches!(
        store.delete_document(bob.id, first.id).await,
        Err(StoreError::NotFound(_))
    ));
    store.delete_document(alice.id, first.id).await.unwrap();
    assert!(matches!(
        store.get_document(alice.id, first.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert!(matches!(
        store.delete_document(alice.id, first.id).await,
        Err(StoreError::NotFound(_))
    ));
    assert_eq!(store.get_document(bob.id, bobs.id).await.unwrap(), bobs);
}

async fn documents_have_one_row_per_source_or_content_claimed_once_per_generation(
    store: Arc<dyn Store>,
) {
    let (alice, bob) = two_users(&store).await;
    let new = |source: Option<&str>, hash: Option<&str>, title: &str| NewDocument {
        title: title.into(),
        source: source.map(str::to_string),
        content_type: "text/plain".into(),
        content_hash: hash.map(str::to_string),
        chars: 10,
        chunks: 1,
    };
    let notes = store
        .insert_document(alice.id, new(Some("/notes.txt"), Some("h1"), "notes"))
        .await
        .unwrap();
    assert_eq!(notes.content_hash.as_deref(), Some("h1"));
    let state = store.document_state(alice.id, notes.id).await.unwrap();
    assert_eq!((state.generation, state.complete), (0, false));
    assert_eq!(state.document, notes);

    // One row per user and source, whatever the content; other users are separate.
    for hash in ["h1", "h2"] {
        assert!(matches!(
            store
                .insert_document(alice.id, new(Some("/notes.txt"), Some(hash), "again"))
                .await,
            Err(StoreError::Conflict(_))
        ));
    }
    let bobs = store
        .insert_document(bob.id, new(Some("/notes.txt"), Some("h1"), "bob's"))
        .await
        .unwrap();
    assert_ne!(bobs.id, notes.id);
    // Without a source, one row per user and content.
    let loose = store
        .insert_document(alice.id, new(None, Some("h1"), "loose"))
        .await
        .unwrap();
    assert!(matches!(
        store
            .insert_document(alice.id, new(None, Some("h1"), "loose again"))
            .await,
        Err(StoreError::Conflict(_))
    ));
    let found = store
        .document_with_content(alice.id, "h1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(found.document.id, loose.id);
    assert!(
        store
            .document_with_content(alice.id, "h2")
            .await
            .unwrap()
            .is_none()
    );
    assert_eq!(
        store
            .document_with_content(bob.id, "h1")
            .await
            .unwrap()
            .map(|state| state.document.id),
        None,
        "bob's document has a source, and alice's are hers"
    );

    // Rows from before content hashes may repeat a source; they are found with the hashed one.
    let legacy = store
        .insert_document(alice.id, new(Some("/notes.txt"), None, "legacy"))
        .await
        .unwrap();
    let from_source = store
        .documents_from_source(alice.id, "/notes.txt")
        .await
        .unwrap();
    assert_eq!(
        from_source
            .iter()
            .map(|state| state.document.id)
            .collect::<Vec<_>>(),
        vec![legacy.id, notes.id]
    );
    assert!(
        store
            .documents_from_source(alice.id, "/other.txt")
            .await
            .unwrap()
            .is_empty()
    );

    // A claim is a compare-and-set on the generation: of two claims of one generation, one
    // wins; the row then describes the winner's content, its chunks not yet written.
    assert!(store.finish_document(alice.id, notes.id, 0).await.unwrap());
    assert!(
        store
            .document_state(alice.id, notes.id)
            .await
            .unwrap()
            .complete
    );
    assert!(
        store
            .claim_document(alice.id, notes.id, 0, new(None, Some("h2"), "notes v2"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_document(alice.id, notes.id, 0, new(None, Some("h3"), "late"))
            .await
            .unwrap()
    );
    assert!(
        !store
            .claim_document(bob.id, notes.id, 1, new(None, Some("h3"), "bob"))
            .await
            .unwrap()
    );
    let claimed = store.document_state(alice.id, notes.id).await.unwrap();
    assert_eq!((claimed.generation, claimed.complete), (1, false));
    assert_eq!(claimed.document.title, "notes v2");
    assert_eq!(claimed.document.content_hash.as_deref(), Some("h2"));
    assert_eq!(
        claimed.document.source.as_deref(),
        Some("/notes.txt"),
        "a claim keeps the source"
    );
    assert_eq!(claimed.document.created_at, notes.created_at);
    assert!(!store.finish_document(alice.id, notes.id, 0).await.unwrap());
    assert!(!store.finish_document(bob.id, notes.id, 1).await.unwrap());
    assert!(store.finish_document(alice.id, notes.id, 1).await.unwrap());
    assert!(
        store
            .document_state(alice.id, notes.id)
            .await
            .unwrap()
            .complete
    );
    // Giving the legacy row a hash would make a second hashed row for the source: refused.
    assert!(
        !store
            .claim_document(alice.id, legacy.id, 0, new(None, Some("h4"), "legacy"))
            .await
            .unwrap()
    );
    assert!(matches!(
        store.document_state(bob.id, notes.id).await,
        Err(StoreError::NotFound(_))
    ));
}

async fn jobs_whose_worker_keeps_dying_fail_for_good(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    assert!(
        store
            .enqueue_job(alice.id, JobKind::Turn, "turn:1", &json!({}), None)
            .await
            .unwrap()
    );
    // A lease that has already run out: as if the worker died during the job.
    let dead = chrono::Duration::milliseconds(-1);
    for attempt in 1..=2 {
        let job = store.claim_job(dead, 2).await.unwrap().expect("claimable");
        assert_eq!(job.attempts, attempt);
        assert_eq!(job.kind, JobKind::Turn);
        assert_eq!(job.user, alice.id);
    }
    assert!(store.claim_job(dead, 2).await.unwrap().is_none());
    assert_eq!(
        store.job_status(alice.id, "turn:1").await.unwrap(),
        Some(JobStatus::Failed)
    );
    assert_eq!(store.job_status(bob.id, "turn:1").await.unwrap(), None);
    let stats = store.queue_stats().await.unwrap();
    assert_eq!((stats.queued, stats.running, stats.failed), (0, 0, 1));
    assert_eq!(stats.recent_failures.len(), 1);
    assert_eq!(stats.recent_failures[0].kind, JobKind::Turn);
    assert!(
        stats.recent_failures[0].error.contains("stopped"),
        "{:?}",
        stats.recent_failures[0]
    );
}

async fn a_turn_job_records_what_it_did_and_is_found_from_its_run(store: Arc<dyn Store>) {
    let (alice, bob) = two_users(&store).await;
    let thread = store.create_thread(alice.id, "t", false).await.unwrap();
    let run = store
        .create_run(alice.id, Some(thread.id), RunKind::Chat, None)
        .await
        .unwrap();
    assert!(
        store
            .enqueue_job(alice.id, JobKind::Turn, "turn:a", &json!({}), Some(run.id))
            .await
            .unwrap()
    );
    let queued = store.run_memory_job(alice.id, run.id).await.unwrap();
    assert_eq!(
        queued,
        Some(JobRecord {
            key: "turn:a".into(),
            kind: JobKind::Turn,
            status: JobStatus::Queued,
            result: None,
        })
    );
    // Another user never sees it, nor a run without a job.
    assert_eq!(store.run_memory_job(bob.id, run.id).await.unwrap(), None);
    let other = store
        .create_run(alice.id, Some(thread.id), RunKind::Chat, None)
        .await
        .unwrap();
    assert_eq!(
        store.run_memory_job(alice.id, other.id).await.unwrap(),
        None
    );

    store
        .finish_run(alice.id, run.id, RunStatus::Completed, None)
        .await
        .unwrap();
    let job = store
        .claim_job(chrono::Duration::seconds(60), 5)
        .await
        .unwrap()
        .expect("claimable once its run ended");
    let old = MemoryId::new();
    let result = JobResult {
        memories: vec![
            ChangedMemory {
                change: MemoryChange::Added,
                id: MemoryId::new(),
                kind: MemoryKind::Fact,
                content: "my sister lives in Graz — 格拉茨".into(),
                replaces: None,
            },
            ChangedMemory {
                change: MemoryChange::Superseded,
                id: MemoryId::new(),
                kind: MemoryKind::Preference,
                content: "prefers tea".into(),
                replaces: Some(old),
            },
        ],
    };
    store.complete_job(job.id, &result).await.unwrap();
    let done = store
        .run_memory_job(alice.id, run.id)
        .await
        .unwrap()
        .expect("the job");
    assert_eq!(done.status, JobStatus::Done);
    assert_eq!(done.result, Some(result));
    assert_eq!(
        store.job_status(alice.id, "turn:a").await.unwrap(),
        Some(JobStatus::Done)
    );
}
