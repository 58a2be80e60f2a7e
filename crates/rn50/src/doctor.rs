//! `rn50 doctor`: what a user checks first on a new cluster node.
use anyhow::Result;
use clap::Args;

/// Check this node.
#[derive(Args, Debug, Clone)]
pub struct DoctorArgs {
    /// Print the checks as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn command(_args: &DoctorArgs) -> Result<()> {
    println!("{}", crate::shim::show_config().unwrap_or_default());
    Ok(())
}
