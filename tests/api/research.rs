//! Deep research end to end: the real server, a fake web on loopback (SearXNG-style search and
//! pages, allowed through the fetcher's test allowlist) and, where a model is involved, the fake
//! OpenAI server. What is checked: stage order, the concurrency cap, citations that map to
//! fetched sources, failures reported without sinking the report, cancellation, plan review,
//! conclusions in the right user's memory, and the research API around it.

use crate::support;
use crate::support::research_site;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use serde_json::{Value, json};
use support::fake_llm::{FakeLlm, Reply, prompt_text};
use support::{Backend, Home, ReceivedEvent, SseReader, TestApp};

use research_site::ResearchSite;

async fn spawn(home: &Home, site: &ResearchSite, llm: Option<&FakeLlm>) -> TestApp {
    let mut env = site.env();
    if let Some(llm) = llm {
        env.extend(llm.env());
    }
    let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    TestApp::spawn_with(home, &borrowed).await
}

/// Starts a research and returns its event stream.
async fn research(app: &TestApp, token: &str, body: Value) -> SseReader {
    let response = app
        .client
        .post(app.url("/research/stream"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .await
        .expect("research request");
    let status = response.status();
    if status != StatusCode::OK {
        let body = response.text().await.unwrap_or_default();
        panic!("POST /research/stream answered {status}: {body}");
    }
    SseReader::new(response)
}

fn of_type<'a>(events: &'a [ReceivedEvent], kind: &str) -> Vec<&'a ReceivedEvent> {
    events.iter().filter(|e| e.event == kind).collect()
}

fn stages(events: &[ReceivedEvent]) -> Vec<String> {
    let mut stages: Vec<String> = of_type(events, "stage_update")
        .iter()
        .filter_map(|e| e.data["stage"].as_str().map(str::to_string))
        .collect();
    stages.dedup();
    stages
}

fn report_text(events: &[ReceivedEvent]) -> String {
    of_type(events, "report_delta")
        .iter()
        .filter_map(|e| e.data["content"].as_str())
        .collect()
}

