//! `ferry run`: start a program with the preload library and a mount table.

use std::path::Path;

#[derive(clap::Args)]
pub struct RunArgs {
    /// PREFIX=URL: make the remote directory URL visible at local path PREFIX.
    #[arg(long = "mount", value_name = "PREFIX=URL")]
    pub mounts: Vec<String>,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub fn run(_a: RunArgs, _token_file: Option<&Path>) -> Result<(), String> {
    Err("ferry run: not built yet".into())
}
