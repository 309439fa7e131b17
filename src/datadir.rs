//! Who holds the data directory. A process that opens the indexes in a data directory (a
//! server, or an embedded CLI command) takes an exclusive lock on `mnemo.lock` in it first and
//! writes there who it is: its pid, its command, and — for a server — the address it listens
//! on and a local credential. The file is readable only by its owner (mode 0600), so a CLI
//! command of the same account finds a running server and talks to it instead of failing on
//! the index locks, and a second server says which process holds the directory.
//!
//! The lock is the operating system's (`flock`), released when the process ends however it
//! ends; what the file says is trusted only while its lock is held.

use parking_lot::Mutex;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// Creates `dir` (and missing parents) readable by its owner only, and takes group and other
/// access away from an existing one: it holds every user's memories.
fn make_private_dir(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    let mode = std::fs::metadata(dir)?.permissions().mode();
    if mode & 0o077 != 0 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode & 0o700))?;
        tracing::info!(dir = %dir.display(), "the data directory is now readable by its owner only");
    }
    Ok(())
}

/// The lock file's name inside the data directory.
pub(crate) const LOCK_FILE: &str = "mnemo.lock";

/// The file naming the replica id of the process holding the data directory (see
/// [`DataDirLock::swap_replica`]).
pub(crate) const REPLICA_FILE: &str = "replica.id";

/// What the holder of a data directory says about itself.
#[derive(Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Holder {
    pub pid: u32,
    /// The program and subcommand, e.g. `mnemo serve` (never further arguments: they may hold
    /// a key).
    pub command: String,
    pub started_at: DateTime<Utc>,
    /// Where a server listens, e.g. `127.0.0.1:8080`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address: Option<String>,
    /// The local credential's secret (see `auth::local_credential`), for CLI commands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_token: Option<String>,
}

impl std::fmt::Debug for Holder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Holder")
            .field("pid", &self.pid)
            .field("command", &self.command)
            .field("started_at", &self.started_at)
            .field("address", &self.address)
            .field(
                "local_token",
                &self.local_token.as_ref().map(|_| "<hidden>"),
            )
            .finish()
    }
}

impl Holder {
    /// One line for messages: `pid 4242 (mnemo serve, listening on 127.0.0.1:8080, since …)`.
    pub(crate) fn describe(&self) -> String {
        let mut text = format!("pid {} ({}", self.pid, self.command);
        if let Some(address) = &self.address {
            text.push_str(&format!(", listening on http://{address}"));
        }
        text.push_str(&format!(
            ", since {})",
            self.started_at.format("%Y-%m-%d %H:%M:%S UTC")
        ));
        text
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the directory; what it said about itself, when readable.
    #[error("{}", held_message(.dir, .holder.as_ref()))]
    Held {
        dir: PathBuf,
        holder: Option<Holder>,
    },
    #[error("the data directory's lock file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn held_message(dir: &Path, holder: Option<&Holder>) -> String {
    match holder {
        Some(holder) => format!(
            "the data directory {} is in use by {}",
            dir.display(),
            holder.describe()
        ),
        None => format!(
            "the data directory {} is in use by another process",
            dir.display()
        ),
    }
}

/// The exclusive lock on a data directory, held until `release` or drop.
#[derive(Debug)]
pub struct DataDirLock {
    path: PathBuf,
    file: Mutex<Option<File>>,
    holder: Mutex<Holder>,
}

impl DataDirLock {
    /// Takes the lock on `dir` (created if missing) and records this process as its holder.
    pub fn acquire(dir: &Path) -> Result<Self, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io {
            path: path.clone(),
            source,
        };
        make_private_dir(dir).map_err(io)?;
        let file = open_private(&path).map_err(io)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(LockError::Held {
                    dir: dir.to_path_buf(),
                    holder: read_holder_file(&path),
                });
            }
            Err(std::fs::TryLockError::Error(error)) => return Err(io(error)),
        }
        let lock = Self {
            path: path.clone(),
            file: Mutex::new(Some(file)),
            holder: Mutex::new(Holder {
                pid: std::process::id(),
                command: this_command(),
                started_at: Utc::now(),
                address: None,
                local_token: None,
            }),
        };
        lock.write().map_err(io)?;
        Ok(lock)
    }

    /// Records the address a server listens on and its local credential's secret.
    pub(crate) fn publish(&self, address: &str, local_token: &str) -> std::io::Result<()> {
        {
            let mut holder = self.holder.lock();
            holder.address = Some(address.to_string());
            holder.local_token = Some(local_token.to_string());
        }
        self.write()
    }

    /// Empties the file and releases the lock (a later process may take it at once).
    pub fn release(&self) {
        let taken = self.file.lock().take();
        if let Some(file) = taken {
            let _ = file.set_len(0);
            let _ = file.unlock();
        }
    }

    #[cfg(test)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Records `replica` as this process's replica id and returns the id the previous holder
    /// recorded: that process is gone (we hold its lock), so the runs it owned can be taken
    /// over at once. `None` when there was none or the file does not hold an id.
    pub(crate) fn swap_replica(&self, replica: uuid::Uuid) -> std::io::Result<Option<uuid::Uuid>> {
        let dir = self.path.parent().unwrap_or_else(|| Path::new("."));
        let path = dir.join(REPLICA_FILE);
        let previous = match std::fs::read_to_string(&path) {
            Ok(text) => uuid::Uuid::parse_str(text.trim()).ok(),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => None,
            Err(error) => return Err(error),
        };
        let fresh = dir.join(format!("{REPLICA_FILE}.new"));
        {
            let mut file = File::create(&fresh)?;
            file.write_all(replica.to_string().as_bytes())?;
            file.sync_data()?;
        }
        std::fs::rename(&fresh, &path)?;
        Ok(previous)
    }

    fn write(&self) -> std::io::Result<()> {
        let text = serde_json::to_string(&*self.holder.lock()).map_err(std::io::Error::other)?;
        let mut guard = self.file.lock();
        let Some(file) = guard.as_mut() else {
            return Ok(());
        };
        file.set_len(0)?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(text.as_bytes())?;
        file.sync_data()
    }
}