/// The `[n]` citations of a text.
fn cited_numbers(text: &str) -> BTreeSet<usize> {
    let mut out = BTreeSet::new();
    let mut rest = text;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        if let Some(close) = after.find(']') {
            for part in after[..close].split(',') {
                if let Ok(n) = part.trim().parse::<usize>() {
                    out.insert(n);
                }
            }
            rest = &after[close + 1..];
        } else {
            break;
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn research_without_a_model_writes_a_cited_digest_and_remembers_it_for_its_user_only() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, None).await;
    let alice = app.user_key("alice").await;
    let bob = app.user_key("bob").await;

    let events = research(
        &app,
        &alice,
        json!({ "query": "Why do spring tides happen at full moon?" }),
    )
    .await
    .collect()
    .await;
    assert_eq!(
        stages(&events),
        [
            "research_brief",
            "research_execution",
            "final_report_generation",
            "completed"
        ]
    );
    let first = &events[0];
    assert_eq!(first.event, "session_start");
    let research_id = first.data["research_id"].as_str().unwrap().to_string();
    for event in &events {
        assert!(event.data["timestamp"].is_string());
        assert_eq!(event.data["type"], event.event);
    }
    assert_eq!(events.last().unwrap().event, "done");
    assert_eq!(events.last().unwrap().data["status"], "completed");

    // The report streamed is the report stored, and every citation names a fetched source.
    let streamed = report_text(&events);
    let (status, record) = app
        .get(&format!("/research/{research_id}"), Some(&alice))
        .await;
    assert_eq!(status, StatusCode::OK, "{record}");
    assert_eq!(record["status"], "completed");
    assert_eq!(record["report"].as_str().unwrap(), streamed);
    let sources = record["sources"].as_array().unwrap();
    assert!(!sources.is_empty());
    let fetched = site.fetched();
    let cited = cited_numbers(streamed.split("## Sources").next().unwrap());
    assert!(
        !cited.is_empty(),
        "the digest cites its sources: {streamed}"
    );
    for n in &cited {
        let source = sources
            .iter()
            .find(|s| s["n"].as_u64() == Some(*n as u64))
            .unwrap_or_else(|| panic!("citation [{n}] has no source"));
        let url = source["url"].as_str().unwrap();
        assert!(
            fetched.contains(url),
            "[{n}] {url} was never fetched ({fetched:?})"
        );
    }
    assert!(streamed.contains("Spring tides happen at new and full moon"));
    // Sources came from search and were announced.
    assert!(!of_type(&events, "sources_found").is_empty());
    let complete = of_type(&events, "research_complete");
    assert_eq!(complete.len(), 1);
    assert!(
        complete[0].data["metadata"]["duration_seconds"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(record["stage_timings"]["research_execution"].is_number());
    // Every citation was checked against its source's text: a digest quotes its sources.
    let metadata = &complete[0].data["metadata"];
    assert_eq!(metadata["outcome"], "completed");
    assert!(
        metadata["citations"]["checked"].as_u64().unwrap() >= 1,
        "{metadata}"
    );
    assert_eq!(
        metadata["citations"]["unsupported"],
        json!([]),
        "{metadata}"
    );
    assert_eq!(
        metadata["citations"]["supported"],
        metadata["citations"]["checked"]
    );

    // The conclusions are memories of alice (source research), not of bob.
    let recall = |token: String| {
        let app = &app;
        async move {
            app.post(
                "/v1/memories/search",
                Some(&token),
                Some(json!({ "query": "spring tides full moon", "kinds": ["conclusion"] })),
            )
            .await
        }
    };
    let mut found = Vec::new();
    for _ in 0..50 {
        let (_, body) = recall(alice.clone()).await;
        found = body["results"].as_array().cloned().unwrap_or_default();
        if !found.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!found.is_empty(), "a conclusion is recallable");
    let memory = &found[0]["memory"];
    assert_eq!(memory["source"], "research");
    assert!(memory["content"].as_str().unwrap().contains("tides"));
    let refs: Vec<&str> = memory["source_refs"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert!(refs.contains(&format!("research:{research_id}").as_str()));
    let (_, theirs) = recall(bob.clone()).await;
    assert_eq!(theirs["results"].as_array().unwrap().len(), 0);

    // History, isolation, comparison, delete.
    let (_, history) = app.get("/research/history", Some(&alice)).await;
    assert_eq!(history["research"][0]["id"], research_id.as_str());
    let (status, _) = app
        .get(&format!("/research/{research_id}"), Some(&bob))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, empty) = app.get("/research/history", Some(&bob)).await;
    assert_eq!(empty["research"].as_array().unwrap().len(), 0);
    let (_, comparison) = app.get("/research/comparison", Some(&alice)).await;
    let stats = &comparison["models"][0];
    assert_eq!(stats["runs"], 1);
    assert_eq!(stats["success_rate"], 1.0);
    assert!(stats["mean_sources"].as_f64().unwrap() >= 1.0);
    let (status, _) = app
        .delete(&format!("/research/history/{research_id}"), Some(&bob))
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (status, _) = app
        .delete(&format!("/research/history/{research_id}"), Some(&alice))
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);

    // The same question researched again repeats its conclusions: none is stored twice.
    let conclusions = |token: String| {
        let app = &app;
        async move {
            let (_, listed) = app
                .get("/v1/memories?kinds=conclusion&limit=100", Some(&token))
                .await;
            let mut contents: Vec<String> = listed["memories"]
                .as_array()
                .unwrap()
                .iter()
                .map(|m| m["content"].as_str().unwrap().to_string())
                .collect();
            contents.sort();
            contents
        }
    };
    let before = conclusions(alice.clone()).await;
    assert!(!before.is_empty());
    let again = research(
        &app,
        &alice,
        json!({ "query": "Why do spring tides happen at full moon?" }),
    )
    .await
    .collect()
    .await;
    assert_eq!(again.last().unwrap().data["status"], "completed");
    app.wait_for_jobs().await;
    assert_eq!(conclusions(alice.clone()).await, before);
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_fetch_is_reported_and_an_edited_plan_still_completes() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, None).await;
    let alice = app.user_key("alice").await;

    let mut stream = research(
        &app,
        &alice,
        json!({ "query": "tides", "plan_review": true, "remember": false }),
    )
    .await;
    // The run pauses with the plan.
    let mut events = Vec::new();
    let plan = loop {
        let event = stream.next().await.expect("a plan_review event");
        events.push(event.clone());
        if event.event == "plan_review" {
            break event;
        }
    };
    assert_eq!(plan.data["metadata"]["topics"], json!(["tides"]));
    let run = plan.data["run_id"].as_str().unwrap().to_string();
    // The user replaces the plan: one topic whose only source is broken, one that works.
    let (status, body) = app
        .post(
            &format!("/v1/runs/{run}/input"),
            Some(&alice),
            Some(json!({ "topics": ["broken mirror", "lighthouse fresnel lens"] })),
        )
        .await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    while let Some(event) = stream.next().await {
        events.push(event);
    }
    assert_eq!(events.last().unwrap().data["status"], "completed");
    let errors = of_type(&events, "error");
    assert!(
        errors.iter().any(|e| e.data["error_type"] == "network"
            && e.data["metadata"]["url"]
                .as_str()
                .unwrap_or("")
                .contains("/broken/")),
        "the failed fetch is an error event: {errors:?}"
    );
    assert!(
        errors.iter().any(|e| e.data["error_type"] == "tool"
            && e.data["message"]
                .as_str()
                .unwrap()
                .contains("broken mirror")),
        "the researcher that got nothing is reported: {errors:?}"
    );
    let report = report_text(&events);
    assert!(report.contains("Fresnel"), "{report}");
    assert!(report.contains("## Not covered") && report.contains("broken mirror"));
    // Input to a run that no longer waits is refused.
    let (status, _) = app
        .post(
            &format!("/v1/runs/{run}/input"),
            Some(&alice),
            Some(json!({ "approve": true })),
        )
        .await;
    assert_eq!(status, StatusCode::CONFLICT);
    app.stop_and_release().await;
}

/// Routes the fake model's replies by the prompt: the supervisor dispatches `topics`, each
/// researcher searches, reads the first result and answers; every other step answers in kind.
fn scripted_model(llm: &FakeLlm, topics: Vec<&'static str>, report: &'static str) {
    llm.set_handler(research_script(topics, report));
}

