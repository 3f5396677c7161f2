//! `crescent config`: the configuration reference, generated from the flags' own definitions (clap) and the
//! config file's own sections (serde), so neither the commented defaults file (`--defaults`) nor the
//! configuration guide (`--markdown`, pasted into `docs/configuration.md` and compared by a test) can drift
//! from what the binary accepts.
//!
//! A flag of `up`, `master` or `node` sets the file key of the same name (dashes as underscores) in its
//! section, except where [`key_of`] says otherwise; a flag with no key is listed in [`FLAG_ONLY`] with the
//! reason, and a key with no flag in [`file_only`] with what it does. The unit tests hold both lists to
//! exactly the flags and keys that exist.

use crescent_cli::config::{EXAMPLE, FileConfig};
use std::fmt::Write as _;

/// `crescent config` flags.
#[derive(clap::Args, Debug)]
#[group(required = true, multiple = false)]
pub struct ConfigArgs {
    /// Print a config file with every key at its default, commented out.
    #[arg(
        long,
        help = "Print a config file with every key, commented out, at its default (or an example where \
        the default is computed), each with what it does and the flag that overrides it"
    )]
    defaults: bool,
    /// Print the configuration guide's generated part (Markdown).
    #[arg(long, help = "Print the flag and key tables of docs/configuration.md (Markdown)")]
    markdown: bool,
}

/// The config file's sections, in file order, with whom each serves.
const SECTIONS: [(&str, &str); 4] = [
    ("", "Top level: client commands and nodes"),
    ("server", "`crescent master` and `up`"),
    ("node", "`crescent node` and the node inside `up`"),
    ("client", "client commands (`put`, `get`, `bench`, …)"),
];

/// Commands whose every flag is configuration: each has a file key or a reason in [`FLAG_ONLY`].
#[cfg(test)]
const SERVERS: [&str; 3] = ["up", "master", "node"];

/// Flags of the servers with no file key, and why.
pub const FLAG_ONLY: &[(&str, &str)] = &[
    ("secret-file", "security settings come from flags and the environment only (docs/security.md)"),
    ("insecure", "a deliberate, visible choice on the command line, never a line in a shared file"),
    ("tls-cert", "security settings come from flags and the environment only (docs/security.md)"),
    ("tls-key", "security settings come from flags and the environment only (docs/security.md)"),
    ("tls-ca", "security settings come from flags and the environment only (docs/security.md)"),
    ("tls-client-ca", "security settings come from flags and the environment only (docs/security.md)"),
    ("tls-server-name", "security settings come from flags and the environment only (docs/security.md)"),
    ("credential-file", "security settings come from flags and the environment only (docs/security.md)"),
];

