//! The README's quickstart, run as written: the lines between its `quickstart:begin` and
//! `quickstart:end` markers run in order in a fresh directory, with `mnemo` being this build's
//! binary and a server (`mnemo serve`, as `scripts/serve` starts it) holding `./data`. Every
//! line must succeed, and a line ending in `# → TEXT` must print TEXT.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The quickstart's command lines with what each must print (if anything).
fn quickstart_lines() -> Vec<(String, Option<String>)> {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md"))
        .expect("README.md");
    let begin = readme
        .find("<!-- quickstart:begin")
        .expect("README.md has a quickstart:begin marker");
    let end = readme[begin..]
        .find("<!-- quickstart:end -->")
        .map(|at| begin + at)
        .expect("README.md has a quickstart:end marker");
    readme[begin..end]
        .lines()
        .skip(1)
        .filter(|line| !line.trim().is_empty() && !line.starts_with("```"))
        .map(|line| match line.split_once("# →") {
            Some((command, expected)) => (
                command.trim().to_string(),
                Some(expected.trim().to_string()),
            ),
            None => (line.trim().to_string(), None),
        })
        .collect()
}

#[test]
fn the_readme_quickstart_runs_as_written() {
    let lines = quickstart_lines();
    assert!(
        lines.len() >= 8,
        "the quickstart lost its commands: {lines:?}"
    );
    let dir = tempfile::tempdir().unwrap();
    let binary = env!("CARGO_BIN_EXE_mnemo");
    let model_dir = concat!(env!("CARGO_MANIFEST_DIR"), "/models/all-MiniLM-L6-v2");
    let environment = |command: &mut Command| {
        command
            .current_dir(dir.path())
            .env_remove("MNEMO__DATABASE__URL")
            .env_remove("MNEMO_SERVER")
            .env_remove("MNEMO_KEY")
            .env_remove("MNEMO_USER")
            .env("MNEMO__LOG__LEVEL", "warn")
            .env("MNEMO__EMBEDDER__MODEL_DIR", model_dir);
    };
    let mut serve = Command::new(binary);
    serve
        .args(["serve", "--addr", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    environment(&mut serve);
    let mut server = serve.spawn().unwrap();
    let mut banner = BufReader::new(server.stdout.take().unwrap()).lines();
    let listening = banner.next().unwrap().unwrap();
    assert!(
        listening.starts_with("mnemo listening on http://127.0.0.1:"),
        "{listening}"
    );

    for (command, expected) in &lines {
        let script = format!("mnemo() {{ \"$MNEMO_BIN\" \"$@\"; }}\n{command}");
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut shell = Command::new("bash");
            shell
                .args(["-euo", "pipefail", "-c", &script])
                .env("MNEMO_BIN", binary);
            environment(&mut shell);
            let output = shell.output().unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success(),
                "`{command}` failed ({}):\nstdout: {stdout}\nstderr: {stderr}",
                output.status
            );
            let Some(expected) = expected else { break };
            if stdout.contains(expected.as_str()) {
                break;
            }
            // A memory written a moment ago may still be on its way into the indexes.
            assert!(
                Instant::now() < deadline,
                "`{command}` did not print {expected:?}:\nstdout: {stdout}\nstderr: {stderr}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    let pid = server.id().to_string();
    Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while server.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "serve did not stop");
        std::thread::sleep(Duration::from_millis(50));
    }
}
