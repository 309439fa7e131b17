//! The user's own documents through the HTTP API, against the real app, the real local
//! embedding model and both indexes: ingestion (JSON, raw HTML, PDF), the `local` search
//! provider finding the right chunk, isolation between users, document chunks kept out of
//! ordinary memory recall and lists, deletion removing the chunks, and client mistakes.

use crate::support;

use std::sync::Arc;
use std::time::Duration;

use mnemo::search::{self, SearchHit, SearchProvider};
use mnemo::store::UserId;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Backend, Home, TestApp};

const INDEX_WAIT: Duration = Duration::from_secs(60);

async fn wait_recallable(app: &TestApp) {
    assert!(
        app.state
            .memory
            .wait_recallable(INDEX_WAIT)
            .await
            .expect("memory log head"),
        "chunks were not indexed within {INDEX_WAIT:?}"
    );
}

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
        app.state.memory.clone(),
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
    wait_recallable(&app).await;

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
    assert_eq!(chunk["trust"], "user");
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

    // Deleting the document deletes its chunks from SQL and from both indexes.
    assert_eq!(
        app.delete_document(&alice, &notes_id).await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        app.delete_document(&alice, &notes_id).await,
        StatusCode::NOT_FOUND
    );
    wait_recallable(&app).await;
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
    wait_recallable(&app).await;
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
    wait_recallable(&app).await;
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
