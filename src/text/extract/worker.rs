//! Extraction in a child process with hard ceilings. The server never parses an uploaded
//! document or a fetched page itself: it runs `mnemo __extract` (this same executable, or the
//! one `extract.worker` names), writes the bytes to its stdin and reads one JSON answer from
//! its stdout. The child first limits its own address space (`RLIMIT_AS`: its start-up
//! footprint plus `extract.memory_mb`) and CPU time (`RLIMIT_CPU`), so a document that would need gigabytes or minutes kills the child — an
//! allocation fails and it aborts, or the kernel stops it — and the server answers 413. A
//! wall-clock deadline (twice the CPU ceiling) and `kill_on_drop` bound a child that sleeps
//! or whose caller went away; a semaphore bounds how many run at once.

use parking_lot::Mutex;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{ExitCode, Stdio};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;
use tokio::sync::Semaphore;

use super::{Budget, ExtractError, Extracted, by_content_type_within};
use crate::config::ExtractSettings;

/// The first argument that makes the `mnemo` executable an extraction worker.
pub const WORKER_COMMAND: &str = "__extract";

/// The ceilings of one extraction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ceilings {
    pub memory_bytes: u64,
    pub cpu_secs: u64,
    pub max_text_bytes: usize,
}

impl Ceilings {
    fn from_settings(settings: &ExtractSettings) -> Self {
        Self {
            memory_bytes: settings.memory_mb.saturating_mul(1024 * 1024),
            cpu_secs: settings.cpu_secs,
            max_text_bytes: settings.max_text_bytes,
        }
    }

    fn memory_mib(&self) -> u64 {
        self.memory_bytes / (1024 * 1024)
    }
}

/// What the worker answers on stdout.
#[derive(Debug, Serialize, Deserialize)]
struct Answer {
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    text: Option<String>,
    /// `unsupported`, `pdf`, `too_large` or `unreadable` with its message, when it failed.
    #[serde(default)]
    error: Option<(String, String)>,
    /// The worker's peak resident memory (KiB) and CPU time (ms), for benchmarks and logs.
    peak_rss_kib: u64,
    cpu_ms: u64,
}

/// What an extraction cost the worker that ran it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub peak_rss_kib: u64,
    pub cpu_ms: u64,
}

struct Worker {
    program: Option<PathBuf>,
    ceilings: Ceilings,
    permits: Arc<Semaphore>,
}

static WORKER: Mutex<Option<Arc<Worker>>> = Mutex::new(None);

/// Sets the worker executable and ceilings (at startup; later calls replace them).
pub fn configure(settings: &ExtractSettings) {
    let worker = Worker {
        program: program(settings.worker.as_deref()),
        ceilings: Ceilings::from_settings(settings),
        permits: Arc::new(Semaphore::new(settings.concurrency)),
    };
    *WORKER.lock() = Some(Arc::new(worker));
}

fn current() -> Arc<Worker> {
    WORKER
        .lock()
        .get_or_insert_with(|| {
            let settings = ExtractSettings::default();
            Arc::new(Worker {
                program: program(None),
                ceilings: Ceilings::from_settings(&settings),
                permits: Arc::new(Semaphore::new(settings.concurrency)),
            })
        })
        .clone()
}

/// The configured executable, or this one when it is `mnemo`.
fn program(configured: Option<&Path>) -> Option<PathBuf> {
    if let Some(path) = configured.filter(|path| !path.as_os_str().is_empty()) {
        return Some(path.to_path_buf());
    }
    std::env::current_exe()
        .ok()
        .filter(|exe| exe.file_stem().is_some_and(|stem| stem == "mnemo"))
}

/// Extracts `bytes` of `content_type` in a worker process under the configured ceilings.
pub(crate) async fn extract_isolated(
    content_type: &str,
    bytes: Vec<u8>,
) -> Result<Extracted, ExtractError> {
    extract_with_cost(content_type, bytes)
        .await
        .map(|(extracted, _)| extracted)
}

