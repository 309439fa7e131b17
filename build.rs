//! Makes a release build re-embed the web app whenever `web/dist` changes: the folder is
//! watched, and a stamp of its files (names, sizes, modification times) is handed to the
//! crate as `MNEMO_WEB_DIST_STAMP`, so a changed stamp recompiles `http::web`. The folder is
//! created empty when missing, so that a build before the app's first build watches it too
//! (cargo reruns a build script on every build while a watched path is missing). Also hands
//! the encoder's CPU kernels on as `cpu_*` cfg flags for the tests.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::Path;

fn main() {
    let dist = Path::new("web/dist");
    let _ = std::fs::create_dir_all(dist);
    println!("cargo:rerun-if-changed=web/dist");
    println!("cargo:rerun-if-changed=build.rs");
    let mut files = Vec::new();
    collect(dist, &mut files);
    files.sort();
    let mut hasher = DefaultHasher::new();
    files.hash(&mut hasher);
    let stamp = if files.is_empty() {
        "empty".to_string()
    } else {
        format!("{:016x}", hasher.finish())
    };
    println!("cargo:rustc-env=MNEMO_WEB_DIST_STAMP={stamp}");
    // The encoder's kernels this CPU runs (its build script detects them): tests of a kernel
    // the CPU lacks are marked ignored, never passed.
    for kernel in ["amx", "vnni", "avx512", "avx2"] {
        println!("cargo::rustc-check-cfg=cfg(cpu_{kernel})");
        let found = std::env::var(format!("DEP_MNEMO_ENCODER_CPU_{}", kernel.to_uppercase()));
        if found.is_ok_and(|value| value == "1") {
            println!("cargo::rustc-cfg=cpu_{kernel}");
        }
    }
}

/// (path, size, modified in nanoseconds) of every file below `dir`.
fn collect(dir: &Path, files: &mut Vec<(String, u64, u128)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Ok(metadata) = entry.metadata() else {
            continue;
        };
        if metadata.is_dir() {
            collect(&path, files);
        } else {
            let modified = metadata
                .modified()
                .ok()
                .and_then(|time| time.duration_since(std::time::UNIX_EPOCH).ok())
                .map_or(0, |since| since.as_nanos());
            files.push((path.display().to_string(), metadata.len(), modified));
        }
    }
}
