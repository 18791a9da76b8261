//! `tracer generate`: the man pages and shell completions, made from the
//! clap definitions themselves so they never drift from `--help`.
//! `cargo xtask dist` ships them beside the static binary; someone who
//! copied the binary alone makes them with it.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use clap_complete::Shell;

use crate::error::{ExitCode, fatal};

#[derive(Debug, Args)]
pub(super) struct GenerateArgs {
    /// What to make.
    #[arg(value_enum)]
    what: Generated,

    /// With `man`: write tracer.1 and a page per verb (tracer-record.1,
    /// ...) into this directory instead of tracer.1 to standard output.
    #[arg(value_name = "DIR")]
    dir: Option<PathBuf>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Generated {
    /// Man pages (roff): `tracer generate man > tracer.1`
    Man,
    /// bash completions: `tracer generate bash > tracer.bash`
    Bash,
    /// zsh completions: `tracer generate zsh > _tracer`
    Zsh,
    /// fish completions: `tracer generate fish > tracer.fish`
    Fish,
}

/// The text `args` asks for from tracer's `command` line definitions
/// (empty when the pages went to a directory).
pub(super) fn generate(args: &GenerateArgs, command: clap::Command) -> anyhow::Result<String> {
    let command = command.disable_help_subcommand(true);
    let shell = match args.what {
        Generated::Man => return man(command, args.dir.as_ref()),
        Generated::Bash => Shell::Bash,
        Generated::Zsh => Shell::Zsh,
        Generated::Fish => Shell::Fish,
    };
    if args.dir.is_some() {
        return Err(fatal(
            ExitCode::Usage,
            "DIR goes with `tracer generate man` only: completions go to standard output",
        ));
    }
    let mut bytes = Vec::new();
    clap_complete::generate(shell, &mut command.clone(), "tracer", &mut bytes);
    Ok(String::from_utf8(bytes)?)
}

fn man(command: clap::Command, dir: Option<&PathBuf>) -> anyhow::Result<String> {
    let Some(dir) = dir else {
        let mut bytes = Vec::new();
        clap_mangen::Man::new(command).render(&mut bytes)?;
        return Ok(String::from_utf8(bytes)?);
    };
    clap_mangen::generate_to(command, dir).map_err(|error| {
        fatal(
            ExitCode::Output,
            format!(
                "could not write the man pages into {}: {error} (is it an existing, writable directory?)",
                dir.display()
            ),
        )
    })?;
    Ok(String::new())
}
