//! Accumulating results: one run per (memory unit, retrieval, fusion constant), the answers
//! file, WordPiece counts, and the embedder that caches vectors across runs.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use mnemo::config::Settings;
use mnemo::llm::embed::Embedder;

use super::*;

/// Identifies one result row; orders the rows of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RunKey {
    /// 0 for the `product` run (the first row), 1 for the ablations.
    pub(super) headline: u8,
    pub(super) unit: MemoryUnit,
    pub(super) credit: Credit,
    pub(super) sweep: bool,
    pub(super) retrieval: Retrieval,
    /// `-rrf_k × 1000`, so larger constants come first.
    pub(super) rrf_order: i64,
    /// The gate sweep's thresholds in thousandths.
    pub(super) gate_order: Option<[i64; 2]>,
    /// `--ablate` rows after the rest, in the order given.
    pub(super) ablation: Option<usize>,
}

impl RunKey {
    pub(super) fn new(unit: MemoryUnit, credit: Credit, probe: Probe) -> Self {
        let product = unit == MemoryUnit::Product
            && probe.retrieval == Retrieval::HybridDecay
            && !probe.sweep
            && probe.ablation.is_none();
        Self {
            headline: if product { 0 } else { 1 },
            unit,
            credit,
            sweep: probe.sweep,
            retrieval: probe.retrieval,
            rrf_order: -(probe.rrf_k * 1000.0).round() as i64,
            gate_order: probe.gate.map(GatePoint::order),
            ablation: probe.ablation,
        }
    }

    /// `dated`, `window` or `window-centre`.
    pub(super) fn unit_label(&self) -> String {
        match self.credit {
            Credit::AllRefs => self.unit.key().to_string(),
            Credit::Centre => format!("{}-centre", self.unit.key()),
        }
    }

    /// `product` for the product's own path (its memories, recalled as `recall_memory`
    /// does, with the shipped settings), else `unit/retrieval`.
    pub(super) fn label(
        &self,
        rrf_k: f64,
        gate: Option<GatePoint>,
        ablation: Option<&str>,
    ) -> String {
        if self.headline == 0 {
            return "product".to_string();
        }
        if let Some(change) = ablation {
            return format!("product {change}");
        }
        if let Some(gate) = gate {
            return format!("{} {}", self.unit_label(), gate.label());
        }
        if self.sweep {
            format!(
                "{}/{} rrf_k={}",
                self.unit_label(),
                self.retrieval.key(),
                rrf_k
            )
        } else {
            format!("{}/{}", self.unit_label(), self.retrieval.key())
        }
    }
}

pub(super) struct Accumulator {
    pub(super) aggregate: metrics::Aggregate,
    pub(super) rrf_k: f64,
    /// The probe's own gate (gate sweep rows), and the gate it recalled with.
    pub(super) gate: Option<GatePoint>,
    pub(super) gate_used: Option<GatePoint>,
    /// What an `--ablate` row changed.
    pub(super) ablation: Option<String>,
    pub(super) latencies_ms: Vec<f64>,
    pub(super) returned: usize,
    pub(super) words: usize,
    pub(super) wordpieces: Option<usize>,
    /// Questions of another conversation asked (fused retrievals), how many found nothing,
    /// and how many memories they returned in all (at most `tokens_k` each).
    pub(super) foreign_asked: usize,
    pub(super) foreign_nothing: usize,
    pub(super) foreign_returned: usize,
    /// The same for the dataset's own questions nothing answers (BEAM's abstention).
    pub(super) abstain_asked: usize,
    pub(super) abstain_nothing: usize,
    pub(super) abstain_returned: usize,
    /// Questions naming an earlier statement and the later one changing it: how many, how
    /// often the later ranked first (or alone), and how often both were found.
    pub(super) order_asked: usize,
    pub(super) order_newer_first: usize,
    pub(super) order_both: usize,
}

impl Accumulator {
    pub(super) fn new(probe: Probe, plan: &Plan) -> Self {
        Self {
            aggregate: metrics::Aggregate::new(&plan.ks),
            rrf_k: probe.rrf_k,
            gate: probe.gate,
            gate_used: probe.gate_used(&plan.memory, &plan.ablations),
            ablation: plan.ablation(probe).map(str::to_string),
            latencies_ms: Vec::new(),
            returned: 0,
            words: 0,
            wordpieces: Some(0),
            foreign_asked: 0,
            foreign_nothing: 0,
            foreign_returned: 0,
            abstain_asked: 0,
            abstain_nothing: 0,
            abstain_returned: 0,
            order_asked: 0,
            order_newer_first: 0,
            order_both: 0,
        }
    }

