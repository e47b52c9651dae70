//! `pinring._native.Supervisor`: the restart policy of `pinring run` (pinring-runtime's
//! `children::Supervisor`) for the `pinring-loader` children that `pinring.Loader(loaders=N)`
//! starts (`pinring/_loaders.py`), so that both restart and give up on the same books.

use pinring_exit::Coded;
use pinring_runtime::children::{Ended, Next, Supervisor as Books};
use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// The books of a Python process's loader children.
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "Supervisor")]
pub struct Supervisor {
    books: Books,
    /// `time.monotonic()` at `origin`: the caller's clock, which tests may move.
    origin: (Instant, f64),
}

#[pymethods]
impl Supervisor {
    /// The books of `loaders` loaders, none restarted yet; `now` is `time.monotonic()`.
    #[new]
    fn new(loaders: usize, now: f64) -> Self {
        Supervisor {
            books: Books::new(loaders),
            origin: (Instant::now(), now),
        }
    }

    /// Loader `index` (pid `pid`) ended with `returncode` (`Popen.returncode`: negative for a
    /// signal) at `now` (`time.monotonic()`): `"restart"`, `"leave"` (it finished, or its daemon
    /// is gone) or `"stop"` (the run stops: `failure()` says why).
    fn ended(
        &mut self,
        index: usize,
        pid: u32,
        returncode: i32,
        now: f64,
    ) -> PyResult<&'static str> {
        if index >= self.books.loaders() {
            return Err(crate::exit_error(
                pinring_exit::Exit::Usage,
                format!("loader {index}: there are {} loaders", self.books.loaders()),
            ));
        }
        let ended = if returncode < 0 {
            Ended::Signal {
                signal: -returncode,
                core: false,
            }
        } else {
            Ended::Code(returncode)
        };
        let at = self.origin.0 + Duration::from_secs_f64((now - self.origin.1).max(0.0));
        Ok(match self.books.ended(index, pid, ended, at) {
            Next::Restart => "restart",
            Next::Leave => "leave",
            Next::StopRun => "stop",
        })
    }

    /// The failure that stops the run, once one is booked: `(exit code, sentence)`, the exit
    /// code the loader's own (3 for bad data, ...) or 5 for one killed too often.
    fn failure(&self) -> Option<(u8, String)> {
        self.books
            .failure()
            .map(|f| (f.exit().code(), f.sentence()))
    }
}
