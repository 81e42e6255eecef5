use std::process::ExitCode;

#[derive(clap::Args)]
pub struct Args {}

pub fn main(_args: Args) -> ExitCode {
    eprintln!("error: `splice webhook` is not built yet");
    ExitCode::from(2)
}
