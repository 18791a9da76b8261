//! Numbers as people read them.
use crate::model::Model;

/// The live totals of every kind, one "heap 1.2 MiB live in 300 allocs"
/// phrase each, for status lines.
pub fn live_totals(model: &Model) -> Vec<String> {
    model
        .totals()
        .iter()
        .map(|(kind, totals)| {
            format!(
                "{} {} live in {} allocs",
                kind.as_str(),
                human_bytes(totals.live_bytes as f64),
                totals.live_allocs
            )
        })
        .collect()
}

/// Human units: 1536 -> "1.5 KiB", 512 -> "512 B", then MiB, GiB and TiB.
/// Negative values keep the sign.
pub fn human_bytes(bytes: f64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    let sign = if bytes < 0.0 { "-" } else { "" };
    let magnitude = bytes.abs();
    // Thresholds sit where the rounded figure would read 1024 of a unit.
    if magnitude < 1023.5 {
        return format!("{sign}{magnitude:.0} B");
    }
    let mut scaled = magnitude / 1024.0;
    let mut unit = 0;
    while scaled >= 1023.95 && unit + 1 < UNITS.len() {
        scaled /= 1024.0;
        unit += 1;
    }
    format!("{sign}{scaled:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_bytes_picks_a_readable_unit() {
        assert_eq!(human_bytes(0.0), "0 B");
        assert_eq!(human_bytes(512.0), "512 B");
        assert_eq!(human_bytes(1023.0), "1023 B");
        assert_eq!(human_bytes(1024.0), "1.0 KiB");
        assert_eq!(human_bytes(1536.0), "1.5 KiB");
        assert_eq!(human_bytes(1048575.0), "1.0 MiB");
        assert_eq!(human_bytes(3.0 * 1024.0 * 1024.0), "3.0 MiB");
        assert_eq!(human_bytes(5.5 * 1024.0 * 1024.0 * 1024.0), "5.5 GiB");
        assert_eq!(human_bytes(2.0 * 1024f64.powi(4)), "2.0 TiB");
        assert_eq!(human_bytes(2048.0 * 1024f64.powi(4)), "2048.0 TiB");
        assert_eq!(human_bytes(-1536.0), "-1.5 KiB");
        assert_eq!(human_bytes(-12.0), "-12 B");
        assert_eq!(human_bytes(33.3), "33 B");
    }
}
