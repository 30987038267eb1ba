//! `ferry compare`: the papers' experiments against ferry and the baselines.

use std::path::Path;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Tiny sizes, for the test suite.
    #[arg(long)]
    pub quick: bool,
}

pub fn run(_a: CompareArgs, _token_file: Option<&Path>) -> Result<(), String> {
    Err("ferry compare: not built yet".into())
}
