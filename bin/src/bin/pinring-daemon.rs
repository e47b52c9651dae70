//! `pinring-daemon`: one per ring (usually one per GPU). See `pinring_daemon`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    pinring::main(pinring::Program::Daemon, std::env::args_os().collect()).into()
}
