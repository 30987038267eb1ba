//! `ferry completions` and `ferry man`: made from the parser's own table
//! (cli.rs) by clap_complete and clap_mangen, so they list exactly what
//! the parser accepts.

use std::io::Write;
use std::path::Path;

use clap::CommandFactory;

use crate::cli::Cli;

#[derive(Clone, Copy, clap::ValueEnum)]
pub enum Shell {
    Bash,
    Zsh,
    Fish,
}

pub fn completions(shell: Shell) -> Result<(), String> {
    let shell = match shell {
        Shell::Bash => clap_complete::Shell::Bash,
        Shell::Zsh => clap_complete::Shell::Zsh,
        Shell::Fish => clap_complete::Shell::Fish,
    };
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "ferry", &mut out);
    out.flush().map_err(|e| e.to_string())
}

/// The whole command as the pages see it: `ferry help` is no page of its
/// own, and every subcommand knows its names ("ferry cp", "ferry-cp").
fn command() -> clap::Command {
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    cmd
}

/// ferry(1) or ferry-COMMAND(1) on stdout, or all of them into `dir`.
pub fn man(name: Option<&str>, dir: Option<&Path>) -> Result<(), String> {
    let cmd = command();
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        return clap_mangen::generate_to(cmd, dir).map_err(|e| format!("{}: {e}", dir.display()));
    }
    let page = match name {
        None => cmd,
        Some(n) => match cmd.find_subcommand(n).filter(|s| !s.is_hide_set()) {
            Some(sub) => sub.clone(),
            None => return Err(format!("no such command: {n} (`ferry help` lists them)")),
        },
    };
    let mut out = std::io::stdout().lock();
    clap_mangen::Man::new(page).render(&mut out).and_then(|_| out.flush()).map_err(|e| e.to_string())
}
