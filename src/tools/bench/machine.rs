//! What the bench reads of the machine: directory sizes, the load, peak memory; scratch
//! directories made and emptied.

use super::*;

/// Creates `dir` or checks that it is empty; true when it was created.
pub(super) fn prepare_dir(dir: &Path) -> anyhow::Result<bool> {
    if dir.exists() {
        let mut entries =
            std::fs::read_dir(dir).with_context(|| format!("reading {}", dir.display()))?;
        if entries.next().is_some() {
            bail!(
                "{} is not empty; the benchmark needs an empty or new directory",
                dir.display()
            );
        }
        Ok(false)
    } else {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(true)
    }
}

/// Removes what the benchmark wrote (the directory was empty before it started).
pub(super) fn remove_contents(dir: &Path, created: bool) -> anyhow::Result<()> {
    if created {
        return std::fs::remove_dir_all(dir).with_context(|| format!("removing {}", dir.display()));
    }
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("removing {}", path.display()))?;
    }
    Ok(())
}

pub(super) fn dir_size(path: &Path) -> u64 {
    let Ok(metadata) = std::fs::metadata(path) else {
        return 0;
    };
    if !metadata.is_dir() {
        return allocated(&metadata);
    }
    std::fs::read_dir(path)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|entry| dir_size(&entry.path()))
                .sum()
        })
        .unwrap_or(0)
}

/// Bytes a file really occupies (sparse and preallocated files count what is allocated).
pub(super) fn allocated(metadata: &std::fs::Metadata) -> u64 {
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        metadata.blocks() * 512
    }
    #[cfg(not(unix))]
    {
        metadata.len()
    }
}

/// The 1-, 5- and 15-minute load averages (Linux only): the machine may be shared.
pub(super) fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let fields: Vec<&str> = text.split_whitespace().take(3).collect();
    (fields.len() == 3).then(|| fields.join(" / "))
}

pub(super) fn wal_size(dir: &Path) -> u64 {
    dir_size(&dir.join("mnemo.db-wal"))
}

/// Peak resident set size (Linux only).
pub(super) fn peak_rss() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(bytes(kib * 1024))
}
