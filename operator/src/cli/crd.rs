use std::process::ExitCode;

pub fn main() -> ExitCode {
    match splice_crds::crd_yaml() {
        Ok(yaml) => {
            print!("{yaml}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: cannot render the CRD: {e}");
            ExitCode::FAILURE
        }
    }
}
