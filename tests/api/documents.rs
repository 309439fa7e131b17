//! The user's own documents through the HTTP API, against the real app, the real local
//! embedding model and both indexes: ingestion (JSON, raw HTML, PDF), the `local` search
//! provider finding the right chunk, isolation between users, document chunks kept out of
//! ordinary memory recall and lists, deletion removing the chunks, re-ingesting (unchanged
//! documents left alone, changed ones replaced, concurrent ingests making one document, also
//! through `mnemo ingest`), and client mistakes.

use crate::support;

use std::sync::Arc;

use mnemo::search::{self, SearchHit, SearchProvider};
use mnemo::store::UserId;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Backend, Home, TestApp};

async fn user_id(app: &TestApp, name: &str) -> UserId {
    app.state
        .store
        .accounts()
        .user_by_name(name)
        .await
        .expect("user lookup")
        .expect("user exists")
        .id
}

fn local(app: &TestApp) -> Arc<dyn SearchProvider> {
    search::provider(
        "local",
        &app.state.settings.research.search,
        Arc::new(mnemo::documents::DocumentCorpus::new(
            app.state.memory.clone(),
        )),
    )
    .expect("local provider")
}

const MIGRATION: &str = "The Quillfeather moth-whales of Vellacorn Bay migrate every November \
    to the basalt caves of Orrin Deep, where they feed on glowing krill until the spring thaw.";

/// A field-notes document long enough for several chunks, with the migration paragraph in the
/// middle.
fn field_notes() -> String {
    let mut paragraphs = vec!["# Field notes from the Vellacorn lighthouse".to_string()];
    for day in 1..=14 {
        paragraphs.push(format!(
            "Keeper's log, day {day}: the fog horn was tested at {day} o'clock, the lens was \
             polished with a linen cloth, and the supply boat brought {day} crates of lamp oil \
             and a sack of flour. The wind came from the north-west all afternoon."
        ));
        if day == 7 {
            paragraphs.push(MIGRATION.to_string());
        }
    }
    paragraphs.join("\n\n")
}

fn urls(hits: &[SearchHit]) -> Vec<&str> {
    hits.iter().map(|hit| hit.url.as_str()).collect()
}

