//! Research people can steer and keep, end to end on the extractive path (no model) against the
//! fake web: follow-ups linked in history, report options, domain filters, the user's documents
//! and the web in one research, and exports read back (Markdown; DOCX unzipped; PDF through
//! `pdftotext`, Chinese included).

use crate::support;
use crate::support::research_site;

use std::time::Duration;

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::{Backend, Home, ReceivedEvent, SseReader, TestApp};

use research_site::ResearchSite;

async fn spawn(home: &Home, site: &ResearchSite) -> TestApp {
    let env = site.env();
    let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    TestApp::spawn_with(home, &borrowed).await
}

/// Posts a research request to `path` and reads its stream to the end.
async fn run(app: &TestApp, token: &str, path: &str, body: Value) -> Vec<ReceivedEvent> {
    let response = app
        .client
        .post(app.url(path))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("research request");
    let status = response.status();
    if status != StatusCode::OK {
        let body = response.text().await.unwrap_or_default();
        panic!("POST {path} answered {status}: {body}");
    }
    SseReader::new(response).collect().await
}

fn research_id(events: &[ReceivedEvent]) -> String {
    events[0].data["research_id"]
        .as_str()
        .expect("a research id")
        .to_string()
}

fn complete(events: &[ReceivedEvent]) -> Value {
    events
        .iter()
        .find(|e| e.event == "research_complete")
        .unwrap_or_else(|| panic!("no research_complete: {events:?}"))
        .data
        .clone()
}

