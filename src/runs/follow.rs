//! Following a run: its log, then its live events, as one stream that ends after `done`; the
//! readers a run has here and, through `read_until`, on other replicas; the watchdog that
//! cancels a run nobody reads.

use super::*;
use crate::retry::{Attempt, RetryPolicy};

/// How a follower reads a run's log again while the store is unavailable (a pool timeout
/// under load): four more attempts after jittered waits from 100 ms.
const FOLLOW_READ_RETRY: RetryPolicy = RetryPolicy::new(4, Duration::from_millis(100));

/// `read` retried under [`FOLLOW_READ_RETRY`] while the store's failure is passing; `None`
/// when every attempt failed or the failure is not passing.
pub(super) async fn read_with_retries<T>(
    read: impl FnMut() -> futures::future::BoxFuture<'static, StoreResult<T>>,
) -> Option<T> {
    FOLLOW_READ_RETRY
        .run("reading a run's events", read, |error: &StoreError| {
            Attempt::passing(crate::error::HasKind::kind(error).retryable())
        })
        .await
        .inspect_err(|error| tracing::warn!(%error, "reading a run's events failed"))
        .ok()
}

/// What a follower ends with when the run's log cannot be read: `done` (cancelled) when the
/// run itself is gone (its thread was deleted, which cancels its runs first), else the
/// unreadable-log `error`.
pub(super) async fn ending_event(hub: &RunHub, user: UserId, run: RunId, last: i64) -> StoredEvent {
    if let Err(StoreError::NotFound(_)) = hub.store.user(user).get_run(run).await {
        let done = RunEvent::done(RunStatus::Cancelled);
        return StoredEvent {
            seq: last,
            event_type: EventType::Done,
            data: event_data(&done, run, last, None, None).unwrap_or_else(|_| json!({})),
            created_at: chrono::Utc::now(),
        };
    }
    unreadable_log_event(run, last)
}

/// The `error` a follower ends with when the run's log cannot be read; it carries the last
/// delivered sequence number, so `Last-Event-ID` resumes from there.
pub(super) fn unreadable_log_event(run: RunId, last: i64) -> StoredEvent {
    let error = RunEvent::Error(ErrorEvent {
        error_type: RunErrorType::Internal,
        message: "the run's events could not be read; reconnect to resume".into(),
        retryable: true,
        content: None,
        metadata: None,
    });
    StoredEvent {
        seq: last,
        event_type: EventType::Error,
        data: event_data(&error, run, last, None, None).unwrap_or_else(|_| json!({})),
        created_at: chrono::Utc::now(),
    }
}

impl RunHub {
    /// Cancels the run when it has had no reader for the grace period, here or (through the
    /// run's `read_until`) on another replica.
    /// A run taken over runs in the background (its readers lost their stream with the
    /// replica that died), except while it waits for its user's input: with nobody reading, it
    /// would wait for ever.
    pub(super) fn watch_readers(
        &self,
        run: RunId,
        cancel: CancellationToken,
        readers: Arc<AtomicUsize>,
        background: Arc<AtomicBool>,
        input: Arc<RunInput>,
        taken_over: bool,
    ) -> tokio::task::JoinHandle<()> {
        let grace = self.abandon_after;
        let store = self.store.clone();
        tokio::spawn(async move {
            let Some(grace) = grace else { return };
            let tick = Duration::from_millis(250).min(grace);
            let mut unread_for = Duration::ZERO;
            loop {
                tokio::time::sleep(tick).await;
                if background.load(Ordering::Relaxed) {
                    if !taken_over {
                        return;
                    }
                    if !input.awaiting.load(Ordering::Relaxed) {
                        unread_for = Duration::ZERO;
                        continue;
                    }
                }
                if readers.load(Ordering::Relaxed) == 0 {
                    unread_for += tick;
                    if unread_for >= grace {
                        let remote = store.maintenance().remote_readers_until(run).await;
                        if let Ok(Some(until)) = remote
                            && until > crate::store::now()
                        {
                            // Someone follows it through another replica.
                            unread_for = Duration::ZERO;
                            continue;
                        }
                        tracing::info!("cancelling a run nobody has followed for {grace:?}");
                        cancel.cancel();
                        return;
                    }
                } else {
                    unread_for = Duration::ZERO;
                }
            }
        })
    }

    /// Tells the owner of a run executing elsewhere that it has a reader here (its
    /// no-reader watchdog reads `read_until`), at most every third of the grace period.
    pub(super) async fn tell_remote_reader(
        &self,
        user: UserId,
        run: RunId,
        told: &mut Option<std::time::Instant>,
    ) {
        let Some(grace) = self.abandon_after else {
            return;
        };
        if told.is_some_and(|at| at.elapsed() < grace / 3) {
            return;
        }
        *told = Some(std::time::Instant::now());
        let until = crate::store::now()
            + chrono::Duration::from_std(grace).unwrap_or(chrono::Duration::days(1));
        if let Err(error) = self.store.user(user).touch_run_reader(run, until).await {
            tracing::warn!(%run, %error, "could not record a reader of a run on another replica");
        }
    }