/// File keys no flag sets: what each does, with the default where the code's settings do not carry it (the
/// master's do: serialized from its defaults).
pub fn file_only() -> Vec<(&'static str, String)> {
    let t = crescent_client::ClientConfig::new(String::new()).transfer;
    let poll = crescent_net::poll::DEFAULT_POLL_WINDOW.as_micros();
    let budget = crescent_master::server::RpcLimits::DEFAULT_FRAME_BUDGET as u64;
    let owned = |pairs: &[(&'static str, &str)]| -> Vec<(&'static str, String)> {
        pairs.iter().map(|(k, h)| (*k, squash(h))).collect()
    };
    let mut keys = vec![
        (
            "server.poll_us",
            format!(
                "Microseconds an idle RPC connection polls for its next request before parking \
            (0 never; 0 for the master inside `up`) [default: {poll}]"
            ),
        ),
        (
            "server.frame_budget",
            format!(
                "Bytes of large frames (over 16 KiB) all RPC connections may hold at once \
            (at least one 16 MiB frame) [default: {}]",
                size_literal(budget)
            ),
        ),
        (
            "node.poll_us",
            format!(
                "Microseconds the node's runtime polls all its connections before it sleeps (0 \
            never) [default: {poll}]"
            ),
        ),
        ("client.lanes", format!("Data-plane connections per storage node [default: {}]", t.lanes_per_peer)),
        (
            "client.stripe_size",
            format!("Reads larger than this are striped over several lanes [default: {}]", size_literal(t.stripe_size)),
        ),
        (
            "client.write_stripe_size",
            format!(
                "Writes larger than this are striped over several lanes [default: {}]",
                size_literal(t.write_stripe_size)
            ),
        ),
        (
            "client.poll_us",
            format!(
                "Microseconds a request polls for its reply before parking (0 never) \
            [default: {}]",
                t.poll_window.as_micros()
            ),
        ),
        (
            "client.local_lanes",
            format!(
                "Reach storage nodes on this host over their Unix socket when they offer \
            one [default: {}]",
                t.local_lanes
            ),
        ),
    ];
    keys.extend(owned(&[
        (
            "server.put_start_discard_timeout_ms",
            "An unfinished write may be preempted by a new put of its key \
            after this long, in ms",
        ),
        (
            "server.put_start_release_timeout_ms",
            "The buffers of a preempted write are freed this long after its \
            start, in ms (a zombie writer may still write until then)",
        ),
        ("server.default_soft_pin_ttl_ms", "Soft-pin TTL of a write that asks for a soft pin without a TTL, in ms"),
        ("server.max_soft_pin_ttl_ms", "Longest soft-pin TTL accepted, in ms"),
        ("server.allow_evict_soft_pinned", "Eviction may take soft-pinned objects (after all others)"),
        ("server.cxl_window", "CXL device window in bytes (enables CXL segments) [default: none]"),
        (
            "server.census_chunk",
            "Handles copied per route-lock hold while the master walks its index (listings, \
            snapshots, eviction census)",
        ),
        (
            "server.grant_write_window_ms",
            "How long a put's data-plane write grants live in an authenticating \
            cluster, in ms: a put's transfers must start within it",
        ),
        (
            "server.write_hold_ms",
            "Space freed within this long of its allocation stays out of reuse until then, \
            in ms (0 off; an authenticating master sets it to the write-grant window plus clock slack)",
        ),
        (
            "server.disk_offload",
            "Memory evictions keep objects on the disk tier of the node that held them, where \
            it has one (false: they are dropped)",
        ),
        (
            "server.disk_task_timeout_ms",
            "A node must start a disk copy within this long of its task, in ms; the \
            master fails the task after twice that",
        ),
        (
            "server.disk_promotion",
            "A read of an object found only on a disk tier brings it back to memory in the \
            background when its node has room below the eviction watermark",
        ),
        (
            "server.verify_unreachable_reports",
            "A client's report that it cannot reach a node is checked by the \
            master's own probe before the node leaves placement (an authenticating master turns it on)",
        ),
        (
            "node.threads",
            "Runtime threads of `crescent node` and `up` (1: single-threaded) [default: half the \
            CPUs, at least one]",
        ),
        (
            "node.local_lanes",
            "Serve clients on this host over a Unix socket too, their payloads copied between the \
            processes (never beside TLS) [default: true]",
        ),
    ]));
    keys.into_iter().map(|(k, h)| (k, squash(&h))).collect()
}

/// A byte count as the file writes it: `512KiB`, `2MiB` (whole units), else bytes.
fn size_literal(n: u64) -> String {
    match n {
        0 => "0".to_owned(),
        n if n % (1 << 30) == 0 => format!("{}GiB", n >> 30),
        n if n % (1 << 20) == 0 => format!("{}MiB", n >> 20),
        n if n % (1 << 10) == 0 => format!("{}KiB", n >> 10),
        n => n.to_string(),
    }
}

/// The file key (`section.key`; the top level has no section) a flag of subcommand `sub` sets, if any.
pub fn key_of(sub: &str, flag: &str) -> Option<String> {
    let keys = file_keys();
    let in_section = |section: &str, key: &str| {
        let k = if section.is_empty() { key.to_owned() } else { format!("{section}.{key}") };
        keys.iter().any(|(s, name)| *s == section && name == key).then_some(k)
    };
    let key = flag.replace('-', "_");
    match (sub, flag) {
        (_, "master") => in_section("", "master"),
        ("up" | "master", "multi-tenant") => in_section("server", "enable_multi_tenants"),
        ("up" | "master", "placement") => in_section("server", "placement_policy"),
        ("up", "node-listen") => in_section("node", "listen"),
        ("up", _) => in_section("server", &key).or_else(|| {
            let segment_flag = ["segment-size", "segments", "memfd", "prefault", "host-id", "ssd-dir", "ssd-size"];
            segment_flag.contains(&flag).then(|| in_section("node", &key)).flatten()
        }),
        ("master", _) => in_section("server", &key),
        ("node", _) => in_section("node", &key),
        (_, "tenant") => in_section("", "tenant"),
        ("put", "replicas") | (_, "request-timeout") => in_section("client", &key),
        _ => None,
    }
}

/// Every key of the file as `(section, key)`, sections in file order, keys alphabetically (serialized once from
/// the default file: a key is there whatever its value).
pub fn file_keys() -> &'static [(&'static str, String)] {
    static KEYS: std::sync::OnceLock<Vec<(&'static str, String)>> = std::sync::OnceLock::new();
    KEYS.get_or_init(|| {
        let Ok(serde_json::Value::Object(file)) = serde_json::to_value(FileConfig::default()) else {
            return Vec::new();
        };
        let mut keys = Vec::new();
        for (section, _) in SECTIONS {
            if section.is_empty() {
                keys.extend(file.iter().filter(|(_, v)| !v.is_object()).map(|(k, _)| ("", k.clone())));
            } else if let Some(serde_json::Value::Object(fields)) = file.get(section) {
                keys.extend(fields.keys().map(|k| (section, k.clone())));
            }
        }
        keys
    })
}

/// One flag as the guide lists it.
struct Flag {
    /// `--name <VALUE>`.
    usage: String,
    /// The long name.
    long: String,
    /// Its help, with its default.
    help: String,
}

/// The visible long flags of `cmd` (its own, then the global ones it inherits are left to the top level).
fn flags(cmd: &clap::Command) -> Vec<Flag> {
    cmd.get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_global_set())
        .filter_map(|a| {
            let long = a.get_long()?.to_owned();
            if long == "help" || long == "version" {
                return None;
            }
            let takes_value = a.get_num_args().is_some_and(|n| n.takes_values());
            let value = a.get_value_names().and_then(|v| v.first()).map(|v| v.to_string());
            let usage = match (takes_value, value) {
                (true, Some(v)) => format!("--{long} <{v}>"),
                (true, None) => format!("--{long} <{}>", long.to_uppercase().replace('-', "_")),
                (false, _) => format!("--{long}"),
            };
            let mut help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
            let defaults: Vec<String> = a.get_default_values().iter().map(|v| v.to_string_lossy().into()).collect();
            if !defaults.is_empty() && !help.contains("[default:") {
                let _ = write!(help, " [default: {}]", defaults.join(","));
            }
            let possible: Vec<String> = a.get_possible_values().iter().map(|p| p.get_name().to_owned()).collect();
            let boolean = a.get_value_parser().type_id() == clap::builder::ValueParser::bool().type_id();
            if takes_value && !possible.is_empty() && !boolean {
                let _ = write!(help, " [possible values: {}]", possible.join(", "));
            }
            if let Some(env) = a.get_env() {
                let _ = write!(help, " [env: {}]", env.to_string_lossy());
            }
            Some(Flag { usage, long, help })
        })
        .collect()
}

