//! The house's rules hold (issue 46): no circle between modules and no
//! import against the layers in any of the three crates
//! (scripts/module-graph.py), and a run's config, with its parts, comes
//! back up to a higher layer at most 3 times on its way down from
//! `record::run` (scripts/config-flow.py), and no struct holds more than
//! 10 fields without a reason at its definition, and no file runs past
//! 500 lines without one at its top (scripts/sizes.py).
//! `cargo xtask lint` runs the same checks.

use std::{path::PathBuf, process::Command};

fn run_script(script: &str, args: &[&str]) -> String {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_owned();
    let output = Command::new("python3")
        .arg(root.join("scripts").join(script))
        .args(args)
        .current_dir(&root)
        .output()
        .expect("python3 runs");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "{script} {args:?} failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

#[test]
fn no_module_names_one_above_it_or_closes_a_circle() {
    let out = run_script("module-graph.py", &["--check"]);
    assert!(out.contains("circles: 0, layer failures: 0"), "{out}");
}

#[test]
fn the_config_goes_down_and_comes_back_up_at_most_three_times() {
    let out = run_script("config-flow.py", &["--parts", "--check", "3"]);
    let returns: usize = out
        .lines()
        .find_map(|line| line.strip_prefix("returns to a higher layer: "))
        .and_then(|count| count.trim().parse().ok())
        .unwrap_or_else(|| panic!("no count in:\n{out}"));
    assert!(returns <= 3, "{out}");
    assert!(out.starts_with("record -> session"), "{out}");
}

#[test]
fn every_struct_of_more_than_ten_fields_and_file_of_more_than_500_lines_says_why() {
    let out = run_script("sizes.py", &["--check"]);
    assert!(out.contains("wide types without a reason: 0"), "{out}");
    assert!(out.contains("long files without a reason: 0"), "{out}");
}
