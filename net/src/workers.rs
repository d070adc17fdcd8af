//! Serving threads: one single-threaded event loop per thread, each
//! serving the connections handed to it for their whole life, as nginx's
//! worker processes do.
//!
//! A connection's request handling (hyper, the handler, its body, and the
//! pooled backend connections it opens) then stays on one thread: no work
//! stealing, no wake-up of another thread per I/O event. On the proxy's
//! small PUTs that is 8-21 % less CPU per request than a work-stealing
//! runtime (BENCHMARKS.md).
//!
//! The accept loop stays where it is ([`crate::serve`]); it moves each
//! accepted socket to the worker with the fewest open connections, which
//! registers it with its own event loop.

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::runtime::Handle;
use tokio_util::sync::CancellationToken;

/// Stack of a serving thread.
const SERVING_STACK: usize = 8 * 1024 * 1024;

thread_local! {
    /// The index of the worker this thread is, if it is one.
    static CURRENT: Cell<Option<usize>> = const { Cell::new(None) };
}

/// A set of serving threads. Dropping the last handle stops them (their
/// connections should have been drained first: [`crate::serve`] does).
#[derive(Debug)]
pub struct Workers {
    workers: Vec<Worker>,
    stop: CancellationToken,
}

#[derive(Debug)]
struct Worker {
    handle: Handle,
    /// Connections this worker serves now.
    open: Arc<AtomicUsize>,
}

/// A connection's claim on its worker, released when the connection ends.
#[derive(Debug)]
pub(crate) struct Assigned {
    open: Arc<AtomicUsize>,
}

impl Drop for Assigned {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Workers {
    /// Starts `n` serving threads (at least one), named `<name>-<i>`.
    pub fn start(n: usize, name: &str) -> std::io::Result<Arc<Workers>> {
        let stop = CancellationToken::new();
        let mut workers = Vec::with_capacity(n.max(1));
        for index in 0..n.max(1) {
            let started = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .and_then(|runtime| {
                    let handle = runtime.handle().clone();
                    let stopped = stop.clone();
                    std::thread::Builder::new()
                        .name(format!("{name}-{index}"))
                        // A request's future is polled on this stack, the
                        // store probe and the SDK's calls nested in it: the
                        // 8 MiB a main thread gets, not a spawned thread's
                        // 2 MiB (a debug build overflowed that, once). Only
                        // the pages touched are memory.
                        .stack_size(SERVING_STACK)
                        .spawn(move || {
                            CURRENT.with(|c| c.set(Some(index)));
                            runtime.block_on(stopped.cancelled());
                        })
                        .map(|_| handle)
                });
            match started {
                Ok(handle) => workers.push(Worker {
                    handle,
                    open: Arc::new(AtomicUsize::new(0)),
                }),
                Err(e) => {
                    // The threads already started stop with the rest.
                    stop.cancel();
                    return Err(e);
                }
            }
        }
        Ok(Arc::new(Workers { workers, stop }))
    }

    /// One serving thread per core.
    pub fn per_core(name: &str) -> std::io::Result<Arc<Workers>> {
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        Workers::start(cores, name)
    }

    /// How many serving threads there are.
    pub fn len(&self) -> usize {
        self.workers.len()
    }

    /// Never true: there is at least one serving thread.
    pub fn is_empty(&self) -> bool {
        self.workers.is_empty()
    }

    /// The worker serving the fewest connections, and a claim on it.
    pub(crate) fn assign(&self) -> (&Handle, Assigned) {
        let w = self
            .workers
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
            .expect("there is at least one worker");
        w.open.fetch_add(1, Ordering::Relaxed);
        (
            &w.handle,
            Assigned {
                open: w.open.clone(),
            },
        )
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The index of the serving thread the caller runs on, if it runs on one:
/// lets per-thread resources (a connection pool) be picked without a lock.
pub fn current() -> Option<usize> {
    CURRENT.with(Cell::get)
}