impl Drop for DataDirLock {
    fn drop(&mut self) {
        self.release();
    }
}

/// Whether `dir` is held by another process, and by whom (`None`: free, or no directory).
pub fn probe(dir: &Path) -> Option<Option<Holder>> {
    let path = dir.join(LOCK_FILE);
    let file = File::open(&path).ok()?;
    match file.try_lock_shared() {
        Ok(()) => {
            let _ = file.unlock();
            None
        }
        Err(std::fs::TryLockError::WouldBlock) => Some(read_holder_file(&path)),
        Err(std::fs::TryLockError::Error(_)) => None,
    }
}

/// Reads what the holder wrote, retrying briefly while it is being rewritten.
fn read_holder_file(path: &Path) -> Option<Holder> {
    for _ in 0..20 {
        let mut text = String::new();
        if let Ok(mut file) = File::open(path) {
            let _ = file.read_to_string(&mut text);
        }
        if let Ok(holder) = serde_json::from_str::<Holder>(&text) {
            return Some(holder);
        }
        std::thread::sleep(std::time::Duration::from_millis(25));
    }
    None
}

fn open_private(path: &Path) -> std::io::Result<File> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create(true).truncate(false);
    #[cfg(unix)]
    {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        options.mode(0o600);
        let file = options.open(path)?;
        // A file made by an older version or another umask: only the owner may read it.
        file.set_permissions(std::fs::Permissions::from_mode(0o600))?;
        Ok(file)
    }
    #[cfg(not(unix))]
    {
        options.open(path)
    }
}

/// `mnemo serve`: the program's file name and the subcommand, nothing more, so no key given
/// on the command line is ever written down.
fn this_command() -> String {
    describe_command(std::env::args())
}

/// The global flags that take a value (skipped with it when looking for the subcommand).
const VALUE_FLAGS: &[&str] = &["--data-dir", "--config", "--server", "--key", "--user"];

fn describe_command(mut args: impl Iterator<Item = String>) -> String {
    let program = args
        .next()
        .and_then(|arg| {
            Path::new(&arg)
                .file_name()
                .map(|name| name.to_string_lossy().into_owned())
        })
        .unwrap_or_else(|| "mnemo".into());
    while let Some(arg) = args.next() {
        if VALUE_FLAGS.contains(&arg.as_str()) {
            args.next();
            continue;
        }
        if arg.starts_with('-') {
            continue;
        }
        if !arg.is_empty() && arg.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            return format!("{program} {arg}");
        }
        break;
    }
    program
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_is_the_program_and_subcommand_without_flag_values() {
        let args = |list: &[&str]| list.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(
            describe_command(
                args(&["/x/mnemo", "--data-dir", "/tmp/d", "serve", "--dev"]).into_iter()
            ),
            "mnemo serve"
        );
        assert_eq!(
            describe_command(args(&["mnemo", "--key", "mnemo_secret", "chat"]).into_iter()),
            "mnemo chat"
        );
        assert_eq!(describe_command(args(&["mnemo"]).into_iter()), "mnemo");
    }

    #[test]
    fn a_held_directory_names_its_holder_and_frees_on_release() {
        let dir = tempfile::tempdir().unwrap();
        let lock = DataDirLock::acquire(dir.path()).unwrap();
        lock.publish("127.0.0.1:4321", "secret").unwrap();
        let holder = probe(dir.path()).expect("held").expect("readable");
        assert_eq!(holder.pid, std::process::id());
        assert_eq!(holder.address.as_deref(), Some("127.0.0.1:4321"));
        assert_eq!(holder.local_token.as_deref(), Some("secret"));
        match DataDirLock::acquire(dir.path()) {
            Err(error @ LockError::Held { .. }) => {
                let text = error.to_string();
                assert!(text.contains("is in use by pid"), "{text}");
                assert!(text.contains("http://127.0.0.1:4321"), "{text}");
                assert!(!text.contains("secret"), "{text}");
            }
            other => panic!("expected Held, got {other:?}"),
        }
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(lock.path()).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        lock.release();
        assert!(probe(dir.path()).is_none());
        let again = DataDirLock::acquire(dir.path()).unwrap();
        assert!(probe(dir.path()).unwrap().unwrap().address.is_none());
        drop(again);
        assert!(probe(dir.path()).is_none());
    }
}
