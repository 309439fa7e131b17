//! The real local model's phase: ingest through the embedder, and query embedding on its own.

use super::*;

impl Bench<'_> {
    pub(super) async fn model_phase(&mut self, shutdown: &CancellationToken) -> anyhow::Result<()> {
        let step = "2 ingest, local model";
        let Some(model) = &self.model else {
            let what = match &self.options.model_dir {
                Some(dir) => format!("skipped: no model in {}", dir.display()),
                None => "skipped: no model directory given".to_string(),
            };
            self.row(step, &what, "–", "")?;
            return Ok(());
        };
        let embedder = model.embedder.clone();
        let load_time = model.load_time;
        let model = embedder.model_id().to_string();
        let dimension = embedder.dimension();

        let n = self.options.model_memories;
        if n > 0 {
            self.model_ingest(embedder.clone(), dimension, n, shutdown)
                .await?;
        }
        // Query embedding: single short English queries, as recall embeds them.
        let queries = self.options.queries.clamp(1, 200);
        for _ in 0..3 {
            let text = self.corpus.english_text(&mut self.rng, 4, 8);
            embedder.embed_queries(&[text]).await?;
        }
        let bar = progress(queries as u64, "query embedding");
        let mut samples = Vec::with_capacity(queries);
        for _ in 0..queries {
            let text = self.corpus.english_text(&mut self.rng, 4, 8);
            let started = Instant::now();
            embedder.embed_queries(&[text]).await?;
            samples.push(millis(started.elapsed()));
            bar.inc(1);
        }
        bar.finish_and_clear();
        let latency = Latency::of(samples, 0.0);
        self.row(
            "4 query embedding",
            &format!("{model}, one 4–8-word query per call, {queries} calls"),
            &format!("{} (model load {})", latency.short(), seconds(load_time)),
            "",
        )?;

        Ok(())
    }

    pub(super) async fn model_ingest(
        &mut self,
        embedder: Arc<dyn Embedder>,
        dimension: usize,
        n: usize,
        shutdown: &CancellationToken,
    ) -> anyhow::Result<()> {
        let step = "2 ingest, local model";
        let dir = self.options.data_dir.join("model");
        let store = open_sqlite(&dir).await?;
        let user = create_users(store.as_ref(), "bench-model", 1).await?[0];
        let (vector, keyword, watermark) = open_indexes(&dir, dimension, &self.options).await?;
        let token = shutdown.child_token();
        let engine = MemoryEngine::assemble(
            store.clone(),
            embedder,
            vector,
            keyword,
            watermark,
            MemorySettings::default(),
            u64::MAX,
            token.clone(),
        )
        .await?;
        let texts: Vec<String> = (0..n)
            .map(|_| self.corpus.english_text(&mut self.rng, 8, 16))
            .collect();
        let bar = progress(n as u64, "embed + insert");
        let started = Instant::now();
        for chunk in texts.chunks(MODEL_BATCH) {
            let memories = chunk
                .iter()
                .map(|text| NewMemory::from_user(MemoryKind::Fact, text.clone(), 3))
                .collect();
            engine.add(user, memories).await?;
            bar.inc(chunk.len() as u64);
        }
        let elapsed = started.elapsed();
        bar.finish_and_clear();
        let indexed = engine.wait_recallable(Duration::from_secs(600)).await?;
        let all_indexed = started.elapsed();
        self.row(
            step,
            &format!(
                "`MemoryEngine::add` of {} memories (8–16 English words), batches of \
                 {MODEL_BATCH}: embed + SQL, indexer running",
                count(n)
            ),
            &format!(
                "{} → **{}/s**; all recallable after {}{}",
                seconds(elapsed),
                rate(n, elapsed),
                seconds(all_indexed),
                if indexed { "" } else { " (timed out)" }
            ),
            "",
        )?;
        stop_engine(&engine, &token).await;
        store.close().await;
        Ok(())
    }

    // --- 3: reindex ------------------------------------------------------------------------
}
