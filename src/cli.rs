//! Start-up shared by the binaries: ds4's argument spellings, help and usage
//! errors with ds4's exit codes, quiet exit on closed pipes.

use std::process::ExitCode;

/// Parses the process arguments into `T`. `-sys` is accepted for `--system`
/// (ds4's spelling; argh only knows one-letter short flags). `--help` prints
/// and returns `Err(0)`; a usage error prints and returns `Err(2)`.
pub fn parse_args<T: argh::FromArgs>(name: &str) -> Result<T, ExitCode> {
    // Die quietly on a closed pipe (`ds4 --info | head`), as C tools do,
    // instead of panicking inside println!.
    // SAFETY: resetting a signal disposition to its default at start-up,
    // before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let argv: Vec<String> = std::env::args()
        .skip(1)
        .map(|a| if a == "-sys" { "--system".into() } else { a })
        .collect();
    let strs: Vec<&str> = argv.iter().map(|s| s.as_str()).collect();
    T::from_args(&[name], &strs).map_err(|e| {
        if e.status.is_ok() {
            println!("{}", e.output);
            ExitCode::SUCCESS
        } else {
            eprintln!("{}", e.output);
            ExitCode::from(2)
        }
    })
}

/// Runs `f` and maps its error to `name: message` on stderr and exit 1.
pub fn exit_with(name: &str, r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
