//! Recall while the HNSW optimisation runs, and the lag from a committed write to recallable.

use super::*;

impl Bench<'_> {
    pub(super) async fn optimize_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let big = stack.users[0];
        let pool = self.queries(OPTIMIZE_QUERY_POOL, true).await?;
        let mut pool = pool.iter().cycle();
        let probe_memory = self.big_user_memory().await?;
        let mut probe_memory = Some(probe_memory);
        let spin = spinner("optimize (HNSW) of the corpus, sampling recall");
        let started = Instant::now();
        let mut task = {
            let vector = stack.vector.clone();
            tokio::spawn(async move { vector.optimize().await })
        };
        let mut ticker = tokio::time::interval(SAMPLE_EVERY);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut samples = Vec::new();
        let mut results = 0usize;
        let mut probe: Option<tokio::task::JoinHandle<anyhow::Result<(bool, Duration)>>> = None;
        let outcome = loop {
            tokio::select! {
                joined = &mut task => break joined,
                _ = ticker.tick() => {
                    if probe.is_none() && started.elapsed() >= Duration::from_millis(500) {
                        // One write made while HNSW is being built: when is it recallable?
                        let memory = probe_memory.take().context("one probe write")?;
                        stack.store.user(big).insert_memories(vec![memory]).await?;
                        let committed = Instant::now();
                        let engine = stack.engine.clone();
                        probe = Some(tokio::spawn(async move {
                            let ok = engine.wait_recallable(Duration::from_secs(4 * 3600)).await?;
                            Ok::<_, anyhow::Error>((ok, committed.elapsed()))
                        }));
                    } else {
                        let query = pool.next().cloned().unwrap_or_default();
                        let (search_ms, found) =
                            recall_once(&stack.engine, big, query, RecallMode::Hybrid).await?;
                        samples.push(search_ms);
                        results += found;
                        spin.set_message(format!(
                            "optimize (HNSW) of the corpus, {} recall samples",
                            samples.len()
                        ));
                    }
                }
            }
        };
        let elapsed = started.elapsed();
        spin.finish_and_clear();
        outcome.context("optimize task")??;
        let points = self.options.total;
        let layout = match stack.vector.layout().await? {
            Some(l) => format!(
                ": {} segment(s), {} of {} points in HNSW graphs, {} user(s) in a shard of \
                 their own",
                l.segments,
                count(l.indexed_points),
                count(l.points),
                l.tenant_shards
            ),
            None => String::new(),
        };
        self.row(
            "optimize",
            &format!(
                "`VectorIndex::optimize` (Edge HNSW build, blocking) over {} points{layout}",
                count(points)
            ),
            &format!("**{}**", seconds(elapsed)),
            "",
        )?;
        if !samples.is_empty() {
            let n = samples.len();
            let latency = Latency::of(samples, results as f64 / n as f64);
            self.row(
                "4 recall, during optimize",
                &format!(
                    "big user, hybrid, one query every {} ms while optimize runs, {n} queries",
                    SAMPLE_EVERY.as_millis()
                ),
                &latency.long(),
                "",
            )?;
        }
        match probe {
            Some(probe) => {
                let waited = tokio::time::timeout(Duration::from_secs(600), probe).await;
                let mut stalled = true;
                let result = match waited {
                    Ok(joined) => {
                        let (ok, lag) = joined.context("lag probe")??;
                        stalled = !ok || lag > Duration::from_secs(5);
                        format!(
                            "recallable after **{}**{}",
                            seconds(lag),
                            if ok { "" } else { " (timed out)" }
                        )
                    }
                    Err(_) => "not recallable 10 min after optimize ended".into(),
                };
                self.row(
                    "5 index lag, during optimize",
                    "one write committed 0.5 s after optimize started",
                    &result,
                    "",
                )?;
                self.notes.push(if stalled {
                    "A write made during optimize waited for it to end.".to_string()
                } else {
                    "Writes made during optimize stay recallable: the indexer does not wait for \
                     the build's flush; the durable watermark catches up after it."
                        .to_string()
                });
            }
            None => self
                .notes
                .push("optimize ended within 0.5 s, so no write was made during it.".into()),
        }
        Ok(())
    }

    // --- 5: index lag ----------------------------------------------------------------------

    pub(super) async fn lag_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let n = self.options.lag_writes;
        if n == 0 {
            return Ok(());
        }
        let big = stack.users[0];
        let bar = progress(n as u64, "index lag");
        let mut samples = Vec::with_capacity(n);
        let mut timeouts = 0;
        for _ in 0..n {
            let memory = self.big_user_memory().await?;
            stack.store.user(big).insert_memories(vec![memory]).await?;
            let committed = Instant::now();
            stack.engine.indexer().notify();
            if !stack
                .engine
                .wait_recallable(Duration::from_secs(60))
                .await?
            {
                timeouts += 1;
            }
            samples.push(millis(committed.elapsed()));
            bar.inc(1);
            // Independent writes, not a tight loop.
            let pause = self.rng.below(20) as u64;
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
        bar.finish_and_clear();
        let latency = Latency::of(samples, 0.0);
        let mut result = format!(
            "p50 {} / p95 **{}** / max {}",
            ms_text(latency.p50),
            ms_text(latency.p95),
            ms_text(latency.max)
        );
        if timeouts > 0 {
            result.push_str(&format!(" ({timeouts} timed out at 60 s)"));
        }
        self.row(
            "5 index lag",
            &format!(
                "`insert_memories` returned → recallable in both indexes, {n} sequential single \
                 writes (big user), indexer following"
            ),
            &result,
            &verdict("p95 ≤ 1 s", latency.p95 <= 1000.0 && timeouts == 0),
        )
    }
}