/// The command whose flag speaks for a key of `section` when several set it (`up` repeats the others').
fn owner(key: &str) -> &'static str {
    match key.split_once('.').map(|(s, _)| s) {
        Some("server") => "master",
        Some("node") => "node",
        _ => "",
    }
}

/// [`commands`], the owner of `key`'s section first.
fn commands_for<'a>(root: &'a clap::Command, key: &str) -> Vec<(Vec<String>, &'a clap::Command)> {
    let mut all = commands(root);
    all.sort_by_key(|(path, _)| path.join(" ") != owner(key));
    all
}

/// Every subcommand path (`["tenant", "set-quota"]`, …) with its command, depth first in declaration order.
fn commands(root: &clap::Command) -> Vec<(Vec<String>, &clap::Command)> {
    fn walk<'a>(path: &[String], cmd: &'a clap::Command, out: &mut Vec<(Vec<String>, &'a clap::Command)>) {
        for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set() && s.get_name() != "help") {
            let mut p = path.to_vec();
            p.push(sub.get_name().to_owned());
            if sub.has_subcommands() {
                walk(&p, sub, out);
            } else {
                out.push((p, sub));
            }
        }
    }
    let mut out = Vec::new();
    walk(&[], root, &mut out);
    out
}

/// The flag that sets `key` (`section.key`) and the commands that take it, e.g. `("--listen", "master, up")`.
fn flag_of(root: &clap::Command, key: &str) -> Option<(String, String)> {
    let mut found: Option<(String, Vec<String>)> = None;
    for (path, cmd) in commands_for(root, key) {
        let sub = path.join(" ");
        for f in flags(cmd) {
            if key_of(&sub, &f.long).as_deref() == Some(key) {
                match &mut found {
                    Some((long, subs)) if *long == f.long => subs.push(sub.clone()),
                    Some(_) => {}
                    None => found = Some((f.long.clone(), vec![sub.clone()])),
                }
            }
        }
    }
    found.map(|(long, subs)| (format!("--{long}"), subs.join(", ")))
}