fn urls(sources: &Value) -> Vec<String> {
    sources
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["url"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follow_up_starts_from_the_earlier_research_and_history_links_both() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;

    let first = run(
        &app,
        &alice,
        "/research/stream",
        json!({ "query": "Why do spring tides happen at full moon?" }),
    )
    .await;
    assert_eq!(first.last().unwrap().data["status"], "completed");
    let earlier = research_id(&first);
    let (_, record) = app.get(&format!("/research/{earlier}"), Some(&alice)).await;
    let earlier_urls = urls(&record["sources"]);
    assert!(
        record["sources"][0]["excerpt"].as_str().unwrap().len() > 40,
        "the stored sources keep what was read: {record}"
    );

    // Another user's research, or none, cannot be followed up.
    for (token, id) in [
        (&bob, earlier.as_str()),
        (&alice, "0190e1c6-0000-7000-8000-000000000000"),
    ] {
        let (status, body) = app
            .post(
                &format!("/research/{id}/follow-up"),
                Some(token),
                Some(json!({ "query": "and neap tides?" })),
            )
            .await;
        assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    }

    let follow = run(
        &app,
        &alice,
        &format!("/research/{earlier}/follow-up"),
        json!({ "query": "How far apart are high tides in a harbour?" }),
    )
    .await;
    assert_eq!(
        follow.last().unwrap().data["status"],
        "completed",
        "{follow:?}"
    );
    let later = research_id(&follow);
    // The earlier sources were announced as this research's starting point.
    let seeded = follow
        .iter()
        .find(|e| {
            e.event == "sources_found" && e.data["metadata"]["follow_up_of"] == earlier.as_str()
        })
        .unwrap_or_else(|| panic!("no sources of the earlier research: {follow:?}"));
    assert_eq!(urls(&seeded.data["sources"]).len(), earlier_urls.len());
    let (_, record) = app.get(&format!("/research/{later}"), Some(&alice)).await;
    assert_eq!(record["config"]["follow_up_of"], earlier.as_str());
    // It found the harbour page and kept a source of the earlier research citable.
    let later_urls = urls(&record["sources"]);
    assert!(
        later_urls.iter().any(|u| u.ends_with("/page/harbours")),
        "{later_urls:?}"
    );
    assert!(
        later_urls.iter().any(|u| earlier_urls.contains(u)),
        "{later_urls:?} ∩ {earlier_urls:?}"
    );
    let report = record["report"].as_str().unwrap();
    assert!(
        report.contains("twelve hours and twenty-five minutes"),
        "{report}"
    );

    let (_, history) = app.get("/research/history", Some(&alice)).await;
    let item = |id: &str| {
        history["research"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap()
    };
    assert_eq!(item(&later)["follow_up_of"], earlier.as_str());
    assert_eq!(item(&earlier)["follow_ups"], json!([later]));
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn report_options_shape_the_digest_and_domain_filters_keep_sources_out() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site).await;
    let alice = app.user_key("alice").await;

    // Options are checked.
    for (body, says) in [
        (
            json!({ "query": "q", "report": { "type": "poem" } }),
            "report.type",
        ),
        (
            json!({ "query": "q", "report": { "words": 20 } }),
            "report.words",
        ),
        (
            json!({ "query": "q", "include_domains": ["not a domain"] }),
            "include_domains",
        ),
        (
            json!({ "query": "q", "search_api": ["searxng", "altavista"] }),
            "altavista",
        ),
    ] {
        let (status, error) = app.post("/research/stream", Some(&alice), Some(body)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
        assert!(error.to_string().contains(says), "{says}: {error}");
    }

    // An outline: the first sentence of each passage, one line each.
    let events = run(
        &app,
        &alice,
        "/research/stream",
        json!({
            "query": "Why do spring tides happen at full moon?",
            "report": { "type": "outline", "words": 100, "tone": "plain", "language": "English" },
            "remember": false,
        }),
    )
    .await;
    let done = complete(&events);
    let report = done["content"].as_str().unwrap();
    let body = report.split("## Sources").next().unwrap();
    let points: Vec<&str> = body.lines().filter(|l| l.starts_with("- ")).collect();
    assert!(!points.is_empty(), "{report}");
    // About the length asked for: points stop once 100 words are written.
    let words: usize = points.iter().map(|p| p.split_whitespace().count()).sum();
    assert!(words <= 140, "{words} words: {report}");
    for point in &points {
        let text = point.trim_start_matches("- ");
        let text = text.split(" [").next().unwrap();
        assert_eq!(
            text.matches(". ").count(),
            0,
            "one sentence per point: {point}"
        );
    }
    let (_, record) = app
        .get(&format!("/research/{}", research_id(&events)), Some(&alice))
        .await;
    assert_eq!(record["config"]["report"]["type"], "outline");
    assert_eq!(record["config"]["report"]["words"], 100);

    // The fake web is on 127.0.0.1: excluding it leaves no source, and the research says so.
    let events = run(
        &app,
        &alice,
        "/research/stream",
        json!({ "query": "Why do spring tides happen at full moon?", "exclude_domains": ["127.0.0.1"] }),
    )
    .await;
    assert_eq!(events.last().unwrap().data["status"], "failed");
    assert!(
        events
            .iter()
            .filter(|e| e.event == "sources_found")
            .all(|e| e.data["sources"] == json!([])),
        "no excluded source is listed"
    );
    assert!(
        events
            .iter()
            .filter(|e| e.event == "sources_found")
            .any(|e| e.data["metadata"]["excluded_by_domain"].as_u64() > Some(0))
    );
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_users_documents_and_the_web_in_one_research_each_source_labelled() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site).await;
    let alice = app.user_key("alice").await;
    let (status, document) = app
        .ingest_document(
            &alice,
            json!({
                "content": "# Harbour log\n\nAt Port Vellacorn the spring tides of the full moon flooded the lower quay twice in March, our harbour log records.",
                "source": "notes/harbour-log.md",
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    app.wait_indexed().await;
    let events = run(
        &app,
        &alice,
        "/research/stream",
        json!({ "query": "spring tides at full moon", "search_api": ["local", "searxng"], "remember": false }),
    )
    .await;
    let done = complete(&events);
    let sources = done["metadata"]["sources"].as_array().unwrap().clone();
    let providers: Vec<&str> = sources
        .iter()
        .filter_map(|s| s["provider"].as_str())
        .collect();
    assert!(providers.contains(&"local"), "{sources:?}");
    assert!(providers.contains(&"searxng"), "{sources:?}");
    let report = done["content"].as_str().unwrap();
    assert!(report.contains("(your documents)"), "{report}");
    assert!(report.contains("(searxng)"), "{report}");
    let (_, record) = app
        .get(&format!("/research/{}", research_id(&events)), Some(&alice))
        .await;
    assert_eq!(record["config"]["search_api"], json!(["local", "searxng"]));
    app.stop_and_release().await;
}

/// Text of a PDF, through poppler's `pdftotext`.
fn pdf_text(bytes: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.pdf");
    std::fs::write(&path, bytes).unwrap();
    let output = std::process::Command::new("pdftotext")
        .arg("-enc")
        .arg("UTF-8")
        .arg(&path)
        .arg("-")
        .output()
        .expect("pdftotext runs (scripts/test installs poppler-utils)");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The document XML and the hyperlink targets of a DOCX.
fn docx_parts(bytes: &[u8]) -> (String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.docx");
    std::fs::write(&path, bytes).unwrap();
    let part = |name: &str| {
        let output = std::process::Command::new("unzip")
            .arg("-p")
            .arg(&path)
            .arg(name)
            .output()
            .expect("unzip runs");
        assert!(output.status.success(), "{name}: {output:?}");
        String::from_utf8_lossy(&output.stdout).into_owned()
    };
    (
        part("word/document.xml"),
        part("word/_rels/document.xml.rels"),
    )
}

async fn export(
    app: &TestApp,
    token: &str,
    id: &str,
    format: &str,
) -> (StatusCode, String, Vec<u8>) {
    let response = app
        .client
        .get(app.url(&format!("/research/{id}/export?format={format}")))
        .bearer_auth(token)
        .send()
        .await
        .unwrap();
    let status = response.status();
    let kind = response
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    (status, kind, response.bytes().await.unwrap().to_vec())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_research_exports_as_markdown_docx_and_pdf_with_linked_citations() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;
    let events = run(
        &app,
        &alice,
        "/research/stream",
        json!({ "query": "Why do spring tides happen at full moon?", "remember": false }),
    )
    .await;
    let id = research_id(&events);
    let (_, record) = app.get(&format!("/research/{id}"), Some(&alice)).await;
    let first = &record["sources"][0];
    let (url, title) = (
        first["url"].as_str().unwrap(),
        first["title"].as_str().unwrap(),
    );

    let (status, kind, markdown) = export(&app, &alice, &id, "markdown").await;
    assert_eq!(status, StatusCode::OK);
    assert!(kind.starts_with("text/markdown"));
    let markdown = String::from_utf8(markdown).unwrap();
    assert!(
        markdown.contains("> Why do spring tides happen at full moon?"),
        "{markdown}"
    );
    assert!(markdown.contains(&format!("[[1]]({url})")), "{markdown}");
    assert!(
        markdown.contains(&format!("1. [{title}]({url})")),
        "{markdown}"
    );
    assert!(markdown.contains("Spring tides happen at new and full moon"));

    let (status, _, docx) = export(&app, &alice, &id, "docx").await;
    assert_eq!(status, StatusCode::OK);
    let (document, links) = docx_parts(&docx);
    assert!(document.contains("Why do spring tides happen at full moon?"));
    assert!(document.contains("Spring tides happen at new and full moon"));
    assert!(document.contains("[1]"));
    assert!(
        links.contains(url),
        "the citation links to its source: {links}"
    );

    let (status, kind, pdf) = export(&app, &alice, &id, "pdf").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&pdf));
    assert_eq!(kind, "application/pdf");
    assert!(pdf.starts_with(b"%PDF-"));
    let text = pdf_text(&pdf);
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("Why do spring tides happen at full moon?"),
        "{flat}"
    );
    assert!(
        flat.contains("Spring tides happen at new and full moon"),
        "{flat}"
    );
    assert!(flat.contains("Sources"), "{flat}");
    assert!(
        String::from_utf8_lossy(&pdf).contains(url),
        "the PDF links the citation to its source"
    );

    // Not bob's; an unknown format is the client's mistake.
    let (status, _, _) = export(&app, &bob, &id, "pdf").await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _, body) = export(&app, &alice, &id, "odt").await;
    assert_eq!(
        status,
        StatusCode::BAD_REQUEST,
        "{}",
        String::from_utf8_lossy(&body)
    );
    app.stop_and_release().await;
}

/// A report in Chinese renders in the PDF (the font is found on the system), and a failed
/// research has nothing to export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chinese_report_renders_in_the_pdf_and_a_failed_research_has_no_export() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn(&home).await;
    let alice = app.user_key("alice").await;
    let (status, document) = app
        .ingest_document(
            &alice,
            json!({
                "content": "# 潮汐笔记\n\n大潮发生在新月和满月的时候，因为太阳和月亮的引力叠加在一起，海水涨得最高。",
                "source": "notes/潮汐.md",
            }),
        )
        .await;
    assert_eq!(status, StatusCode::CREATED, "{document}");
    app.wait_indexed().await;
    let events = run(
        &app,
        &alice,
        "/research/stream",
        json!({ "query": "大潮为什么发生在满月？", "search_api": "local", "remember": false }),
    )
    .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    let id = research_id(&events);
    let (status, _, pdf) = export(&app, &alice, &id, "pdf").await;
    assert_eq!(status, StatusCode::OK, "{}", String::from_utf8_lossy(&pdf));
    let text: String = pdf_text(&pdf).split_whitespace().collect();
    assert!(text.contains("大潮为什么发生在满月？"), "{text}");
    assert!(text.contains("太阳和月亮的引力叠加在一起"), "{text}");

    // A research without a source failed: it has no report to export.
    let failed = run(
        &app,
        &alice,
        "/research/stream",
        json!({ "query": "lighthouse optics of Cordouan", "search_api": "local", "remember": false }),
    )
    .await;
    assert_eq!(
        failed.last().unwrap().data["status"],
        "failed",
        "{failed:?}"
    );
    let (status, _, body) = export(&app, &alice, &research_id(&failed), "markdown").await;
    assert_eq!(
        status,
        StatusCode::CONFLICT,
        "{}",
        String::from_utf8_lossy(&body)
    );
    app.stop_and_release().await;
}
