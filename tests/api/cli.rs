//! The `mnemo` binary as an operator uses it: `user add` prints a key alone on stdout, `serve`
//! prints where it listens and its backends, answers with that key, and exits cleanly on
//! SIGTERM; bad usage exits with 2.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

type Lines = std::io::Lines<BufReader<std::process::ChildStdout>>;

/// Starts `mnemo serve` on a free port of `data_dir`; returns it, the base URL from its first
/// line, and the rest of what it prints (the banner).
fn serve(data_dir: &std::path::Path) -> (std::process::Child, String, Lines) {
    let mut server = mnemo(data_dir)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let listening = lines.next().unwrap().unwrap();
    let base = listening
        .strip_prefix("mnemo listening on ")
        .unwrap_or_else(|| panic!("unexpected first line: {listening}"))
        .to_string();
    (server, base, lines)
}

fn stop(mut server: std::process::Child) {
    let pid = server.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while server.try_wait().unwrap().is_none() {
        assert!(std::time::Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Runs `mnemo chat` with `args`, feeding `input` on stdin, and waits for it to end.
fn chat_with(data_dir: &std::path::Path, args: &[&str], input: &[u8]) -> std::process::Output {
    use std::io::Write;
    let mut chat = mnemo(data_dir)
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    chat.stdin.take().unwrap().write_all(input).unwrap();
    chat.wait_with_output().unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn mnemo(data_dir: &std::path::Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_mnemo"));
    command
        .arg("--data-dir")
        .arg(data_dir)
        .env_remove("MNEMO__DATABASE__URL")
        .env_remove("MNEMO_SERVER")
        .env_remove("MNEMO_KEY")
        .env_remove("MNEMO_USER")
        .env("MNEMO__LOG__LEVEL", "warn")
        .env(
            "MNEMO__EMBEDDER__MODEL_DIR",
            concat!(env!("CARGO_MANIFEST_DIR"), "/models/all-MiniLM-L6-v2"),
        );
    command
}

#[test]
fn user_commands_manage_keys_that_the_server_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let added = mnemo(dir.path())
        .args(["user", "add", "alice"])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let key = String::from_utf8(added.stdout).unwrap().trim().to_string();
    assert!(
        key.starts_with("mnemo_") && key.len() == 70,
        "stdout is the key alone: {key}"
    );

    let duplicate = mnemo(dir.path())
        .args(["user", "add", "alice"])
        .output()
        .unwrap();
    assert_eq!(duplicate.status.code(), Some(2));
    let message = String::from_utf8(duplicate.stderr).unwrap();
    assert!(message.contains("already exists"), "{message}");
    assert_eq!(message.trim().lines().count(), 1);

    let invalid = mnemo(dir.path())
        .args(["user", "add", "bad name!"])
        .output()
        .unwrap();
    assert_eq!(invalid.status.code(), Some(2));
    let unknown = mnemo(dir.path()).args(["frobnicate"]).output().unwrap();
    assert_eq!(unknown.status.code(), Some(2));

    let (mut server, base, mut lines) = serve(dir.path());
    assert!(!base.ends_with(":0"), "the real port is printed: {base}");
    let banner: Vec<String> = (0..10).map(|_| lines.next().unwrap().unwrap()).collect();
    let banner = banner.join("\n");
    for expected in [
        "database   sqlite",
        "vectors    Qdrant Edge in ",
        "keywords   tantivy in ",
        "embedding  all-MiniLM-L6-v2",
        "chat model none",
        "search     ",
        "auth       api keys",
        "data       ",
        "web app    ",
        "docs       /docs",
    ] {
        assert!(banner.contains(expected), "{expected:?} not in\n{banner}");
    }

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let status = |key: Option<&str>| {
        let client = reqwest::Client::new();
        let mut request = client.get(format!("{base}/v1/threads"));
        if let Some(key) = key {
            request = request.bearer_auth(key);
        }
        runtime.block_on(async { request.send().await.unwrap().status().as_u16() })
    };
    assert_eq!(status(Some(&key)), 200);
    assert_eq!(status(None), 401);

    // User management works against the database while the server runs.
    let listed = mnemo(dir.path()).args(["user", "list"]).output().unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(
        listed
            .lines()
            .any(|line| line.starts_with("alice") && line.contains(" 1 ")),
        "{listed}"
    );
    let revoked = mnemo(dir.path())
        .args(["user", "revoke", "alice"])
        .output()
        .unwrap();
    assert!(revoked.status.success());
    assert_eq!(status(Some(&key)), 401);

    let pid = server.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(exit) = server.try_wait().unwrap() {
            assert!(exit.success(), "serve exits 0 on SIGTERM: {exit:?}");
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "serve did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn chat_runs_an_embedded_server_and_streams_answers_to_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let output = chat_with(dir.path(), &[], b"what do you remember about me?\n/quit\n");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8(output.stdout).unwrap();
    assert!(
        stdout.contains("No language model is configured"),
        "{stdout}"
    );
    let stderr = String::from_utf8(output.stderr).unwrap();
    assert!(stderr.contains("embedded server on 127.0.0.1:"), "{stderr}");
    assert!(!stderr.contains("did not stop in time"), "{stderr}");
}

#[test]
fn ingest_reads_a_directory_and_reports_each_document() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(docs.join("nested")).unwrap();
    std::fs::write(
        docs.join("otters.md"),
        "# Otters of Pellwick\n\nThe Pellwick otters crack clams with flat stones.",
    )
    .unwrap();
    std::fs::write(
        docs.join("nested/page.html"),
        "<html><head><title>Tide table</title></head><body><p>High tide at Pellwick is at 6.</p></body></html>",
    )
    .unwrap();
    std::fs::write(docs.join("picture.png"), b"\x89PNG").unwrap();
    let data = dir.path().join("data");
    let added = mnemo(&data).args(["user", "add", "erin"]).output().unwrap();
    assert!(added.status.success(), "{added:?}");

    let ingested = mnemo(&data)
        .args(["ingest", "--user", "erin"])
        .arg(&docs)
        .output()
        .unwrap();
    let stdout = String::from_utf8(ingested.stdout).unwrap();
    let stderr = String::from_utf8(ingested.stderr).unwrap();
    assert!(ingested.status.success(), "{stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    // Directories are walked in name order: nested/page.html, then otters.md.
    assert!(
        lines[0].ends_with("page.html") && lines[0].contains("  1 chunks  "),
        "{stdout}"
    );
    assert!(
        lines[1].ends_with("otters.md") && lines[1].contains("  1 chunks  "),
        "{stdout}"
    );
    let id = lines[1].split_whitespace().next().unwrap();
    assert!(uuid::Uuid::parse_str(id).is_ok(), "{id}");
    assert!(
        stderr.contains("skipping") && stderr.contains("picture.png"),
        "{stderr}"
    );

    // The chunks are in the user's memory as documents, out of default recall.
    let listed = mnemo(&data)
        .args(["memory", "list", "--user", "erin", "--kinds", "document"])
        .output()
        .unwrap();
    let listed = String::from_utf8(listed.stdout).unwrap();
    assert!(listed.contains("crack clams"), "{listed}");
    assert!(listed.contains("High tide"), "{listed}");
    let searched = mnemo(&data)
        .args(["memory", "search", "--user", "erin", "otters clams"])
        .output()
        .unwrap();
    assert!(searched.status.success());
    assert!(
        String::from_utf8(searched.stdout)
            .unwrap()
            .trim()
            .is_empty()
    );

    // Bad usage: a missing path, and no user for an embedded run.
    let missing = mnemo(&data)
        .args(["ingest", "--user", "erin", "/nonexistent/file.md"])
        .output()
        .unwrap();
    assert_eq!(missing.status.code(), Some(2));
    // Without --user an embedded ingest is the local dev user's, like every command.
    let no_user = mnemo(&data).arg("ingest").arg(&docs).output().unwrap();
    assert!(no_user.status.success(), "{no_user:?}");
    let empty = dir.path().join("empty.txt");
    std::fs::write(&empty, "   ").unwrap();
    let failed = mnemo(&data)
        .args(["ingest", "--user", "erin"])
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(failed.status.code(), Some(2));
    let message = String::from_utf8(failed.stderr).unwrap();
    assert!(message.contains("empty"), "{message}");
}

#[test]
fn research_without_a_model_over_local_documents_writes_a_cited_report() {
    let dir = tempfile::tempdir().unwrap();
    let docs = dir.path().join("docs");
    std::fs::create_dir_all(&docs).unwrap();
    std::fs::write(
        docs.join("otters.md"),
        "# Otters of Pellwick\n\nThe Pellwick otters crack clams open with flat stones they keep under their arms.\n\nThey float on their backs in the kelp beds while they eat.",
    )
    .unwrap();
    std::fs::write(
        docs.join("tides.md"),
        "# Pellwick harbour\n\nHigh tide at Pellwick harbour comes twice a day, about twelve hours and twenty-five minutes apart.",
    )
    .unwrap();
    let data = dir.path().join("data");
    assert!(
        mnemo(&data)
            .args(["user", "add", "erin"])
            .output()
            .unwrap()
            .status
            .success()
    );
    let ingested = mnemo(&data)
        .args(["ingest", "--user", "erin"])
        .arg(&docs)
        .output()
        .unwrap();
    assert!(ingested.status.success(), "{ingested:?}");

    let researched = mnemo(&data)
        .args([
            "research",
            "--user",
            "erin",
            "--search-api",
            "local",
            "How do the Pellwick otters open clams?",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8(researched.stdout).unwrap();
    let stderr = String::from_utf8(researched.stderr).unwrap();
    assert!(researched.status.success(), "{stdout}\n{stderr}");
    // An extractive digest: the document's own words, cited, with the source listed.
    let (body, sources) = stdout.split_once("## Sources").expect("a sources section");
    assert!(
        body.contains("crack clams open with flat stones"),
        "{stdout}"
    );
    let line = body
        .lines()
        .find(|line| line.contains("crack clams"))
        .unwrap();
    let cited: usize = line
        .rsplit('[')
        .next()
        .and_then(|rest| rest.trim_end().trim_end_matches(']').parse().ok())
        .unwrap_or_else(|| panic!("the passage is cited: {line}"));
    let source = sources
        .lines()
        .find(|l| l.starts_with(&format!("[{cited}] ")))
        .unwrap_or_else(|| panic!("[{cited}] is listed: {sources}"));
    assert!(source.contains("doc:"), "{source}");
    assert!(stderr.contains("== completed"), "{stderr}");
    // The embedded state shuts down in order: no background task has to be aborted.
    assert!(!stderr.contains("did not stop in time"), "{stderr}");
    let id = stderr
        .lines()
        .find_map(|line| line.strip_prefix("research "))
        .expect("the research id is shown")
        .trim()
        .to_string();

    // A follow-up from the terminal starts from that research and goes further.
    let followed = mnemo(&data)
        .args([
            "research",
            "--user",
            "erin",
            "--search-api",
            "local",
            "--follow-up",
            &id,
        ])
        .arg("When is high tide at Pellwick harbour?")
        .output()
        .unwrap();
    let follow_out = String::from_utf8_lossy(&followed.stdout).into_owned();
    assert!(followed.status.success(), "{followed:?}");
    assert!(
        follow_out.contains("twelve hours and twenty-five minutes"),
        "{follow_out}"
    );

    // The first research exported as DOCX and PDF files, read back.
    let docx = dir.path().join("otters.docx");
    let exported = mnemo(&data)
        .args([
            "research", "--user", "erin", "--export", &id, "--format", "docx", "-o",
        ])
        .arg(&docx)
        .output()
        .unwrap();
    assert!(exported.status.success(), "{exported:?}");
    let xml = std::process::Command::new("unzip")
        .arg("-p")
        .arg(&docx)
        .arg("word/document.xml")
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&xml.stdout).contains("crack clams open with flat stones"),
        "{xml:?}"
    );
    let pdf = dir.path().join("otters.pdf");
    let exported = mnemo(&data)
        .args([
            "research", "--user", "erin", "--export", &id, "--format", "pdf", "-o",
        ])
        .arg(&pdf)
        .output()
        .unwrap();
    assert!(exported.status.success(), "{exported:?}");
    assert!(std::fs::read(&pdf).unwrap().starts_with(b"%PDF-"));

    // Another user has no documents: nothing to research.
    assert!(
        mnemo(&data)
            .args(["user", "add", "finn"])
            .output()
            .unwrap()
            .status
            .success()
    );
    let other = mnemo(&data)
        .args([
            "research",
            "--user",
            "finn",
            "--search-api",
            "local",
            "Pellwick otters clams",
        ])
        .output()
        .unwrap();
    let other_out = String::from_utf8(other.stdout).unwrap();
    assert!(!other_out.contains("crack clams"), "{other_out}");
    // …and the research says it failed, and why (it used to "complete" with nothing).
    assert!(!other.status.success());
    let other_err = String::from_utf8_lossy(&other.stderr);
    assert!(other_err.contains("no source to cite"), "{other_err}");
    // erin's research is not finn's to export.
    let theirs = mnemo(&data)
        .args(["research", "--user", "finn", "--export", &id])
        .output()
        .unwrap();
    assert!(!theirs.status.success());
}

#[test]
fn ingest_sends_files_to_a_running_server() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let added = mnemo(&data).args(["user", "add", "fay"]).output().unwrap();
    assert!(added.status.success(), "{added:?}");
    let key = String::from_utf8(added.stdout).unwrap().trim().to_string();
    let file = dir.path().join("kilns.txt");
    std::fs::write(
        &file,
        "Pellwick kilns burn driftwood.\n\nThey glow all night.",
    )
    .unwrap();

    let (server, base, _banner) = serve(&data);

    let ingested = mnemo(&data)
        .args(["ingest", "--server", &base, "--key", &key])
        .arg(&file)
        .output()
        .unwrap();
    assert!(ingested.status.success(), "{ingested:?}");
    let stdout = String::from_utf8(ingested.stdout).unwrap();
    assert!(stdout.trim().ends_with("kilns.txt"), "{stdout}");
    assert!(stdout.contains("  1 chunks  "), "{stdout}");
    let wrong_key = mnemo(&data)
        .args(["ingest", "--server", &base, "--key", "mnemo_wrong"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(wrong_key.status.code(), Some(2));

    let runtime = tokio::runtime::Runtime::new().unwrap();
    let documents: serde_json::Value = runtime.block_on(async {
        reqwest::Client::new()
            .get(format!("{base}/v1/documents"))
            .bearer_auth(&key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    });
    let documents = documents["documents"].as_array().unwrap().clone();
    assert_eq!(documents.len(), 1);
    assert_eq!(documents[0]["title"], "Pellwick kilns burn driftwood.");
    assert_eq!(documents[0]["content_type"], "text/plain");
    assert!(
        documents[0]["source"]
            .as_str()
            .unwrap()
            .ends_with("kilns.txt"),
        "{documents:?}"
    );

    stop(server);
}

/// `mnemo check` compares both indexes with SQL: equal after ordinary writes (exit 0), a row
/// removed behind the log's back shows as an extra point in each index (exit 1, pointing at
/// `mnemo reindex`), and after `reindex` they are equal again.
#[test]
fn check_finds_indexes_that_differ_from_sql_and_reindex_repairs_them() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let added = mnemo(&data).args(["user", "add", "fay"]).output().unwrap();
    assert!(added.status.success(), "{added:?}");
    for fact in [
        "Fay keeps bees on the roof.",
        "Fay's bicycle is green.",
        "Fay moved to Lisbon in 2021.",
    ] {
        let out = mnemo(&data)
            .args(["memory", "add", "--user", "fay", fact])
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    }
    let check = mnemo(&data).arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout).to_string();
    assert!(check.status.success(), "{stdout}\n{check:?}");
    assert!(
        stdout.contains("3 memories of 1 users; vector index: 0 missing, 0 extra; keyword index: 0 missing, 0 extra"),
        "{stdout}"
    );
    // A row deleted straight from SQL, without a log entry: the indexes still hold it.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        use sqlx::Connection;
        let url = format!("sqlite://{}", data.join("mnemo.db").display());
        let mut db = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query("DELETE FROM memories WHERE content LIKE '%bicycle%'")
            .execute(&mut db)
            .await
            .unwrap();
    });
    let check = mnemo(&data).arg("check").output().unwrap();
    let stdout = String::from_utf8_lossy(&check.stdout).to_string();
    let stderr = String::from_utf8_lossy(&check.stderr).to_string();
    assert_eq!(check.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("2 memories of 1 users; vector index: 0 missing, 1 extra; keyword index: 0 missing, 1 extra"),
        "{stdout}"
    );
    assert!(stderr.contains("mnemo reindex"), "{stderr}");
    let reindex = mnemo(&data).arg("reindex").output().unwrap();
    assert!(reindex.status.success(), "{reindex:?}");
    let check = mnemo(&data).arg("check").output().unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

/// While `serve` holds the data directory, the CLI's data commands talk to it as `--user`
/// (through the local credential in the owner-only lock file) and say so; a second `serve`
/// and `reindex` name the holding process; identity is the same for every command; keys
/// rotate; after the server stops, the same commands run embedded.
#[test]
fn cli_commands_use_the_server_holding_the_data_directory_as_the_named_user() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let added = mnemo(&data)
        .args(["user", "add", "alice"])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let key = text(&added.stdout).trim().to_string();
    let (server, base, _banner) = serve(&data);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join("mnemo.lock"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "the lock file holds a credential");
    }

    let add = mnemo(&data)
        .args([
            "--user",
            "alice",
            "memory",
            "add",
            "My sister Ilse lives in Graz",
        ])
        .output()
        .unwrap();
    assert!(add.status.success(), "{add:?}");
    let note = text(&add.stderr);
    assert!(note.contains("talking to the server that holds"), "{note}");
    assert!(note.contains(&base), "{note}");
    assert!(note.contains("as alice"), "{note}");

    let mut found = String::new();
    for _ in 0..50 {
        let search = mnemo(&data)
            .args([
                "memory",
                "search",
                "where does my sister live",
                "--user",
                "alice",
            ])
            .output()
            .unwrap();
        assert!(search.status.success(), "{search:?}");
        found = text(&search.stdout);
        if found.contains("Graz") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(found.contains("Ilse lives in Graz"), "{found}");
    // The local dev user (no --user) sees none of alice's memories.
    let as_dev = mnemo(&data)
        .args(["memory", "search", "where does my sister live"])
        .output()
        .unwrap();
    assert!(as_dev.status.success(), "{as_dev:?}");
    assert!(!text(&as_dev.stdout).contains("Graz"), "{as_dev:?}");
    let nobody = mnemo(&data)
        .args(["memory", "list", "--user", "nobody"])
        .output()
        .unwrap();
    assert_eq!(nobody.status.code(), Some(2), "{nobody:?}");
    assert!(
        text(&nobody.stderr).contains("no user named nobody"),
        "{nobody:?}"
    );

    // chat --user alice: the same identity (no model: the answer lists what it recalled).
    let chatted = chat_with(
        &data,
        &["--user", "alice"],
        b"where does my sister live?\n/quit\n",
    );
    assert!(chatted.status.success(), "{chatted:?}");
    assert!(
        text(&chatted.stdout).contains("Ilse lives in Graz"),
        "{chatted:?}"
    );

    // A second server and reindex name the holder instead of failing on index locks.
    let second = mnemo(&data)
        .args(["serve", "--addr", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert!(!second.status.success());
    let message = text(&second.stderr);
    assert!(
        message.contains(&format!("is in use by pid {} (mnemo serve", server.id())),
        "{message}"
    );
    assert!(message.contains(&base), "{message}");
    let reindex = mnemo(&data).arg("reindex").output().unwrap();
    assert!(!reindex.status.success());
    assert!(
        text(&reindex.stderr).contains("is in use by pid"),
        "{reindex:?}"
    );

    // --server without a scheme, with a key: the key's user.
    let address = base.trim_start_matches("http://").to_string();
    let listed = mnemo(&data)
        .args(["memory", "list", "--server", &address, "--key", &key])
        .output()
        .unwrap();
    assert!(listed.status.success(), "{listed:?}");
    assert!(
        text(&listed.stdout).contains("Ilse lives in Graz"),
        "{listed:?}"
    );
    let both = mnemo(&data)
        .args([
            "memory", "list", "--server", &address, "--key", &key, "--user", "bob",
        ])
        .output()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "{both:?}");

    // Key rotation: a new key, the old one revoked; --keep-old keeps the previous one.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let status = |key: &str| {
        let request = reqwest::Client::new()
            .get(format!("{base}/v1/threads"))
            .bearer_auth(key);
        runtime.block_on(async { request.send().await.unwrap().status().as_u16() })
    };
    let rotated = mnemo(&data)
        .args(["user", "key", "alice"])
        .output()
        .unwrap();
    assert!(rotated.status.success(), "{rotated:?}");
    let second_key = text(&rotated.stdout).trim().to_string();
    assert_ne!(second_key, key);
    assert_eq!(status(&key), 401);
    assert_eq!(status(&second_key), 200);
    let kept = mnemo(&data)
        .args(["user", "key", "alice", "--keep-old"])
        .output()
        .unwrap();
    let third_key = text(&kept.stdout).trim().to_string();
    assert_eq!(status(&second_key), 200);
    assert_eq!(status(&third_key), 200);
    let keys = mnemo(&data)
        .args(["user", "keys", "alice"])
        .output()
        .unwrap();
    let keys = text(&keys.stdout);
    let rows: Vec<&str> = keys.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{keys}");
    assert!(
        rows[0].starts_with(&third_key[..12]) && rows[0].trim_end().ends_with('-'),
        "{keys}"
    );
    assert!(
        rows[2].starts_with(&key[..12]) && !rows[2].trim_end().ends_with('-'),
        "{keys}"
    );
    let revoke_then_add = mnemo(&data)
        .args(["user", "add", "alice"])
        .output()
        .unwrap();
    assert!(
        text(&revoke_then_add.stderr).contains("mnemo user key alice"),
        "{revoke_then_add:?}"
    );

    stop(server);
    // With the server gone the same command runs embedded, and says nothing about a server.
    let embedded = mnemo(&data)
        .args(["--user", "alice", "memory", "list"])
        .output()
        .unwrap();
    assert!(embedded.status.success(), "{embedded:?}");
    assert!(text(&embedded.stdout).contains("Graz"), "{embedded:?}");
    assert!(
        !text(&embedded.stderr).contains("talking to the server"),
        "{embedded:?}"
    );
}

/// `mnemo memory forget` lists what would go and asks; "n" keeps everything, `--yes` forgets
/// the passport alone, `memory forgotten` lists it and `memory restore` brings it back.
#[test]
fn memory_forget_asks_first_and_can_be_undone() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    for fact in [
        "My passport number is X1234567.",
        "My sister lives in Lisbon.",
        "I play the cello in a community orchestra.",
    ] {
        let add = mnemo(&data).args(["memory", "add", fact]).output().unwrap();
        assert!(add.status.success(), "{add:?}");
    }
    let forget = |yes: bool, input: &[u8]| {
        let mut command = mnemo(&data);
        command.args(["memory", "forget", "Forget everything about my passport"]);
        if yes {
            command.arg("--yes");
        }
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(input).unwrap();
        child.wait_with_output().unwrap()
    };
    let kept = forget(false, b"n\n");
    assert!(kept.status.success(), "{kept:?}");
    let listing = text(&kept.stderr);
    assert!(listing.contains("X1234567"), "{listing}");
    assert!(
        !listing.contains("Lisbon") && !listing.contains("cello"),
        "{listing}"
    );
    assert!(listing.contains("nothing forgotten"), "{listing}");
    let list = |data: &std::path::Path| {
        text(
            &mnemo(data)
                .args(["memory", "list"])
                .output()
                .unwrap()
                .stdout,
        )
    };
    assert!(list(&data).contains("X1234567"));

    let done = forget(true, b"");
    assert!(done.status.success(), "{done:?}");
    assert!(
        text(&done.stdout).contains("1 memories forgotten"),
        "{done:?}"
    );
    let listed = list(&data);
    assert!(!listed.contains("X1234567"), "{listed}");
    assert!(
        listed.contains("Lisbon") && listed.contains("cello"),
        "{listed}"
    );

    let forgotten = text(
        &mnemo(&data)
            .args(["memory", "forgotten"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(forgotten.contains("X1234567"), "{forgotten}");
    let id = forgotten.split_whitespace().next().unwrap().to_string();
    let restore = mnemo(&data)
        .args(["memory", "restore", &id])
        .output()
        .unwrap();
    assert!(restore.status.success(), "{restore:?}");
    assert!(list(&data).contains("X1234567"));
    let again = mnemo(&data)
        .args(["memory", "restore", &id])
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(2), "{again:?}");
}

/// Under the usual umask 022 the database was 0644 and the data directory 0755: anyone on the
/// machine could read every user's memories. Everything the server creates is now its
/// owner's alone, and an existing data directory open to others is closed.
#[test]
fn data_files_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let fresh = dir.path().join("fresh/data");
    let added = mnemo(&fresh)
        .args(["user", "add", "alice"])
        .output()
        .unwrap();
    assert!(added.status.success(), "{added:?}");
    let (server, _base, _lines) = serve(&fresh);
    stop(server);

    let existing = dir.path().join("existing");
    std::fs::create_dir_all(&existing).unwrap();
    std::fs::set_permissions(&existing, std::fs::Permissions::from_mode(0o755)).unwrap();
    let (server, _base, _lines) = serve(&existing);
    stop(server);

    for root in [&fresh, &existing] {
        let mut seen = 0;
        let mut stack = vec![root.clone()];
        while let Some(path) = stack.pop() {
            let metadata = std::fs::symlink_metadata(&path).unwrap();
            let mode = metadata.permissions().mode() & 0o777;
            assert_eq!(mode & 0o077, 0, "{} is {mode:o}", path.display());
            seen += 1;
            if metadata.is_dir() {
                stack.extend(std::fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
            }
        }
        assert!(seen > 5, "the server wrote its files in {}", root.display());
    }
    let database = std::fs::metadata(fresh.join("mnemo.db")).unwrap();
    assert_eq!(database.permissions().mode() & 0o777, 0o600);
}

/// Runs `mnemo` with `args`, the password (and a line end) on stdin.
fn with_password(
    data_dir: &std::path::Path,
    args: &[&str],
    password: &str,
) -> std::process::Output {
    use std::io::Write as _;
    let mut child = mnemo(data_dir)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(format!("{password}\n").as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

#[test]
fn an_administrator_made_from_the_shell_signs_in_with_the_password_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let added = with_password(
        dir.path(),
        &["user", "add", "root", "--admin", "--password-stdin"],
        "first password",
    );
    assert!(added.status.success(), "{added:?}");
    assert!(
        text(&added.stdout).trim().starts_with("mnemo_"),
        "the key is printed"
    );
    assert!(!text(&added.stderr).contains("first password"));
    let short = with_password(dir.path(), &["user", "password", "root"], "short");
    assert_eq!(short.status.code(), Some(2), "{short:?}");
    let changed = with_password(dir.path(), &["user", "password", "root"], "second password");
    assert!(changed.status.success(), "{changed:?}");
    let listed = text(
        &mnemo(dir.path())
            .args(["user", "list"])
            .output()
            .unwrap()
            .stdout,
    );
    assert!(
        listed
            .lines()
            .any(|line| line.starts_with("root") && line.ends_with("admin,password")),
        "{listed}"
    );

    let (server, base, _lines) = serve(dir.path());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let client = reqwest::Client::new();
    let (setup, old, new) = runtime.block_on(async {
        let setup: serde_json::Value = client
            .get(format!("{base}/v1/auth/status"))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let login = |password: &'static str| {
            client
                .post(format!("{base}/v1/auth/login"))
                .json(&serde_json::json!({ "name": "root", "password": password }))
                .send()
        };
        let old = login("first password").await.unwrap().status().as_u16();
        let new: serde_json::Value = login("second password")
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        (setup, old, new)
    });
    assert_eq!(
        setup["setup_required"], false,
        "an admin exists: no browser setup"
    );
    assert_eq!(old, 401);
    assert_eq!(
        (new["name"].as_str(), new["is_admin"].as_bool()),
        (Some("root"), Some(true))
    );
    stop(server);
}
