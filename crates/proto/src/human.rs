//! Quantities as people read them, in messages and CLI output.

/// `n` bytes with a binary unit: `512 B`, `4.0 KiB`, `57.6 MiB`.
pub fn fmt_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Parses `123`, `4KiB`, `16MiB`, `1GiB`, `2TiB` (also K/M/G/T and KB/MB/GB/TB, 1024-based, case-insensitive):
/// what a person types for a size (the CLI's sizes, the admin HTTP's `?quota=`).
pub fn parse_bytes(s: &str) -> Result<u64, String> {
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

#[cfg(test)]
mod tests {
    use super::{fmt_bytes, parse_bytes};

    #[test]
    fn sizes_parse_as_people_write_them() {
        assert_eq!(parse_bytes("10GiB"), Ok(10 << 30));
        assert_eq!(parse_bytes(" 4 kb "), Ok(4 << 10));
        assert_eq!(parse_bytes("7"), Ok(7));
        assert!(parse_bytes("GiB").is_err());
        assert!(parse_bytes("1.5GiB").is_err());
        assert!(parse_bytes("99999999999TiB").is_err());
    }

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(4096), "4.0 KiB");
        assert_eq!(fmt_bytes(60 << 20), "60.0 MiB");
        assert_eq!(fmt_bytes(3 << 40), "3.0 TiB");
    }
}
