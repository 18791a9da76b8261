//! The report as JSON, for scripts and for the integration tests. The keys
//! are the field names of [`Report`] and its parts, so the Rust types are the
//! schema.

use std::path::Path;

use super::Report;

/// The report as pretty-printed JSON.
pub fn to_json(report: &Report) -> String {
    // Every key is a string and every value plain data, so this cannot fail.
    serde_json::to_string_pretty(report).expect("a report always serializes to JSON")
}

/// Writes the report as JSON to `path` (mode 0600), replacing what was
/// there.
pub fn write_json(report: &Report, path: &Path) -> anyhow::Result<()> {
    let mut json = to_json(report);
    json.push('\n');
    super::file::write_private(path, json.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::fixtures::sample_report;
    use serde_json::Value;

    fn keys(value: &Value) -> Vec<&str> {
        let mut keys: Vec<&str> = value
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        keys
    }

    #[test]
    fn keys_are_the_field_names() {
        let json: Value = serde_json::from_str(&to_json(&sample_report(2))).unwrap();
        assert_eq!(
            keys(&json),
            [
                "cost",
                "drops",
                "events",
                "groups",
                "interval_ms",
                "judged_at",
                "libraries",
                "loader_pauses",
                "probes",
                "sampling",
                "snapshots",
                "stacks",
                "suspected_leak_groups",
                "suspected_leaks",
                "targets",
                "totals",
                "tracer_version",
                "unlisted",
                "unwinding",
                "unwinding_stopped",
                "window_s"
            ]
        );
        // The third stack by live bytes, cut by --top 2.
        assert_eq!(
            json["unlisted"],
            serde_json::json!([
                {"pid": 10, "kind": "heap", "stacks": 1, "live_bytes": 4096, "live_allocs": 64}
            ])
        );
        assert_eq!(json["unwinding_stopped"]["outside_code"], 2);
        assert_eq!(json["window_s"], 4.0);
        let library = &json["libraries"][1];
        assert_eq!(
            keys(library),
            [
                "functions",
                "hooked",
                "hooked_after_s",
                "noticed_by",
                "path",
                "pid"
            ]
        );
        assert_eq!(library["hooked_after_s"], 2.5);
        assert_eq!(library["noticed_by"], "mmap-event");
        assert_eq!(library["hooked"], "late");
        assert_eq!(json["libraries"][0]["hooked"], "attach");
        assert_eq!(json["libraries"][2]["noticed_by"], "at-open");
        assert_eq!(json["libraries"][2]["hooked"], "at-open");
        assert_eq!(
            json["totals"]["heap"]["live_bytes"],
            4 * 65536 + 4096 + 8192
        );
        assert_eq!(json["totals"]["heap"]["live_allocs"], 4096 + 64 + 128);
        assert_eq!(json["drops"]["stack_table_full"], 3);

        let target = &json["targets"][1];
        assert_eq!(
            keys(target),
            [
                "command",
                "execs_after_s",
                "exited_after_s",
                "followed_after_s",
                "gpu_contexts_destroyed",
                "memory",
                "memory_limit",
                "pid",
                "stack_quality",
                "totals"
            ]
        );
        assert_eq!(target["exited_after_s"], 3.2);
        assert_eq!(
            keys(&target["stack_quality"]),
            [
                "reaching_entry_bytes",
                "recorded_bytes",
                "share_reaching_entry"
            ]
        );
        assert_eq!(target["stack_quality"]["recorded_bytes"], 16384);
        assert_eq!(target["stack_quality"]["share_reaching_entry"], 1.0);
        assert_eq!(json["targets"][0]["exited_after_s"], Value::Null);
        assert_eq!(
            keys(&json["probes"][0]),
            [
                "module",
                "offset",
                "offset_in_function",
                "pid",
                "reason",
                "single_stepped",
                "symbol"
            ]
        );
        assert_eq!(
            keys(&json["sampling"]),
            [
                "max_size_bytes",
                "min_size_bytes",
                "mode",
                "return_probes",
                "sample_bytes"
            ]
        );

        let stack = &json["stacks"][0];
        assert_eq!(
            keys(stack),
            [
                "alloc_bytes_total",
                "alloc_count_total",
                "confidence",
                "evidence",
                "frames",
                "growth",
                "growth_bytes_per_s",
                "kind",
                "live_allocs",
                "live_bytes",
                "peak_at_s",
                "peak_live_bytes",
                "pid",
                "rank",
                "ranked_live_bytes",
                "series",
                "site",
                "stack_id",
                "suspected_leak",
                "verdict"
            ]
        );
        assert_eq!(stack["verdict"], "too-early");
        assert_eq!(stack["confidence"], "low");
        assert_eq!(
            stack["evidence"],
            "grew by 256.0 KiB in 4 intervals, 4096 freed (4096 of 8192 blocks since attach \
             still live); the window holds too few snapshots to tell (need 5)"
        );
        assert_eq!(
            keys(&stack["growth"]),
            [
                "confidence",
                "first_live_bytes",
                "growing_fraction",
                "last_live_bytes",
                "late_rate_bytes_per_s",
                "leaking_part",
                "net_growth_bytes",
                "non_shrinking_fraction",
                "r_squared",
                "rate_bytes_per_s",
                "shape",
                "site_share",
                "steps",
                "suspected_leak",
                "verdict",
                "work"
            ]
        );
        assert!(
            stack["series"][0]
                .as_array()
                .is_some_and(|point| point.len() == 2)
        );
        assert_eq!(stack["kind"], "heap");
        assert_eq!(stack["rank"], 1);
        assert_eq!(stack["live_bytes"], 4 * 65536);
        assert_eq!(stack["peak_live_bytes"], 4 * 65536);
        assert_eq!(stack["peak_at_s"], 4.0);
        assert_eq!(json["judged_at"], Value::Null);
        let frame = &stack["frames"][0];
        assert_eq!(
            keys(frame),
            [
                "address",
                "build_id",
                "file",
                "file_offset",
                "function",
                "language",
                "line",
                "module",
                "offset"
            ]
        );
        assert_eq!(frame["function"], "grow_1");
        assert_eq!(frame["file"], "leak.c");
        assert_eq!(frame["line"], 12);
        assert_eq!(frame["module"], "/opt/app/bin/server");
        assert_eq!(frame["build_id"], "0123abcd");
        assert_eq!(frame["file_offset"], 0x1234);
        assert_eq!(stack["frames"][1]["file"], Value::Null);
        assert_eq!(stack["site"]["function"], "grow_1");
        assert_eq!(stack["site"]["line"], 12);
        assert_eq!(stack["site"]["via"], Value::Null);
        assert_eq!(stack["site"]["label"], "grow_1 (leak.c:12)");
    }

    #[test]
    fn write_names_the_path_it_could_not_write() {
        let path = Path::new("/nonexistent-tracer-dir/report.json");
        let error = write_json(&sample_report(1), path).unwrap_err();
        let message = format!("{error:#}");
        assert!(
            message.starts_with("could not write /nonexistent-tracer-dir/report.json: "),
            "{message}"
        );
        assert!(message.contains("No such file or directory"), "{message}");
    }

    #[test]
    fn write_then_read_back() {
        let path =
            std::env::temp_dir().join(format!("tracer-json-test-{}.json", std::process::id()));
        write_json(&sample_report(1), &path).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let json: Value = serde_json::from_str(&written).unwrap();
        assert_eq!(json["stacks"].as_array().unwrap().len(), 1);
    }
}
