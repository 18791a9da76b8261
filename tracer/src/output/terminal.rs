//! Text meant for a terminal holds names the target chose (its command
//! line, its symbols, its perf map's names): a control character among
//! them (ESC starting a sequence that clears the screen, sets the window
//! title or answers back) would act on the operator's terminal. Each is
//! shown as an escape instead (`\x1b`, `\u{9b}`), so the name stays
//! readable and nothing reaches the terminal but text.
use std::fmt::Write as _;

/// `text` (lines, `\n` between them kept) with every other control
/// character written as an escape: C0 (tab too), DEL and C1.
pub fn lines(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for character in text.chars() {
        match character {
            '\n' => out.push('\n'),
            '\u{0}'..='\u{1f}' | '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", character as u32);
            }
            '\u{80}'..='\u{9f}' => {
                let _ = write!(out, "\\u{{{:x}}}", character as u32);
            }
            _ => out.push(character),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_shown_not_sent() {
        assert_eq!(
            lines("evil\x1b[2J\x1b]0;title\x07 \u{9b}31m\tok\n"),
            "evil\\x1b[2J\\x1b]0;title\\x07 \\u{9b}31m\\x09ok\n"
        );
        assert_eq!(lines("a\x1bb\nc\r\n"), "a\\x1bb\nc\\x0d\n");
        assert_eq!(
            lines("plain ünïcode (std::vector<int>)"),
            "plain ünïcode (std::vector<int>)"
        );
    }
}
