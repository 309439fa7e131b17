//! One embedding queue for the whole process ([`EmbedQueue`]): every caller's texts — API adds,
//! imports, the memory writer, context views, re-embedding, research, recall's queries — wait
//! in it, and one worker runs the model on micro-batches made across callers.
//!
//! - **Batching**: when the model is idle, the worker waits at most `batch_wait_ms` for more
//!   texts before it runs; while it runs, new texts queue up and form the next batch. A batch
//!   holds at most `max_batch` texts, sorted by length so the padded batch wastes little.
//! - **Queries ahead of bulk work**: recall's query texts have a lane and a worker of their
//!   own. The bulk worker does not start a batch while a query is being embedded (it waits
//!   `QUERY_YIELD_MAX` at most, so a steady stream of queries never stops writes), and while
//!   queries keep coming (one in the last `QUERY_RECENT`) it runs pieces of `BUSY_BULK_BATCH`
//!   texts only, so a query waits for a short piece at most instead of a whole batch (the
//!   model's matrix products share one thread pool, so two batches at once would not help).
//!   A bulk request is cut into pieces in any case, so concurrent imports and writes take
//!   turns.
//! - **A cache of query vectors** (LRU by model and text): a repeated query embeds nothing.
//! - `/metrics`: `mnemo_embed_queue_texts` (waiting), `mnemo_embed_batch_texts` (histogram of
//!   batch sizes), `mnemo_embed_query_cache_total{result="hit"|"miss"}`.

use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use tokio::sync::{mpsc, oneshot};

use super::embed::{EmbedError, Embedder};

/// How the queue batches (from `[embedder]` settings).
#[derive(Debug, Clone, Copy)]
pub(crate) struct QueueSettings {
    /// Longest wait for more texts before an idle model runs a batch.
    pub batch_wait: Duration,
    /// Texts per model call at most.
    pub max_batch: usize,
    /// Query vectors kept (0 turns the cache off).
    pub query_cache: usize,
}

type Reply = oneshot::Sender<Result<Vec<Vec<f32>>, EmbedError>>;

/// A bulk piece while queries are coming in.
const BUSY_BULK_BATCH: usize = 1;
/// How long after a query the bulk lane keeps its pieces short.
const QUERY_RECENT: Duration = Duration::from_millis(250);
/// The longest the bulk lane waits for queries in flight before its next piece.
const QUERY_YIELD_MAX: Duration = Duration::from_millis(100);

/// What the bulk worker knows of the query lane.
struct QueryActivity {
    in_flight: AtomicUsize,
    /// When the last query arrived, in ms after `epoch`.
    last_ms: std::sync::atomic::AtomicU64,
    epoch: std::time::Instant,
    idle: tokio::sync::Notify,
}

impl QueryActivity {
    /// Counts a query as in flight until the returned guard is dropped (also when the caller
    /// gives up and drops the future awaiting it).
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        self.last_ms
            .store(self.epoch.elapsed().as_millis() as u64, Ordering::Relaxed);
        InFlight(self.clone())
    }

    fn recent(&self) -> bool {
        let last = self.last_ms.load(Ordering::Relaxed);
        self.epoch.elapsed().as_millis() as u64 <= last + QUERY_RECENT.as_millis() as u64
            && last > 0
    }

    /// Returns once no query is being embedded, or after `QUERY_YIELD_MAX` (so a steady
    /// stream of queries slows bulk work down but never stops it).
    async fn wait_idle(&self) {
        let waited = async {
            loop {
                let notified = self.idle.notified();
                if self.in_flight.load(Ordering::SeqCst) == 0 {
                    return;
                }
                notified.await;
            }
        };
        let _ = tokio::time::timeout(QUERY_YIELD_MAX, waited).await;
    }
}