/// `POST /v1/memories/search` results' memories.
async fn recall(app: &TestApp, key: &str, body: Value) -> Vec<Value> {
    let (status, response) = app.post("/v1/memories/search", Some(key), Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{response}");
    response["results"]
        .as_array()
        .expect("results")
        .iter()
        .map(|result| result["memory"].clone())
        .collect()
}

async fn documents_are_searched_locally_and_private(backend: Backend) {
    let home = Home::new(backend).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;

    let (status, notes) = app
        .ingest_document(
            &alice,
            json!({ "content": field_notes(), "source": "notes/vellacorn.md" }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{notes}");
    assert_eq!(notes["title"], "Field notes from the Vellacorn lighthouse");
    assert_eq!(notes["content_type"], "text/markdown");
    assert_eq!(notes["source"], "notes/vellacorn.md");
    assert!(notes["chunks"].as_i64().unwrap() >= 3, "{notes}");
    let notes_id = notes["id"].as_str().unwrap().to_string();

    let page = "<html><head><title>Harbour timetable</title><script>var x = 1;</script></head>\
        <body><nav>Home</nav><main><h1>Ferries</h1><p>The ferry to Orrin Island leaves at \
        seven and returns at noon.</p></main></body></html>";
    let (status, timetable) = app
        .upload_document(
            &alice,
            Some("text/html; charset=utf-8"),
            page.as_bytes().to_vec(),
            "source=https%3A%2F%2Fharbour.example%2Ftimetable",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{timetable}");
    assert_eq!(timetable["title"], "Harbour timetable");
    assert_eq!(timetable["content_type"], "text/html");
    assert_eq!(timetable["chunks"], 1);

    let (status, bobs) = app
        .ingest_document(
            &bob,
            json!({
                "title": "Rumours",
                "content": "Bob heard that the Quillfeather moth-whales are a hoax made up by the \
                            tourist board to sell boat trips.",
                "content_type": "text/plain",
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{bobs}");
    let bobs_id = bobs["id"].as_str().unwrap().to_string();
    // An ordinary memory, to show that default recall still finds what the user said.
    let (status, _) = app
        .post(
            "/v1/memories",
            Some(&alice),
            Some(json!({ "content": "I want to see the Quillfeather moth-whales one day" })),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED);
    app.wait_indexed().await;

    // The local provider finds the chunk that answers the question, with its document.
    let provider = local(&app);
    assert_eq!(provider.name(), "local");
    let alice_id = user_id(&app, "alice").await;
    let bob_id = user_id(&app, "bob").await;
    let hits = provider
        .search(
            alice_id,
            "where do the Quillfeather moth-whales migrate in November?",
            3,
        )
        .await
        .unwrap();
    assert!(!hits.is_empty() && hits.len() <= 3, "{hits:?}");
    let best = &hits[0];
    assert!(
        best.content.as_deref().unwrap().contains("Orrin Deep"),
        "{best:?}"
    );
    assert_eq!(best.title, "Field notes from the Vellacorn lighthouse");
    assert!(
        best.url.starts_with(&format!("doc:{notes_id}#")),
        "{best:?}"
    );
    assert!(best.snippet.len() <= best.content.as_ref().unwrap().len());
    assert!(best.score.is_some());
    let ferry = provider
        .search(alice_id, "ferry departure time", 1)
        .await
        .unwrap();
    assert_eq!(ferry[0].title, "Harbour timetable", "{ferry:?}");

    // Bob's search never sees Alice's documents, and his own are found.
    let bob_hits = provider
        .search(bob_id, "Quillfeather moth-whales migrate Orrin Deep", 10)
        .await
        .unwrap();
    assert!(!bob_hits.is_empty());
    for hit in &bob_hits {
        assert!(hit.url.starts_with(&format!("doc:{bobs_id}")), "{hit:?}");
        assert!(!hit.content.as_deref().unwrap().contains("Orrin Deep"));
    }
    assert_eq!(app.list_documents(&bob).await.len(), 1);
    let listed: Vec<String> = app
        .list_documents(&alice)
        .await
        .iter()
        .map(|document| document["id"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed.len(), 2);
    assert!(listed.contains(&notes_id));
    assert_eq!(
        app.delete_document(&bob, &notes_id).await,
        StatusCode::NOT_FOUND
    );

    // Chunks stay out of ordinary recall and lists, and come when asked for.
    let default = recall(&app, &alice, json!({ "query": "Quillfeather moth-whales" })).await;
    assert!(!default.is_empty(), "the ordinary memory is recalled");
    assert!(
        default.iter().all(|memory| memory["kind"] != "document"),
        "{default:?}"
    );
    let asked = recall(
        &app,
        &alice,
        json!({ "query": "Quillfeather moth-whales migrate", "kinds": ["document"] }),
    )
    .await;
    assert!(
        asked
            .iter()
            .any(|memory| memory["content"].as_str().unwrap().contains("Orrin Deep")),
        "{asked:?}"
    );
    assert!(asked.iter().all(|memory| memory["kind"] == "document"));
    let chunk = &asked[0];
    assert_eq!(chunk["importance"], 4);
    assert_eq!(chunk["source"], "import");
    assert_eq!(
        chunk["trust"], "document",
        "a document's author is not the user"
    );
    let (_, listed) = app.get("/v1/memories", Some(&alice)).await;
    let listed = listed["memories"].as_array().unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let (_, documents_only) = app
        .get("/v1/memories?kinds=document&limit=500", Some(&alice))
        .await;
    let chunk_count = notes["chunks"].as_i64().unwrap() + 1;
    assert_eq!(
        documents_only["memories"].as_array().unwrap().len() as i64,
        chunk_count
    );

    // A document reads back with its chunks in order, for its owner only.
    let (status, read) = app
        .get(&format!("/v1/documents/{notes_id}"), Some(&alice))
        .await;
    assert_eq!(status, StatusCode::OK, "{read}");
    assert_eq!(read["document"]["id"], notes_id.as_str());
    let chunks = read["chunks"].as_array().unwrap();
    assert_eq!(chunks.len() as i64, notes["chunks"].as_i64().unwrap());
    let numbers: Vec<i64> = chunks.iter().map(|c| c["n"].as_i64().unwrap()).collect();
    assert_eq!(numbers, (0..chunks.len() as i64).collect::<Vec<_>>());
    assert!(
        chunks
            .iter()
            .any(|c| c["content"].as_str().unwrap().contains("Orrin Deep")),
        "{read}"
    );
    let (status, _) = app
        .get(&format!("/v1/documents/{notes_id}"), Some(&bob))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // Deleting the document deletes its chunks from SQL and from both indexes.
    assert_eq!(
        app.delete_document(&alice, &notes_id).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.delete_document(&alice, &notes_id).await,
        StatusCode::NOT_FOUND
    );
    app.wait_indexed().await;
    let after = provider
        .search(alice_id, "Quillfeather moth-whales migrate Orrin Deep", 10)
        .await
        .unwrap();
    assert!(
        after.iter().all(|hit| !hit.url.contains(notes_id.as_str())),
        "{:?}",
        urls(&after)
    );
    let (_, remaining) = app
        .get("/v1/memories?kinds=document&limit=500", Some(&alice))
        .await;
    assert_eq!(remaining["memories"].as_array().unwrap().len(), 1);
    let keyword = recall(
        &app,
        &alice,
        json!({ "query": "Orrin Deep krill", "kinds": ["document"], "mode": "keyword" }),
    )
    .await;
    assert!(
        keyword
            .iter()
            .all(|memory| !memory["content"].as_str().unwrap().contains("Orrin Deep")),
        "{keyword:?}"
    );
    assert!(
        keyword.len() <= 1,
        "only the timetable may match: {keyword:?}"
    );
    let vector = app
        .state
        .memory
        .indexer()
        .vector()
        .search(
            alice_id,
            &app.state
                .memory
                .embed_one(MIGRATION)
                .await
                .expect("embed")
                .vector,
            &mnemo::index::vector::VectorFilter {
                kinds: Some(vec!["document".into()]),
                ..Default::default()
            },
            50,
        )
        .await
        .expect("vector search");
    assert_eq!(
        vector.len(),
        1,
        "only the timetable chunk is left: {vector:?}"
    );
    assert_eq!(app.list_documents(&alice).await.len(), 1);
    // The provider holds the memory engine; release it so the indexes can close.
    drop(provider);
    app.stop_and_release().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn documents_are_searched_locally_and_private_on(#[case] backend: Backend) {
    documents_are_searched_locally_and_private(backend).await;
}

const TIDES: &str = "# Pellwick tides\n\nTide tables for Pellwick harbour: the Zorblat spring \
    tide peaks at dawn on the first of each month and floods the lower quay.";
const TIDES_REVISED: &str = "# Pellwick tides, revised\n\nRevised tide tables for Pellwick \
    harbour: the Quendrix neap tide now peaks at dusk, and the lower quay stays dry all month.";
const FERRY: &str = "<html><head><title>Ferry</title></head><body><p>The Orrin Island ferry \
    leaves Pellwick pier at seven and returns at noon.</p></body></html>";

fn sha256_hex(text: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(text.as_bytes()))
}

/// `POST /v1/documents` with the raw file and its source, as `mnemo ingest --server` sends it.
async fn upload_file(
    app: &TestApp,
    key: &str,
    source: &str,
    content_type: &str,
    text: &str,
) -> (StatusCode, Value) {
    let query: String = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("source", source)
        .finish();
    app.upload_document(key, Some(content_type), text.as_bytes().to_vec(), &query)
        .await
}

/// Every chunk memory of the user, from SQL.
async fn chunk_memories(app: &TestApp, key: &str) -> Vec<Value> {
    let (status, body) = app
        .get("/v1/memories?kinds=document&limit=500", Some(key))
        .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["memories"].as_array().cloned().unwrap_or_default()
}

fn ids_of(memories: &[Value]) -> std::collections::BTreeSet<String> {
    memories
        .iter()
        .map(|memory| memory["id"].as_str().unwrap().to_string())
        .collect()
}

fn chunk_of_document(memory: &Value, document: &Value) -> bool {
    let reference = format!("doc:{}", document["id"].as_str().unwrap());
    memory["source_refs"]
        .as_array()
        .is_some_and(|refs| refs.iter().any(|r| r.as_str() == Some(reference.as_str())))
}

/// Asserts that no two recalled memories are the same chunk (by id or by content).
fn each_once(memories: &[Value]) {
    let ids = ids_of(memories);
    assert_eq!(
        ids.len(),
        memories.len(),
        "a chunk recalled twice: {memories:?}"
    );
    let contents: std::collections::BTreeSet<&str> = memories
        .iter()
        .map(|memory| memory["content"].as_str().unwrap())
        .collect();
    assert_eq!(
        contents.len(),
        memories.len(),
        "the same text recalled twice: {memories:?}"
    );
}

async fn reingesting_keeps_unchanged_documents_and_replaces_changed_ones(backend: Backend) {
    let home = Home::new(backend).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let folder = [
        (
            "/home/alice/notes/vellacorn.md",
            "text/markdown",
            field_notes(),
        ),
        ("/home/alice/notes/tides.md", "text/markdown", TIDES.into()),
        ("/home/alice/notes/ferry.html", "text/html", FERRY.into()),
    ];
    let mut first = Vec::new();
    for (source, content_type, text) in &folder {
        let (status, document) = upload_file(&app, &alice, source, content_type, text).await;
        assert_eq!(status, StatusCode::CREATED, "{document}");
        assert_eq!(document["status"], "created", "{document}");
        assert_eq!(document["source"], *source);
        assert_eq!(document["content_hash"], sha256_hex(text));
        first.push(document);
    }
    let tides = first[1].clone();
    app.wait_indexed().await;
    let chunks_before = chunk_memories(&app, &alice).await;
    let total: i64 = first.iter().map(|d| d["chunks"].as_i64().unwrap()).sum();
    assert!(total >= 5, "{first:?}");
    assert_eq!(chunks_before.len() as i64, total);

    // The same folder again: every document is unchanged and nothing is written at all.
    let log_head = app
        .state
        .store
        .maintenance()
        .memory_log_head()
        .await
        .unwrap();
    for ((source, content_type, text), before) in folder.iter().zip(&first) {
        let (status, document) = upload_file(&app, &alice, source, content_type, text).await;
        assert_eq!(status, StatusCode::OK, "{document}");
        assert_eq!(document["status"], "unchanged", "{document}");
        for field in [
            "id",
            "title",
            "chunks",
            "chars",
            "content_hash",
            "created_at",
        ] {
            assert_eq!(document[field], before[field], "{field}: {document}");
        }
    }
    assert_eq!(
        app.state
            .store
            .maintenance()
            .memory_log_head()
            .await
            .unwrap(),
        log_head,
        "an unchanged document writes no memory"
    );
    assert_eq!(app.list_documents(&alice).await.len(), 3);
    assert_eq!(
        ids_of(&chunk_memories(&app, &alice).await),
        ids_of(&chunks_before)
    );
    // Recall finds each chunk once.
    for query in [
        "Pellwick harbour tide tables lower quay",
        "Vellacorn lighthouse keeper's log fog horn lamp oil",
        "Quillfeather moth-whales migrate to Orrin Deep",
    ] {
        let recalled = recall(
            &app,
            &alice,
            json!({ "query": query, "kinds": ["document"], "k": 50 }),
        )
        .await;
        assert!(!recalled.is_empty(), "{query}");
        each_once(&recalled);
    }

    // A changed file replaces its document's chunks: same id, new text, old text gone.
    let (status, replaced) = upload_file(
        &app,
        &alice,
        "/home/alice/notes/tides.md",
        "text/markdown",
        TIDES_REVISED,
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{replaced}");
    assert_eq!(replaced["status"], "replaced");
    assert_eq!(replaced["id"], tides["id"]);
    assert_eq!(replaced["title"], "Pellwick tides, revised");
    assert_eq!(replaced["content_hash"], sha256_hex(TIDES_REVISED));
    assert_eq!(replaced["created_at"], tides["created_at"]);
    app.wait_indexed().await;
    let chunks_after = chunk_memories(&app, &alice).await;
    let (new_tides, others_after): (Vec<Value>, Vec<Value>) = chunks_after
        .into_iter()
        .partition(|memory| chunk_of_document(memory, &tides));
    let others_before: Vec<Value> = chunks_before
        .iter()
        .filter(|memory| !chunk_of_document(memory, &tides))
        .cloned()
        .collect();
    assert_eq!(
        ids_of(&others_after),
        ids_of(&others_before),
        "the other documents' chunks are untouched"
    );
    assert_eq!(new_tides.len() as i64, replaced["chunks"].as_i64().unwrap());
    assert!(
        new_tides
            .iter()
            .all(|memory| memory["content"].as_str().unwrap().contains("Quendrix")),
        "{new_tides:?}"
    );
    assert!(ids_of(&new_tides).is_disjoint(&ids_of(&chunks_before)));
    for mode in ["keyword", "vector", "hybrid"] {
        let old = recall(
            &app,
            &alice,
            json!({
                "query": "Zorblat spring tide peaks at dawn and floods the lower quay",
                "kinds": ["document"], "mode": mode, "k": 50,
            }),
        )
        .await;
        assert!(
            old.iter()
                .all(|memory| !memory["content"].as_str().unwrap().contains("Zorblat")),
            "{mode}: {old:?}"
        );
        each_once(&old);
        let new = recall(
            &app,
            &alice,
            json!({
                "query": "Quendrix neap tide peaks at dusk",
                "kinds": ["document"], "mode": mode, "k": 50,
            }),
        )
        .await;
        assert!(
            new.iter()
                .any(|memory| memory["content"].as_str().unwrap().contains("Quendrix")),
            "{mode}: {new:?}"
        );
    }
    assert_eq!(app.list_documents(&alice).await.len(), 3);

    // Users are isolated: bob's file with alice's source and content is his own document.
    let (status, bobs) = upload_file(
        &app,
        &bob,
        "/home/alice/notes/tides.md",
        "text/markdown",
        TIDES_REVISED,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{bobs}");
    assert_eq!(bobs["status"], "created");
    assert_ne!(bobs["id"], tides["id"]);
    assert_eq!(app.list_documents(&alice).await.len(), 3);
    assert_eq!(app.list_documents(&bob).await.len(), 1);

    // The same content under another source is a document of its own.
    let (status, copy) = upload_file(
        &app,
        &alice,
        "/home/alice/backup/tides.md",
        "text/markdown",
        TIDES_REVISED,
    )
    .await;
    assert_eq!(status, StatusCode::CREATED, "{copy}");
    assert_ne!(copy["id"], tides["id"]);

    // Without a source, the content identifies the document: the same upload twice is one.
    let loose =
        json!({ "title": "Loose note", "content": "Pellwick gulls nest on the chapel roof." });
    let (status, created) = app.ingest_document(&alice, loose.clone()).await;
    assert_eq!(status, StatusCode::CREATED, "{created}");
    assert_eq!(created["status"], "created");
    let (status, again) = app.ingest_document(&alice, loose).await;
    assert_eq!(status, StatusCode::OK, "{again}");
    assert_eq!(again["status"], "unchanged");
    assert_eq!(again["id"], created["id"]);
    assert_eq!(app.list_documents(&alice).await.len(), 5);

    // The API reference states what an ingest answers.
    let (status, spec) = app.get("/openapi.json", None).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        spec["components"]["schemas"]["IngestStatus"]["enum"],
        json!(["created", "unchanged", "replaced"])
    );
    let responses = &spec["paths"]["/v1/documents"]["post"]["responses"];
    for code in ["200", "201"] {
        assert!(
            responses[code].to_string().contains("IngestedDocument"),
            "{code}: {responses}"
        );
    }
    app.stop_and_release().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn reingesting_keeps_unchanged_documents_and_replaces_changed_ones_on(
    #[case] backend: Backend,
) {
    reingesting_keeps_unchanged_documents_and_replaces_changed_ones(backend).await;
}

/// Two ingests of one file at once make one document with one set of chunks, whether the
/// document is new or changed; both answer with that document.
async fn concurrent_ingests_of_one_file_make_one_document(backend: Backend) {
    use mnemo::documents::{self, IngestStatus, NewUpload};
    let home = Home::new(backend).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("carol").await;
    let carol = user_id(&app, "carol").await;
    let upload = |text: String| NewUpload {
        title: None,
        source: Some("/home/carol/vellacorn.md".into()),
        content_type: "text/markdown".into(),
        bytes: text.into_bytes(),
    };
    let revised = field_notes().replace("Orrin Deep", "the Sunken Stair");
    for (round, text) in [field_notes(), revised].into_iter().enumerate() {
        let memory = &app.state.memory;
        let (a, b) = tokio::join!(
            documents::ingest(memory, carol, upload(text.clone())),
            documents::ingest(memory, carol, upload(text.clone())),
        );
        let (a, b) = (a.expect("first ingest"), b.expect("second ingest"));
        assert_eq!(a.document.id, b.document.id, "round {round}");
        let wrote = [a.status, b.status]
            .iter()
            .filter(|status| **status != IngestStatus::Unchanged)
            .count();
        assert!(wrote >= 1, "round {round}: {a:?} {b:?}");
        let listed = app.list_documents(&key).await;
        assert_eq!(listed.len(), 1, "round {round}: {listed:?}");
        let state = app
            .state
            .store
            .user(carol)
            .document_state(a.document.id)
            .await
            .unwrap();
        assert!(state.complete, "round {round}: {state:?}");
        let chunks = chunk_memories(&app, &key).await;
        assert_eq!(chunks.len() as i64, state.document.chunks, "round {round}");
        each_once(&chunks);
        let joined: String = chunks
            .iter()
            .map(|memory| memory["content"].as_str().unwrap())
            .collect();
        assert_eq!(
            joined.contains("Sunken Stair"),
            round == 1,
            "round {round}: {joined}"
        );
        assert_eq!(joined.contains("Orrin Deep"), round == 0, "round {round}");
        // And once it is in, ingests of it at once are all no-ops.
        let (c, d) = tokio::join!(
            documents::ingest(memory, carol, upload(text.clone())),
            documents::ingest(memory, carol, upload(text)),
        );
        assert_eq!(c.unwrap().status, IngestStatus::Unchanged);
        assert_eq!(d.unwrap().status, IngestStatus::Unchanged);
        assert_eq!(ids_of(&chunk_memories(&app, &key).await), ids_of(&chunks));
    }
    app.stop_and_release().await;
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn concurrent_ingests_of_one_file_make_one_document_on(#[case] backend: Backend) {
    concurrent_ingests_of_one_file_make_one_document(backend).await;
}

/// `mnemo` on a data directory (and a database URL when given), with the test model.
fn mnemo_cli(data_dir: &std::path::Path, database_url: Option<&str>) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_mnemo"));
    command
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("MNEMO__DATABASE__URL")
        .env("MNEMO__LOG__LEVEL", "warn")
        .env("MNEMO__EMBEDDER__MODEL_DIR", support::model_dir());
    if let Some(url) = database_url {
        command.env("MNEMO__DATABASE__URL", url);
    }
    command
}

/// `mnemo ingest --user erin PATH`: stdout's lines as (id, status, path), and stderr.
fn cli_ingest(
    data: &std::path::Path,
    url: Option<&str>,
    path: &std::path::Path,
) -> (Vec<(String, String, String)>, String) {
    let output = mnemo_cli(data, url)
        .args(["ingest", "--user", "erin"])
        .arg(path)
        .output()
        .unwrap();
    let stdout = String::from_utf8(output.stdout).unwrap();
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(output.status.success(), "{stdout}\n{stderr}");
    // `<id>  <n> chunks  <status>  <path>`
    let lines = stdout
        .lines()
        .map(|line| {
            let fields: Vec<&str> = line.split("  ").collect();
            assert_eq!(fields.len(), 4, "{line}");
            (
                fields[0].to_string(),
                fields[2].to_string(),
                fields[3].to_string(),
            )
        })
        .collect();
    (lines, stderr)
}

/// The user's chunk memories, through `mnemo memory list`.
fn cli_chunks(data: &std::path::Path, url: Option<&str>) -> Vec<Value> {
    let output = mnemo_cli(data, url)
        .args([
            "memory", "list", "--user", "erin", "--kinds", "document", "--limit", "500", "--json",
        ])
        .output()
        .unwrap();
    assert!(output.status.success(), "{output:?}");
    let listed: Value = serde_json::from_slice(&output.stdout).unwrap();
    listed.as_array().cloned().unwrap_or_default()
}

/// Ingesting a folder twice with `mnemo ingest` (embedded) leaves it as it was; after one file
/// changes, a third run replaces that file's chunks only.
async fn ingesting_a_folder_again_writes_only_what_changed(backend: Backend) {
    let dir = tempfile::tempdir().unwrap();
    let url = match backend {
        Backend::Sqlite => None,
        Backend::Postgres => Some(support::databases::fresh_postgres_url().await),
    };
    let url = url.as_deref();
    let data = dir.path().join("data");
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(docs.join("nested")).unwrap();
    std::fs::write(docs.join("vellacorn.md"), field_notes()).unwrap();
    std::fs::write(docs.join("nested/tides.md"), TIDES).unwrap();
    let added = mnemo_cli(&data, url)
        .args(["user", "add", "erin"])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");

    let (first, stderr) = cli_ingest(&data, url, &docs);
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first.iter().all(|(_, status, _)| status == "created"),
        "{first:?}"
    );
    assert!(stderr.contains("2 created"), "{stderr}");
    let chunks_before = cli_chunks(&data, url);
    assert!(chunks_before.len() >= 4, "{chunks_before:?}");

    // Again, through another spelling of the same folder: the canonical paths match.
    let (second, stderr) = cli_ingest(&data, url, &docs.join("nested").join(".."));
    assert_eq!(second.len(), 2, "{second:?}");
    for ((id, status, _), (first_id, _, _)) in second.iter().zip(&first) {
        assert_eq!(status, "unchanged", "{second:?}");
        assert_eq!(id, first_id);
    }
    assert!(stderr.contains("2 unchanged"), "{stderr}");
    let chunks_again = cli_chunks(&data, url);
    assert_eq!(ids_of(&chunks_again), ids_of(&chunks_before));
    each_once(&chunks_again);

    // One file changes: its chunks are replaced, the other file's stay.
    std::fs::write(docs.join("nested/tides.md"), TIDES_REVISED).unwrap();
    let (third, _) = cli_ingest(&data, url, &docs);
    let status_of = |suffix: &str| {
        third
            .iter()
            .find(|(_, _, path)| path.ends_with(suffix))
            .unwrap_or_else(|| panic!("{suffix} in {third:?}"))
            .clone()
    };
    let tides = status_of("tides.md");
    assert_eq!(tides.1, "replaced", "{third:?}");
    assert_eq!(status_of("vellacorn.md").1, "unchanged", "{third:?}");
    assert!(first.iter().any(|(id, _, _)| *id == tides.0), "same id");
    let chunks_after = cli_chunks(&data, url);
    each_once(&chunks_after);
    let contents: Vec<&str> = chunks_after
        .iter()
        .map(|memory| memory["content"].as_str().unwrap())
        .collect();
    assert!(
        contents.iter().all(|text| !text.contains("Zorblat")),
        "{contents:?}"
    );
    assert_eq!(
        contents
            .iter()
            .filter(|text| text.contains("Quendrix"))
            .count(),
        1,
        "{contents:?}"
    );
    let kept = ids_of(&chunks_before)
        .intersection(&ids_of(&chunks_after))
        .count();
    assert_eq!(
        kept,
        chunks_before.len() - 1,
        "only the tides chunk was replaced"
    );
    assert_eq!(chunks_after.len(), chunks_before.len());
}

#[rstest::rstest]
#[case::sqlite(Backend::Sqlite)]
#[case::postgres(Backend::Postgres)]
#[tokio::test]
async fn ingesting_a_folder_again_writes_only_what_changed_on(#[case] backend: Backend) {
    ingesting_a_folder_again_writes_only_what_changed(backend).await;
}

/// A one-page PDF with `lines` of text in a standard font.
fn pdf(lines: &[&str]) -> Vec<u8> {
    use lopdf::content::{Content, Operation};
    use lopdf::{Object, Stream, dictionary};
    let mut document = lopdf::Document::with_version("1.5");
    let pages_id = document.new_object_id();
    let font_id = document.add_object(dictionary! {
        "Type" => "Font",
        "Subtype" => "Type1",
        "BaseFont" => "Helvetica",
    });
    let resources_id = document.add_object(dictionary! {
        "Font" => dictionary! { "F1" => font_id },
    });
    let mut operations = vec![
        Operation::new("BT", vec![]),
        Operation::new("Tf", vec!["F1".into(), 12.into()]),
        Operation::new("TL", vec![16.into()]),
        Operation::new("Td", vec![50.into(), 780.into()]),
    ];
    for line in lines {
        operations.push(Operation::new("Tj", vec![Object::string_literal(*line)]));
        operations.push(Operation::new("T*", vec![]));
    }
    operations.push(Operation::new("ET", vec![]));
    let content = Content { operations };
    one_page_pdf(
        document,
        pages_id,
        resources_id,
        Stream::new(dictionary! {}, content.encode().expect("content")),
    )
}

/// A one-page PDF whose page content is one FlateDecode stream that inflates to `expanded`
/// bytes of blanks (a few KB on the wire).
fn pdf_bomb(expanded: usize) -> Vec<u8> {
    use lopdf::{Stream, dictionary};
    let mut document = lopdf::Document::with_version("1.5");
    let pages_id = document.new_object_id();
    let resources_id = document.add_object(dictionary! {});
    let mut stream = Stream::new(dictionary! {}, vec![b' '; expanded]);
    stream.compress().expect("compress");
    assert!(stream.content.len() < expanded / 100, "compressed");
    one_page_pdf(document, pages_id, resources_id, stream)
}

fn one_page_pdf(
    mut document: lopdf::Document,
    pages_id: lopdf::ObjectId,
    resources_id: lopdf::ObjectId,
    content: lopdf::Stream,
) -> Vec<u8> {
    use lopdf::{Object, dictionary};
    let content_id = document.add_object(content);
    let page_id = document.add_object(dictionary! {
        "Type" => "Page",
        "Parent" => pages_id,
        "Contents" => content_id,
    });
    document.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages",
            "Kids" => vec![page_id.into()],
            "Count" => 1,
            "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = document.add_object(dictionary! {
        "Type" => "Catalog",
        "Pages" => pages_id,
    });
    document.trailer.set("Root", catalog_id);
    let mut bytes = Vec::new();
    document.save_to(&mut bytes).expect("save pdf");
    bytes
}

#[tokio::test]
async fn pdf_documents_are_extracted_and_searchable() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("carol").await;
    let bytes = pdf(&[
        "Zentrovian glassblowers anneal their lanterns",
        "in kilns fired with driftwood from Pellwick shore.",
    ]);
    let (status, document) = app
        .upload_document(&key, Some("application/pdf"), bytes, "title=Glass%20notes")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    assert_eq!(document["title"], "Glass notes");
    assert_eq!(document["content_type"], "application/pdf");
    assert_eq!(document["chunks"], 1);
    app.wait_indexed().await;
    let carol = user_id(&app, "carol").await;
    let hits = local(&app)
        .search(carol, "how do Zentrovian glassblowers anneal lanterns", 5)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    let text = hits[0].content.as_deref().unwrap();
    assert!(
        text.contains("Zentrovian") && text.contains("Pellwick"),
        "{text}"
    );
    app.stop_and_release().await;
}

/// Hostile documents: HTML nested 20,000 deep (it overflowed the stack of a recursive walk
/// and aborted the process) is read, and a PDF that inflates to 40 MiB is refused with 413
/// before it is parsed.
#[tokio::test]
async fn hostile_documents_neither_crash_nor_exhaust_the_server() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("erin").await;
    let depth = 20_000;
    let html = format!(
        "<html><body>{}<p>Quillfeather otters nest under the Marrowby bridge.</p>{}</body></html>",
        "<div>".repeat(depth),
        "</div>".repeat(depth)
    );
    let (status, document) = app
        .upload_document(&key, Some("text/html"), html.into_bytes(), "")
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    app.wait_indexed().await;
    let erin = user_id(&app, "erin").await;
    let hits = local(&app)
        .search(erin, "where do Quillfeather otters nest", 5)
        .await
        .unwrap();
    assert_eq!(hits.len(), 1, "{hits:?}");
    assert!(
        hits[0]
            .content
            .as_deref()
            .unwrap_or("")
            .contains("Marrowby bridge"),
        "{hits:?}"
    );

    let (status, body) = app
        .upload_document(&key, Some("application/pdf"), pdf_bomb(40 << 20), "")
        .await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let message = body["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("expands to more than 32 MiB"), "{body}");
    // The server is still there, and the refused PDF left no document behind.
    assert_eq!(app.list_documents(&key).await.len(), 1);
    app.stop_and_release().await;
}

#[tokio::test]
async fn client_mistakes_are_clear_4xx_errors() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let key = app.user_key("dave").await;
    let message = |body: &Value| body["error"]["message"].as_str().unwrap_or("").to_string();

    let (status, body) = app
        .ingest_document(&key, json!({ "content": "   \n  " }))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("empty"), "{body}");

    let (status, body) = app
        .upload_document(&key, Some("image/png"), b"\x89PNG\r\n".to_vec(), "")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        message(&body).contains("unsupported content type"),
        "{body}"
    );

    let (status, body) = app
        .upload_document(
            &key,
            Some("application/pdf"),
            b"%PDF-1.4 broken".to_vec(),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("PDF"), "{body}");

    let (status, body) = app
        .upload_document(&key, None, b"some text".to_vec(), "")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("Content-Type"), "{body}");

    let (status, body) = app
        .upload_document(&key, Some("application/json"), b"{not json".to_vec(), "")
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("invalid document body"), "{body}");

    let (status, body) = app
        .ingest_document(
            &key,
            json!({ "content": "x", "content_type": "application/pdf" }),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(
        message(&body).contains("content_type must be one of"),
        "{body}"
    );

    let (status, _) = app
        .ingest_document(&key, json!({ "content": "x", "owner": "someone-else" }))
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);

    let (status, body) = app
        .upload_document(
            &key,
            Some("text/html"),
            b"<html><script>only()</script><style>p{}</style></html>".to_vec(),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(message(&body).contains("no text"), "{body}");

    let (status, _) = app.get("/v1/documents?limit=0", Some(&key)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(
        app.delete_document(&key, "not-a-uuid").await,
        StatusCode::BAD_REQUEST
    );
    assert_eq!(
        app.delete_document(&key, &uuid::Uuid::now_v7().to_string())
            .await,
        StatusCode::NOT_FOUND
    );
    let (status, _) = app.get("/v1/documents", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    assert!(app.list_documents(&key).await.is_empty());
    app.stop_and_release().await;
}

/// `n` bytes of text-showing operators (`(A) Tj`) in a text object: extraction cost about
/// 400 MB of memory per MiB of them.
fn text_operators(n: usize) -> Vec<u8> {
    let mut content = b"BT /F1 12 Tf 50 780 Td ".to_vec();
    while content.len() < n {
        content.extend_from_slice(b"(A) Tj ");
    }
    content.extend_from_slice(b"ET");
    content
}

fn zlib(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    encoder.write_all(bytes).unwrap();
    encoder.finish().unwrap()
}

/// ASCII85 (Adobe), as a PDF filter reads it.
fn ascii85(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 5 / 4 + 8);
    for chunk in bytes.chunks(4) {
        let mut group = [0u8; 4];
        group[..chunk.len()].copy_from_slice(chunk);
        let value = u32::from_be_bytes(group);
        if value == 0 && chunk.len() == 4 {
            out.push(b'z');
            continue;
        }
        let mut digits = [0u8; 5];
        let mut rest = value;
        for digit in digits.iter_mut().rev() {
            *digit = (rest % 85) as u8 + b'!';
            rest /= 85;
        }
        out.extend_from_slice(&digits[..chunk.len() + 1]);
    }
    out.extend_from_slice(b"~>");
    out
}

/// A one-page PDF whose page lists `content` `refs` times in its `/Contents`.
fn pdf_with_contents(content: lopdf::Stream, refs: usize) -> Vec<u8> {
    use lopdf::{Object, dictionary};
    let mut document = lopdf::Document::with_version("1.5");
    let pages_id = document.new_object_id();
    let font_id = document.add_object(dictionary! {
        "Type" => "Font", "Subtype" => "Type1", "BaseFont" => "Helvetica",
    });
    let resources_id = document.add_object(dictionary! {
        "Font" => dictionary! { "F1" => font_id },
    });
    let content_id = document.add_object(content);
    let contents: Vec<Object> = (0..refs).map(|_| content_id.into()).collect();
    let page_id = document.add_object(dictionary! {
        "Type" => "Page", "Parent" => pages_id, "Contents" => contents,
    });
    document.objects.insert(
        pages_id,
        Object::Dictionary(dictionary! {
            "Type" => "Pages", "Kids" => vec![page_id.into()], "Count" => 1,
            "Resources" => resources_id,
            "MediaBox" => vec![0.into(), 0.into(), 595.into(), 842.into()],
        }),
    );
    let catalog_id = document.add_object(dictionary! { "Type" => "Catalog", "Pages" => pages_id });
    document.trailer.set("Root", catalog_id);
    let mut bytes = Vec::new();
    document.save_to(&mut bytes).expect("save pdf");
    bytes
}

/// Each of these small files killed the server (OOM, or minutes of CPU) through the 32 MiB
/// inflation check and the nesting scan: a filter chain the check could not inflate, a
/// content stream marked as an image, one stream listed many times in `/Contents`, text
/// operators within the limit, an HTML page whose parse clones formatting elements into
/// every paragraph, and nesting hidden from the scan by `<!-->`. They are now read by a
/// worker process under memory and CPU ceilings: each is refused with 413, nothing is stored,
/// and the server goes on answering.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_past_the_extraction_ceilings_are_refused_and_the_server_lives() {
    use lopdf::{Object, Stream, dictionary};
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            ("MNEMO__EXTRACT__MEMORY_MB", "256"),
            ("MNEMO__EXTRACT__CPU_SECS", "3"),
        ],
    )
    .await;
    let key = app.user_key("mallory").await;
    let flate = |bytes: &[u8]| {
        Stream::new(dictionary! { "Filter" => "FlateDecode" }, zlib(bytes)).with_compression(false)
    };
    let chain = Stream::new(
        dictionary! { "Filter" => vec![Object::from("ASCII85Decode"), Object::from("FlateDecode")] },
        ascii85(&zlib(&text_operators(40 << 20))),
    )
    .with_compression(false);
    let image = Stream::new(
        dictionary! { "Subtype" => "Image", "Filter" => "FlateDecode" },
        zlib(&text_operators(40 << 20)),
    )
    .with_compression(false);
    let cases: Vec<(&str, &str, Vec<u8>)> = vec![
        (
            "filter chain",
            "application/pdf",
            pdf_with_contents(chain, 1),
        ),
        (
            "content marked as an image",
            "application/pdf",
            pdf_with_contents(image, 1),
        ),
        (
            "one stream listed 64 times",
            "application/pdf",
            pdf_with_contents(flate(&text_operators(1 << 20)), 64),
        ),
        (
            "text operators within the inflation limit",
            "application/pdf",
            pdf_with_contents(flate(&text_operators(4 << 20)), 1),
        ),
        (
            "formatting elements cloned into every paragraph",
            "text/html",
            support::research_site::formatting_bomb(6_000).into_bytes(),
        ),
        (
            "nesting hidden by <!-->",
            "text/html",
            format!("<!-->{}x", "<div>".repeat(200_000)).into_bytes(),
        ),
    ];
    for (name, content_type, bytes) in cases {
        assert!(bytes.len() < 2 << 20, "{name}: {} bytes", bytes.len());
        let (status, body) = app
            .upload_document(&key, Some(content_type), bytes, "")
            .await;
        assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{name}: {body}");
        let message = body["error"]["message"].as_str().unwrap_or("");
        assert!(
            message.contains("MiB of memory")
                || message.contains("s of CPU")
                || message.contains("took longer")
                || message.contains("expands to more than"),
            "{name}: {body}"
        );
        // The server answers between two hostile files.
        let (status, _) = app.get("/v1/threads", Some(&key)).await;
        assert_eq!(status, StatusCode::OK, "{name}");
    }
    assert!(app.list_documents(&key).await.is_empty());
    // A normal document still goes through the same worker.
    let (status, document) = app
        .upload_document(
            &key,
            Some("application/pdf"),
            pdf(&["Kelp forests shelter otters."]),
            "",
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    app.stop_and_release().await;
}

/// Markup soups and damaged PDFs through the extraction worker, the ceiling asserted: each is
/// read within the ceiling, or refused as too large or unreadable; the worker never fails in
/// another way, and the largest cost of a document that was read is printed.
#[test]
fn fuzzed_documents_are_read_within_the_ceiling_or_refused() {
    use mnemo::text::extract::{self, ExtractError};
    use proptest::prelude::*;
    const PIECES: &[&str] = &[
        "<p>",
        "</p>",
        "<b>",
        "</b>",
        "<i>",
        "<div>",
        "</div>",
        "<span>",
        "</span>",
        "<table>",
        "<td>",
        "<tr>",
        "<!--",
        "-->",
        "<!-->",
        "<script>",
        "</script>",
        "<a href=x>",
        "</a>",
        "&amp;",
        "text ",
        "文字",
        "<br>",
        "<li>",
        "<font>",
        "<nobr>",
        "<svg>",
        "<template>",
    ];
    let memory_mb = 256u64;
    extract::configure(&mnemo::config::ExtractSettings {
        worker: Some(env!("CARGO_BIN_EXE_mnemo").into()),
        memory_mb,
        cpu_secs: 4,
        ..Default::default()
    });
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let html =
        proptest::collection::vec((0..PIECES.len(), 1usize..3_000), 1..24).prop_map(|runs| {
            let text: String = runs
                .iter()
                .map(|(piece, times)| PIECES[*piece].repeat(*times))
                .collect();
            ("text/html", text.into_bytes())
        });
    let valid = pdf(&["Kelp forests shelter otters.", "Tides turn twice a day."]);
    let length = valid.len();
    let damaged =
        proptest::collection::vec((0..length, any::<u8>()), 1..12).prop_map(move |edits| {
            let mut bytes = valid.clone();
            for (at, byte) in edits {
                bytes[at] = byte;
            }
            ("application/pdf", bytes)
        });
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig::with_cases(40));
    let largest = std::sync::Mutex::new((0u64, 0u64));
    runner
        .run(&prop_oneof![html, damaged], |(content_type, bytes)| {
            match runtime.block_on(extract::extract_with_cost(content_type, bytes)) {
                Ok((_, cost)) => {
                    prop_assert!(cost.peak_rss_kib <= memory_mb * 1024, "{cost:?}");
                    let mut largest = largest.lock().unwrap();
                    largest.0 = largest.0.max(cost.peak_rss_kib);
                    largest.1 = largest.1.max(cost.cpu_ms);
                }
                Err(ExtractError::Worker(message)) => {
                    prop_assert!(false, "the worker failed: {message}");
                }
                Err(_) => {}
            }
            Ok(())
        })
        .unwrap();
    let (rss, cpu) = *largest.lock().unwrap();
    eprintln!("largest fuzzed document read: {rss} KiB resident, {cpu} ms CPU");
}