/// The help of `key`: its flag's (the same words as `--help`), else its [`file_only`] line.
fn key_help(root: &clap::Command, key: &str) -> Option<String> {
    for (path, cmd) in commands_for(root, key) {
        let sub = path.join(" ");
        if let Some(f) = flags(cmd).into_iter().find(|f| key_of(&sub, &f.long).as_deref() == Some(key)) {
            return Some(f.help);
        }
    }
    file_only().into_iter().find(|(k, _)| *k == key).map(|(_, h)| h)
}

/// Help texts are written across source lines: one space between words.
fn squash(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The value a key's line shows: its default where the code has one as a value, else the default its help
/// states if the file accepts it, else the example file's (`true` when it is an example).
fn key_value(section: &str, key: &str, help: &str) -> Option<(String, bool)> {
    let file = serde_json::to_value(FileConfig::default()).ok()?;
    let default = if section.is_empty() { file.get(key) } else { file.get(section).and_then(|s| s.get(key)) };
    if let Some(v) = default.and_then(json_literal) {
        return Some((v, false));
    }
    let accepted = |lit: &str| {
        let text =
            if section.is_empty() { format!("{key} = {lit}\n") } else { format!("[{section}]\n{key} = {lit}\n") };
        FileConfig::parse(&text).is_ok()
    };
    // A default stated in words ("the listen IP; …") is no value: the example file's stands in.
    let stated = help.rsplit_once("[default: ").and_then(|(_, d)| d.split_once(']')).map(|(d, _)| d);
    let words = ["off", "none", "empty"];
    if let Some(stated) = stated.filter(|d| !d.contains(char::is_whitespace) && !words.contains(d)) {
        let quoted = toml::Value::String(stated.to_owned()).to_string();
        let bare = toml::from_str::<toml::Table>(&format!("v = {stated}")).is_ok();
        for lit in [bare.then(|| stated.to_owned()), Some(quoted)].into_iter().flatten() {
            if accepted(&lit) {
                return Some((lit, false));
            }
        }
    }
    let example: toml::Table = toml::from_str(EXAMPLE).ok()?;
    let v = if section.is_empty() { example.get(key) } else { example.get(section)?.get(key) };
    v.map(|v| (v.to_string(), true))
}

/// A JSON default as a TOML literal (`None` for null: no value).
fn json_literal(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::Null | serde_json::Value::Array(_) | serde_json::Value::Object(_) => None,
        serde_json::Value::String(s) => Some(toml::Value::String(s.clone()).to_string()),
        other => Some(other.to_string()),
    }
}

/// Wraps `text` into `# `-comment lines of at most `width` columns.
fn comment(text: &str, width: usize) -> String {
    let mut out = String::new();
    let mut line = String::from("#");
    for word in text.split_whitespace() {
        if line.len() + 1 + word.len() > width && line.len() > 1 {
            out.push_str(&line);
            out.push('\n');
            line = String::from("#");
        }
        line.push(' ');
        line.push_str(word);
    }
    out.push_str(&line);
    out.push('\n');
    out
}

