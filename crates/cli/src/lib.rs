//! The library part of the `crescent` command: what is worth reaching without running the binary. Its config
//! file parser ([`config::FileConfig::parse`]) is fuzzed (`fuzz/`), and the binary uses both modules.

pub mod config;

/// Parses `123`, `4KiB`, `16MiB`, `1GiB`, `2TiB` (also KB/MB/GB/TB, 1024-based, case-insensitive).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("invalid size {s:?}"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1 << 10,
        "m" | "mb" | "mib" => 1 << 20,
        "g" | "gb" | "gib" => 1 << 30,
        "t" | "tb" | "tib" => 1 << 40,
        _ => return Err(format!("invalid size unit in {s:?}")),
    };
    n.checked_mul(mult).ok_or_else(|| format!("size {s:?} overflows"))
}