    /// A stream of the run's events with `seq > after`: first the log, then live events as they
    /// are appended, ending after the `done` event (or when `stop` is cancelled). The owner
    /// check must have been done by the caller (`Store::get_run`).
    pub fn follow(
        self: &Arc<Self>,
        user: UserId,
        run: RunId,
        after: i64,
        stop: CancellationToken,
    ) -> impl Stream<Item = StoredEvent> + Send + 'static {
        let hub = self.clone();
        let (receiver, readers) = match hub.live().get(&run) {
            Some(live) => (Some(live.notify.subscribe()), Some(live.readers.clone())),
            None => (None, None),
        };
        let guard = readers.map(ReaderGuard::new);
        // Wakes a follower of a run executing on another replica (NOTIFY on PostgreSQL).
        let mut remote = receiver.is_none().then(|| hub.remote_events.subscribe());
        async_stream(move |sender| async move {
            let _guard = guard;
            let mut receiver = receiver;
            let mut last = after;
            let mut stopping = false;
            let mut reader_told: Option<std::time::Instant> = None;
            loop {
                let Some(events) = read_with_retries(|| {
                    let hub = hub.clone();
                    Box::pin(
                        async move { hub.store.user(user).run_events_after(run, last, 500).await },
                    )
                })
                .await
                else {
                    // The log cannot be read: the client learns it and may resume later.
                    let _ = sender.send(ending_event(&hub, user, run, last).await).await;
                    return;
                };
                let full_page = events.len() == 500;
                for event in events {
                    last = event.seq;
                    let is_done = event.event_type == EventType::Done;
                    if sender.send(event).await.is_err() || is_done {
                        return;
                    }
                }
                if full_page {
                    continue;
                }
                if stopping {
                    // Shutdown: what was written before it has been delivered.
                    return;
                }
                match read_with_retries(|| {
                    let hub = hub.clone();
                    Box::pin(async move { hub.store.user(user).get_run(run).await })
                })
                .await
                {
                    Some(state) if state.status.is_terminal() && state.last_seq <= last => {
                        if last == after {
                            // Asked from the end or past it: nothing was delivered, and the
                            // final `done` still tells the client how the run ended.
                            let from = state.last_seq - 1;
                            if let Some(done) = read_with_retries(|| {
                                let hub = hub.clone();
                                Box::pin(async move {
                                    hub.store.user(user).run_events_after(run, from, 1).await
                                })
                            })
                            .await
                            .and_then(|events| events.into_iter().next())
                                && done.event_type == EventType::Done
                            {
                                let _ = sender.send(done).await;
                            }
                        }
                        return;
                    }
                    Some(_) => {}
                    None => {
                        let _ = sender.send(ending_event(&hub, user, run, last).await).await;
                        return;
                    }
                }
                if receiver.is_none() {
                    hub.tell_remote_reader(user, run, &mut reader_told).await;
                }
                let mut left_here = false;
                let wait = async {
                    match (receiver.as_mut(), remote.as_mut()) {
                        (Some(receiver), _) => {
                            if receiver.changed().await.is_err() {
                                // The run stopped executing in this process (it ended, or
                                // another replica goes on with it): read what is left, then
                                // follow it as a remote run.
                                left_here = true;
                            }
                        }
                        // Executing elsewhere (another replica) or recovered: poll the log,
                        // sooner when the owner's append is notified.
                        (None, remote) => {
                            let notified = async {
                                let Some(remote) = remote else {
                                    return futures::future::pending().await;
                                };
                                loop {
                                    match remote.recv().await {
                                        Ok(id) if id == run => return,
                                        Ok(_) => {}
                                        Err(tokio::sync::broadcast::error::RecvError::Lagged(
                                            _,
                                        )) => {
                                            return;
                                        }
                                        Err(tokio::sync::broadcast::error::RecvError::Closed) => {
                                            return futures::future::pending().await;
                                        }
                                    }
                                }
                            };
                            tokio::select! {
                                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
                                _ = notified => {}
                            }
                        }
                    }
                };
                tokio::select! {
                    _ = wait => {}
                    _ = stop.cancelled() => stopping = true,
                    _ = sender.closed() => return,
                }
                if left_here {
                    receiver = None;
                    remote = Some(hub.remote_events.subscribe());
                }
            }
        })
    }
}

/// Counts a connected reader for as long as it lives.
pub(super) struct ReaderGuard(Arc<AtomicUsize>);

impl ReaderGuard {
    fn new(readers: Arc<AtomicUsize>) -> Self {
        readers.fetch_add(1, Ordering::Relaxed);
        Self(readers)
    }
}

impl Drop for ReaderGuard {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A stream fed by a producer task through a small channel; the task stops when the receiver
/// is dropped.
pub(super) fn async_stream<T, F, Fut>(producer: F) -> impl Stream<Item = T> + Send + 'static
where
    T: Send + 'static,
    F: FnOnce(tokio::sync::mpsc::Sender<T>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let (sender, receiver) = tokio::sync::mpsc::channel(64);
    let task = tokio::spawn(producer(sender));
    let aborter = AbortOnDrop(task);
    futures::stream::unfold((receiver, aborter), |(mut receiver, aborter)| async move {
        receiver
            .recv()
            .await
            .map(|item| (item, (receiver, aborter)))
    })
}

pub(super) struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