/// `crescent config --defaults`: a config file with every key commented out at its default.
pub fn defaults_toml(root: &clap::Command) -> String {
    let mut out = comment(
        "Crescent's configuration file (crescent --config FILE COMMAND): every key, commented out, at its default \
         (or an example, where the default is computed at start-up). A flag given on the command line wins over \
         the file, the file over the default. Generated by `crescent config --defaults`; docs/configuration.md \
         has the same in tables.",
        110,
    );
    let keys = file_keys();
    for (section, about) in SECTIONS {
        out.push('\n');
        if !section.is_empty() {
            let _ = writeln!(out, "[{section}]");
        }
        out.push_str(&comment(about, 110));
        for (_, key) in keys.iter().filter(|(s, _)| *s == section) {
            let full = if section.is_empty() { key.clone() } else { format!("{section}.{key}") };
            let help = key_help(root, &full).unwrap_or_default();
            let flag = flag_of(root, &full).map(|(f, subs)| format!(" Flag: {f} ({subs})."));
            out.push('\n');
            out.push_str(&comment(&format!("{help}{}", flag.unwrap_or_default()), 110));
            match key_value(section, key, &help) {
                Some((v, false)) => {
                    let _ = writeln!(out, "# {key} = {v}");
                }
                Some((v, true)) => {
                    let _ = writeln!(out, "# {key} = {v}  # an example");
                }
                None => {
                    let _ = writeln!(out, "# {key} =");
                }
            }
        }
    }
    out
}

/// A Markdown table cell: no line breaks, pipes escaped.
fn cell(s: &str) -> String {
    squash(s).replace('|', "\\|")
}

/// `crescent config --markdown`: the generated part of `docs/configuration.md`.
pub fn markdown(root: &clap::Command) -> String {
    let mut out = String::from("## Flags of every command\n\n");
    out.push_str(
        "Every command also takes the global flags `--config FILE`, `--log-level LEVEL` and `--log-format \
         text|json` (listed last). The *file key* column names the config-file key a flag overrides.\n",
    );
    let mut all = commands(root);
    all.push((vec![], root));
    for (path, cmd) in all {
        let fl: Vec<Flag> = if path.is_empty() {
            root.get_arguments()
                .filter(|a| a.is_global_set() && !a.is_hide_set())
                .filter_map(|a| {
                    let long = a.get_long()?.to_owned();
                    let mut help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                    let defaults: Vec<String> =
                        a.get_default_values().iter().map(|v| v.to_string_lossy().into()).collect();
                    if !defaults.is_empty() && !help.contains("[default:") {
                        let _ = write!(help, " [default: {}]", defaults.join(","));
                    }
                    let value = a.get_value_names().and_then(|v| v.first()).map(|v| v.to_string());
                    let usage = format!("--{long} <{}>", value.unwrap_or_else(|| long.to_uppercase()));
                    Some(Flag { usage, long, help })
                })
                .collect()
        } else {
            flags(cmd)
        };
        let title = if path.is_empty() {
            "Global flags (every command)".to_owned()
        } else {
            format!("`crescent {}`", path.join(" "))
        };
        let about = cmd.get_about().map(|a| a.to_string()).unwrap_or_default();
        let _ = write!(out, "\n### {title}\n\n");
        if !path.is_empty() && !about.is_empty() {
            let _ = writeln!(out, "{}\n", squash(&about));
        }
        if fl.is_empty() {
            out.push_str("No flags.\n");
            continue;
        }
        out.push_str("| flag | file key | what it does |\n|---|---|---|\n");
        let sub = path.join(" ");
        for f in fl {
            let key = key_of(&sub, &f.long).map(|k| display_key(&k)).unwrap_or_else(|| "—".to_owned());
            let _ = writeln!(out, "| `{}` | {} | {} |", f.usage, key, cell(&f.help));
        }
    }
    out.push_str("\n## Keys of the config file\n\n");
    out.push_str(
        "Each key with the value it takes by default (or an example, in italics, where the default is \
                  computed at start-up) and the flag that overrides it. Keys that no flag sets say what they do.\n",
    );
    let keys = file_keys();
    for (section, about) in SECTIONS {
        let title = if section.is_empty() { "Top level".to_owned() } else { format!("`[{section}]`") };
        let _ =
            write!(out, "\n### {title}\n\n{about}.\n\n| key | default | flag | what it does |\n|---|---|---|---|\n");
        for (_, key) in keys.iter().filter(|(s, _)| *s == section) {
            let full = if section.is_empty() { key.clone() } else { format!("{section}.{key}") };
            let help = key_help(root, &full).unwrap_or_default();
            let value = match key_value(section, key, &help) {
                Some((v, false)) => format!("`{}`", v.replace('|', "\\|")),
                Some((v, true)) => format!("*e.g.* `{}`", v.replace('|', "\\|")),
                None => "—".to_owned(),
            };
            let (flag, what) = match flag_of(root, &full) {
                Some((f, subs)) => (format!("`{f}` ({subs})"), "as the flag".to_owned()),
                None => ("—".to_owned(), cell(&help)),
            };
            let _ = writeln!(out, "| `{key}` | {value} | {flag} | {what} |");
        }
    }
    out.push_str("\n## Flags without a file key\n\n| flag | why |\n|---|---|\n");
    for (flag, why) in FLAG_ONLY {
        let _ = writeln!(out, "| `--{flag}` | {why} |");
    }
    out
}

