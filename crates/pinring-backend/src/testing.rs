//! The skip decision of every test that needs a GPU (this crate's cuda tests and the end-to-end
//! GPU tests in bin/tests/gpu.rs), in one place; [`skip_or_fail`] also serves the systemd tests
//! (bin/tests/systemd.rs, `PINRING_REQUIRE_SYSTEMD`).
//!
//! Where no usable GPU is present a GPU test prints `SKIPPED: <reason>` and passes, so the suite
//! runs everywhere. On a machine that must have one (the GPU host check), set
//! [`REQUIRE_GPU`]` = 1`: a missing GPU is then a failure with the same reason.

/// Environment variable that turns a GPU test's skip into a failure: `PINRING_REQUIRE_GPU=1`.
pub const REQUIRE_GPU: &str = "PINRING_REQUIRE_GPU";

/// Whether the environment variable `var` asks for the skip to be a failure (`1`, `true`, `yes`).
pub fn required(var: &str) -> bool {
    requires(std::env::var(var).ok().as_deref())
}

fn requires(value: Option<&str>) -> bool {
    value.is_some_and(|v| matches!(v.trim().to_ascii_lowercase().as_str(), "1" | "true" | "yes"))
}

/// Skips the calling test: prints `SKIPPED: <reason>`, or, when `$require_var` is set (see
/// [`required`]), panics with the reason.
pub fn skip_or_fail(require_var: &str, reason: &str) {
    if required(require_var) {
        panic!("{reason} ({require_var} is set: this test must not be skipped)");
    }
    eprintln!("SKIPPED: {reason}");
}

/// The GPU for a test that needs one (`"NVIDIA H200 x1, driver …"`), or `None` after the skip
/// (see [`skip_or_fail`] with [`REQUIRE_GPU`]).
pub fn gpu() -> Option<String> {
    match crate::cuda_available() {
        Ok(what) => Some(what),
        Err(why) => {
            skip_or_fail(REQUIRE_GPU, &format!("no usable GPU here: {why}"));
            None
        }
    }
}

/// For a test of what happens *without* a GPU: `true` where there is none; `false` after
/// printing `SKIPPED: <reason>` where one is present. [`REQUIRE_GPU`] does not change it: on a
/// GPU host such a test has nothing to test.
pub fn no_gpu() -> bool {
    match crate::cuda_available() {
        Ok(what) => {
            eprintln!("SKIPPED: this host has a GPU ({what}); the test is for hosts without one");
            false
        }
        Err(_) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_an_explicit_yes_requires() {
        for (value, want) in [
            (Some("1"), true),
            (Some("true"), true),
            (Some(" YES "), true),
            (Some("0"), false),
            (Some(""), false),
            (Some("no"), false),
            (None, false),
        ] {
            assert_eq!(requires(value), want, "{value:?}");
        }
    }
}