/// A query in flight; dropping it ends it.
struct InFlight(Arc<QueryActivity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// A caller's texts, as they go through the worker piece by piece.
struct Request {
    texts: Vec<String>,
    /// Vectors of the texts embedded so far, in order.
    done: Vec<Vec<f32>>,
    reply: Reply,
}

impl Request {
    fn remaining(&self) -> usize {
        self.texts.len() - self.done.len()
    }
}

/// The [`Embedder`] every part of the server uses: the model behind one batching queue.
pub(crate) struct EmbedQueue {
    model_id: String,
    vectors_id: String,
    earlier_vectors_id: Option<String>,
    dimension: usize,
    queries: mpsc::UnboundedSender<Request>,
    bulk: mpsc::UnboundedSender<Request>,
    waiting: Arc<AtomicUsize>,
    cache: Mutex<QueryCache>,
    queries_active: Arc<QueryActivity>,
}

impl EmbedQueue {
    /// Starts the two workers (queries, bulk) on the current tokio runtime; they end when the
    /// queue is dropped.
    pub(crate) fn start(inner: Arc<dyn Embedder>, settings: QueueSettings) -> Self {
        let settings = QueueSettings {
            max_batch: settings.max_batch.max(1),
            ..settings
        };
        let waiting = Arc::new(AtomicUsize::new(0));
        let queries_active = Arc::new(QueryActivity {
            in_flight: AtomicUsize::new(0),
            last_ms: std::sync::atomic::AtomicU64::new(0),
            epoch: std::time::Instant::now(),
            idle: tokio::sync::Notify::new(),
        });
        let lane = |yields: Option<Arc<QueryActivity>>| {
            let (sender, receiver) = mpsc::unbounded_channel();
            let worker = Worker {
                inner: inner.clone(),
                settings,
                lane: receiver,
                pending: VecDeque::new(),
                waiting: waiting.clone(),
                queries: yields.is_none(),
                yields_to: yields,
                last_shared: None,
            };
            tokio::spawn(worker.run());
            sender
        };
        let queries = lane(None);
        let bulk = lane(Some(queries_active.clone()));
        Self {
            model_id: inner.model_id().to_string(),
            vectors_id: inner.vectors_id().to_string(),
            earlier_vectors_id: inner.earlier_vectors_id().map(str::to_string),
            dimension: inner.dimension(),
            queries,
            bulk,
            waiting,
            cache: Mutex::new(QueryCache::new(settings.query_cache)),
            queries_active,
        }
    }

    async fn submit(&self, lane: Lane, texts: Vec<String>) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let (reply, answer) = oneshot::channel();
        let count = texts.len();
        let request = Request {
            texts,
            done: Vec::with_capacity(count),
            reply,
        };
        self.waiting.fetch_add(count, Ordering::Relaxed);
        metrics::gauge!("mnemo_embed_queue_texts").set(self.waiting.load(Ordering::Relaxed) as f64);
        let sender = match lane {
            Lane::Query => &self.queries,
            Lane::Bulk => &self.bulk,
        };
        let stopped = || EmbedError::Unavailable("the embedding queue has stopped".into());
        if sender.send(request).is_err() {
            self.waiting.fetch_sub(count, Ordering::Relaxed);
            return Err(stopped());
        }
        answer.await.map_err(|_| stopped())?
    }

    fn cache(&self) -> parking_lot::MutexGuard<'_, QueryCache> {
        self.cache.lock()
    }
}

#[derive(Clone, Copy)]
enum Lane {
    Query,
    Bulk,
}

#[async_trait]
impl Embedder for EmbedQueue {
    fn model_id(&self) -> &str {
        &self.model_id
    }

    fn vectors_id(&self) -> &str {
        &self.vectors_id
    }

    fn earlier_vectors_id(&self) -> Option<&str> {
        self.earlier_vectors_id.as_deref()
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.submit(Lane::Bulk, texts.to_vec()).await
    }

    async fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let in_flight = self.queries_active.begin();
        let embedded = self.submit(Lane::Query, texts.to_vec()).await;
        drop(in_flight);
        embedded
    }

    async fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        if let Some(vector) = self.cache().get(text) {
            metrics::counter!("mnemo_embed_query_cache_total", "result" => "hit").increment(1);
            return Ok(vector);
        }
        metrics::counter!("mnemo_embed_query_cache_total", "result" => "miss").increment(1);
        let vector = self
            .embed_queries(&[text.to_string()])
            .await?
            .pop()
            .ok_or_else(|| EmbedError::Internal("no vector returned".into()))?;
        self.cache().put(text, vector.clone());
        Ok(vector)
    }
}