/// `server.listen` as the guide writes it: `[server] listen`.
fn display_key(k: &str) -> String {
    match k.split_once('.') {
        Some((section, key)) => format!("`[{section}] {key}`"),
        None => format!("`{k}`"),
    }
}

/// `crescent config`.
pub fn run(a: &ConfigArgs, root: &clap::Command) {
    if a.defaults {
        print!("{}", defaults_toml(root));
    } else if a.markdown {
        print!("{}", markdown(root));
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn root() -> clap::Command {
        crate::cli_command()
    }

    #[test]
    fn every_server_flag_has_a_file_key_or_a_reason_and_every_key_has_a_flag_or_a_description() {
        let root = root();
        let mut flag_only_used = Vec::new();
        for sub in SERVERS {
            let cmd = root.find_subcommand(sub).unwrap();
            for f in flags(cmd) {
                match key_of(sub, &f.long) {
                    Some(_) => {}
                    None => {
                        assert!(
                            FLAG_ONLY.iter().any(|(l, _)| *l == f.long),
                            "`crescent {sub} --{}` has no key",
                            f.long
                        );
                        flag_only_used.push(f.long);
                    }
                }
            }
        }
        for (flag, _) in FLAG_ONLY {
            assert!(flag_only_used.iter().any(|f| f == flag), "FLAG_ONLY names --{flag}, which no server takes");
        }
        for &(section, ref key) in file_keys() {
            let full = if section.is_empty() { key.clone() } else { format!("{section}.{key}") };
            let by_flag = flag_of(&root, &full).is_some();
            let described = file_only().iter().any(|(k, _)| *k == full);
            assert!(by_flag != described, "{full}: set by a flag: {by_flag}, in file_only: {described} (exactly one)");
        }
        for (k, _) in file_only() {
            let (s, key) = k.split_once('.').unwrap();
            assert!(file_keys().iter().any(|(fs, fk)| fs == &s && fk == key), "file_only names {k}, not a key");
        }
    }

    /// `text` with its key lines uncommented (`examples`: those showing an example too).
    fn uncomment(text: &str, examples: bool) -> String {
        let key_line = |l: &str| {
            let rest = l.strip_prefix("# ")?;
            let (key, _) = rest.split_once(" = ")?;
            (!key.contains(' ') && (examples || !rest.ends_with("# an example"))).then(|| rest.to_owned())
        };
        text.lines().map(|l| format!("{}\n", key_line(l).unwrap_or_else(|| l.to_owned()))).collect()
    }

    #[test]
    fn the_defaults_file_names_every_key_and_uncommented_it_parses_to_the_defaults() {
        let text = defaults_toml(&root());
        let every = uncomment(&text, true);
        FileConfig::parse(&every).unwrap_or_else(|e| panic!("{e:#}\n{every}"));
        let parsed: toml::Table = toml::from_str(&every).unwrap();
        for &(section, ref key) in file_keys() {
            let table = if section.is_empty() { Some(&parsed) } else { parsed.get(section).and_then(|s| s.as_table()) };
            assert!(table.is_some_and(|t| t.contains_key(key)), "[{section}] {key} is not in the defaults file");
        }
        // The values shown as defaults are the defaults.
        let file = FileConfig::parse(&uncomment(&text, false)).unwrap();
        assert_eq!(file.server.master, crescent_master::service::MasterConfig::default());
        assert_eq!(file.node.segment_size.as_deref(), Some(crescent_cli::config::DEFAULT_SEGMENT_SIZE));
        assert_eq!(file.master.as_deref(), Some(crescent_cli::config::DEFAULT_MASTER));
        let client = crescent_cli::config::Global::resolve(&None, &None, &file).client_config();
        let default = crescent_cli::config::Global::resolve(&None, &None, &FileConfig::default()).client_config();
        assert_eq!(format!("{:?}", client.transfer), format!("{:?}", default.transfer));
        assert_eq!(client.request_timeout, default.request_timeout);
    }
}
