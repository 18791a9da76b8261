//! The values of flags that clap does not parse by itself: durations,
//! times since attach, ring sizes, memory kinds.
use std::time::Duration;

use crate::model::Kind;

/// Parses "30s", "500ms", "2m", "1h", "1.5s" or a bare number of seconds.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a duration (examples: 30s, 500ms, 5m)"))?;
    let seconds = match unit {
        "" | "s" => value,
        "ms" => value / 1000.0,
        "m" | "min" => value * 60.0,
        "h" => value * 3600.0,
        _ => {
            return Err(format!(
                "unknown unit '{unit}' in '{text}' (use ms, s, m or h)"
            ));
        }
    };
    if !seconds.is_finite() || seconds <= 0.0 {
        return Err(format!("'{text}' must be more than zero"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

pub(super) fn parse_ring_kib(text: &str) -> Result<u32, String> {
    let kib: u32 = text
        .parse()
        .map_err(|_| format!("'{text}' is not a number of KiB"))?;
    if kib < 4 || !kib.is_power_of_two() || kib > 1 << 20 {
        return Err(format!("'{text}' must be a power of two from 4 to 1048576"));
    }
    Ok(kib)
}

pub(super) fn parse_interval(text: &str) -> Result<Duration, String> {
    let interval = parse_duration(text)?;
    if interval < Duration::from_millis(10) {
        return Err(format!(
            "'{text}' is too short: the interval must be at least 10ms"
        ));
    }
    Ok(interval)
}

/// A time since attach: a duration, zero included.
pub(super) fn parse_time(text: &str) -> Result<Duration, String> {
    if text
        .trim()
        .trim_end_matches(|c: char| c.is_ascii_alphabetic())
        == "0"
    {
        return Ok(Duration::ZERO);
    }
    parse_duration(text)
}

pub(super) fn parse_kind(name: &str) -> Result<Kind, String> {
    Kind::from_name(name).ok_or_else(|| format!("unknown memory kind '{name}' (e.g. heap)"))
}