/// Runs one lane's requests in batches, one batch at a time.
struct Worker {
    inner: Arc<dyn Embedder>,
    settings: QueueSettings,
    lane: mpsc::UnboundedReceiver<Request>,
    pending: VecDeque<Request>,
    waiting: Arc<AtomicUsize>,
    /// The bulk worker gives way to the query lane.
    yields_to: Option<Arc<QueryActivity>>,
    /// The query lane: its texts are search queries (the model may prefix them).
    queries: bool,
    /// When the last batch that served more than one caller ended: while callers come
    /// together, an idle worker waits `batch_wait` for company; a lone caller (one client
    /// posting one memory at a time, one recall) is served at once.
    last_shared: Option<std::time::Instant>,
}

/// How long after a batch shared by several callers the worker keeps waiting for company.
const SHARED_RECENTLY: Duration = Duration::from_millis(100);

impl Worker {
    async fn run(mut self) {
        loop {
            self.drain();
            if self.pending.is_empty() {
                // Idle: sleep until someone asks, then a little while for more to batch.
                let Some(request) = self.lane.recv().await else {
                    return;
                };
                self.pending.push_back(request);
                self.drain();
                let shared_recently = self
                    .last_shared
                    .is_some_and(|at| at.elapsed() < SHARED_RECENTLY);
                let deadline = tokio::time::Instant::now() + self.settings.batch_wait;
                while shared_recently && self.pending_texts() < self.settings.max_batch {
                    tokio::select! {
                        Some(request) = self.lane.recv() => self.pending.push_back(request),
                        () = tokio::time::sleep_until(deadline) => break,
                    }
                }
            }
            let mut cap = self.settings.max_batch;
            if let Some(queries) = &self.yields_to {
                queries.wait_idle().await;
                if queries.recent() {
                    cap = cap.min(BUSY_BULK_BATCH);
                }
            }
            self.run_batch(cap).await;
        }
    }

    /// Moves what has arrived into the pending list, without waiting.
    fn drain(&mut self) {
        while let Ok(request) = self.lane.try_recv() {
            self.pending.push_back(request);
        }
    }

    fn pending_texts(&self) -> usize {
        self.pending.iter().map(Request::remaining).sum()
    }

    /// Embeds the next batch: the oldest requests' next texts, `cap` at most.
    async fn run_batch(&mut self, cap: usize) {
        // (index in the pending list, texts taken from it)
        let mut taken: Vec<(usize, usize)> = Vec::new();
        let mut texts: Vec<String> = Vec::new();
        for (index, request) in self.pending.iter().enumerate() {
            let room = cap - texts.len();
            if room == 0 {
                break;
            }
            let start = request.done.len();
            let take = request.remaining().min(room);
            texts.extend_from_slice(&request.texts[start..start + take]);
            taken.push((index, take));
        }
        if texts.is_empty() {
            return;
        }
        let shared = taken.len() > 1;
        metrics::histogram!("mnemo_embed_batch_texts").record(texts.len() as f64);
        // Shortest first: the model pads each of its batches to their longest text.
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&index| texts[index].len());
        let sorted: Vec<String> = order.iter().map(|&index| texts[index].clone()).collect();
        let result = if self.queries {
            self.inner.embed_queries(&sorted).await
        } else {
            self.inner.embed(&sorted).await
        };
        self.waiting.fetch_sub(texts.len(), Ordering::Relaxed);
        if shared {
            self.last_shared = Some(std::time::Instant::now());
        }
        metrics::gauge!("mnemo_embed_queue_texts").set(self.waiting.load(Ordering::Relaxed) as f64);
        let mut vectors: Vec<Vec<f32>> = vec![Vec::new(); texts.len()];
        let failure = match result {
            Ok(found) if found.len() == sorted.len() => {
                for (vector, &index) in found.into_iter().zip(&order) {
                    vectors[index] = vector;
                }
                None
            }
            Ok(_) => Some("the model returned a wrong number of vectors".to_string()),
            Err(error) => Some(error.to_string()),
        };
        // Hand each request its vectors; finished (or failed) requests are answered.
        let mut vectors = vectors.into_iter();
        let mut finished: Vec<usize> = Vec::new();
        for &(index, take) in &taken {
            let request = &mut self.pending[index];
            request.done.extend(vectors.by_ref().take(take));
            if failure.is_some() || request.remaining() == 0 {
                finished.push(index);
            }
        }
        // Removed from the back, so the indexes stay valid.
        for &index in finished.iter().rev() {
            let Some(request) = self.pending.remove(index) else {
                continue;
            };
            let answer = match &failure {
                None => Ok(request.done),
                Some(message) => {
                    // Its texts still waiting are given up with it.
                    self.waiting
                        .fetch_sub(request.texts.len() - request.done.len(), Ordering::Relaxed);
                    Err(EmbedError::Unavailable(message.clone()))
                }
            };
            let _ = request.reply.send(answer);
        }
    }
}

