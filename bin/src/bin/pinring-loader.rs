//! `pinring-loader`: any number per ring. See `pinring_producer::loader`.

#![forbid(unsafe_code)]

fn main() -> std::process::ExitCode {
    pinring::main(pinring::Program::Loader, std::env::args_os().collect()).into()
}
