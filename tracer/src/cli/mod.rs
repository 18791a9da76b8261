//! The command line: verbs and flags (clap, `args`), turned into the
//! configs the rest of tracer is given (`crate::config`). Usage errors
//! become one line, exit code 2. Nothing below cli names it.
mod args;
mod generate;
mod help;
#[cfg(test)]
mod tests;
mod values;
mod version;

use std::ffi::OsString;

use anyhow::Result;
use clap::Parser as _;

use crate::{
    config::{Config, FloorConfig, RecordConfig, ReportConfig},
    error::{ExitCode, fatal},
};
pub use values::parse_duration;

/// What the user asked for: a run, a report on a recording, or text to
/// print (help, version).
pub enum Parsed {
    Record(RecordConfig),
    Top(Config),
    Report(ReportConfig),
    Floor(FloorConfig),
    Print(String),
}

/// Parses the arguments. Help, version, man pages and completions are
/// returned as text; usage
/// errors become a one-line error with exit code 2.
pub fn parse(arguments: impl IntoIterator<Item = OsString>) -> Result<Parsed> {
    let cli = match args::Cli::try_parse_from(arguments) {
        Ok(cli) => cli,
        Err(error) => {
            use clap::error::ErrorKind;
            return match error.kind() {
                ErrorKind::DisplayVersion => Ok(Parsed::Print(version::version_text())),
                ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
                    Ok(Parsed::Print(error.render().to_string()))
                }
                _ => Err(fatal(ExitCode::Usage, usage_line(&error))),
            };
        }
    };
    cli.into_parsed()
}

/// clap's message, reduced to its first line, with where to get help.
fn usage_line(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first = rendered.lines().next().unwrap_or("invalid arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (see tracer --help)")
}
