//! `mnemo ingest PATH...`: adds files (or every supported file under a directory, recursively)
//! to the user's documents for local research — on a running server with `--server URL --key
//! KEY`, or embedded on the data directory as the user named by `--user`. Supported: `.md`
//! `.markdown` `.txt` `.html` `.htm` `.pdf`; other files are skipped with a note on stderr.
//! Prints one line per document: its id, its chunk count, what was done (`created`,
//! `unchanged` or `replaced`) and the path, then a count of each on stderr.
//!
//! A file's source is its canonical path, which identifies its document: ingesting a folder
//! again writes only the files that changed (their chunks are replaced, the id kept) and new
//! files; unchanged ones are recognised by the hash of their bytes, before any extraction or
//! embedding.

use std::path::{Path, PathBuf};

use reqwest::Method;

use super::Failure;
use super::memory::{Backend, RemoteBody, Target, memory_failure, parse_json};
use mnemo::config::Settings;
use mnemo::documents::{self, DocumentError, NewUpload};

/// The content type a file is ingested as, by its extension.
pub fn content_type_of(path: &Path) -> Option<&'static str> {
    let extension = path.extension()?.to_str()?.to_ascii_lowercase();
    match extension.as_str() {
        "md" | "markdown" => Some("text/markdown"),
        "txt" => Some("text/plain"),
        "html" | "htm" => Some("text/html"),
        "pdf" => Some("application/pdf"),
        _ => None,
    }
}

/// The files to ingest, in a stable order: named files as given, directories walked
/// recursively (sorted). Unsupported files are reported on stderr and left out.
fn collect(paths: &[PathBuf]) -> Result<Vec<(PathBuf, &'static str)>, Failure> {
    let mut files = Vec::new();
    for path in paths {
        let metadata = std::fs::metadata(path)
            .map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
        if metadata.is_dir() {
            walk(path, &mut files)?;
        } else {
            match content_type_of(path) {
                Some(kind) => files.push((path.clone(), kind)),
                None => eprintln!("skipping {}: not a supported document type", path.display()),
            }
        }
    }
    Ok(files)
}

fn walk(dir: &Path, files: &mut Vec<(PathBuf, &'static str)>) -> Result<(), Failure> {
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|error| Failure::usage(format!("{}: {error}", dir.display())))?
        .filter_map(|entry| entry.ok().map(|entry| entry.path()))
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            walk(&path, files)?;
        } else {
            match content_type_of(&path) {
                Some(kind) => files.push((path, kind)),
                None => eprintln!("skipping {}: not a supported document type", path.display()),
            }
        }
    }
    Ok(())
}

pub async fn run(settings: &Settings, target: Target, paths: Vec<PathBuf>) -> Result<(), Failure> {
    if paths.is_empty() {
        return Err(Failure::usage("mnemo ingest needs at least one PATH"));
    }
    let files = collect(&paths)?;
    if files.is_empty() {
        return Err(Failure::usage(
            "no supported documents among the given paths",
        ));
    }
    let backend = Backend::open(settings, target).await?;
    let mut worst: Option<Failure> = None;
    let mut failed = 0usize;
    let mut counts: Vec<(String, usize)> = Vec::new();
    for (path, content_type) in &files {
        match ingest_one(&backend, path, content_type).await {
            Ok(done) => {
                println!(
                    "{}  {} chunks  {}  {}",
                    done.id,
                    done.chunks,
                    done.status,
                    path.display()
                );
                match counts.iter_mut().find(|(status, _)| *status == done.status) {
                    Some((_, count)) => *count += 1,
                    None => counts.push((done.status, 1)),
                }
            }
            Err(failure) => {
                eprintln!(
                    "error: {}: {}",
                    path.display(),
                    failure.message.replace('\n', " ")
                );
                failed += 1;
                // A failure that is not the input's fault decides the exit code.
                if worst.as_ref().is_none_or(|worst| worst.code == 2) {
                    worst = Some(failure);
                }
            }
        }
    }
    backend.close().await;
    if !counts.is_empty() {
        let summary: Vec<String> = counts
            .iter()
            .map(|(status, count)| format!("{count} {status}"))
            .collect();
        eprintln!("{}", summary.join(", "));
    }
    match worst {
        None => Ok(()),
        Some(failure) => Err(Failure {
            code: failure.code,
            message: format!("{failed} of {} documents were not ingested", files.len()),
        }),
    }
}

/// One file's document as ingested: its id, its chunk count and what was done.
struct Ingested {
    id: String,
    chunks: i64,
    status: String,
}

async fn ingest_one(
    backend: &Backend,
    path: &Path,
    content_type: &'static str,
) -> Result<Ingested, Failure> {
    let bytes = std::fs::read(path)
        .map_err(|error| Failure::usage(format!("reading the file: {error}")))?;
    // The canonical path, so `docs/a.md`, `./docs/a.md` and a symlink to it are one document.
    let source = std::fs::canonicalize(path)
        .map_err(|error| Failure::usage(format!("resolving the path: {error}")))?
        .display()
        .to_string();
    match backend {
        Backend::Remote { .. } => {
            let query: String = url::form_urlencoded::Serializer::new(String::new())
                .append_pair("source", &source)
                .finish();
            let text = backend
                .remote(
                    Method::POST,
                    &format!("/v1/documents?{query}"),
                    Some(RemoteBody::Bytes {
                        content_type,
                        bytes,
                    }),
                )
                .await?;
            let document = parse_json(&text)?;
            Ok(Ingested {
                id: document["id"].as_str().unwrap_or("-").to_string(),
                chunks: document["chunks"].as_i64().unwrap_or(0),
                // A server from before content hashes always created a document.
                status: document["status"].as_str().unwrap_or("created").to_string(),
            })
        }
        Backend::Embedded { engine, user, .. } => {
            let upload = NewUpload {
                title: None,
                source: Some(source),
                content_type: content_type.to_string(),
                bytes,
            };
            let ingested = documents::ingest(engine, *user, upload)
                .await
                .map_err(|error| match error {
                    DocumentError::Memory(error) => memory_failure(error),
                    DocumentError::Store(error) => error.into(),
                    DocumentError::BadInput(message) | DocumentError::TooLarge(message) => {
                        Failure::usage(message)
                    }
                    DocumentError::Unavailable(message) => Failure::other(message),
                })?;
            Ok(Ingested {
                id: ingested.document.id.to_string(),
                chunks: ingested.document.chunks,
                status: ingested.status.as_str().to_string(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extensions_pick_the_content_type() {
        let cases = [
            ("notes.md", Some("text/markdown")),
            ("README.MARKDOWN", Some("text/markdown")),
            ("a/b/c.txt", Some("text/plain")),
            ("page.HTM", Some("text/html")),
            ("page.html", Some("text/html")),
            ("paper.pdf", Some("application/pdf")),
            ("image.png", None),
            ("Makefile", None),
        ];
        for (path, expected) in cases {
            assert_eq!(content_type_of(Path::new(path)), expected, "{path}");
        }
    }
}
