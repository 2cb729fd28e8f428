//! Start-up shared by the binaries: ds4's argument spellings, help and usage
//! errors with ds4's exit codes, quiet exit on closed pipes for the tools,
//! and for the server the opposite: closed pipes ignored and log lines that
//! never fail ([`log_line!`](crate::log_line)).

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

/// Maps a binary's result to its exit code: an error is printed as
/// `name: message` on stderr and exits 1.
pub fn exit_with(name: &str, r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // The server's stderr may be closed by now.
            stderr_line(format_args!("{name}: {e}"));
            ExitCode::FAILURE
        }
    }
}

/// For a long-running server: a reader of stdout or stderr that goes away
/// (`ds4-server 2>&1 | head`, a restarting log shipper) must not end the
/// process, so SIGPIPE is ignored and writes fail with EPIPE instead, which
/// [`log_line!`](crate::log_line) then drops.
pub fn ignore_closed_pipes() {
    // SAFETY: setting a signal disposition to SIG_IGN; no handler runs.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}

/// Writes one line to stderr and ignores a failed write: `eprintln!`
/// panics when stderr is closed, and a log line is never worth a crash.
pub fn stderr_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut e = std::io::stderr().lock();
    let _ = e.write_fmt(args);
    let _ = e.write_all(b"\n");
}

/// Writes one line to stdout and ignores a failed write (the server's
/// banner: nobody may be reading it).
pub fn stdout_line(args: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut o = std::io::stdout().lock();
    let _ = o.write_fmt(args);
    let _ = o.write_all(b"\n");
    let _ = o.flush();
}

/// `eprintln!` for code that must survive a closed stderr (the server and
/// what it calls): the line is dropped instead of panicking.
#[macro_export]
macro_rules! log_line {
    ($($arg:tt)*) => {
        $crate::app::cli::stderr_line(format_args!($($arg)*))
    };
}
