//! The README and the guide under docs/ do not contradict `--help`: every
//! flag they name is one the tracer binary lists, and a flag on a
//! `tracer VERB` command line is one that verb lists. Flags of other tools
//! (cargo xtask, node, objcopy, ...) are allowed only near their tool's name.

use std::{collections::BTreeSet, path::PathBuf, process::Command};

use regex::Regex;

/// Flags of other programs named in the docs, with a word that must be
/// within a few lines of each mention (the program they belong to).
const FOREIGN: &[(&str, &[&str])] = &[
    ("--dry-run", &["xtask"]),
    ("--short", &["xtask", "bench", "CI"]),
    ("--restarting", &["xtask soak"]),
    ("--its-args", &["./myprog"]),
    ("--now", &["systemctl"]),
    ("--interpreted-frames-native-stack", &["node"]),
    ("--loop", &["torch_models.py"]),
    ("--pause-ms", &["torch_models.py"]),
    ("--bug", &["s1_export_loop.py"]),
    ("--ml", &["xtask"]),
    ("--exceptions", &["xtask"]),
    ("--only-keep-debug", &["objcopy"]),
    ("--lib", &["cargo test"]),
    ("--test", &["xtask", "cargo test"]),
    ("--release", &["cargo test"]),
    ("--seconds", &["xtask"]),
    ("--only", &["xtask"]),
    ("--no-index", &["pip install"]),
    ("--rm", &["podman run"]),
    ("--privileged", &["podman run"]),
    ("--profile", &["kubectl debug"]),
    ("--image", &["kubectl debug"]),
    ("--target", &["kubectl debug"]),
    ("--parts", &["config-flow"]),
    ("--check", &["config-flow", "module-graph", "sizes"]),
];
/// Lines either side of a foreign flag searched for its program's name.
const FOREIGN_WINDOW: usize = 3;

fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tracer/ has a parent")
        .to_path_buf()
}

/// README.md and docs/*.md: (name, text).
fn pages() -> Vec<(String, String)> {
    let root = workspace_root();
    let mut paths = vec![root.join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    assert!(docs.len() >= 5, "docs/ holds the guide: {docs:?}");
    paths.extend(docs);
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("readable page");
            (
                path.strip_prefix(&root).unwrap().display().to_string(),
                text,
            )
        })
        .collect()
}

fn help(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_tracer"))
        .args(args)
        .output()
        .expect("tracer runs");
    assert!(output.status.success(), "tracer {args:?}: {output:?}");
    String::from_utf8(output.stdout).expect("UTF-8 help")
}

fn flag_regex() -> Regex {
    Regex::new(r"(?:^|[^A-Za-z0-9_-])(--[a-z][a-z0-9-]*)").unwrap()
}

fn flags_in(text: &str) -> BTreeSet<String> {
    flag_regex()
        .captures_iter(text)
        .map(|captures| captures[1].to_owned())
        .collect()
}

/// The verbs `tracer --help` lists (help aside), with the flags of each.
fn verbs() -> Vec<(String, BTreeSet<String>)> {
    let top = help(&["--help"]);
    let commands = top
        .split("Commands:")
        .nth(1)
        .expect("tracer --help lists its commands")
        .split("Options:")
        .next()
        .unwrap();
    let verbs: Vec<String> = commands
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .filter(|verb| *verb != "help")
        .map(str::to_owned)
        .collect();
    assert!(
        verbs.iter().any(|verb| verb == "record"),
        "verbs parsed from tracer --help: {verbs:?}"
    );
    let global = flags_in(&top);
    verbs
        .into_iter()
        .map(|verb| {
            let mut flags = flags_in(&help(&[&verb, "--help"]));
            flags.extend(global.iter().cloned());
            (verb, flags)
        })
        .collect()
}

#[test]
fn every_flag_named_in_the_docs_is_in_some_help() {
    let verbs = verbs();
    let known: BTreeSet<&String> = verbs.iter().flat_map(|(_, flags)| flags).collect();
    let mut wrong = Vec::new();
    let mut named = 0;
    for (page, text) in pages() {
        let lines: Vec<&str> = text.lines().collect();
        for (number, line) in lines.iter().enumerate() {
            for flag in flags_in(line) {
                named += 1;
                if known.contains(&flag) {
                    continue;
                }
                let near = lines[number.saturating_sub(FOREIGN_WINDOW)
                    ..(number + FOREIGN_WINDOW + 1).min(lines.len())]
                    .join("\n");
                let foreign = FOREIGN.iter().any(|(name, owners)| {
                    *name == flag && owners.iter().any(|owner| near.contains(owner))
                });
                if !foreign {
                    wrong.push(format!("{page}:{}: {flag}", number + 1));
                }
            }
        }
    }
    assert!(named > 100, "only {named} flags found in the docs");
    assert!(
        wrong.is_empty(),
        "flags no `tracer ... --help` lists:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn flags_on_a_tracer_command_line_belong_to_its_verb() {
    let verbs = verbs();
    let names: Vec<&str> = verbs.iter().map(|(verb, _)| verb.as_str()).collect();
    let command = Regex::new(&format!(r"\btracer ({})\b(.*)", names.join("|"))).unwrap();
    let mut wrong = Vec::new();
    let mut lines_checked = 0;
    for (page, text) in pages() {
        for (number, line) in text.lines().enumerate() {
            let Some(captures) = command.captures(line) else {
                continue;
            };
            let verb = &captures[1];
            // What follows ` -- ` is the traced command's; what follows a
            // backtick or `&&` is another command's.
            let rest = captures[2]
                .split(" -- ")
                .next()
                .unwrap()
                .split(['`', '&', '|', '#', ';', ')'])
                .next()
                .unwrap();
            let flags = &verbs.iter().find(|(name, _)| name == verb).unwrap().1;
            lines_checked += 1;
            for flag in flags_in(rest) {
                if !flags.contains(&flag) {
                    wrong.push(format!("{page}:{}: tracer {verb} {flag}", number + 1));
                }
            }
        }
    }
    assert!(
        lines_checked > 30,
        "only {lines_checked} tracer command lines found"
    );
    assert!(
        wrong.is_empty(),
        "flags their verb's --help does not list:\n{}",
        wrong.join("\n")
    );
}
