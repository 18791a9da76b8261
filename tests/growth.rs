//! Growth over time against tests/fixtures/growth, which runs four memory
//! shapes at once: a steady leak, a sawtooth, a bounded cache and a
//! one-time step. Only the steady leak may be reported as a leak.

use crate::harness;

use std::time::{Duration, Instant};

use harness::{
    ATTACH_TIMEOUT, Fixture, Record, Traced, Tracer, frames_contain, json_path, require_root,
};
use serde_json::Value;

/// The functions of growth.c that are not leaks.
const NOT_LEAKS: [&str; 3] = ["sawtooth_fill", "cache_insert", "step_alloc"];

fn svg_path(test_name: &str) -> std::path::PathBuf {
    json_path(test_name).with_extension("svg")
}

#[test]
fn only_the_steady_leak_is_suspected_and_plotted_first() {
    let mut fixture = Fixture::start("growth", &[]);
    let svg = svg_path("growth_ranking");
    let trace = Record::pid(fixture.pid)
        .interval("500ms")
        .top(20)
        .args(["--duration", "20s", "--svg", svg.to_str().unwrap()])
        .attach();
    assert_eq!(fixture.cmd("start"), "started");
    let Traced { output, report } = trace.wait_exit();

    let leaks = report.json["suspected_leaks"]
        .as_array()
        .unwrap_or_else(|| panic!("no suspected_leaks in the report: {}", report.json));
    assert_eq!(
        leaks.len(),
        1,
        "exactly one suspected leak expected: {leaks:#?}"
    );
    assert!(frames_contain(&leaks[0], "steady_leak"), "{:#}", leaks[0]);
    let growth = &leaks[0]["growth"];
    // 4 KiB every 100 ms: 40 KiB/s, steady.
    let rate = growth["rate_bytes_per_s"].as_f64().unwrap();
    assert!(
        (30_000.0..50_000.0).contains(&rate),
        "rate {rate}: {growth}"
    );
    assert!(growth["r_squared"].as_f64().unwrap() > 0.95, "{growth}");
    assert!(leaks[0]["series"].as_array().unwrap().len() > 30);

    for function in NOT_LEAKS {
        let stacks = report.heap_stacks_with(function);
        assert!(
            !stacks.is_empty(),
            "{function} is missing from the report:\n{report}"
        );
        for stack in stacks {
            assert_eq!(
                stack["suspected_leak"],
                Value::Bool(false),
                "{function} must not be a suspected leak: {:#}",
                stack["growth"]
            );
        }
    }
    assert!(output.stdout.contains("suspected leaks (1)"), "{output}");
    let text_leak = output
        .stdout
        .lines()
        .position(|line| line.starts_with("L1 "));
    let steady = output
        .stdout
        .lines()
        .position(|line| line.contains("steady_leak"));
    assert!(text_leak.is_some() && steady >= text_leak, "{output}");

    let svg_text = std::fs::read_to_string(&svg).expect("the SVG was written");
    let _ = std::fs::remove_file(&svg);
    let document = roxmltree::Document::parse(&svg_text).expect("the SVG is XML");
    let legend: Vec<&str> = document
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .filter_map(|node| node.text().map(str::trim))
        .collect();
    let leak_label = legend.iter().find(|text| text.starts_with("L1 "));
    assert!(
        leak_label.is_some_and(|label| label.contains("steady_leak")),
        "legend: {legend:?}"
    );
    let first_stack_label = legend
        .iter()
        .find(|text| text.starts_with('L') || text.starts_with('#'));
    assert_eq!(
        first_stack_label, leak_label,
        "the leak is plotted first: {legend:?}"
    );
    assert!(
        !legend.iter().any(|text| text.contains("step_alloc")),
        "the one-time step stopped growing and must not be plotted: {legend:?}"
    );
    let data_lines = document
        .descendants()
        .filter(|node| node.has_tag_name("polyline") && node.attribute("stroke-width") == Some("2"))
        .count();
    assert!(
        data_lines >= 2,
        "a line for the heap total and the leak: {data_lines}"
    );
}