    pub(super) fn result(&self, key: &RunKey, plan: &Plan) -> RunResult {
        let n = self.latencies_ms.len().max(1) as f64;
        RunResult {
            key: key.label(self.rrf_k, self.gate, self.ablation.as_deref()),
            unit: key.unit_label(),
            credit: match key.credit {
                Credit::AllRefs => "all refs",
                Credit::Centre => "centre turn",
            }
            .to_string(),
            single_turn_credit: key.unit != MemoryUnit::Window || key.credit == Credit::Centre,
            retrieval: key.retrieval.key().to_string(),
            rrf_k: key.retrieval.fuses().then_some(self.rrf_k),
            decay: key.retrieval.decay(),
            sweep: key.sweep,
            gate: self.gate_used,
            ablation: self.ablation.clone(),
            overall: self.aggregate.overall(),
            categories: self.aggregate.by_category(),
            latency: metrics::latency(&self.latencies_ms),
            returned_at_tokens_k: self.returned as f64 / n,
            words_at_tokens_k: self.words as f64 / n,
            wordpieces_at_tokens_k: self.wordpieces.map(|count| count as f64 / n),
            tokens_k: plan.tokens_k,
            foreign: (self.foreign_asked > 0).then(|| Foreign {
                asked: self.foreign_asked,
                nothing: self.foreign_nothing as f64 / self.foreign_asked as f64,
                returned: self.foreign_returned as f64 / self.foreign_asked as f64,
            }),
            abstention: (self.abstain_asked > 0).then(|| Foreign {
                asked: self.abstain_asked,
                nothing: self.abstain_nothing as f64 / self.abstain_asked as f64,
                returned: self.abstain_returned as f64 / self.abstain_asked as f64,
            }),
            newest_first: (self.order_asked > 0).then(|| NewestFirst {
                asked: self.order_asked,
                newer_first: self.order_newer_first as f64 / self.order_asked as f64,
                both_found: self.order_both as f64 / self.order_asked as f64,
            }),
        }
    }
}

/// Where query results go.
pub(super) struct Sink {
    pub(super) accumulators: BTreeMap<RunKey, Accumulator>,
    pub(super) per_question: std::io::BufWriter<std::fs::File>,
    pub(super) wordpieces: Option<WordPieces>,
    pub(super) answers: answer::AnswerTally,
    pub(super) answers_file: Option<std::io::BufWriter<std::fs::File>>,
    /// The relevance features of the product's ungated results (`--features`).
    pub(super) features: Option<std::io::BufWriter<std::fs::File>>,
}

/// Counts BERT WordPiece tokens with the local embedding model's tokenizer.
pub(super) struct WordPieces(pub(super) tokenizers::Tokenizer);

impl WordPieces {
    pub(super) fn load(settings: &Settings) -> Option<Self> {
        if settings.embedder.provider != mnemo::config::EmbedderProvider::Local {
            return None;
        }
        let path = settings.embedder.model_dir.join("tokenizer.json");
        let mut tokenizer = tokenizers::Tokenizer::from_file(&path).ok()?;
        tokenizer.with_truncation(None).ok()?;
        tokenizer.with_padding(None);
        Some(Self(tokenizer))
    }

    pub(super) fn count(&self, text: &str) -> usize {
        self.0
            .encode(text, false)
            .map(|encoding| encoding.len())
            .unwrap_or(0)
    }
}

/// What every pass of one evaluation shares.
pub(super) struct Env<'a> {
    pub(super) dataset: &'a str,
    pub(super) conversations: &'a [Conversation],
    pub(super) scratch_root: PathBuf,
    pub(super) settings: &'a Settings,
    pub(super) embedder: Arc<EvalEmbedder>,
    pub(super) plan: Plan,
    /// `--answer`: the models, the memory unit answered from, and how many memories.
    pub(super) answers: Option<(answer::AnswerModels, MemoryUnit, usize)>,
    /// The model extracting the `facts` unit (the `memory` role), when an LLM is configured.
    pub(super) facts: Option<(mnemo::llm::chat::RoleModel, u32)>,
}

