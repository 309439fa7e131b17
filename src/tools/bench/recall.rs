//! Recall latency: rows of series before, during and after optimisation, beam widths,
//! filters.

use super::*;

impl Bench<'_> {
    pub(super) async fn recall_rows(
        &mut self,
        stack: &MainStack,
        step: &str,
    ) -> anyhow::Result<()> {
        let n = self.options.queries;
        let quarter = (n / 4).max(1);
        let big = stack.users[0];
        if let KeywordSearch::Local(keyword) = stack.engine.indexer().keyword() {
            self.notes.push(format!(
                "{step}: the keyword index has {} segment(s)",
                keyword.segments()
            ));
        }
        let big_count = count(self.options.user_memories);
        let series = [
            (
                big,
                RecallMode::Hybrid,
                n,
                format!("big user ({big_count}), hybrid"),
            ),
            (
                big,
                RecallMode::Vector,
                quarter,
                "big user, vector only".to_string(),
            ),
            (
                big,
                RecallMode::Keyword,
                quarter,
                "big user, BM25 only".to_string(),
            ),
        ];
        for (index, (user, mode, queries, label)) in series.into_iter().enumerate() {
            let latency = self
                .recall_series(&stack.engine, user, true, mode, queries, &label)
                .await?;
            let target = if index == 0 {
                verdict(
                    "p50 ≤ 5 ms, p99 ≤ 20 ms",
                    latency.p50 <= 5.0 && latency.p99 <= 20.0,
                )
            } else {
                String::new()
            };
            self.row(
                step,
                &format!("{label}, {queries} queries"),
                &latency.long(),
                &target,
            )?;
        }
        if stack.users.len() > 1 && self.options.share(1) > 0 {
            let typical = count(self.options.share(1));
            for (mode, name) in [
                (RecallMode::Hybrid, "hybrid"),
                (RecallMode::Keyword, "BM25 only"),
            ] {
                let label = format!("typical user ({typical}), {name}");
                let latency = self
                    .recall_series(&stack.engine, stack.users[1], false, mode, quarter, &label)
                    .await?;
                let target = if self.options.share(1) == TYPICAL_MEMORIES {
                    verdict(
                        "p50 ≤ 1 ms, p99 ≤ 3 ms",
                        latency.p50 <= 1.0 && latency.p99 <= 3.0,
                    )
                } else {
                    String::new()
                };
                self.row(
                    step,
                    &format!("{label}, {quarter} queries"),
                    &latency.long(),
                    &target,
                )?;
            }
        }
        Ok(())
    }

    pub(super) async fn recall_series(
        &mut self,
        engine: &MemoryEngine,
        user: UserId,
        big: bool,
        mode: RecallMode,
        queries: usize,
        label: &str,
    ) -> anyhow::Result<Latency> {
        let warmup = WARMUP_QUERIES.min(queries);
        let mut texts = self.queries(warmup + queries, big).await?.into_iter();
        for query in texts.by_ref().take(warmup) {
            recall_once(engine, user, query, mode).await?;
        }
        let bar = progress(queries as u64, label);
        let mut samples = Vec::with_capacity(queries);
        let mut stages: [Vec<f64>; 4] = Default::default();
        let mut results = 0usize;
        for query in texts {
            let (search_ms, found, timings) = recall_timed(engine, user, query, mode).await?;
            samples.push(search_ms);
            for (stage, ms) in stages.iter_mut().zip([
                timings.vector_ms,
                timings.keyword_ms,
                timings.hydrate_ms,
                timings.rank_ms,
            ]) {
                stage.push(ms);
            }
            results += found;
            bar.inc(1);
        }
        bar.finish_and_clear();
        let [vector, keyword, hydrate, rank] = stages.map(|stage| Latency::of(stage, 0.0).p50);
        self.notes.push(format!(
            "{label}: stage p50s: vector search {}, BM25 search {} (in parallel), SQL \
             hydration {}, ranking {}",
            ms_text(vector),
            ms_text(keyword),
            ms_text(hydrate),
            ms_text(rank)
        ));
        Ok(Latency::of(samples, results as f64 / queries as f64))
    }

    /// The HNSW beam width against speed and quality: hybrid recall timed at each width, and
    /// the vector search's candidates compared with an exact scan of the big user's vectors.
    pub(super) async fn beam_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let big = stack.users[0];
        let candidates = MemorySettings::default().candidates;
        let spin = spinner("beam widths: reading the big user's vectors for an exact scan");
        let filter = MemoryFilter {
            kinds: Some(MemoryKind::ordinary()),
            ..MemoryFilter::default()
        };
        let points: Vec<(MemoryId, Vec<f32>)> = stack
            .store
            .user(big)
            .all_memories(&filter)
            .await?
            .into_iter()
            .map(|memory| (memory.id, memory.embedding))
            .collect();
        let queries = self.query_vectors(BEAM_QUERIES).await?;
        let exact: Vec<HashSet<MemoryId>> = queries
            .iter()
            .map(|query| {
                let mut scored: Vec<(f32, MemoryId)> = points
                    .iter()
                    .map(|(id, vector)| (mnemo::memory::rank::cosine(query, vector), *id))
                    .collect();
                let n = candidates.min(scored.len());
                if n > 0 {
                    scored.select_nth_unstable_by(n - 1, |a, b| b.0.total_cmp(&a.0));
                }
                scored.into_iter().take(n).map(|(_, id)| id).collect()
            })
            .collect();
        spin.finish_and_clear();
        let vector_filter = recall_vector_filter();
        for ef in BEAM_WIDTHS {
            stack.vector.set_search_ef(ef);
            let width = ef.map_or_else(|| "engine default (100)".to_string(), |ef| ef.to_string());
            let mut found = 0usize;
            let mut wanted = 0usize;
            for (query, exact) in queries.iter().zip(&exact) {
                let hits = stack
                    .vector
                    .search(big, query, &vector_filter, candidates)
                    .await?;
                found += hits.iter().filter(|(id, _)| exact.contains(id)).count();
                wanted += exact.len();
            }
            let label = format!("big user, hybrid, ef = {width}");
            let latency = self
                .recall_series(
                    &stack.engine,
                    big,
                    true,
                    RecallMode::Hybrid,
                    BEAM_QUERIES,
                    &label,
                )
                .await?;
            self.row(
                "6 HNSW beam width",
                &format!(
                    "{label}, {BEAM_QUERIES} queries; share of the exact top {candidates} among \
                     the vector candidates ({BEAM_QUERIES} other queries)"
                ),
                &format!(
                    "{}; **{:.1} %** of the exact neighbours",
                    latency.long(),
                    100.0 * found as f64 / wanted.max(1) as f64
                ),
                "",
            )?;
        }
        stack.vector.set_search_ef(self.options.search_ef);
        Ok(())
    }

    /// The vectors of `n` queries for the big user.
    pub(super) async fn query_vectors(&mut self, n: usize) -> anyhow::Result<Vec<Vec<f32>>> {
        let texts = self.queries(n, true).await?;
        Ok(self.vectors.embed(&texts).await?)
    }

    /// What the payload conditions of recall's vector search cost: the search alone (no
    /// embedding, no SQL), with recall's filter and with fewer conditions.
    pub(super) async fn filter_phase(&mut self, stack: &MainStack) -> anyhow::Result<()> {
        let big = stack.users[0];
        let candidates = MemorySettings::default().candidates;
        let queries = self.query_vectors(BEAM_QUERIES).await?;
        let ordinary = recall_vector_filter();
        let variants = [
            (
                "recall's filter: user, kind not `document`, not archived, valid",
                ordinary,
            ),
            ("user, not archived, valid", VectorFilter::default()),
            (
                "user only",
                VectorFilter {
                    include_archived: true,
                    include_invalid: true,
                    ..VectorFilter::default()
                },
            ),
        ];
        for (label, filter) in variants {
            let mut samples = Vec::with_capacity(queries.len());
            let mut results = 0usize;
            for query in &queries {
                let started = Instant::now();
                let hits = stack.vector.search(big, query, &filter, candidates).await?;
                samples.push(millis(started.elapsed()));
                results += hits.len();
            }
            let n = samples.len();
            let latency = Latency::of(samples, results as f64 / n.max(1) as f64);
            self.row(
                "7 vector search alone",
                &format!("big user, `VectorIndex::search` top {candidates}, {label}, {n} queries"),
                &latency.long(),
                "",
            )?;
        }
        Ok(())
    }
}
