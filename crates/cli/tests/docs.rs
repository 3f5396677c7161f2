//! The guides under `docs/` as a user follows them: every ```` ```sh ```` block of a guide runs, in order, as one
//! bash script (`set -euo pipefail`) against the binary under test, so a command a guide shows is a command
//! that works. Blocks fenced otherwise (```` ```text ````, ```` ```toml ````, ```` ```python ```` — the Python
//! guide's code runs in `crates/python/tests/test_docs.py`) are not run.
//!
//! The guides use the documented default ports (50051, 9003, …); the script gets free ones instead, so guides
//! run beside other tests. Everything a script starts is in its own process group, killed when it ends.
//!
//! Also here: the configuration guide's tables are what `crescent config --markdown` prints (run with
//! `CRESCENT_BLESS=1` to rewrite them), every error code has a troubleshooting entry, every script is in the
//! benchmarks or another guide, and the README stays short and points at every guide.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_crescent"))
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// The ports the guides write, each replaced by a free one when a guide runs.
const GUIDE_PORTS: [u16; 13] = [50051, 50052, 50053, 9003, 9004, 9005, 5557, 2379, 2380, 9000, 7001, 7002, 7003];

/// How long one guide may run.
const GUIDE_DEADLINE: Duration = Duration::from_secs(240);

/// The bodies of the blocks of `text` fenced with exactly `lang`, in order.
fn blocks(text: &str, lang: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        let fence = line.trim_start();
        match &mut current {
            None if fence.strip_prefix("```") == Some(lang) => current = Some(String::new()),
            Some(body) if fence == "```" => {
                out.push(std::mem::take(body));
                current = None;
            }
            Some(body) => {
                body.push_str(line);
                body.push('\n');
            }
            None => {}
        }
    }
    out
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Runs the ```` ```sh ```` blocks of `docs/{guide}.md` as one script in a fresh directory, and fails with the
/// script's output if any command fails.
fn run_guide(guide: &str) {
    let text = read(&format!("docs/{guide}.md"));
    let mut script = blocks(&text, "sh").join("\n");
    assert!(!script.trim().is_empty(), "docs/{guide}.md has no sh block");
    for port in GUIDE_PORTS {
        script = script.replace(&format!(":{port}"), &format!(":{}", free_port()));
    }
    let dir = tempfile::tempdir().unwrap();
    // `crescent` on the PATH is the binary under test itself (not a shell function: `kill %1` must reach the
    // server a guide started, as it does for a user).
    let path_dir = dir.path().join("bin");
    std::fs::create_dir(&path_dir).unwrap();
    std::os::unix::fs::symlink(bin(), path_dir.join("crescent")).unwrap();
    let path_var = format!("{}:{}", path_dir.display(), std::env::var("PATH").unwrap_or_default());
    let preamble = format!("set -euo pipefail\ncd {:?}\n", dir.path());
    let path = dir.path().join(format!("{guide}.sh"));
    std::fs::write(&path, format!("{preamble}{script}")).unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = Command::new("bash")
        .arg(&path)
        .env_remove("CRESCENT_MASTER")
        .env("PATH", path_var)
        .env("CRESCENT_REPO", repo())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .process_group(0)
        .spawn()
        .unwrap();
    let pgid = child.id();
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if start.elapsed() > GUIDE_DEADLINE {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    // Whatever the guide left running (servers started with `&`) stops with it.
    let _ = Command::new("kill").args(["-KILL", "--", &format!("-{pgid}")]).stderr(Stdio::null()).status();
    let _ = child.wait();
    let tail = |p: &Path| {
        let s = std::fs::read_to_string(p).unwrap_or_default();
        let lines: Vec<&str> = s.lines().collect();
        lines[lines.len().saturating_sub(60)..].join("\n")
    };
    match status {
        Some(s) if s.success() => {}
        other => panic!(
            "docs/{guide}.md: {}\n--- stdout (tail)\n{}\n--- stderr (tail)\n{}",
            other.map_or("ran past its deadline".to_owned(), |s| format!("the script failed: {s}")),
            tail(&out),
            tail(&err)
        ),
    }
}

#[test]
fn the_getting_started_guide_runs_as_written() {
    run_guide("getting-started");
}

#[test]
fn the_configuration_guide_runs_as_written() {
    run_guide("configuration");
}

#[test]
fn the_ha_guide_runs_as_written() {
    run_guide("ha");
}

#[test]
fn the_operations_guide_runs_as_written() {
    run_guide("operations");
}

#[test]
fn the_security_guide_runs_as_written() {
    run_guide("security");
}

#[test]
fn the_troubleshooting_guide_runs_as_written() {
    run_guide("troubleshooting");
}

#[test]
fn the_benchmarks_guide_runs_as_written() {
    run_guide("benchmarks");
}

/// The markers around the generated part of the configuration guide.
const BEGIN: &str = "<!-- BEGIN generated by `crescent config --markdown`: do not edit -->\n";
const END: &str = "<!-- END generated -->\n";

#[test]
fn the_configuration_guide_lists_every_flag_and_key_as_the_binary_defines_them() {
    let out = Command::new(bin()).args(["config", "--markdown"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let generated = String::from_utf8(out.stdout).unwrap();
    let path = repo().join("docs/configuration.md");
    let guide = std::fs::read_to_string(&path).unwrap();
    let (head, rest) = guide.split_once(BEGIN).expect("the configuration guide's BEGIN marker");
    let (current, tail) = rest.split_once(END).expect("the configuration guide's END marker");
    if current != generated {
        if std::env::var_os("CRESCENT_BLESS").is_some() {
            std::fs::write(&path, format!("{head}{BEGIN}{generated}{END}{tail}")).unwrap();
        } else {
            let differs = current.lines().zip(generated.lines()).find(|(a, b)| a != b);
            panic!(
                "docs/configuration.md is not what `crescent config --markdown` prints (first difference: {differs:?}); \
                 rerun this test with CRESCENT_BLESS=1 to rewrite it"
            );
        }
    }
    // And the flags of each command, read from `--help` as a user sees them, are all in it.
    for sub in ["up", "master", "node", "put", "get", "bench", "wait", "drain"] {
        let help = Command::new(bin()).args([sub, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&help.stdout).into_owned();
        let section =
            generated.split(&format!("### `crescent {sub}`\n")).nth(1).unwrap().split("\n### ").next().unwrap();
        // The flag column: lines that start with `-x, --name` or `--name`.
        let flags = help.lines().filter_map(|l| {
            let l = l.trim_start();
            let l = l.strip_prefix("-").filter(|r| !r.starts_with('-')).map_or(l, |r| r.get(3..).unwrap_or(""));
            l.starts_with("--").then(|| l.split_whitespace().next().unwrap_or(""))
        });
        for flag in flags {
            if ["--help", "--config", "--log-level", "--log-format"].contains(&flag) {
                continue;
            }
            assert!(section.contains(&format!("`{flag}")), "crescent {sub} {flag} is not in the configuration guide");
        }
    }
}

