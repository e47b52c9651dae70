//! `pinring`: the command-line front end (`run`, `daemon`, `loader`, `status`, `clean`, `config`, `bench`). See the `pinring` library.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    pinring::main(pinring::Program::Pinring, std::env::args_os().collect()).into()
}
