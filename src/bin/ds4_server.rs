//! `ds4-server`: the OpenAI/Anthropic-compatible HTTP server (SERVER.md).
//! Not built yet: this binary only says so, so scripts fail clearly.

use std::process::ExitCode;

fn main() -> ExitCode {
    if std::env::args().any(|a| a == "-h" || a == "--help") {
        println!(
            "ds4-server: the HTTP server is not built yet in this version; use `ds4 -p` for now."
        );
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "ds4-server: the HTTP server is not built yet in this version; use `ds4 -p` for now."
    );
    ExitCode::FAILURE
}