#[test]
fn every_error_code_has_a_troubleshooting_entry() {
    let guide = read("docs/troubleshooting.md");
    for code in crescent_proto::ErrorCode::ALL {
        assert!(
            guide.contains(&format!("### `{}`", code.name())),
            "docs/troubleshooting.md has no `### `{}`` entry",
            code.name()
        );
    }
}

#[test]
fn every_script_is_in_a_guide() {
    let guides: String = std::fs::read_dir(repo().join("docs"))
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap_or_default())
        .collect();
    for e in std::fs::read_dir(repo().join("scripts")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(guides.contains(&format!("scripts/{name}")), "scripts/{name} is in no guide under docs/");
    }
}

#[test]
fn the_readme_is_short_and_points_at_every_guide() {
    let readme = read("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 150, "the README has {lines} lines; the rest belongs in a guide under docs/");
    let mut guides = String::new();
    for e in std::fs::read_dir(repo().join("docs")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        // The guides; `docs/img` holds their figures (checked below: each one shown by a guide).
        if name.ends_with(".md") {
            assert!(readme.contains(&format!("(docs/{name})")), "the README does not link docs/{name}");
            guides.push_str(&read(&format!("docs/{name}")));
        }
    }
    for e in std::fs::read_dir(repo().join("docs/img")).unwrap() {
        let name = e.unwrap().file_name().into_string().unwrap();
        assert!(guides.contains(&format!("(img/{name})")), "docs/img/{name} is shown by no guide");
    }
}
