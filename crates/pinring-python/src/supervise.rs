//! `pinring._native.Supervisor`: pinring-runtime's `children::Supervisor`, the one set of
//! restart books, for the Python package's children: the `pinring-loader` processes that
//! `pinring.Loader(loaders=N)` starts (`pinring/_loaders.py`, `pinring run`'s own policy) and a
//! `pinring.torch.DataLoader`'s workers (`pinring/torch/_pool.py`), so that every pinring
//! program restarts and gives up on the same books.

use pinring_exit::{Coded, Exit};
use pinring_runtime::children::{
    Budget, Ended, Next, RestartPolicy, Restartable, Supervisor as Books,
};
use pyo3::prelude::*;
use std::time::{Duration, Instant};

/// The restart books of a Python process's children.
#[derive(Debug)]
#[pyclass(module = "pinring._native", name = "Supervisor")]
pub struct Supervisor {
    books: Books,
    /// `time.monotonic()` at `origin`: the caller's clock, which tests may move.
    origin: (Instant, f64),
}

/// The policy named by `Supervisor`'s `policy` and `max_restarts`.
fn policy_of(policy: &str, max_restarts: Option<usize>) -> PyResult<RestartPolicy> {
    let usage = |m: String| crate::exit_error(Exit::Usage, m);
    match (policy, max_restarts) {
        ("loaders", None) => Ok(RestartPolicy::LOADERS),
        ("stream", None) => Ok(RestartPolicy::STREAM_WORKERS),
        ("workers", Some(max)) => Ok(RestartPolicy::workers(max)),
        ("workers", None) => Err(usage(
            "Supervisor(policy=\"workers\"): pass max_restarts=, the restarts allowed in all"
                .into(),
        )),
        ("loaders" | "stream", Some(max)) => Err(usage(format!(
            "Supervisor(policy={policy:?}, max_restarts={max}): this policy has its own budget; \
             leave max_restarts out, or pass policy=\"workers\""
        ))),
        (other, _) => Err(usage(format!(
            "Supervisor(policy={other:?}): no such policy; pass \"loaders\" (pinring-loader \
             programs), \"workers\" (a DataLoader's workers, with max_restarts=) or \"stream\" \
             (an iterable dataset's workers, never restarted)"
        ))),
    }
}

#[pymethods]
impl Supervisor {
    /// The books of `children` children, none restarted yet; `now` is `time.monotonic()`.
    /// `policy`: `"loaders"` (pinring-loader programs: a signal restarts, each at most 5 times
    /// in any 60 s; exit 0 or 5 leaves; any other code stops), `"workers"` (every booked ending
    /// restarts, `max_restarts` in all over the books' life) or `"stream"` (never restarted).
    #[new]
    #[pyo3(signature = (children, now, policy = "loaders", max_restarts = None))]
    fn new(children: usize, now: f64, policy: &str, max_restarts: Option<usize>) -> PyResult<Self> {
        Ok(Supervisor {
            books: Books::with_policy(children, policy_of(policy, max_restarts)?),
            origin: (Instant::now(), now),
        })
    }

    /// Child `index` (pid `pid`) ended with `returncode` (`Popen.returncode`: negative for a
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
                Exit::Usage,
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

    /// Forgets the failure booked, keeping the restarts counted (a new run: a DataLoader's
    /// next pass).
    fn next_run(&mut self) {
        self.books.next_run();
    }

    /// The restarts allowed so far, over the books' life.
    #[getter]
    fn restarts(&self) -> usize {
        self.books.restarts()
    }

    /// The restarts allowed in all (`"workers"`), 0 (`"stream"`), or None (`"loaders"`: per
    /// loader, within a window).
    #[getter]
    fn max_restarts(&self) -> Option<usize> {
        match self.books.policy().budget {
            Budget::Total { max } => Some(max),
            Budget::Never => Some(0),
            Budget::PerChild { .. } => None,
        }
    }

    /// The policy's name: `"loaders"`, `"workers"` or `"stream"`.
    #[getter]
    fn policy(&self) -> &'static str {
        match self.books.policy() {
            RestartPolicy {
                restart: Restartable::Signals,
                ..
            } => "loaders",
            RestartPolicy {
                budget: Budget::Never,
                ..
            } => "stream",
            _ => "workers",
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Supervisor(children={}, policy={:?}, restarts={})",
            self.books.loaders(),
            self.policy(),
            self.books.restarts()
        )
    }
}
