//! Putting the corpus in: `Indexer::rebuild` of one user (the `mnemo reindex` path), SQL
//! ingest of the whole corpus and the indexes' catch-up, the big user's memories.

use super::*;

impl Bench<'_> {
    pub(super) async fn reindex_phase(&mut self) -> anyhow::Result<()> {
        let n = self.options.reindex_memories;
        if n == 0 {
            self.row("3 reindex", "skipped (0 memories)", "–", "")?;
            return Ok(());
        }
        let dir = self.options.data_dir.join("reindex");
        let store = open_sqlite(&dir).await?;
        let user = create_users(store.as_ref(), "bench-reindex", 1).await?[0];
        let bar = progress(n as u64, "reindex store: insert");
        let mut left = n;
        while left > 0 {
            let batch = left.min(SQL_BATCH);
            let memories = (0..batch)
                .map(|_| self.corpus.memory(&mut self.rng))
                .collect();
            store.user(user).insert_memories(memories).await?;
            left -= batch;
            bar.inc(batch as u64);
        }
        bar.finish_and_clear();
        let (vector, keyword, watermark) = open_indexes(&dir, DIMENSION, &self.options).await?;
        let indexer = Indexer::new(
            store.clone(),
            vector.clone(),
            keyword,
            watermark,
            DIMENSION,
            u64::MAX,
        )
        .await?;
        for (label, what) in [
            ("into empty indexes", "fresh data directory"),
            (
                "over existing indexes",
                "what `mnemo reindex` does: clear, then rebuild",
            ),
        ] {
            let bar = progress(n as u64, &format!("reindex {label}"));
            let started = Instant::now();
            let done = indexer
                .rebuild(|done, total| {
                    bar.set_length(total);
                    bar.set_position(done);
                })
                .await?;
            let elapsed = started.elapsed();
            bar.finish_and_clear();
            self.row(
                "3 reindex",
                &format!(
                    "`Indexer::rebuild` of {} memories (one user) {label}: {what}",
                    count(done as usize)
                ),
                &format!("**{}** ({}/s)", seconds(elapsed), rate(n, elapsed)),
                &verdict("≤ 60 s", elapsed <= Duration::from_secs(60)),
            )?;
        }
        if self.options.optimize {
            let spin = spinner("reindex: optimize (HNSW)");
            let started = Instant::now();
            vector.optimize().await?;
            let elapsed = started.elapsed();
            spin.finish_and_clear();
            self.row(
                "3 reindex",
                &format!(
                    "then `optimize` (HNSW) of those {} points, as the indexer does in the background",
                    count(n)
                ),
                &seconds(elapsed),
                "",
            )?;
        }
        drop(indexer);
        store.close().await;
        Ok(())
    }

    // --- 1: corpus ingest and catch-up -----------------------------------------------------

    pub(super) async fn main_ingest(
        &mut self,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<MainStack> {
        let dir = self.options.data_dir.clone();
        let store = open_sqlite(&dir).await?;
        let users = create_users(store.as_ref(), "bench-user", self.options.users).await?;

        let big_user = self.big_user_memories().await?;
        // The big user's threads: their memories are turns, each with its neighbours' view.
        let big_threads = {
            let scope = store.user(users[0]);
            let mut threads = Vec::new();
            for index in 0..self.options.user_memories.div_ceil(TURNS_PER_THREAD) {
                threads.push(
                    scope
                        .create_thread(&format!("bench thread {index}"), false)
                        .await?
                        .id,
                );
            }
            threads
        };
        let turns_since = Utc::now() - chrono::Duration::days(365);
        let plan = self.ingest_plan();
        let calls = plan.len();
        let (sender, mut receiver) = tokio::sync::mpsc::channel(8);
        let producer = {
            let corpus = self.corpus.clone();
            let mut rng = Rng::new(self.rng.next_u64());
            let mut big_user = big_user.map(Vec::into_iter);
            let mut turns = 0usize;
            tokio::task::spawn_blocking(move || {
                for (user, batch) in plan {
                    let mut memories: Vec<(NewMemory, Embedded)> = match big_user.as_mut() {
                        Some(made) if user == 0 => made.by_ref().take(batch).collect(),
                        _ => (0..batch).map(|_| corpus.memory(&mut rng)).collect(),
                    };
                    if user == 0 {
                        for (memory, _) in &mut memories {
                            memory.kind = MemoryKind::Turn;
                            memory.thread_id = Some(big_threads[turns / TURNS_PER_THREAD]);
                            memory.created_at =
                                Some(turns_since + chrono::Duration::seconds(60 * turns as i64));
                            turns += 1;
                        }
                    }
                    if sender.blocking_send((user, memories)).is_err() {
                        return;
                    }
                }
            })
        };
        let total = self.options.total;
        let bar = progress(total as u64, "SQL insert");
        let started = Instant::now();
        let mut sql_time = Duration::ZERO;
        while let Some((user, memories)) = receiver.recv().await {
            let len = memories.len();
            let call = Instant::now();
            store.user(users[user]).insert_memories(memories).await?;
            sql_time += call.elapsed();
            bar.inc(len as u64);
        }
        let wall = started.elapsed();
        producer.await.context("generating the corpus")?;
        bar.finish_and_clear();
        self.row(
            "1 ingest, precomputed vectors",
            &format!(
                "`insert_memories` of {} memories in {} calls (≤ {SQL_BATCH} rows, one user \
                 each; the big user's are turns, {TURNS_PER_THREAD} per thread, indexed with \
                 their context views)",
                count(total),
                count(calls)
            ),
            &format!(
                "{} wall → **{}/s**; time inside `insert_memories` {} → {}/s",
                seconds(wall),
                rate(total, wall),
                seconds(sql_time),
                rate(total, sql_time)
            ),
            "",
        )?;

        let (vector, keyword, watermark) = self.catch_up(&store, &dir, total).await?;

        let embedder: Arc<dyn Embedder> = self.vectors.clone();
        let stop = shutdown.child_token();
        let engine = MemoryEngine::assemble(
            store.clone(),
            embedder,
            vector.clone(),
            keyword,
            watermark,
            MemorySettings::default(),
            // Optimisation is started by the benchmark, never behind its back.
            u64::MAX,
            stop.clone(),
        )
        .await?;
        Ok(MainStack {
            store,
            stop,
            users,
            vector,
            engine,
        })
    }

    /// The ingest's calls, `(user, batch size)`: ROUNDS passes over all users, each writing
    /// its share in batches of at most `SQL_BATCH`.
    fn ingest_plan(&self) -> Vec<(usize, usize)> {
        let mut plan = Vec::new();
        for round in 0..ROUNDS {
            for user in 0..self.options.users {
                let share = self.options.share(user);
                let mut left = share * (round + 1) / ROUNDS - share * round / ROUNDS;
                while left > 0 {
                    let batch = left.min(SQL_BATCH);
                    plan.push((user, batch));
                    left -= batch;
                }
            }
        }
        plan
    }

    /// Opens the indexes and brings them up to the memory log (timed, as a row), then the
    /// disk space used (a row); returns the indexes.
    async fn catch_up(
        &mut self,
        store: &Arc<dyn Store>,
        dir: &Path,
        total: usize,
    ) -> anyhow::Result<(Arc<dyn VectorIndex>, KeywordSearch, VectorWatermark)> {
        let (vector, keyword, watermark) = open_indexes(dir, DIMENSION, &self.options).await?;
        let indexer = Indexer::new(
            store.clone(),
            vector.clone(),
            keyword.clone(),
            watermark.clone(),
            DIMENSION,
            u64::MAX,
        )
        .await?;
        let head = store.maintenance().memory_log_head().await?;
        let bar = progress(head.max(0) as u64, "index catch-up");
        let started = Instant::now();
        loop {
            let applied = indexer.step().await?;
            if applied == 0 {
                break;
            }
            bar.inc(applied as u64);
        }
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        drop(indexer);
        self.row(
            "1 index catch-up",
            &format!(
                "`Indexer` steps over {} log entries into Edge + tantivy (batches of 1000, \
                 flush + commit each)",
                count(head.max(0) as usize)
            ),
            &format!("{} → **{}/s**", seconds(elapsed), rate(total, elapsed)),
            "",
        )?;
        let sizes = format!(
            "SQLite {}, Edge {}, tantivy {}",
            bytes(dir_size(&dir.join("mnemo.db")) + wal_size(dir)),
            bytes(dir_size(&EdgeVectorIndex::dir(dir, DIMENSION))),
            bytes(dir_size(&dir.join("keyword")))
        );
        self.row("1 storage", "disk space used after catch-up", &sizes, "")?;

        Ok((vector, keyword, watermark))
    }

    /// With model vectors: the big user's memories made up front and embedded by the model
    /// (timed, as a row); `None` with synthetic vectors, which are made as they are inserted.
    pub(super) async fn big_user_memories(
        &mut self,
    ) -> anyhow::Result<Option<Vec<(NewMemory, Embedded)>>> {
        let Some(model) = self.vectors.model.clone() else {
            return Ok(None);
        };
        let n = self.options.user_memories;
        let mut rng = Rng::new(self.rng.next_u64());
        let mut memories: Vec<(NewMemory, Embedded)> =
            (0..n).map(|_| self.corpus.memory(&mut rng)).collect();
        let bar = progress(n as u64, "embedding the big user's memories");
        let started = Instant::now();
        for chunk in memories.chunks_mut(EMBED_CHUNK) {
            let texts: Vec<String> = chunk.iter().map(|(m, _)| m.content.clone()).collect();
            let vectors = self.vectors.compute(&texts, true).await?;
            for ((_, embedded), vector) in chunk.iter_mut().zip(vectors) {
                embedded.vector = vector;
            }
            bar.inc(chunk.len() as u64);
        }
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        self.row(
            "1 big user's vectors",
            &format!(
                "{} embeds the big user's {} texts (6–14 words), before the SQL insert",
                model.model_id(),
                count(n)
            ),
            &format!("{} → {}/s", seconds(elapsed), rate(n, elapsed)),
            "",
        )?;
        Ok(Some(memories))
    }

    /// `n` recall queries for the big user (`big`) or another one, embedded now so that
    /// recall finds their vectors ready and times only its searches, SQL and ranking.
    pub(super) async fn queries(&mut self, n: usize, big: bool) -> anyhow::Result<Vec<String>> {
        let texts: Vec<String> = (0..n).map(|_| self.corpus.query(&mut self.rng)).collect();
        self.vectors.prepare(&texts, big).await?;
        Ok(texts)
    }

    /// A new memory of the big user, with a vector of the kind the big user's others have.
    pub(super) async fn big_user_memory(&mut self) -> anyhow::Result<(NewMemory, Embedded)> {
        let (memory, mut embedded) = self.corpus.memory(&mut self.rng);
        if self.vectors.model.is_some() {
            let text = [memory.content.clone()];
            embedded.vector = self.vectors.embed(&text).await?.pop().unwrap_or_default();
        }
        Ok((memory, embedded))
    }

    // --- 4: recall -------------------------------------------------------------------------
}