impl Env<'_> {
    /// The scratch store of one (memory unit, conversation): created on the first open,
    /// reopened as it was left afterwards.
    pub(super) async fn open(&self, unit: MemoryUnit, index: usize) -> anyhow::Result<Scratch> {
        let dir = self.scratch_root.join(unit.key()).join(format!(
            "{:03}-{}",
            index + 1,
            slug(&self.conversations[index].id)
        ));
        let embedder: Arc<dyn Embedder> = self.embedder.clone();
        Scratch::open(&dir, self.settings, embedder).await
    }
}

/// The configured embedder, shared by every scratch store, with two changes that leave the
/// vectors as they are (up to float rounding): a batch is embedded in order of text length (the local model pads each chunk of 32
/// texts to its longest, and LoCoMo turns vary enough that session-ordered chunks do twice the
/// work), and queries are cached, so the dozen probes of one question embed it once. The time of that one real embedding is kept: latencies still include it.
pub(super) struct EvalEmbedder {
    pub(super) inner: Arc<dyn Embedder>,
    pub(super) queries: parking_lot::Mutex<std::collections::HashMap<String, (Vec<f32>, f64)>>,
    /// `--vector-cache`: document vectors kept on disk between runs.
    stored: Option<VectorCache>,
}

impl EvalEmbedder {
    pub(super) fn new(inner: Arc<dyn Embedder>) -> Self {
        Self {
            inner,
            queries: parking_lot::Mutex::new(std::collections::HashMap::new()),
            stored: None,
        }
    }

    /// Document vectors are first looked up in `cache` (and what is embedded is added to it).
    pub(super) fn with_cache(mut self, cache: VectorCache) -> Self {
        self.stored = Some(cache);
        self
    }

    pub(super) fn queries(
        &self,
    ) -> parking_lot::MutexGuard<'_, std::collections::HashMap<String, (Vec<f32>, f64)>> {
        self.queries.lock()
    }

    /// The inner model's vectors of `texts`, embedded in order of length.
    async fn embed_sorted(
        &self,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, mnemo::llm::embed::EmbedError> {
        let mut order: Vec<usize> = (0..texts.len()).collect();
        order.sort_by_key(|&i| (texts[i].len(), i));
        let sorted: Vec<String> = order.iter().map(|&i| texts[i].clone()).collect();
        let vectors = self.inner.embed(&sorted).await?;
        let mut out = vec![Vec::new(); texts.len()];
        for (vector, &i) in vectors.into_iter().zip(&order) {
            out[i] = vector;
        }
        Ok(out)
    }

    /// How long the real embedding of `text` took, if it was embedded alone.
    pub(super) fn embed_ms(&self, text: &str) -> Option<f64> {
        self.queries().get(text).map(|(_, ms)| *ms)
    }
}

#[async_trait::async_trait]
impl Embedder for EvalEmbedder {
    fn model_id(&self) -> &str {
        self.inner.model_id()
    }

    fn vectors_id(&self) -> &str {
        self.inner.vectors_id()
    }

    fn earlier_vectors_id(&self) -> Option<&str> {
        self.inner.earlier_vectors_id()
    }

    fn dimension(&self) -> usize {
        self.inner.dimension()
    }

