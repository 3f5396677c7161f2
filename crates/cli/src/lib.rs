//! The library part of the `crescent` command: what is worth reaching without running the binary. Its config
//! file parser ([`config::FileConfig::parse`]) is fuzzed (`fuzz/`), and the binary uses both modules.

pub mod config;

/// Parses `123`, `4KiB`, `16MiB`, `1GiB`, `2TiB` (also KB/MB/GB/TB, 1024-based, case-insensitive).
pub fn parse_size(s: &str) -> Result<u64, String> {
    crescent_proto::human::parse_bytes(s)
}