/// [`extract_isolated`], with what it cost the worker.
pub async fn extract_with_cost(
    content_type: &str,
    bytes: Vec<u8>,
) -> Result<(Extracted, Cost), ExtractError> {
    let worker = current();
    let Some(program) = worker.program.clone() else {
        return Err(ExtractError::Worker(
            "no extraction worker: set extract.worker to the mnemo executable".into(),
        ));
    };
    let _permit = worker
        .permits
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| ExtractError::Worker("the extraction workers were shut down".into()))?;
    run(&program, worker.ceilings, content_type, bytes).await
}

async fn run(
    program: &Path,
    ceilings: Ceilings,
    content_type: &str,
    bytes: Vec<u8>,
) -> Result<(Extracted, Cost), ExtractError> {
    let mut child = tokio::process::Command::new(program)
        .arg(WORKER_COMMAND)
        .arg(content_type)
        .arg(ceilings.memory_bytes.to_string())
        .arg(ceilings.cpu_secs.to_string())
        .arg(ceilings.max_text_bytes.to_string())
        .env_clear()
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|error| {
            ExtractError::Worker(format!(
                "the extraction worker {} could not start: {error}",
                program.display()
            ))
        })?;
    let stdin = child.stdin.take();
    let feed = async move {
        if let Some(mut stdin) = stdin {
            // A worker that died early closes its end: its exit status says why.
            let _ = stdin.write_all(&bytes).await;
        }
    };
    let wall = Duration::from_secs(ceilings.cpu_secs.saturating_mul(2).max(2));
    let Ok((_, output)) =
        tokio::time::timeout(wall, async { tokio::join!(feed, child.wait_with_output()) }).await
    else {
        return Err(ExtractError::TooLarge(format!(
            "reading the document took longer than {} s; it is refused",
            wall.as_secs()
        )));
    };
    let output = output
        .map_err(|error| ExtractError::Worker(format!("the extraction worker failed: {error}")))?;
    if !output.status.success() {
        return Err(died(&output.status, &output.stderr, ceilings));
    }
    let answer: Answer = serde_json::from_slice(&output.stdout).map_err(|error| {
        ExtractError::Worker(format!("the extraction worker answered badly: {error}"))
    })?;
    let cost = Cost {
        peak_rss_kib: answer.peak_rss_kib,
        cpu_ms: answer.cpu_ms,
    };
    metrics::histogram!("mnemo_extract_peak_rss_kib").record(cost.peak_rss_kib as f64);
    metrics::histogram!("mnemo_extract_cpu_seconds").record(cost.cpu_ms as f64 / 1000.0);
    if let Some((kind, message)) = answer.error {
        return Err(match kind.as_str() {
            "unsupported" => ExtractError::Unsupported(message),
            "pdf" => ExtractError::Pdf(message),
            "too_large" => ExtractError::TooLarge(message),
            _ => ExtractError::Unreadable(message),
        });
    }
    Ok((
        Extracted {
            title: answer.title,
            text: answer.text.unwrap_or_default(),
        },
        cost,
    ))
}

/// Why a worker that did not answer died: a ceiling (the document is refused) or a crash.
fn died(status: &std::process::ExitStatus, stderr: &[u8], ceilings: Ceilings) -> ExtractError {
    let stderr = String::from_utf8_lossy(stderr);
    const SIGKILL: i32 = 9;
    const SIGXCPU: i32 = 24;
    metrics::counter!("mnemo_extract_refused_total", "reason" => "ceiling").increment(1);
    match status.signal() {
        Some(SIGXCPU | SIGKILL) => ExtractError::TooLarge(format!(
            "reading the document needs more than {} s of CPU; it is refused",
            ceilings.cpu_secs
        )),
        _ if stderr.contains("memory allocation") || stderr.contains("capacity overflow") => {
            ExtractError::TooLarge(format!(
                "reading the document needs more than {} MiB of memory; it is refused",
                ceilings.memory_mib()
            ))
        }
        Some(_) => ExtractError::Unreadable("reading the document crashed the reader".into()),
        None => ExtractError::Unreadable(format!(
            "the document could not be read ({})",
            stderr.lines().last().unwrap_or("no reason given").trim()
        )),
    }
}

