//! The library part of the `crescent` command: what is worth reaching without running the binary. Its config
//! file parser ([`config::FileConfig::parse`]) is fuzzed (`fuzz/`), and the binary uses both modules.

pub mod config;

/// Parses `123`, `4KiB`, `16MiB`, `1GiB`, `2TiB` (also KB/MB/GB/TB, 1024-based, case-insensitive).
pub fn parse_size(s: &str) -> Result<u64, String> {
    crescent_proto::human::parse_bytes(s)
}

/// Parses a duration as a person types it: `500ms`, `5s`, `1.5s`, `2m` (a unit is required; zero is refused,
/// since a zero timeout would fail every request).
pub fn parse_duration(s: &str) -> Result<std::time::Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: f64 = num.parse().map_err(|_| format!("invalid duration {s:?} (e.g. 500ms, 5s)"))?;
    let secs = match unit.trim().to_ascii_lowercase().as_str() {
        "ms" => n / 1000.0,
        "s" => n,
        "m" | "min" => n * 60.0,
        "" => return Err(format!("duration {s:?} needs a unit (e.g. 500ms, 5s)")),
        _ => return Err(format!("invalid duration unit in {s:?} (ms, s or m)")),
    };
    match std::time::Duration::try_from_secs_f64(secs) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(format!("duration {s:?} must be positive")),
        Err(_) => Err(format!("duration {s:?} is out of range")),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_parse_as_people_write_them() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 5s "), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("5").unwrap_err().contains("needs a unit"));
        assert!(parse_duration("0s").unwrap_err().contains("positive"));
        assert!(parse_duration("5h").is_err());
        assert!(parse_duration("ms").is_err());
        assert!(parse_duration("1e400s").is_err());
    }
}
