//! What a report says about dropped events: which way each drop makes
//! the figures wrong, in lines for the text report and in a few words for
//! a subtitle.
use super::{Report, human_bytes};

/// Which way a drop makes the figures wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DropEffect {
    /// Something was not counted: live and allocated figures are lower
    /// bounds.
    TooLow,
    /// Something that went away was not taken off: live figures may be
    /// too high.
    TooHigh,
    /// Mapping calls were missed (a map or an unmap): live mapping
    /// figures may be too high or too low.
    EitherWay,
    /// Every byte is counted; some blocks' stacks are worse (walked by
    /// frame pointers instead of unwound).
    StacksOnly,
}

/// How a drop counter (by its STATS name) makes the figures wrong.
pub fn drop_effect(name: &str) -> DropEffect {
    match name {
        "stack_free_lost" | "context_epoch_table_full" => DropEffect::TooHigh,
        "mapping_events_lost" | "mapping_pending_full" => DropEffect::EitherWay,
        "stack_copy_ring_full" => DropEffect::StacksOnly,
        _ => DropEffect::TooLow,
    }
}

impl Report {
    /// The warning about dropped events: the first line names them; when
    /// any of them is not a plain undercount, one line per direction
    /// follows, so a figure that may be too high is never called a lower
    /// bound.
    pub fn drop_warning(&self) -> Vec<String> {
        if self.drops.is_empty() {
            return Vec::new();
        }
        let dropped: u64 = self.drops.values().sum();
        let reasons: Vec<String> = self
            .drops
            .iter()
            .map(|(name, count)| format!("{name}={count}"))
            .collect();
        let mut first = format!("WARNING: {dropped} events dropped ({})", reasons.join(", "));
        let named = |effect: DropEffect| -> Vec<&str> {
            self.drops
                .keys()
                .filter(|name| drop_effect(name) == effect)
                .map(String::as_str)
                .collect()
        };
        let too_low = named(DropEffect::TooLow);
        if too_low.len() == self.drops.len() {
            first.push_str(": numbers below are lower bounds");
            return vec![first];
        }
        first.push(':');
        let mut lines = vec![first];
        let too_high = named(DropEffect::TooHigh);
        if !too_high.is_empty() {
            let lost_bytes = self.events.get("stack_free_lost_bytes").copied();
            let by = match lost_bytes {
                Some(bytes) if too_high == ["stack_free_lost"] => {
                    format!(" by up to {}", human_bytes(bytes as f64))
                }
                _ => String::new(),
            };
            lines.push(format!(
                "  live bytes may be too high{by}: frees or releases not seen ({})",
                too_high.join(", ")
            ));
        }
        if !too_low.is_empty() {
            lines.push(format!(
                "  live and allocated bytes may be too low: allocations not counted ({})",
                too_low.join(", ")
            ));
        }
        let either_way = named(DropEffect::EitherWay);
        if !either_way.is_empty() {
            lines.push(format!(
                "  live mapping bytes may be too high or too low: mapping calls missed ({})",
                either_way.join(", ")
            ));
        }
        if !named(DropEffect::StacksOnly).is_empty() {
            let blocks = self.drops.get("stack_copy_ring_full").copied().unwrap_or(0);
            lines.push(format!(
                "  bytes exact, but {blocks} blocks have frame-pointer stacks (cut short in code \
                 without frame pointers): their copies found the ring full (stack_copy_ring_full)"
            ));
        }
        lines
    }

    /// The drop warning in a few words, for a subtitle.
    pub fn drop_summary(&self) -> Option<String> {
        if self.drops.is_empty() {
            return None;
        }
        let dropped: u64 = self.drops.values().sum();
        let mut effects: Vec<&str> = Vec::new();
        for name in self.drops.keys() {
            let effect = match drop_effect(name) {
                DropEffect::TooLow => "some numbers may be too low",
                DropEffect::TooHigh => "some live numbers may be too high",
                DropEffect::EitherWay => "mapping numbers may be off either way",
                DropEffect::StacksOnly => "some stacks are cut short",
            };
            if !effects.contains(&effect) {
                effects.push(effect);
            }
        }
        if effects == ["some numbers may be too low"] {
            return Some(format!(
                "{dropped} events dropped: numbers are lower bounds"
            ));
        }
        Some(format!("{dropped} events dropped: {}", effects.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::super::fixtures::sample_report;
    use std::collections::BTreeMap;

    #[test]
    fn lost_frees_are_called_too_high_never_a_lower_bound() {
        let mut report = sample_report(1);
        report.drops = BTreeMap::from([
            ("stack_copy_ring_full".to_owned(), 7),
            ("stack_free_lost".to_owned(), 20),
        ]);
        report
            .events
            .insert("stack_free_lost_bytes".to_owned(), 20 * 1000);
        let lines = report.drop_warning();
        assert_eq!(
            lines[0],
            "WARNING: 27 events dropped (stack_copy_ring_full=7, stack_free_lost=20):"
        );
        assert_eq!(
            lines[1],
            "  live bytes may be too high by up to 19.5 KiB: frees or releases not seen \
             (stack_free_lost)"
        );
        assert!(lines[2].starts_with("  bytes exact, but 7 blocks have frame-pointer stacks"));
        assert!(!lines.iter().any(|line| line.contains("lower bound")));
        let summary = report.drop_summary().expect("drops");
        assert!(summary.contains("may be too high"), "{summary}");
        assert!(!summary.contains("lower bound"), "{summary}");
    }

    #[test]
    fn undercounts_alone_are_lower_bounds_and_mixed_drops_say_each_direction() {
        let mut report = sample_report(1);
        report.drops = BTreeMap::from([("live_map_full".to_owned(), 2)]);
        assert_eq!(
            report.drop_warning(),
            ["WARNING: 2 events dropped (live_map_full=2): numbers below are lower bounds"]
        );
        report.drops.insert("mapping_events_lost".to_owned(), 1);
        let lines = report.drop_warning();
        assert_eq!(lines.len(), 3, "{lines:?}");
        assert!(lines[1].contains("may be too low") && lines[1].contains("live_map_full"));
        assert!(lines[2].contains("too high or too low"));
    }
}
