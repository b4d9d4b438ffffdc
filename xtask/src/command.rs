//! Running other programs: echo the command line, then check how it ended.

use std::ffi::OsStr;
use std::process::{Command, Output};

use anyhow::{bail, Context, Result};

/// The command line as one printable string.
pub fn describe(command: &Command) -> String {
    let program = command.get_program().to_string_lossy().into_owned();
    let args = command.get_args().map(quote);
    std::iter::once(program)
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Quotes an argument that has spaces or is empty, for display only.
fn quote(arg: &OsStr) -> String {
    let arg = arg.to_string_lossy();
    if arg.is_empty() || arg.contains(char::is_whitespace) {
        format!("{arg:?}")
    } else {
        arg.into_owned()
    }
}

/// Prints and runs `command` with inherited stdio; fails unless it exits 0.
pub fn run(command: &mut Command) -> Result<()> {
    let line = describe(command);
    println!("$ {line}");
    let status = command
        .status()
        .with_context(|| format!("could not start `{line}`"))?;
    if !status.success() {
        bail!("`{line}` failed ({status})");
    }
    Ok(())
}

/// Runs `command` quietly and returns its output, whatever its exit status;
/// fails only if it cannot start.
pub fn capture(command: &mut Command) -> Result<Output> {
    let line = describe(command);
    command
        .output()
        .with_context(|| format!("could not start `{line}`"))
}

/// Runs `command` quietly; returns its stdout if it exits 0, else fails with
/// its stderr.
pub fn stdout_of(command: &mut Command) -> Result<String> {
    let output = capture(command)?;
    if !output.status.success() {
        bail!(
            "`{}` failed ({}): {}",
            describe(command),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}