/// The most recently used query vectors, by text (one queue serves one model).
struct QueryCache(Option<lru::LruCache<String, Vec<f32>>>);

impl QueryCache {
    /// A cache of `capacity` vectors; none at all for 0.
    fn new(capacity: usize) -> Self {
        Self(std::num::NonZeroUsize::new(capacity).map(lru::LruCache::new))
    }

    fn get(&mut self, text: &str) -> Option<Vec<f32>> {
        self.0.as_mut()?.get(text).cloned()
    }

    fn put(&mut self, text: &str, vector: Vec<f32>) {
        if let Some(cache) = self.0.as_mut() {
            cache.put(text.to_string(), vector);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    /// Vectors that name their text's length; records every batch it is given.
    struct Counting {
        batches: Mutex<Vec<Vec<String>>>,
        delay: Duration,
        calls: AtomicUsize,
    }

    #[async_trait]
    impl Embedder for Counting {
        fn model_id(&self) -> &str {
            "counting"
        }

        fn dimension(&self) -> usize {
            1
        }

        async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.batches.lock().push(texts.to_vec());
            tokio::time::sleep(self.delay).await;
            if texts.iter().any(|text| text == "poison") {
                return Err(EmbedError::BadInput("poison".into()));
            }
            Ok(texts.iter().map(|text| vec![text.len() as f32]).collect())
        }
    }

    fn counting(delay_ms: u64) -> Arc<Counting> {
        Arc::new(Counting {
            batches: Mutex::new(Vec::new()),
            delay: Duration::from_millis(delay_ms),
            calls: AtomicUsize::new(0),
        })
    }

    fn settings(max_batch: usize) -> QueueSettings {
        QueueSettings {
            batch_wait: Duration::from_millis(20),
            max_batch,
            query_cache: 4,
        }
    }

    #[tokio::test]
    async fn concurrent_callers_share_batches_and_get_their_own_vectors_in_order() {
        let model = counting(5);
        let queue = Arc::new(EmbedQueue::start(model.clone(), settings(64)));
        let calls = (0..8).map(|caller| {
            let queue = queue.clone();
            async move {
                let texts: Vec<String> = (0..3).map(|i| "x".repeat(caller * 3 + i + 1)).collect();
                (texts.clone(), queue.embed(&texts).await.unwrap())
            }
        });
        for (texts, vectors) in futures::future::join_all(calls).await {
            let lengths: Vec<f32> = texts.iter().map(|text| text.len() as f32).collect();
            assert_eq!(vectors.concat(), lengths);
        }
        // 24 texts from 8 callers in far fewer model calls than 8.
        assert!(
            model.calls.load(Ordering::SeqCst) <= 2,
            "{:?}",
            model.batches
        );
        let first = &model.batches.lock()[0];
        let mut sorted = first.clone();
        sorted.sort_by_key(String::len);
        assert_eq!(first, &sorted, "a batch runs shortest first");
    }

    /// A lone caller does not wait `batch_wait` for company that is not coming; once callers
    /// have come together, a caller that finds the worker idle waits for the others.
    #[tokio::test]
    async fn only_callers_that_come_together_wait_for_company() {
        let model = counting(5);
        let wait = Duration::from_millis(500);
        let queue = Arc::new(EmbedQueue::start(
            model.clone(),
            QueueSettings {
                batch_wait: wait,
                ..settings(64)
            },
        ));
        for round in 0..3 {
            let started = std::time::Instant::now();
            queue.embed(&[format!("alone {round}")]).await.unwrap();
            assert!(
                started.elapsed() < wait / 2,
                "round {round} waited for company"
            );
        }
        // Two callers at once share a batch; the next caller then waits for company and is
        // joined by one who comes 50 ms later.
        let texts = |text: &str| vec![text.to_string()];
        let (one, two) = (texts("a"), texts("b"));
        let (a, b) = tokio::join!(queue.embed(&one), queue.embed(&two));
        assert_eq!((a.unwrap(), b.unwrap()), (vec![vec![1.0]], vec![vec![1.0]]));
        let later = queue.clone();
        let three = texts("cc");
        let (first, second) = tokio::join!(queue.embed(&three), async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            later.embed(&texts("ddd")).await
        });
        assert_eq!(
            (first.unwrap(), second.unwrap()),
            (vec![vec![2.0]], vec![vec![3.0]])
        );
        let batches = model.batches.lock().clone();
        assert_eq!(batches.len(), 5, "{batches:?}");
        assert_eq!(batches[3], ["a".to_string(), "b".to_string()]);
        assert_eq!(batches[4], ["cc".to_string(), "ddd".to_string()]);
    }

