//! Totals in a report, by kind and by target. The report lists only the
//! stacks that still hold memory, so a stack freed to zero and a stack
//! gone negative both vanish from it; totals count every stack and tell the
//! two apart.

use std::collections::BTreeMap;

use serde_json::Value;

use super::{Live, Report, stack_int};

/// Reserved address space: totalled, never listed as a stack.
const ADDRESS_SPACE_KIND: &str = "mmap-reserved";

/// Bytes and calls a stack allocated over the whole run, freed or not.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Allocated {
    pub bytes: i64,
    pub count: i64,
}

/// Live bytes and blocks of a stack, or of a kind in a totals object.
pub fn stack_live(stack: &Value) -> Live {
    Live {
        bytes: stack_int(stack, "live_bytes"),
        allocs: stack_int(stack, "live_allocs"),
    }
}

/// Live bytes and blocks summed over `stacks`.
pub fn sum_live(stacks: &[&Value]) -> Live {
    stacks
        .iter()
        .map(|stack| stack_live(stack))
        .fold(Live::default(), |sum, live| sum + live)
}

/// What a stack allocated over the run.
pub fn stack_allocated(stack: &Value) -> Allocated {
    Allocated {
        bytes: stack_int(stack, "alloc_bytes_total"),
        count: stack_int(stack, "alloc_count_total"),
    }
}

fn totals_live(totals: &Value, kind: &str) -> Live {
    match totals.get(kind) {
        Some(live) => stack_live(live),
        None => Live::default(),
    }
}

impl Report {
    /// Live memory of `kind` (as the report names it) over every traced
    /// process; zero where the report has no totals for the kind.
    pub fn total(&self, kind: &str) -> Live {
        totals_live(&self.json["totals"], kind)
    }

    /// Live memory of `kind` in one traced process.
    pub fn target_total(&self, pid: u32, kind: &str) -> Live {
        totals_live(&self.target(pid)["totals"], kind)
    }

    /// The traced process `pid` as the report lists it.
    pub fn target(&self, pid: u32) -> &Value {
        self.targets()
            .iter()
            .find(|target| target["pid"].as_u64() == Some(pid.into()))
            .unwrap_or_else(|| panic!("PID {pid} is not among the targets:\n{}", self.json))
    }

    pub fn targets(&self) -> &[Value] {
        self.json["targets"]
            .as_array()
            .unwrap_or_else(|| panic!("no `targets` array in the report:\n{}", self.json))
    }

    /// Live bytes and blocks over the heap stacks of process `pid`
    /// containing `function`.
    pub fn heap_live_of(&self, pid: u32, function: &str) -> Live {
        self.heap_stacks_with(function)
            .into_iter()
            .filter(|stack| stack["pid"].as_u64() == Some(pid.into()))
            .map(stack_live)
            .fold(Live::default(), |sum, live| sum + live)
    }

    /// Fails unless the report counts no drops.
    pub fn assert_no_drops(&self) {
        let drops = &self.json["drops"];
        assert!(
            drops.as_object().is_some_and(serde_json::Map::is_empty),
            "drops: {drops}"
        );
    }

    /// Every memory total, overall and per target, is the sum of the listed
    /// stacks and of those `--top` left out (`unlisted`): no stack holding
    /// memory was lost and none that went negative hides in the totals.
    /// `top` is the `--top` the report was made with (0: every stack): at
    /// most that many are listed, and stacks are left out only then.
    pub fn assert_totals_are_the_listed_stacks(&self, top: usize) {
        let unlisted = self.json.get("unlisted").map_or(&[][..], |unlisted| {
            unlisted
                .as_array()
                .unwrap_or_else(|| panic!("`unlisted` is not an array:\n{}", self.json))
        });
        let cut = top != 0 && self.stacks().len() == top;
        assert!(
            (top == 0 || self.stacks().len() <= top) && (cut || unlisted.is_empty()),
            "{} stacks listed at --top {top} (0: every stack), unlisted {unlisted:?}",
            self.stacks().len()
        );
        let mut listed: BTreeMap<(Option<u64>, String), Live> = BTreeMap::new();
        for stack in self.stacks().iter().chain(unlisted) {
            let kind = stack["kind"].as_str().expect("a kind name").to_owned();
            for pid in [None, stack["pid"].as_u64()] {
                let sum = listed.entry((pid, kind.clone())).or_default();
                *sum = *sum + stack_live(stack);
            }
        }
        let mut totalled = BTreeMap::new();
        let targets = self.targets().iter().map(|target| {
            let pid = target["pid"].as_u64().expect("a target's pid");
            (Some(pid), &target["totals"])
        });
        for (pid, totals) in [(None, &self.json["totals"])].into_iter().chain(targets) {
            let kinds = totals.as_object().map(|kinds| kinds.keys());
            for kind in kinds.into_iter().flatten() {
                if kind != ADDRESS_SPACE_KIND {
                    totalled.insert((pid, kind.clone()), totals_live(totals, kind));
                }
            }
        }
        // A kind whose stacks were all freed may be totalled as zero.
        totalled.retain(|key, live| *live != Live::default() || listed.contains_key(key));
        assert_eq!(
            totalled, listed,
            "totals (left) that are not the sum of the listed and unlisted stacks \
             (right), by (PID, kind):\n{self}"
        );
    }
}
