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

#[cfg(test)]
mod tests {
    use super::fmt_bytes;

    #[test]
    fn bytes_read_as_people_write_them() {
        assert_eq!(fmt_bytes(512), "512 B");
        assert_eq!(fmt_bytes(4096), "4.0 KiB");
        assert_eq!(fmt_bytes(60 << 20), "60.0 MiB");
        assert_eq!(fmt_bytes(3 << 40), "3.0 TiB");
    }
}
