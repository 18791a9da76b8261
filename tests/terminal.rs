//! The text report on a terminal, with real eBPF: a target whose command
//! line carries escape sequences (clear the screen, set the window title,
//! ring the bell) has them shown as escapes (`\x1b`), never sent.

use crate::harness;

use harness::{Fixture, Record};

#[test]
fn escape_sequences_in_a_command_line_are_shown_not_sent() {
    let hostile = "\x1b[2J\x1b]0;owned\x07\u{9b}31mred";
    let mut fixture = Fixture::start("holders", &[hostile]);
    let trace = Record::pid(fixture.pid).attach();
    fixture.cmd("cache 3");
    let traced = trace.stop();
    fixture.cmd("quit");

    let text = &traced.output.stdout;
    assert!(
        text.contains("\\x1b[2J\\x1b]0;owned\\x07\\u{9b}31mred"),
        "the command line, escaped:\n{text}"
    );
    let sent: Vec<char> = text
        .chars()
        .filter(|&character| character != '\n' && character.is_control())
        .collect();
    assert!(sent.is_empty(), "control characters {sent:?} in:\n{text}");
}