#[test]
fn svg_is_rewritten_while_tracing() {
    let mut fixture = Fixture::start("growth", &[]);
    let svg = svg_path("growth_periodic");
    let _ = std::fs::remove_file(&svg);
    let trace = Record::pid(fixture.pid)
        .args(["--svg", svg.to_str().unwrap(), "--svg-every", "1s"])
        .attach();
    assert_eq!(fixture.cmd("start"), "started");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !svg.exists() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(svg.exists(), "no SVG while tracing after 10 s");
    let first = drawn(&std::fs::read_to_string(&svg).unwrap());
    // Rewritten with more drawn (not only a new time label), within 5 s.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let now = drawn(&std::fs::read_to_string(&svg).unwrap());
        if now != first {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the SVG's drawing did not change in 5 s of a growing leak"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    trace.stop();
    let _ = std::fs::remove_file(&svg);
}

/// What an SVG draws, its text left out (the time label changes at every
/// rewrite): every element's name and attributes. Fails unless the SVG
/// is complete XML (a rewrite is never seen half-written).
fn drawn(svg: &str) -> Vec<String> {
    let document = roxmltree::Document::parse(svg).expect("a mid-run SVG is complete XML");
    document
        .descendants()
        .filter(roxmltree::Node::is_element)
        .map(|node| {
            let attributes: Vec<String> = node
                .attributes()
                .map(|attribute| format!("{}={}", attribute.name(), attribute.value()))
                .collect();
            format!("{} {}", node.tag_name().name(), attributes.join(" "))
        })
        .collect()
}

#[test]
fn top_shows_the_leak_first_within_5_s() {
    require_root();
    let mut fixture = Fixture::start("growth", &[]);
    let pid = fixture.pid.to_string();
    let mut tracer = Tracer::start([
        "top",
        "--pid",
        &pid,
        "--interval",
        "500ms",
        "--duration",
        "5s",
    ]);
    tracer.wait_attached(ATTACH_TIMEOUT);
    assert_eq!(fixture.cmd("start"), "started");
    let output = tracer.wait_exit(Duration::from_secs(30));
    output.assert_success();
    // Piped stdout: one plain table per interval; look at the last one.
    let last_table = output.last_top_table();
    let first_row = last_table
        .lines()
        .skip_while(|line| !line.trim_start().starts_with("RANK"))
        .nth(1)
        .unwrap_or_else(|| panic!("no rows in the last table: {output}"));
    assert!(
        first_row.contains("steady_leak") && first_row.contains("yes"),
        "the leak is not first: {last_table}"
    );
    // Under the table: when the leak reaches the target's memory limit
    // (its cgroup's, else the host's).
    assert!(
        last_table
            .lines()
            .any(|line| line.starts_with(&format!("PID {pid}: at +"))
                && line.contains("(its suspected leaks)")
                && line.contains("is reached in ~")),
        "no time-to-limit line: {last_table}"
    );
}

/// The `<text>` contents and the number of data lines of an SVG.
fn svg_outline(svg: &str) -> (Vec<String>, usize) {
    let document = roxmltree::Document::parse(svg).expect("the SVG is XML");
    let texts = document
        .descendants()
        .filter(|node| node.has_tag_name("text"))
        .filter_map(|node| node.text().map(|text| text.trim().to_owned()))
        .collect();
    let lines = document
        .descendants()
        .filter(|node| node.has_tag_name("polyline") && node.attribute("stroke-width") == Some("2"))
        .count();
    (texts, lines)
}

#[test]
fn plot_of_a_recording_matches_the_live_svg() {
    let mut fixture = Fixture::start("growth", &[]);
    let svg = svg_path("plot_live");
    let recording = json_path("plot_recording").with_extension("tracer");
    let replotted = svg_path("plot_replayed");
    let trace = Record::pid(fixture.pid)
        .interval("500ms")
        .args([
            "--duration",
            "6s",
            "--svg",
            svg.to_str().unwrap(),
            "-o",
            recording.to_str().unwrap(),
        ])
        .attach();
    assert_eq!(fixture.cmd("start"), "started");
    trace.wait_exit();
    let plot = Tracer::start([
        "plot",
        recording.to_str().unwrap(),
        "-o",
        replotted.to_str().unwrap(),
    ])
    .wait_exit(Duration::from_secs(60));
    plot.assert_success();
    let live = std::fs::read_to_string(&svg).unwrap();
    let replayed = std::fs::read_to_string(&replotted).unwrap();
    for path in [&svg, &recording, &replotted] {
        let _ = std::fs::remove_file(path);
    }
    let (live_texts, live_lines) = svg_outline(&live);
    assert!(
        live_texts.iter().any(|text| text.contains("steady_leak")),
        "{live_texts:?}"
    );
    assert_eq!(svg_outline(&replayed), (live_texts, live_lines));
}