/// The worker's side: `mnemo __extract CONTENT_TYPE MEMORY_BYTES CPU_SECS MAX_TEXT_BYTES`,
/// the document on stdin, one JSON [`Answer`] on stdout.
pub fn worker_main(args: &[String]) -> ExitCode {
    let parsed = (|| {
        let [content_type, memory, cpu, max_text] = args else {
            return None;
        };
        Some((
            content_type.clone(),
            memory.parse::<u64>().ok()?,
            cpu.parse::<u64>().ok()?,
            max_text.parse::<usize>().ok()?,
        ))
    })();
    let Some((content_type, memory, cpu, max_text)) = parsed else {
        eprintln!(
            "usage: mnemo {WORKER_COMMAND} CONTENT_TYPE MEMORY_BYTES CPU_SECS MAX_TEXT_BYTES (the server runs this)"
        );
        return ExitCode::from(2);
    };
    // The ceilings come first: nothing of the document is read before they hold. The memory
    // ceiling is what the extraction may map beyond the worker's own start (its executable,
    // stack and libraries, which differ between builds); a killed worker leaves no core file.
    let address_space = own_status_kib("VmSize:")
        .saturating_mul(1024)
        .saturating_add(memory);
    let limited = rlimit::setrlimit(rlimit::Resource::CORE, 0, 0)
        .and_then(|()| rlimit::setrlimit(rlimit::Resource::AS, address_space, address_space))
        .and_then(|()| rlimit::setrlimit(rlimit::Resource::CPU, cpu, cpu.saturating_add(1)));
    if let Err(error) = limited {
        eprintln!("cannot set the extraction ceilings: {error}");
        return ExitCode::from(1);
    }
    let mut bytes = Vec::new();
    if let Err(error) = std::io::stdin().lock().read_to_end(&mut bytes) {
        eprintln!("cannot read the document: {error}");
        return ExitCode::from(1);
    }
    let budget = Budget::new(Duration::from_secs(cpu.saturating_mul(2)));
    let result = by_content_type_within(&content_type, &bytes, &budget);
    drop(bytes);
    let mut answer = Answer {
        title: None,
        text: None,
        error: None,
        peak_rss_kib: 0,
        cpu_ms: 0,
    };
    match result {
        Ok(extracted) if extracted.text.len() > max_text => {
            answer.error = Some((
                "too_large".into(),
                format!(
                    "the document has more than {} MiB of text; it is refused",
                    max_text / (1024 * 1024)
                ),
            ));
        }
        Ok(extracted) => {
            answer.title = extracted.title;
            answer.text = Some(extracted.text);
        }
        Err(error) => {
            answer.error = Some(match error {
                ExtractError::Unsupported(kind) => ("unsupported".into(), kind),
                ExtractError::Pdf(reason) => ("pdf".into(), reason),
                ExtractError::TooLarge(reason) => ("too_large".into(), reason),
                ExtractError::Unreadable(reason) | ExtractError::Worker(reason) => {
                    ("unreadable".into(), reason)
                }
            });
        }
    }
    (answer.peak_rss_kib, answer.cpu_ms) = own_cost();
    let mut stdout = std::io::stdout().lock();
    let written = serde_json::to_writer(&mut stdout, &answer)
        .map_err(std::io::Error::from)
        .and_then(|()| stdout.flush());
    match written {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("cannot answer: {error}");
            ExitCode::from(1)
        }
    }
}

/// A `kB` line of /proc/self/status (`VmSize:`, `VmHWM:`), 0 when unreadable.
fn own_status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix(field))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// This process's peak resident memory (KiB) and CPU time (ms), from /proc.
fn own_cost() -> (u64, u64) {
    let peak = own_status_kib("VmHWM:");
    // utime and stime, the 14th and 15th fields, in clock ticks of 1/100 s (USER_HZ).
    let cpu = std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|stat| {
            let after = stat.rsplit_once(')')?.1;
            let fields: Vec<&str> = after.split_whitespace().collect();
            let user: u64 = fields.get(11)?.parse().ok()?;
            let system: u64 = fields.get(12)?.parse().ok()?;
            Some((user + system) * 10)
        })
        .unwrap_or(0);
    (peak, cpu)
}