    async fn embed(
        &self,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, mnemo::llm::embed::EmbedError> {
        let Some(cache) = &self.stored else {
            return self.embed_sorted(texts).await;
        };
        let vectors_id = self.inner.vectors_id();
        let keys: Vec<[u8; 16]> = texts
            .iter()
            .map(|text| VectorCache::key(vectors_id, text))
            .collect();
        let mut out: Vec<Option<Vec<f32>>> = keys.iter().map(|key| cache.get(key)).collect();
        let missing: Vec<usize> = (0..texts.len()).filter(|&i| out[i].is_none()).collect();
        if !missing.is_empty() {
            let wanted: Vec<String> = missing.iter().map(|&i| texts[i].clone()).collect();
            let vectors = self.embed_sorted(&wanted).await?;
            cache.put(missing.iter().map(|&i| keys[i]).zip(&vectors));
            for (vector, &i) in vectors.into_iter().zip(&missing) {
                out[i] = Some(vector);
            }
        }
        Ok(out.into_iter().map(Option::unwrap_or_default).collect())
    }

    async fn embed_queries(
        &self,
        texts: &[String],
    ) -> Result<Vec<Vec<f32>>, mnemo::llm::embed::EmbedError> {
        let [text] = texts else {
            return self.inner.embed_queries(texts).await;
        };
        if let Some((vector, _)) = self.queries().get(text) {
            return Ok(vec![vector.clone()]);
        }
        let started = Instant::now();
        let vectors = self.inner.embed_queries(texts).await?;
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        if let Some(vector) = vectors.first() {
            self.queries().insert(text.clone(), (vector.clone(), ms));
        }
        Ok(vectors)
    }
}

/// Document vectors kept in a file between evaluation runs (`--vector-cache`), so a run that
/// changes only recall does not embed the same conversations again. Keyed by the model's
/// vectors id and the text; records are appended as they are embedded (16-byte key, u32
/// dimension, the floats little-endian), and a record cut short by a crash is ignored.
pub(super) struct VectorCache {
    vectors: parking_lot::Mutex<std::collections::HashMap<[u8; 16], Vec<f32>>>,
    file: parking_lot::Mutex<std::io::BufWriter<std::fs::File>>,
}

impl VectorCache {
    pub(super) fn open(path: &std::path::Path) -> anyhow::Result<Self> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
            Err(error) => {
                return Err(error).with_context(|| format!("reading {}", path.display()));
            }
        };
        let vectors = Self::parse(&bytes);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .with_context(|| format!("opening {}", path.display()))?;
        // A record cut short stays at the end; appending after it would misalign the rest.
        file.set_len(Self::whole_length(&bytes) as u64)
            .with_context(|| format!("truncating {}", path.display()))?;
        Ok(Self {
            vectors: parking_lot::Mutex::new(vectors),
            file: parking_lot::Mutex::new(std::io::BufWriter::new(file)),
        })
    }

    /// The records of `bytes`, up to the first incomplete one.
    fn parse(bytes: &[u8]) -> std::collections::HashMap<[u8; 16], Vec<f32>> {
        let mut vectors = std::collections::HashMap::new();
        let mut rest = bytes;
        while let Some((key, vector, tail)) = Self::record(rest) {
            vectors.insert(key, vector);
            rest = tail;
        }
        vectors
    }

    /// How many leading bytes of `bytes` are whole records.
    fn whole_length(bytes: &[u8]) -> usize {
        let mut rest = bytes;
        while let Some((_, _, tail)) = Self::record(rest) {
            rest = tail;
        }
        bytes.len() - rest.len()
    }

    fn record(bytes: &[u8]) -> Option<([u8; 16], Vec<f32>, &[u8])> {
        let key: [u8; 16] = bytes.get(..16)?.try_into().ok()?;
        let dimension = u32::from_le_bytes(bytes.get(16..20)?.try_into().ok()?) as usize;
        let floats = bytes.get(20..20 + dimension * 4)?;
        let vector = floats
            .chunks_exact(4)
            .map(|chunk| f32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]))
            .collect();
        Some((key, vector, &bytes[20 + dimension * 4..]))
    }

    pub(super) fn key(vectors_id: &str, text: &str) -> [u8; 16] {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        hasher.update(vectors_id.as_bytes());
        hasher.update([0]);
        hasher.update(text.as_bytes());
        let digest = hasher.finalize();
        let mut key = [0; 16];
        key.copy_from_slice(&digest[..16]);
        key
    }

    pub(super) fn get(&self, key: &[u8; 16]) -> Option<Vec<f32>> {
        self.vectors.lock().get(key).cloned()
    }

    /// Keeps the vectors and appends them to the file (a failed write only costs a later run
    /// the embedding).
    fn put<'a>(&self, records: impl Iterator<Item = ([u8; 16], &'a Vec<f32>)>) {
        use std::io::Write;
        let mut bytes = Vec::new();
        let mut vectors = self.vectors.lock();
        for (key, vector) in records {
            bytes.extend_from_slice(&key);
            bytes.extend_from_slice(&(vector.len() as u32).to_le_bytes());
            for value in vector {
                bytes.extend_from_slice(&value.to_le_bytes());
            }
            vectors.insert(key, vector.clone());
        }
        let mut file = self.file.lock();
        if let Err(error) = file.write_all(&bytes).and_then(|()| file.flush()) {
            tracing::warn!(%error, "writing the eval vector cache failed");
        }
    }
}