    #[tokio::test]
    async fn a_query_overtakes_a_bulk_import_and_repeats_come_from_the_cache() {
        let model = counting(30);
        let queue = Arc::new(EmbedQueue::start(model.clone(), settings(4)));
        let bulk_queue = queue.clone();
        let import = tokio::spawn(async move {
            let texts: Vec<String> = (0..40).map(|i| format!("memory {i}")).collect();
            bulk_queue.embed(&texts).await.unwrap()
        });
        tokio::time::sleep(Duration::from_millis(40)).await;
        let query = queue.embed_query("what is my cat called").await.unwrap();
        assert_eq!(query, vec![21.0]);
        assert!(
            !import.is_finished(),
            "the query was answered while the import (10 batches) was still running"
        );
        let batches = model.batches.lock().clone();
        assert!(batches.iter().all(|batch| batch.len() <= 4));
        let vectors = import.await.unwrap();
        assert_eq!(vectors.len(), 40);
        assert_eq!(vectors[12], vec!["memory 12".len() as f32]);
        let calls = model.calls.load(Ordering::SeqCst);
        assert_eq!(
            queue.embed_query("what is my cat called").await.unwrap(),
            vec![21.0]
        );
        assert_eq!(
            model.calls.load(Ordering::SeqCst),
            calls,
            "a cached query embeds nothing"
        );
    }

    #[tokio::test]
    async fn a_failed_batch_fails_its_callers_and_the_queue_goes_on() {
        let model = counting(1);
        let queue = EmbedQueue::start(model.clone(), settings(8));
        let error = queue.embed(&["poison".to_string()]).await.unwrap_err();
        assert!(error.to_string().contains("poison"), "{error}");
        assert_eq!(
            queue.embed(&["ok".to_string()]).await.unwrap(),
            vec![vec![2.0]]
        );
    }

    #[tokio::test]
    async fn a_query_whose_caller_gave_up_does_not_hold_back_bulk_work() {
        let model = counting(50);
        let queue = EmbedQueue::start(model.clone(), settings(8));
        // The caller stops waiting (a client that went away): the future is dropped mid-way.
        let gave_up =
            tokio::time::timeout(Duration::from_millis(10), queue.embed_query("who left")).await;
        assert!(gave_up.is_err());
        let bulk = tokio::time::timeout(
            Duration::from_secs(5),
            queue.embed(&["written after".to_string()]),
        )
        .await
        .expect("bulk work goes on after an abandoned query");
        assert_eq!(bulk.unwrap(), vec![vec![13.0]]);
    }

    #[test]
    fn the_cache_forgets_the_least_recently_used() {
        let mut cache = QueryCache::new(2);
        cache.put("a", vec![1.0]);
        cache.put("b", vec![2.0]);
        assert_eq!(cache.get("a"), Some(vec![1.0]));
        cache.put("c", vec![3.0]);
        assert_eq!(cache.get("b"), None);
        assert_eq!(cache.get("a"), Some(vec![1.0]));
        assert_eq!(cache.get("c"), Some(vec![3.0]));
        let mut off = QueryCache::new(0);
        off.put("a", vec![1.0]);
        assert_eq!(off.get("a"), None);
    }
}
