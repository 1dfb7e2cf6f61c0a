//! What this x86_64 Linux machine can check of the other systems the crate is for (issue
//! 57): no target but its own can be built here, so these read the source for what would
//! break another system's build. The choices themselves (`src/platform.rs`) are unit-tested
//! for every system.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

fn sources(dirs: &[&str]) -> Vec<(PathBuf, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in dirs {
        rust_files(&root.join(dir), &mut files);
    }
    files
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            (path, text)
        })
        .collect()
}

#[test]
fn no_64_bit_atomic_of_the_standard_library_is_used_so_32_bit_gateways_build() {
    // ARMv5, MIPS and PowerPC have no 64-bit atomics: std's AtomicU64 and AtomicI64 do not
    // exist there; portable-atomic's do (native where the instructions exist).
    for (path, text) in sources(&["src", "cli/src"]) {
        for (number, line) in text.lines().enumerate() {
            let std_import = line.contains("std::sync::atomic")
                && (line.contains("AtomicU64") || line.contains("AtomicI64"));
            assert!(
                !std_import,
                "{}:{}: {line}: use portable_atomic's",
                path.display(),
                number + 1
            );
        }
    }
}

#[test]
fn unix_only_apis_are_behind_cfg_unix_so_windows_builds() {
    // `outbox relay` beside a desktop app on Windows: the CLI must build there.
    for (path, text) in sources(&["src", "cli/src"]) {
        let lines: Vec<&str> = text.lines().collect();
        for (number, line) in lines.iter().enumerate() {
            if !(line.contains("os::unix") || line.contains("signal::unix")) {
                continue;
            }
            // The item it belongs to says `#[cfg(unix)]` within the lines above it.
            let guarded = lines[number.saturating_sub(12)..number]
                .iter()
                .rev()
                .any(|above| above.contains("#[cfg(unix)]"));
            assert!(
                guarded,
                "{}:{}: {line}: not behind #[cfg(unix)]",
                path.display(),
                number + 1
            );
        }
    }
}