/// The replies of `scripted_model`, as a handler to combine with others.
pub(crate) fn research_script(
    topics: Vec<&'static str>,
    report: &'static str,
) -> impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static {
    move |request: &Value| {
        let prompt = prompt_text(request);
        let tool_results: Vec<&str> = request["messages"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|m| m["role"] == "tool")
            .filter_map(|m| m["content"].as_str())
            .collect();
        if prompt.contains("You are the research supervisor") {
            if !tool_results.is_empty() {
                return Some(Reply::tool("research_complete", json!({})));
            }
            return Some(Reply::ToolCalls(
                topics
                    .iter()
                    .map(|t| {
                        (
                            "conduct_research".to_string(),
                            json!({ "research_topic": t }),
                        )
                    })
                    .collect(),
            ));
        }
        if prompt.contains("You are a researcher") {
            return Some(match tool_results.as_slice() {
                [] => {
                    let topic = request["messages"][1]["content"]
                        .as_str()
                        .unwrap_or("tides");
                    Reply::tool("web_search", json!({ "query": topic }))
                }
                [search] => {
                    let url = search
                        .split_whitespace()
                        .find(|word| word.starts_with("http://"))
                        .unwrap_or("http://127.0.0.1:9/none");
                    Reply::tool("fetch_url", json!({ "url": url }))
                }
                _ => Reply::text("The findings are in the sources read."),
            });
        }
        if prompt.contains("You compress") {
            return Some(Reply::text("- Tides follow the Moon [source]"));
        }
        if prompt.contains("You score the sources") {
            return Some(Reply::text(r#"{"sources": []}"#));
        }
        if prompt.contains("You write the final report") {
            return Some(Reply::slow_text(report, 8, 1));
        }
        if prompt.contains("worth remembering from a finished research") {
            return Some(Reply::text(
                r#"{"conclusions": ["Spring tides occur when the Sun and Moon line up."]}"#,
            ));
        }
        if prompt.contains("You write the research brief") {
            return Some(Reply::text(
                r#"{"brief": "Explain tides and lighthouse optics."}"#,
            ));
        }
        None
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn researchers_run_in_parallel_up_to_the_cap_and_citations_map_to_fetched_sources() {
    let site = ResearchSite::start(Duration::from_millis(300)).await;
    let llm = FakeLlm::start().await;
    scripted_model(
        &llm,
        vec![
            "tides moon",
            "tides harbour",
            "lighthouse lens",
            "ocean tides",
            "fresnel lens",
        ],
        "# Tides and lights\n\nTides follow the Moon [1]. Lenses focus light [2]. Made up [9].",
    );
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let events = research(
        &app,
        &alice,
        json!({ "query": "tides and lighthouses", "max_concurrent_research_units": 2 }),
    )
    .await
    .collect()
    .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    assert_eq!(site.searches(), 5, "one search per researcher");
    assert_eq!(
        site.peak_concurrent_searches(),
        2,
        "researchers ran in parallel, never more than the cap"
    );
    let complete = of_type(&events, "research_complete");
    assert_eq!(
        complete[0].data["metadata"]["peak_concurrent_researchers"],
        2
    );
    // The invented citation [9] is reported and removed from the stored report.
    assert!(
        of_type(&events, "error")
            .iter()
            .any(|e| e.data["error_type"] == "validation"
                && e.data["metadata"]["invalid_citations"] == json!([9]))
    );
    // …and it was never shown: the stream cut it as it arrived.
    assert!(
        !report_text(&events).contains("[9]"),
        "{}",
        report_text(&events)
    );
    let id = events[0].data["research_id"].as_str().unwrap();
    let (_, record) = app.get(&format!("/research/{id}"), Some(&alice)).await;
    let report = record["report"].as_str().unwrap();
    assert!(!report.contains("[9]"));
    // Both remaining citations were checked against their sources' text, and the event
    // carries the report as stored.
    let metadata = &complete[0].data["metadata"];
    assert_eq!(metadata["citations"]["checked"], 2, "{metadata}");
    assert_eq!(complete[0].data["content"], record["report"]);
    let sources = record["sources"].as_array().unwrap();
    let fetched_or_read: BTreeSet<String> = sources
        .iter()
        .map(|s| s["url"].as_str().unwrap().to_string())
        .collect();
    for n in cited_numbers(report.split("## Sources").next().unwrap()) {
        assert!(
            n >= 1 && n <= sources.len(),
            "[{n}] maps to a listed source"
        );
    }
    assert!(!fetched_or_read.is_empty());
    // Every stage reported usage, and the model saw the user's brief as data.
    assert!(of_type(&events, "usage").len() >= 5);
    let reports: Vec<Value> = llm
        .requests()
        .into_iter()
        .filter(|r| prompt_text(r).contains("You write the final report"))
        .collect();
    assert_eq!(reports.len(), 1);
    assert!(prompt_text(&reports[0]).contains("[1] "));
    app.stop_and_release().await;
}

/// A research with a budget stops researching at its share of it, writes its report from
/// what it found, and says so; every `usage` event shows the running total and the cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_research_at_its_budget_stops_researching_and_reports_what_it_found() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    scripted_model(
        &llm,
        vec![
            "tides moon",
            "tides harbour",
            "lighthouse lens",
            "fresnel lens",
        ],
        "# Tides\n\nTides follow the Moon [1].",
    );
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let (status, error) = app
        .post(
            "/research/stream",
            Some(&alice),
            Some(json!({ "query": "q", "budget": { "tokens": 10 } })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(error.to_string().contains("budget.tokens"));

    // Every fake call costs 120 tokens: the brief, the supervisor and one researcher's calls
    // pass half of 1,000.
    let events = research(
        &app,
        &alice,
        json!({
            "query": "tides and lighthouses",
            "max_concurrent_research_units": 1,
            "budget": { "tokens": 1000, "research_share": 0.5 },
        }),
    )
    .await
    .collect()
    .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    assert_eq!(site.searches(), 1, "researching stopped at the budget");
    let budget_errors: Vec<_> = of_type(&events, "error")
        .into_iter()
        .filter(|e| e.data["error_type"] == "budget")
        .collect();
    assert_eq!(budget_errors.len(), 1, "said once: {budget_errors:?}");
    assert!(
        budget_errors[0].data["message"]
            .as_str()
            .unwrap()
            .contains("of its 1000 tokens")
    );
    let usage = of_type(&events, "usage");
    let mut last = 0;
    for event in &usage {
        assert_eq!(event.data["budget"]["tokens"], 1000, "{}", event.data);
        let total = event.data["total"]["total_tokens"].as_u64().unwrap();
        assert!(total > last, "the running total grows");
        last = total;
    }
    let complete = of_type(&events, "research_complete");
    assert_eq!(complete[0].data["metadata"]["outcome"], "partial");
    let report = complete[0].data["content"].as_str().unwrap();
    assert!(report.contains("Tides follow the Moon"), "{report}");
    assert!(
        report.contains("## Not covered") && report.contains("reached its budget"),
        "{report}"
    );
    let id = events[0].data["research_id"].as_str().unwrap();
    let (_, record) = app.get(&format!("/research/{id}"), Some(&alice)).await;
    assert_eq!(record["status"], "partial");
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_stops_every_researcher_within_a_second() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    llm.set_handler(|request| {
        let prompt = prompt_text(request);
        if prompt.contains("You are the research supervisor") {
            return Some(Reply::ToolCalls(
                ["a", "b", "c"]
                    .iter()
                    .map(|t| {
                        (
                            "conduct_research".to_string(),
                            json!({ "research_topic": t }),
                        )
                    })
                    .collect(),
            ));
        }
        if prompt.contains("You are a researcher") {
            return Some(Reply::Hang);
        }
        if prompt.contains("You write the research brief") {
            return Some(Reply::text(r#"{"brief": "b"}"#));
        }
        None
    });
    let home = Home::new(Backend::Postgres).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let mut stream = research(&app, &alice, json!({ "query": "anything" })).await;
    let mut run = None;
    let deadline = Instant::now() + Duration::from_secs(10);
    // Wait until the three researchers are waiting on the model.
    while llm
        .requests()
        .iter()
        .filter(|r| prompt_text(r).contains("You are a researcher"))
        .count()
        < 3
    {
        assert!(Instant::now() < deadline, "researchers started");
        if run.is_none()
            && let Some(event) = stream.next().await
        {
            run = event.data["run_id"].as_str().map(str::to_string);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let run = run.expect("run id");
    let cancelled_at = Instant::now();
    let (status, _) = app
        .post(&format!("/v1/runs/{run}/cancel"), Some(&alice), None)
        .await;
    assert_eq!(status, StatusCode::ACCEPTED);
    let mut last = None;
    while let Some(event) = stream.next().await {
        last = Some(event);
    }
    let last = last.expect("events");
    assert_eq!(last.event, "done");
    assert_eq!(last.data["status"], "cancelled");
    while llm.hangs_dropped() < 3 {
        assert!(
            cancelled_at.elapsed() < Duration::from_secs(1),
            "all researchers' model calls closed within 1 s (closed {})",
            llm.hangs_dropped()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The record says so.
    let mut status = String::new();
    for _ in 0..50 {
        let (_, record) = app.get(&format!("/research/{run}"), Some(&alice)).await;
        status = record["status"].as_str().unwrap_or("").to_string();
        if status != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(status, "cancelled");
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn research_requests_are_validated_and_the_test_endpoint_resolves_them() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    for (body, needle) in [
        (json!({ "query": "" }), "query must not be empty"),
        (
            json!({ "query": "q", "max_concurrent_research_units": 1000 }),
            "above this server's limit",
        ),
        (
            json!({ "query": "q", "search_api": "altavista" }),
            "altavista",
        ),
        (json!({ "query": "q", "mode": "sideways" }), "sideways"),
    ] {
        let (status, error) = app
            .post("/research/stream", Some(&alice), Some(body.clone()))
            .await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
        assert!(
            error["error"]["message"].as_str().unwrap().contains(needle),
            "{error}"
        );
        let (status, tested) = app.post("/research/test", Some(&alice), Some(body)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(tested["valid"], false);
    }
    // A misspelled knob was silently dropped; like every other body, it is refused.
    let (status, error) = app
        .post(
            "/research/stream",
            Some(&alice),
            Some(json!({ "query": "q", "max_source": 3 })),
        )
        .await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{error}");
    assert!(error.to_string().contains("max_source"), "{error}");
    // A thread that is not the caller's is 404, and the API document says so (schemathesis
    // found the answer undocumented).
    let (status, error) = app
        .post(
            "/research/stream",
            Some(&alice),
            Some(json!({ "query": "q", "thread_id": "e1570d82-7ac1-1c75-b2c3-20292336541a" })),
        )
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{error}");
    assert_eq!(error["error"]["code"], "not_found", "{error}");
    let (_, spec) = app.get("/openapi.json", None).await;
    for path in ["/research/stream", "/research/compare"] {
        let responses = &spec["paths"][path]["post"]["responses"];
        assert!(responses["404"].is_object(), "{path}: {responses}");
    }
    let (status, tested) = app
        .post("/research/test", Some(&alice), Some(json!({ "query": "tides", "model": "other-model", "api_key": "sk-mine-123456", "depth": 3, "mode": "recursive" })))
        .await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(tested["valid"], true, "{tested}");
    assert_eq!(tested["config"]["mode"], "recursive");
    assert_eq!(tested["config"]["depth"], 3);
    assert_eq!(tested["config"]["api_key"], "request");
    assert_eq!(tested["config"]["search_api"], "searxng");
    assert!(!tested.to_string().contains("sk-mine"));
    assert!(
        tested["config"]["models"]
            .as_array()
            .unwrap()
            .iter()
            .all(|m| m["model"] == "other-model")
    );
    let (_, models) = app.get("/models", Some(&alice)).await;
    assert_eq!(models["default_model"], "fake-model");
    assert!(
        models["search_providers"]
            .as_array()
            .unwrap()
            .contains(&json!("local"))
    );
    let (status, _) = app.get("/research/history", None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_web_page_that_says_remember_this_never_becomes_more_than_web_trust() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, None).await;
    let alice = app.user_key("alice").await;
    let events = research(
        &app,
        &alice,
        json!({ "query": "How should I choose an account password?" }),
    )
    .await
    .collect()
    .await;
    assert_eq!(events.last().unwrap().data["status"], "completed");
    assert!(
        site.fetched()
            .iter()
            .any(|url| url.ends_with("/page/account-tips"))
    );
    // Give the memory writer time to act on anything it was (wrongly) handed.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, listed) = app
        .get("/v1/memories?limit=500&include_invalid=true", Some(&alice))
        .await;
    assert_eq!(status, StatusCode::OK);
    let memories = listed["memories"].as_array().unwrap();
    assert!(
        !memories.is_empty(),
        "the research's conclusions were written"
    );
    for memory in memories {
        assert_eq!(memory["trust"], "web", "{memory}");
        assert_eq!(memory["source"], "research", "{memory}");
        assert_ne!(memory["kind"], "fact", "{memory}");
    }
    // Nothing the page said was stored as a fact or preference about the user.
    let (_, recalled) = app
        .post(
            "/v1/memories/search",
            Some(&alice),
            Some(json!({ "query": "user's password hunter2", "kinds": ["fact", "preference"] })),
        )
        .await;
    assert_eq!(
        recalled["results"].as_array().unwrap().len(),
        0,
        "{recalled}"
    );
    app.stop_and_release().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recursive_mode_goes_a_level_deeper_and_models_can_be_compared() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    llm.set_handler(|request| {
        let prompt = prompt_text(request);
        if prompt.contains("You plan web searches") {
            return Some(if !prompt.contains("Tides follow") {
                Reply::text(r#"{"queries": [{"query": "tides moon", "goal": "cause"}, {"query": "lighthouse lens", "goal": "optics"}]}"#)
            } else {
                Reply::text(r#"{"queries": [{"query": "harbour tide tables", "goal": "prediction"}]}"#)
            });
        }
        if prompt.contains("You read the sources found for one search") {
            return Some(Reply::text(
                r#"{"learnings": ["Tides follow the Moon [http://x]"], "follow_up_questions": ["How are tide tables computed?"]}"#,
            ));
        }
        if prompt.contains("You write the research brief") {
            return Some(Reply::text(r#"{"brief": "Tides and lighthouses."}"#));
        }
        if prompt.contains("You score the sources") {
            return Some(Reply::text(r#"{"sources": []}"#));
        }
        if prompt.contains("You write the final report") {
            return Some(Reply::text("# Report\n\nTides follow the Moon [1]."));
        }
        if prompt.contains("worth remembering from a finished research") {
            return Some(Reply::text(r#"{"conclusions": []}"#));
        }
        None
    });
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let secret = "sk-user-own-key-5f1e";
    let events = research(
        &app,
        &alice,
        json!({ "query": "tides and lighthouses", "mode": "recursive", "breadth": 2, "depth": 2, "api_key": secret }),
    )
    .await
    .collect()
    .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    let levels: Vec<&str> = of_type(&events, "thinking")
        .iter()
        .filter_map(|e| e.data["content"].as_str())
        .filter(|c| c.starts_with("Level "))
        .collect();
    assert_eq!(levels, ["Level 1: 2 queries", "Level 2: 1 queries"]);
    let queries = site.queries();
    assert!(
        queries.contains(&"harbour tide tables".to_string()),
        "{queries:?}"
    );
    // The user's key was used for this research only and never shows.
    let all: String = events.iter().map(|e| e.data.to_string()).collect();
    assert!(!all.contains(secret));
    let id = events[0].data["research_id"].as_str().unwrap();
    let (_, record) = app.get(&format!("/research/{id}"), Some(&alice)).await;
    assert!(!record.to_string().contains(secret));
    assert_eq!(record["config"]["api_key"], "request");

    // Two models side by side on one query.
    let (status, compared) = app
        .post("/research/compare", Some(&alice), Some(json!({ "query": "tides", "models": ["model-a", "model-b"], "mode": "recursive", "depth": 1, "breadth": 1 })))
        .await;
    assert_eq!(status, StatusCode::OK, "{compared}");
    let results = compared["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    assert_eq!(results[0]["model"], "model-a");
    assert_eq!(results[1]["research"]["model"], "model-b");
    assert!(
        results
            .iter()
            .all(|r| r["research"]["status"] == "completed")
    );
    let used: BTreeSet<String> = llm
        .requests()
        .iter()
        .filter_map(|r| r["model"].as_str().map(str::to_string))
        .collect();
    assert!(
        used.contains("model-a") && used.contains("model-b"),
        "{used:?}"
    );
    let (_, comparison) = app.get("/research/comparison", Some(&alice)).await;
    let models: Vec<&str> = comparison["models"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["model"].as_str())
        .collect();
    assert!(
        models.contains(&"model-a") && models.contains(&"model-b"),
        "{models:?}"
    );
    app.stop_and_release().await;
}

/// Posts a chat message, follows its run to the end and checks that it completed.
async fn completed_turn(
    app: &TestApp,
    key: &str,
    thread: &str,
    message: &str,
) -> Vec<ReceivedEvent> {
    let run = app.post_message(key, thread, message).await;
    let events = app
        .events(key, run["id"].as_str().unwrap(), None)
        .await
        .collect()
        .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    events
}

/// The research a chat turn's `deep_research` runs: one search, a cited report on lenses.
fn lenses_research() -> impl Fn(&Value) -> Option<Reply> + Send + Sync + 'static {
    research_script(
        vec!["lighthouse fresnel lens"],
        "# Lenses\n\nA Fresnel lens concentrates the lamp into a beam [1].",
    )
}

/// A request of the chat model (it offers mnemo's tools); the research's requests do not.
fn is_chat_request(request: &Value) -> bool {
    request["tools"].as_array().is_some_and(|tools| {
        tools
            .iter()
            .any(|t| t["function"]["name"] == "recall_memory")
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chat_agent_runs_deep_research_as_a_tool_inside_its_turn() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    let research = lenses_research();
    // The chat model asks for a research, then answers from its result; every other request
    // belongs to the research.
    llm.set_handler(move |request| {
        if !is_chat_request(request) {
            return research(request);
        }
        let answered = request["messages"]
            .as_array()
            .is_some_and(|m| m.iter().any(|m| m["role"] == "tool"));
        Some(if answered {
            Reply::text("The research says Fresnel lenses concentrate the light.")
        } else {
            Reply::tool(
                "deep_research",
                json!({ "query": "How do lighthouse lenses work?" }),
            )
        })
    });
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let thread = app.create_thread(&alice, "lenses").await;
    let thread = thread["id"].as_str().unwrap();
    let events = completed_turn(
        &app,
        &alice,
        thread,
        "Please research how lighthouse lenses work.",
    )
    .await;
    let kinds: Vec<&str> = events.iter().map(|e| e.event.as_str()).collect();
    let call = kinds.iter().position(|k| *k == "tool_call").unwrap();
    let report = kinds.iter().position(|k| *k == "report_delta").unwrap();
    let result = kinds.iter().position(|k| *k == "tool_result").unwrap();
    let answer = kinds
        .iter()
        .rposition(|k| *k == "message_complete")
        .unwrap();
    assert!(
        call < report && report < result && result < answer,
        "{kinds:?}"
    );
    let tool_result = &events[result].data;
    assert!(tool_result.to_string().contains("Fresnel"), "{tool_result}");
    // The research is in the user's history, attached to the thread.
    let (_, history) = app.get("/research/history", Some(&alice)).await;
    assert_eq!(history["research"].as_array().unwrap().len(), 1);
    assert_eq!(history["research"][0]["status"], "completed");
    app.stop_and_release().await;
}

/// A research whose every search failed wrote its failure ("search request failed: …") to
/// memory as a conclusion; only research with cited sources writes conclusions. It also ended
/// "completed" (green, "0 sources", 100 % success) with an error naming neither the provider's
/// address nor the cause: it now fails, saying both, and `/health` says the provider is down.
#[tokio::test]
async fn a_research_without_sources_writes_no_conclusions() {
    let home = Home::new(Backend::Sqlite).await;
    let app = TestApp::spawn_with(
        &home,
        &[
            // Nothing listens on the discard port: every search fails.
            (
                "MNEMO__RESEARCH__SEARCH__SEARXNG_URL",
                "http://127.0.0.1:9/",
            ),
            ("MNEMO__RESEARCH__SEARCH__DEFAULT_PROVIDER", "searxng"),
        ],
    )
    .await;
    let alice = app.user_key("alice").await;
    let events = research(
        &app,
        &alice,
        json!({ "query": "Why do spring tides happen at full moon?" }),
    )
    .await
    .collect()
    .await;
    // The research failed — it did not "complete" with nothing — and says where and why.
    let done = events.last().unwrap();
    assert_eq!(done.event, "done");
    assert_eq!(done.data["status"], "failed", "{events:?}");
    assert!(of_type(&events, "research_complete").is_empty());
    assert!(
        report_text(&events).is_empty(),
        "no report (nor citation) is shown"
    );
    assert!(!stages(&events).contains(&"completed".to_string()));
    let last_error = of_type(&events, "error").last().unwrap().data.clone();
    let message = last_error["error"]["message"]
        .as_str()
        .or(last_error["message"].as_str())
        .unwrap_or_default()
        .to_string();
    for named in [
        "every researcher failed",
        "searxng at http://127.0.0.1:9/search",
        "onnection refused",
    ] {
        assert!(message.contains(named), "{named:?} in {last_error}");
    }
    let research_id = events[0].data["research_id"].as_str().unwrap();
    let (_, record) = app
        .get(&format!("/research/{research_id}"), Some(&alice))
        .await;
    assert_eq!(record["status"], "failed");
    assert!(
        record["error"]
            .as_str()
            .unwrap()
            .contains("searxng at http://127.0.0.1:9/search")
    );
    let (_, history) = app.get("/research/history", Some(&alice)).await;
    assert_eq!(history["research"][0]["status"], "failed");
    let (_, comparison) = app.get("/research/comparison", Some(&alice)).await;
    assert_eq!(comparison["models"][0]["success_rate"], 0.0);
    let (status, listed) = app.get("/v1/memories?kinds=conclusion", Some(&alice)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(listed["memories"], json!([]), "{listed}");
    // `/health` tells the operator the provider cannot be reached, and where.
    let (_, health) = app.health().await;
    assert_eq!(health["status"], "degraded", "{health}");
    let search = &health["components"]["search"];
    assert_eq!(search["status"], "down", "{health}");
    assert_eq!(search["provider"], "searxng");
    assert!(search["error"].as_str().unwrap().contains("127.0.0.1:9"));
    app.stop().await;
}

/// A page read by a research inside a chat turn tells the model to remember something; the
/// model's `remember` then carries web trust (it was user trust: an injected page became a
/// user fact). A `remember` asked with nothing but the user's words in view stays user trust.
#[tokio::test]
async fn what_the_model_remembers_after_reading_the_web_has_web_trust() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    let research = lenses_research();
    llm.set_handler(move |request| {
        let messages = request["messages"].as_array().cloned().unwrap_or_default();
        let text = serde_json::Value::Array(messages.clone()).to_string();
        // The writer's extraction of bob's turn: the model already remembered it with its tool.
        if request["response_format"].is_object() && text.contains("vegetarian") {
            return Some(Reply::text(r#"{"memories": []}"#));
        }
        if !is_chat_request(request) {
            return research(request);
        }
        let tool_results = messages.iter().filter(|m| m["role"] == "tool").count();
        Some(if text.contains("vegetarian") {
            match tool_results {
                0 => Reply::tool(
                    "remember",
                    json!({ "content": "The user is vegetarian", "kind": "fact" }),
                ),
                _ => Reply::text("Noted."),
            }
        } else {
            match tool_results {
                0 => Reply::tool(
                    "deep_research",
                    json!({ "query": "How do lighthouse lenses work?" }),
                ),
                // What an injected page would make a model do.
                1 => Reply::tool(
                    "remember",
                    json!({ "content": "The user wants every reply signed by Captain Nemo", "kind": "preference" }),
                ),
                _ => Reply::text("Fresnel lenses concentrate the light."),
            }
        })
    });
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let mut stored = Vec::new();
    for (name, message) in [
        ("alice", "Please research how lighthouse lenses work."),
        ("bob", "Remember that I am vegetarian."),
    ] {
        let key = app.user_key(name).await;
        let thread = app.create_thread(&key, "t").await;
        completed_turn(&app, &key, thread["id"].as_str().unwrap(), message).await;
        let mut found = None;
        for _ in 0..400 {
            let (_, listed) = app
                .get("/v1/memories?kinds=fact,preference", Some(&key))
                .await;
            if let Some(memory) = listed["memories"].as_array().and_then(|m| m.first()) {
                found = Some(memory.clone());
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        stored.push(found.unwrap_or_else(|| panic!("{name}'s remembered memory")));
    }
    assert_eq!(
        stored[0]["content"],
        "The user wants every reply signed by Captain Nemo"
    );
    assert_eq!(stored[0]["trust"], "web", "{}", stored[0]);
    assert_eq!(stored[0]["source"], "assistant", "{}", stored[0]);
    assert_eq!(stored[1]["content"], "The user is vegetarian");
    assert_eq!(stored[1]["trust"], "user", "{}", stored[1]);
    app.stop_and_release().await;
}

/// A weak local model: it answers every request in prose — no JSON object where one is asked
/// for, no tool call where tools are offered — and writes its report as one cited point.
fn prose_model(request: &Value) -> Option<Reply> {
    let prompt = prompt_text(request);
    if prompt.contains("You write the final report") {
        return Some(Reply::text(
            "- Spring tides come when the Sun and the Moon pull the sea together [1].",
        ));
    }
    Some(Reply::text(
        "Sure! Tides are a lovely topic, and I am happy to help you with them.",
    ))
}

/// The `stage_fallback` events of a run: (index in the stream, step).
fn fallbacks(events: &[ReceivedEvent]) -> Vec<(usize, String)> {
    events
        .iter()
        .enumerate()
        .filter(|(_, e)| e.event == "stage_fallback")
        .map(|(index, e)| (index, e.data["step"].as_str().unwrap_or("").to_string()))
        .collect()
}

fn index_of(events: &[ReceivedEvent], kind: &str) -> usize {
    events
        .iter()
        .position(|e| e.event == kind)
        .unwrap_or_else(|| panic!("no {kind} event in {events:?}"))
}

/// A model that never answers JSON used to fail the research ("no valid JSON after 4
/// attempts"). Each step it cannot do is done the extractive way, as without a model, and
/// said so in a `stage_fallback` event; the research completes with a report citing what was
/// read. Both modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn research_with_a_model_that_never_answers_json_falls_back_and_completes() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    llm.set_handler(prose_model);
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let query = "Why do spring tides happen at full moon?";

    let events = research(
        &app,
        &alice,
        json!({ "query": query, "allow_clarification": true }),
    )
    .await
    .collect()
    .await;
    let done = events.last().unwrap();
    assert_eq!(done.event, "done");
    assert_eq!(done.data["status"], "completed", "{events:?}");
    let steps: Vec<String> = fallbacks(&events).into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        steps,
        [
            "clarification",
            "research_brief",
            "supervisor",
            "researcher",
            "curate_sources",
            "conclusions"
        ],
        "{events:?}"
    );
    // Every fallback but the conclusions' (which read the report) comes before the report,
    // and all of them before the research ends.
    let first_delta = index_of(&events, "report_delta");
    let complete = index_of(&events, "research_complete");
    for (index, step) in fallbacks(&events) {
        if step == "conclusions" {
            assert!(first_delta < index && index < complete, "{step} at {index}");
        } else {
            assert!(
                index < first_delta,
                "{step} at {index} is before the report"
            );
        }
    }
    for event in of_type(&events, "stage_fallback") {
        let reason = event.data["reason"].as_str().unwrap();
        assert!(!event.data["content"].as_str().unwrap().is_empty());
        assert!(
            !reason.contains("Sure!"),
            "the reply is not echoed: {reason}"
        );
        assert!(!reason.contains("sk-test-secret"), "{reason}");
        assert_eq!(
            event.data["research_id"], events[0].data["research_id"],
            "fallbacks carry the research envelope"
        );
    }
    let brief = &of_type(&events, "stage_fallback")[1].data;
    assert_eq!(brief["stage"], "research_brief");
    assert!(
        brief["reason"]
            .as_str()
            .unwrap()
            .starts_with("no valid JSON after 4 attempts"),
        "{brief}"
    );
    // The brief is the query, and the one researcher searched it.
    let thinking = of_type(&events, "thinking");
    assert!(
        thinking
            .iter()
            .any(|e| e.data["stage"] == "research_brief" && e.data["content"] == query)
    );
    assert!(site.queries().contains(&query.to_lowercase()));
    // A failed step is not an error of the research.
    assert!(
        of_type(&events, "error")
            .iter()
            .all(|e| e.data["error_type"] != "llm"),
        "{events:?}"
    );

    // The report cites a page that was read, lists it, and the model wrote it from the
    // passages the extractive researcher kept.
    let id = events[0].data["research_id"].as_str().unwrap();
    let (_, record) = app.get(&format!("/research/{id}"), Some(&alice)).await;
    assert_eq!(record["status"], "completed");
    let report = record["report"].as_str().unwrap();
    assert_eq!(report, report_text(&events));
    let sources = record["sources"].as_array().unwrap();
    let fetched = site.fetched();
    let body = report.split("## Sources").next().unwrap();
    assert_eq!(cited_numbers(body), BTreeSet::from([1]), "{report}");
    let first = sources
        .iter()
        .find(|s| s["n"] == 1)
        .unwrap_or_else(|| panic!("[1] is listed: {record}"));
    let url = first["url"].as_str().unwrap();
    assert!(fetched.contains(url), "[1] {url} was read ({fetched:?})");
    assert!(report.contains(&format!("[1] {} — {url}", first["title"].as_str().unwrap())));
    let report_prompts: Vec<String> = llm
        .requests()
        .iter()
        .map(prompt_text)
        .filter(|p| p.contains("You write the final report"))
        .collect();
    assert_eq!(report_prompts.len(), 1);
    assert!(
        report_prompts[0].contains("Spring tides happen at new and full moon"),
        "the findings are the passages read: {}",
        report_prompts[0]
    );
    // The conclusion taken from the report's point is remembered.
    assert_eq!(
        of_type(&events, "research_complete")[0].data["metadata"]["memories_written"],
        1
    );

    // The recursive mode: its query plan and learnings fall back too.
    let events = research(
        &app,
        &alice,
        json!({ "query": "lighthouse fresnel lens", "mode": "recursive", "depth": 2, "breadth": 2, "remember": false }),
    )
    .await
    .collect()
    .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    let steps: Vec<String> = fallbacks(&events).into_iter().map(|(_, s)| s).collect();
    assert_eq!(
        steps,
        [
            "research_brief",
            "plan_queries",
            "learnings",
            "curate_sources"
        ],
        "one level (no follow-up questions without learnings): {events:?}"
    );
    assert!(
        site.queries()
            .contains(&"lighthouse fresnel lens".to_string())
    );
    assert!(report_text(&events).contains("## Sources"));
    assert!(
        fallbacks(&events)
            .iter()
            .all(|(i, _)| *i < index_of(&events, "report_delta"))
    );
    app.stop_and_release().await;
}

/// A model that answers the report with nothing (a local model out of context, say) leaves an
/// extractive digest of the passages read instead of an empty report, with citations.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_report_from_the_model_becomes_an_extractive_digest() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let llm = FakeLlm::start().await;
    let script = research_script(vec!["spring tides moon"], "unused");
    llm.set_handler(move |request| {
        if prompt_text(request).contains("You write the final report") {
            return Some(Reply::text(""));
        }
        script(request)
    });
    let home = Home::new(Backend::Sqlite).await;
    let app = spawn(&home, &site, Some(&llm)).await;
    let alice = app.user_key("alice").await;
    let events = research(
        &app,
        &alice,
        json!({ "query": "Why do spring tides happen at full moon?", "remember": false }),
    )
    .await
    .collect()
    .await;
    assert_eq!(
        events.last().unwrap().data["status"],
        "completed",
        "{events:?}"
    );
    let steps = fallbacks(&events);
    assert_eq!(
        steps.iter().map(|(_, s)| s.as_str()).collect::<Vec<_>>(),
        ["final_report"],
        "{events:?}"
    );
    assert!(steps[0].0 < index_of(&events, "report_delta"));
    let report = report_text(&events);
    assert!(report.contains("the model's report was empty"), "{report}");
    assert!(
        report.contains("Spring tides happen at new and full moon"),
        "{report}"
    );
    let id = events[0].data["research_id"].as_str().unwrap();
    let (_, record) = app.get(&format!("/research/{id}"), Some(&alice)).await;
    assert_eq!(record["report"].as_str().unwrap(), report);
    let sources = record["sources"].as_array().unwrap();
    let fetched = site.fetched();
    let cited = cited_numbers(report.split("## Sources").next().unwrap());
    assert!(!cited.is_empty(), "{report}");
    for n in cited {
        let source = sources
            .iter()
            .find(|s| s["n"].as_u64() == Some(n as u64))
            .unwrap_or_else(|| panic!("[{n}] is listed"));
        assert!(fetched.contains(source["url"].as_str().unwrap()));
    }
    app.stop_and_release().await;
}

/// A small HTML page whose parse needs gigabytes killed the server (OOM), and a resumed
/// research fetched it again and died again. It is now read by a worker process under a
/// memory ceiling: the worker dies, the research reports the page as unreadable and goes on,
/// and the page is never fetched twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_that_would_exhaust_memory_is_refused_and_the_research_goes_on() {
    let site = ResearchSite::start(Duration::ZERO).await;
    let home = Home::new(Backend::Sqlite).await;
    let mut env = site.env();
    env.push(("MNEMO__EXTRACT__MEMORY_MB".into(), "256".into()));
    let borrowed: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let app = TestApp::spawn_with(&home, &borrowed).await;
    let alice = app.user_key("alice").await;
    let events = research(
        &app,
        &alice,
        json!({ "query": "How are coral reefs surveyed and how do tides affect reefs?" }),
    )
    .await
    .collect()
    .await;
    assert_eq!(events.last().unwrap().event, "done", "{events:?}");
    let refused: Vec<&str> = of_type(&events, "error")
        .iter()
        .filter_map(|e| e.data["message"].as_str())
        .filter(|message| message.contains("/hostile/reef-survey"))
        .collect();
    assert!(!refused.is_empty(), "the page is reported: {events:?}");
    assert!(
        refused.iter().all(|m| m.contains("MiB of memory")),
        "{refused:?}"
    );
    assert_eq!(site.hostile_fetches(), 1, "fetched once");
    // The server is alive and the other sources were read and cited.
    let report = report_text(&events);
    assert!(!report.contains("/hostile/"), "{report}");
    assert!(report.contains("/page/tides"), "{report}");
    let (status, _) = app.get("/v1/threads", Some(&alice)).await;
    assert_eq!(status, StatusCode::OK);
    app.stop().await;
}
