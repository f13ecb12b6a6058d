//! A decision ready now or later.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

/// A provider's answer: ready now, or a future that yields it.
pub enum Verdict<T> {
    /// Decided: the caller goes on at once (no allocation on this path).
    Now(T),
    /// To be decided; the caller awaits it under its own deadline and may drop it (a
    /// dropped future must cancel whatever it waited on, as tokio's do).
    Later(Later<T>),
}

impl<T: Send + 'static> Verdict<T> {
    /// A later verdict from a future.
    pub fn later(f: impl Future<Output = T> + Send + 'static) -> Self {
        Verdict::Later(Later::new(f))
    }

    /// The answer, awaited if it is not ready.
    pub async fn resolve(self) -> T {
        match self {
            Verdict::Now(v) => v,
            Verdict::Later(f) => f.await,
        }
    }

    /// The verdict with its answer mapped (a later one is wrapped in another future).
    pub fn map<U: Send + 'static>(self, f: impl FnOnce(T) -> U + Send + 'static) -> Verdict<U> {
        match self {
            Verdict::Now(v) => Verdict::Now(f(v)),
            Verdict::Later(l) => Verdict::later(async move { f(l.await) }),
        }
    }
}

impl<T> fmt::Debug for Verdict<T>
where
    T: fmt::Debug,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Verdict::Now(v) => f.debug_tuple("Now").field(v).finish(),
            Verdict::Later(_) => f.write_str("Later(..)"),
        }
    }
}

/// A verdict still to come: a boxed `Send` future, so that it can run in another task.
pub struct Later<T>(Pin<Box<dyn Future<Output = T> + Send + 'static>>);

impl<T> Later<T> {
    /// Boxes `f`.
    pub fn new(f: impl Future<Output = T> + Send + 'static) -> Self {
        Later(Box::pin(f))
    }
}

impl<T> Future for Later<T> {
    type Output = T;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<T> {
        self.0.as_mut().poll(cx)
    }
}
