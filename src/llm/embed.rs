//! Text embedders: the [`Embedder`] trait, a local CPU model — a sentence-transformers BERT
//! directory or a packed 4-bit multilingual-e5 — run by `mnemo-encoder` ([`LocalEmbedder`]),
//! and a client for
//! OpenAI-compatible `/embeddings` endpoints ([`OpenAiEmbedder`]).
//!
//! Every embedder returns unit-length (L2-normalised) vectors, so cosine
//! similarity equals the dot product.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use tokenizers::{Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

use mnemo_encoder::{BertEncoder, BertSettings, Tokens};

use crate::retry::{Attempt, RetryPolicy};

/// Texts per forward pass of the local model.
const LOCAL_BATCH: usize = 32;
/// Inputs per request to a remote embeddings API.
const REMOTE_BATCH: usize = 256;
/// Search queries of at most this many tokens in all (one question, or a few asked at once)
/// run on one thread. Measured with e5 on 2 cores (`docs/benchmarks.md`, "One thread for a
/// query"): a short query takes as long on one thread as on two when the machine is quiet,
/// and less when it is not — its products split over two threads wait for each other at
/// every layer, and a recall's own keyword search (a Qdrant server on the same cores) or an
/// ingest holds one of them. The other thread stays free for that work.
const QUERY_ONE_THREAD_ROWS: usize = 64;

/// Sequence length used when `sentence_bert_config.json` does not say.
const DEFAULT_MAX_SEQ: usize = 512;
/// Longest error body echoed from a remote API.
const MAX_ERROR_BODY: usize = 300;

/// Embedding failures.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    /// Model files missing, remote service down, rate limited, or auth refused.
    #[error("embedder unavailable: {0}")]
    Unavailable(String),
    /// Input or configuration the embedder cannot use.
    #[error("bad embedder input: {0}")]
    BadInput(String),
    /// Unexpected failure inside the embedder or a malformed response.
    #[error("embedder internal error: {0}")]
    Internal(String),
}

impl EmbedError {
    /// Stable, lowercase name of the variant, for metrics.
    #[cfg(test)]
    pub(crate) fn label(&self) -> &'static str {
        match self {
            EmbedError::Unavailable(_) => "unavailable",
            EmbedError::BadInput(_) => "bad_input",
            EmbedError::Internal(_) => "internal",
        }
    }
}

/// Turns texts into unit-length vectors of a fixed dimension.
#[async_trait]
pub trait Embedder: Send + Sync {
    /// Identifier of the model (its relevance calibration, reports, `/status`).
    fn model_id(&self) -> &str;
    /// What is stored next to the vectors of stored texts, so that a change of model or of
    /// arithmetic is noticed (and the vectors made again): the model id, and for a local
    /// model `@` and the arithmetic of its products (`multilingual-e5-small-q4@int8`).
    fn vectors_id(&self) -> &str {
        self.model_id()
    }
    /// An id stored by earlier versions next to vectors this embedder makes the same way:
    /// the bare model id a local model recorded before the arithmetic was, when its arithmetic
    /// is what `embedder.precision = "auto"` picks on this CPU (the default's). Such vectors
    /// are relabelled, not made again.
    fn earlier_vectors_id(&self) -> Option<&str> {
        None
    }
    /// Length of every returned vector.
    fn dimension(&self) -> usize;
    /// One vector per input text, in input order.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError>;
    /// Search queries' vectors: models trained with a query prompt (e5's `query: `) get it
    /// here, stored texts get theirs in [`Embedder::embed`].
    async fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed(texts).await
    }
    /// A search query's vector. The server's queue ([`super::embed_queue::EmbedQueue`]) runs
    /// queries ahead of bulk work and caches repeated ones.
    async fn embed_query(&self, text: &str) -> Result<Vec<f32>, EmbedError> {
        self.embed_queries(&[text.to_string()])
            .await?
            .pop()
            .ok_or_else(|| EmbedError::Internal("no vector returned".into()))
    }
}

fn l2_normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > f32::EPSILON {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

// ---------------------------------------------------------------------------
// Local candle BERT
// ---------------------------------------------------------------------------

pub(crate) use crate::config::Pooling;

#[derive(Deserialize)]
struct PoolingConfig {
    #[serde(default)]
    pooling_mode_cls_token: bool,
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
    #[serde(default)]
    pooling_mode_max_tokens: bool,
    #[serde(default)]
    pooling_mode_mean_sqrt_len_tokens: bool,
}

#[derive(Deserialize)]
struct SentenceBertConfig {
    max_seq_length: Option<usize>,
}

#[derive(Deserialize)]
struct ModuleEntry {
    #[serde(default)]
    path: String,
    #[serde(rename = "type", default)]
    kind: String,
}

/// A local embedding model on the CPU: a sentence-transformers BERT directory (e.g.
/// all-MiniLM-L6-v2) or a packed 4-bit multilingual-e5 file ([`mnemo_encoder::packed`]).
pub struct LocalEmbedder {
    model_id: String,
    /// `model_id@arithmetic` ([`Embedder::vectors_id`]).
    vectors_id: String,
    /// The bare model id when the arithmetic is the default's ([`Embedder::earlier_vectors_id`]).
    earlier_vectors_id: Option<String>,
    dimension: usize,
    inner: Arc<LocalModel>,
}

/// What a model directory does not say, or what the settings override.
#[derive(Clone, Debug, Default)]
pub(crate) struct LocalOptions {
    /// Threads of the model's matrix products (0: one per core).
    pub threads: usize,
    /// The arithmetic of the model's matrix products.
    pub precision: mnemo_encoder::Precision,
    /// Put before every search query (e5: `query: `); unset: the model's own.
    pub query_prefix: Option<String>,
    /// Put before every stored text (e5: `passage: `); unset: the model's own.
    pub passage_prefix: Option<String>,
    /// Unset: the model's own pooling.
    pub pooling: Option<Pooling>,
}

/// The tokenizer of a model directory (`tokenizer.json`) or of a packed model.
enum TextTokenizer {
    HuggingFace(Tokenizer),
    SentencePiece(super::unigram::SentencePieceTokenizer),
}

impl TextTokenizer {
    fn encode_batch(&self, texts: &[&str]) -> Result<Vec<tokenizers::Encoding>, String> {
        match self {
            Self::HuggingFace(tokenizer) => tokenizer
                .encode_batch(texts.to_vec(), true)
                .map_err(|e| e.to_string()),
            Self::SentencePiece(tokenizer) => tokenizer.encode_batch(texts),
        }
    }
}

struct LocalModel {
    encoder: BertEncoder,
    /// Truncates, never pads: the encoder packs the texts of a batch.
    tokenizer: TextTokenizer,
    /// The model's threads (`embedder.threads`).
    pool: rayon::ThreadPool,
    threads: usize,
    /// The arithmetic of the products in effect (read by the tests).
    #[cfg(test)]
    precision: mnemo_encoder::Precision,
    /// The forward pass's buffers, kept between batches (a batch that finds them taken, by
    /// the other lane's, uses its own).
    workspace: std::sync::Mutex<mnemo_encoder::Workspace>,
    pooling: Pooling,
    max_seq_len: usize,
    query_prefix: String,
    passage_prefix: String,
    /// Whether the model's pipeline ends in a `Normalize` module. Output is
    /// normalised regardless; this is kept for diagnostics.
    declares_normalize: bool,
}

impl std::fmt::Debug for LocalEmbedder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalEmbedder")
            .field("model_id", &self.model_id)
            .field("vectors_id", &self.vectors_id)
            .field("dimension", &self.dimension)
            .field("pooling", &self.inner.pooling)
            .field("max_seq_len", &self.inner.max_seq_len)
            .field("query_prefix", &self.inner.query_prefix)
            .field("passage_prefix", &self.inner.passage_prefix)
            .field("declares_normalize", &self.inner.declares_normalize)
            .finish()
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, EmbedError> {
    std::fs::read(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            EmbedError::Unavailable(format!("model file {} is missing", path.display()))
        } else {
            EmbedError::Unavailable(format!("read {}: {e}", path.display()))
        }
    })
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EmbedError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| EmbedError::BadInput(format!("parse {}: {e}", path.display())))
}

/// Like [`read_json`] but `Ok(None)` when the file does not exist.
fn read_optional_json<T: serde::de::DeserializeOwned>(
    path: &Path,
) -> Result<Option<T>, EmbedError> {
    if !path.exists() {
        return Ok(None);
    }
    read_json(path).map(Some)
}

/// The packed model file of `dir`: its one `*.bin` file that starts with the packed magic.
pub(crate) fn packed_model_file(dir: &Path) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "bin"))
        .filter(|path| {
            let mut magic = [0u8; 4];
            std::fs::File::open(path)
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic))
                .is_ok()
                && &magic == mnemo_encoder::packed::MAGIC
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// Whether `dir` holds a model the local embedder can load.
pub fn is_model_dir(dir: &Path) -> bool {
    dir.join("config.json").exists() || packed_model_file(dir).is_some()
}

/// The query and passage prompts a sentence-transformers directory declares.
#[derive(Deserialize, Default)]
struct SentenceTransformersConfig {
    #[serde(default)]
    prompts: std::collections::HashMap<String, String>,
}

/// The encoder, its tokenizer and what the directory says of pooling and prompts.
struct LoadedModel {
    encoder: BertEncoder,
    tokenizer: TextTokenizer,
    dimension: usize,
    pooling: Pooling,
    max_seq_len: usize,
    query_prefix: String,
    passage_prefix: String,
    declares_normalize: bool,
}

impl LocalEmbedder {
    /// Loads a model directory with the model's own settings, on every core: a Hugging Face /
    /// sentence-transformers layout (`config.json`, `tokenizer.json`, `model.safetensors`,
    /// optionally `modules.json`, the pooling config, `sentence_bert_config.json` and
    /// `config_sentence_transformers.json`'s prompts), or a directory holding a packed model
    /// `*.bin` (multilingual-e5-small in 4 bits: `query: `/`passage: ` prefixes, mean pooling).
    /// The model id is the directory name. Blocking (reads ~100 MB); call it at startup or
    /// from `spawn_blocking`.
    pub fn load(dir: &Path) -> Result<Self, EmbedError> {
        Self::load_with(dir, &LocalOptions::default())
    }

    /// [`LocalEmbedder::load`] with the model's thread budget (0: one per core).
    pub fn load_with_threads(dir: &Path, threads: usize) -> Result<Self, EmbedError> {
        Self::load_with(
            dir,
            &LocalOptions {
                threads,
                ..LocalOptions::default()
            },
        )
    }

    /// [`LocalEmbedder::load`] with settings that override the model's.
    pub(crate) fn load_with(dir: &Path, options: &LocalOptions) -> Result<Self, EmbedError> {
        let model_id = dir
            .file_name()
            .and_then(|n| n.to_str())
            .filter(|n| !n.is_empty())
            .ok_or_else(|| {
                EmbedError::BadInput(format!("model dir {} has no usable name", dir.display()))
            })?
            .to_string();
        if !dir.is_dir() {
            return Err(EmbedError::Unavailable(format!(
                "model directory {} does not exist",
                dir.display()
            )));
        }
        let mut loaded = if dir.join("config.json").exists() {
            Self::load_hugging_face(dir)?
        } else if let Some(file) = packed_model_file(dir) {
            Self::load_packed(&file)?
        } else {
            return Err(EmbedError::Unavailable(format!(
                "{} holds neither config.json (a Hugging Face model) nor a packed model .bin",
                dir.display()
            )));
        };
        let default = loaded.encoder.resolve(mnemo_encoder::Precision::Auto);
        let precision = loaded.encoder.set_precision(options.precision);
        let short_query = loaded.encoder.short_text_precision();
        if precision == options.precision || options.precision == mnemo_encoder::Precision::Auto {
            tracing::info!(
                model = %model_id,
                ?precision,
                ?short_query,
                "local embedding model loaded"
            );
        } else {
            tracing::info!(
                model = %model_id,
                asked = ?options.precision,
                ?precision,
                "local embedding model loaded; its products run in f32 (this CPU lacks what the \
                 asked arithmetic needs, AMX for bf16, AVX-512 VNNI or AVX2 for int8, or the \
                 model's widths do not fit its kernel)"
            );
        }
        let threads = if options.threads == 0 {
            std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
        } else {
            options.threads
        };
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("mnemo-embed-{i}"))
            .build()
            .map_err(|e| EmbedError::Internal(format!("embedding threads: {e}")))?;

        Ok(Self {
            vectors_id: format!("{model_id}@{}", precision.name()),
            earlier_vectors_id: (precision == default).then(|| model_id.clone()),
            model_id,
            dimension: loaded.dimension,
            inner: Arc::new(LocalModel {
                encoder: loaded.encoder,
                tokenizer: loaded.tokenizer,
                pool,
                threads,
                #[cfg(test)]
                precision,
                workspace: std::sync::Mutex::default(),
                pooling: options.pooling.unwrap_or(loaded.pooling),
                max_seq_len: loaded.max_seq_len,
                query_prefix: options.query_prefix.clone().unwrap_or(loaded.query_prefix),
                passage_prefix: options
                    .passage_prefix
                    .clone()
                    .unwrap_or(loaded.passage_prefix),
                declares_normalize: loaded.declares_normalize,
            }),
        })
    }

    fn load_hugging_face(dir: &Path) -> Result<LoadedModel, EmbedError> {
        let config: BertSettings = read_json(&dir.join("config.json"))?;

        // modules.json tells where the pooling config lives and whether a
        // Normalize module follows.
        let modules: Vec<ModuleEntry> =
            read_optional_json(&dir.join("modules.json"))?.unwrap_or_default();
        let pooling_dir: PathBuf = modules
            .iter()
            .find(|m| m.kind.ends_with(".Pooling"))
            .map(|m| dir.join(&m.path))
            .unwrap_or_else(|| dir.join("1_Pooling"));
        let declares_normalize = modules.iter().any(|m| m.kind.ends_with(".Normalize"));
        let pooling = match read_optional_json::<PoolingConfig>(&pooling_dir.join("config.json"))? {
            None => Pooling::Mean,
            Some(p) if p.pooling_mode_cls_token => Pooling::Cls,
            Some(p) if p.pooling_mode_mean_tokens => Pooling::Mean,
            Some(p) if p.pooling_mode_max_tokens || p.pooling_mode_mean_sqrt_len_tokens => {
                return Err(EmbedError::BadInput(
                    "unsupported pooling mode (only mean and cls are implemented)".into(),
                ));
            }
            Some(_) => Pooling::Mean,
        };
        let prompts: SentenceTransformersConfig =
            read_optional_json(&dir.join("config_sentence_transformers.json"))?.unwrap_or_default();
        let prompt = |names: &[&str]| {
            names
                .iter()
                .find_map(|name| prompts.prompts.get(*name).cloned())
                .unwrap_or_default()
        };

        let sbert: Option<SentenceBertConfig> =
            read_optional_json(&dir.join("sentence_bert_config.json"))?;
        let max_seq_len = sbert
            .and_then(|s| s.max_seq_length)
            .unwrap_or(DEFAULT_MAX_SEQ)
            .min(config.max_position_embeddings);
        if max_seq_len < 4 {
            return Err(EmbedError::BadInput(format!(
                "max sequence length {max_seq_len} is too small"
            )));
        }

        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).map_err(|e| {
            EmbedError::Unavailable(format!(
                "load tokenizer {}: {e}",
                dir.join("tokenizer.json").display()
            ))
        })?;
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length: max_seq_len,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| EmbedError::BadInput(format!("configure truncation: {e}")))?;
        tokenizer.with_padding(None);

        let weights = read_file(&dir.join("model.safetensors"))?;
        let encoder = BertEncoder::load(&config, &weights)
            .map_err(|e| EmbedError::BadInput(format!("load {}: {e}", dir.display())))?;
        Ok(LoadedModel {
            encoder,
            tokenizer: TextTokenizer::HuggingFace(tokenizer),
            dimension: config.hidden_size,
            pooling,
            max_seq_len,
            query_prefix: prompt(&["query"]),
            passage_prefix: prompt(&["passage", "document"]),
            declares_normalize,
        })
    }

    fn load_packed(file: &Path) -> Result<LoadedModel, EmbedError> {
        let bytes = read_file(file)?;
        let model = mnemo_encoder::packed::load(&bytes)
            .map_err(|e| EmbedError::BadInput(format!("load {}: {e}", file.display())))?;
        let max_seq_len = model.encoder.max_positions().min(DEFAULT_MAX_SEQ);
        let tokenizer = super::unigram::SentencePieceTokenizer::new(&model.vocabulary, max_seq_len)
            .map_err(|e| EmbedError::BadInput(format!("tokenizer of {}: {e}", file.display())))?;
        Ok(LoadedModel {
            dimension: model.encoder.hidden_size(),
            encoder: model.encoder,
            tokenizer: TextTokenizer::SentencePiece(tokenizer),
            pooling: Pooling::Mean,
            max_seq_len,
            // The prompts multilingual-e5 was trained with.
            query_prefix: "query: ".into(),
            passage_prefix: "passage: ".into(),
            declares_normalize: true,
        })
    }

    /// The arithmetic of the model's products in effect (`auto` resolved to what this CPU
    /// has; `bf16` or `int8` asked for on a CPU without what it needs runs in `f32`).
    #[cfg(test)]
    pub(crate) fn precision(&self) -> mnemo_encoder::Precision {
        self.inner.precision
    }

    /// Pooling mode read from the model directory.
    #[cfg(test)]
    pub(crate) fn pooling(&self) -> Pooling {
        self.inner.pooling
    }

    /// Token limit per text; longer texts are truncated.
    #[cfg(test)]
    pub(crate) fn max_seq_len(&self) -> usize {
        self.inner.max_seq_len
    }

    /// What is put before a search query and before a stored text.
    pub fn prefixes(&self) -> (&str, &str) {
        (&self.inner.query_prefix, &self.inner.passage_prefix)
    }

    /// The arithmetic of one short search query: 8 bits where `auto` runs batches in
    /// bfloat16 (one short text reads every weight once, and 8-bit weights are half the
    /// bytes), else [`Self::precision`]. Stored texts always run in [`Self::precision`].
    #[cfg(test)]
    pub(crate) fn short_query_precision(&self) -> mnemo_encoder::Precision {
        self.inner.encoder.short_text_precision()
    }

    async fn run(&self, texts: &[String], role: Role) -> Result<Vec<Vec<f32>>, EmbedError> {
        if texts.is_empty() {
            return Ok(Vec::new());
        }
        let model = Arc::clone(&self.inner);
        let texts = texts.to_vec();
        tokio::task::spawn_blocking(move || {
            let prefix = match role {
                Role::Query => &model.query_prefix,
                Role::Stored => &model.passage_prefix,
            };
            let mut out = Vec::with_capacity(texts.len());
            for chunk in texts.chunks(LOCAL_BATCH) {
                let prefixed: Vec<String>;
                let refs: Vec<&str> = if prefix.is_empty() {
                    chunk.iter().map(String::as_str).collect()
                } else {
                    prefixed = chunk.iter().map(|t| format!("{prefix}{t}")).collect();
                    prefixed.iter().map(String::as_str).collect()
                };
                out.extend(model.embed_batch(&refs, role)?);
            }
            Ok(out)
        })
        .await
        .map_err(|e| EmbedError::Internal(format!("embedding task failed: {e}")))?
    }
}

/// What a text is embedded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Role {
    /// Searched for: the query prompt, and the fastest arithmetic for the call's shape.
    Query,
    /// Stored or searched in: the passage prompt, and always the model's arithmetic, so that
    /// every stored vector is made the same way (the one its `vectors_id` names).
    Stored,
}

impl LocalModel {
    fn embed_batch(&self, texts: &[&str], role: Role) -> Result<Vec<Vec<f32>>, EmbedError> {
        let encodings = self
            .tokenizer
            .encode_batch(texts)
            .map_err(|e| EmbedError::Internal(format!("tokenize: {e}")))?;
        let tokens: Vec<Tokens<'_>> = encodings
            .iter()
            .map(|e| Tokens {
                ids: e.get_ids(),
                type_ids: e.get_type_ids(),
            })
            .collect();
        // A workspace left by a panic is as good as any: a pass writes every value it reads.
        let mut kept = match self.workspace.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
        let mut own = mnemo_encoder::Workspace::default();
        let workspace = kept.as_deref_mut().unwrap_or(&mut own);
        let arithmetic = match role {
            Role::Query => self.encoder.precision_for(&tokens),
            Role::Stored => self.encoder.precision(),
        };
        let rows: usize = tokens.iter().map(|t| t.ids.len()).sum();
        let threads = match role {
            Role::Query if rows <= QUERY_ONE_THREAD_ROWS => 1,
            _ => self.threads,
        };
        let packed = match self.pool.install(|| {
            self.encoder
                .forward_as(arithmetic, &tokens, threads, workspace)
        }) {
            Ok(packed) => packed,
            Err(e) => {
                workspace.trim();
                return Err(EmbedError::Internal(format!("encode: {e}")));
            }
        };
        let width = self.encoder.hidden_size();
        let mut rows = Vec::with_capacity(tokens.len());
        let mut start = 0;
        for text in &tokens {
            let len = text.ids.len();
            let own = &packed[start * width..(start + len) * width];
            start += len;
            let mut pooled = vec![0.0f32; width];
            match self.pooling {
                Pooling::Cls => {
                    if let Some(first) = own.get(..width) {
                        pooled.copy_from_slice(first);
                    }
                }
                Pooling::Mean => {
                    for token in own.chunks_exact(width) {
                        pooled.iter_mut().zip(token).for_each(|(p, v)| *p += v);
                    }
                    let count = len.max(1) as f32;
                    pooled.iter_mut().for_each(|p| *p /= count);
                }
            }
            rows.push(pooled);
        }
        workspace.trim();
        rows.iter_mut().for_each(|r| l2_normalize(r));
        Ok(rows)
    }
}

#[async_trait]
impl Embedder for LocalEmbedder {
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
        self.run(texts, Role::Stored).await
    }

    async fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.run(texts, Role::Query).await
    }
}

// ---------------------------------------------------------------------------
// OpenAI-compatible HTTP API
// ---------------------------------------------------------------------------

/// Client for `POST {base_url}/embeddings` (OpenAI, Azure-compatible
/// gateways, vLLM, Ollama, ...).
pub(crate) struct OpenAiEmbedder {
    client: reqwest::Client,
    base_url: String,
    api_key: Option<String>,
    model: String,
    dimension: usize,
    query_prefix: String,
    passage_prefix: String,
    retry: RetryPolicy,
}

/// A failed `/embeddings` call, and whether trying again may help.
struct CallFailed {
    error: EmbedError,
    again: Attempt,
}

impl CallFailed {
    fn fatal(error: EmbedError) -> Self {
        Self {
            error,
            again: Attempt::Final,
        }
    }
}

impl std::fmt::Display for CallFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::fmt::Debug for OpenAiEmbedder {
    // The key must never reach logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenAiEmbedder")
            .field("base_url", &self.base_url)
            .field("model", &self.model)
            .field("dimension", &self.dimension)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

#[derive(serde::Serialize)]
struct EmbeddingsRequest<'a> {
    model: &'a str,
    input: &'a [String],
}

#[derive(Deserialize)]
struct EmbeddingsResponse {
    data: Vec<EmbeddingItem>,
}

#[derive(Deserialize)]
struct EmbeddingItem {
    embedding: Vec<f32>,
    index: usize,
}

impl OpenAiEmbedder {
    /// `base_url` is the API root including the version, e.g.
    /// `https://api.openai.com/v1`. `dimension` must match what the model
    /// returns; every response is checked against it.
    pub(crate) fn new(
        base_url: impl Into<String>,
        api_key: Option<String>,
        model: impl Into<String>,
        dimension: usize,
    ) -> Result<Self, EmbedError> {
        let base_url = base_url.into().trim_end_matches('/').to_string();
        let model = model.into();
        if !(base_url.starts_with("http://") || base_url.starts_with("https://")) {
            return Err(EmbedError::BadInput(format!(
                "embeddings base URL must start with http:// or https://, got {base_url:?}"
            )));
        }
        if model.is_empty() {
            return Err(EmbedError::BadInput("embedding model name is empty".into()));
        }
        if dimension == 0 {
            return Err(EmbedError::BadInput(
                "embedding dimension must be > 0".into(),
            ));
        }
        let client = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .timeout(Duration::from_secs(120))
            .build()
            .map_err(|e| EmbedError::Internal(format!("build HTTP client: {e}")))?;
        Ok(Self {
            client,
            base_url,
            api_key: api_key.filter(|k| !k.is_empty()),
            model,
            dimension,
            query_prefix: String::new(),
            passage_prefix: String::new(),
            retry: RetryPolicy::never(),
        })
    }

    /// Tries failed calls again under `retry` (rate limits, server errors, network trouble;
    /// never a refused key or request).
    #[must_use]
    pub(crate) fn with_retry(mut self, retry: RetryPolicy) -> Self {
        self.retry = retry;
        self
    }

    /// Puts `query` before every search query and `passage` before every stored text (for a
    /// served model trained with prompts, e.g. e5's `query: ` / `passage: `).
    #[must_use]
    pub(crate) fn with_prefixes(mut self, query: String, passage: String) -> Self {
        self.query_prefix = query;
        self.passage_prefix = passage;
        self
    }

    async fn embed_with(
        &self,
        texts: &[String],
        prefix: &str,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let mut out = Vec::with_capacity(texts.len());
        for chunk in texts.chunks(REMOTE_BATCH) {
            if prefix.is_empty() {
                out.extend(self.embed_chunk(chunk).await?);
            } else {
                let prefixed: Vec<String> = chunk.iter().map(|t| format!("{prefix}{t}")).collect();
                out.extend(self.embed_chunk(&prefixed).await?);
            }
        }
        Ok(out)
    }

    fn redact(&self, text: &str) -> String {
        let mut text = crate::text::prefix(text, MAX_ERROR_BODY).to_string();
        if let Some(key) = &self.api_key {
            text = text.replace(key.as_str(), "<redacted>");
        }
        text
    }

    async fn embed_chunk(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.retry
            .run(
                "embeddings call",
                || self.embed_chunk_once(texts),
                |failed: &CallFailed| failed.again,
            )
            .await
            .map_err(|failed| failed.error)
    }

    async fn embed_chunk_once(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, CallFailed> {
        let url = format!("{}/embeddings", self.base_url);
        let mut request = self.client.post(&url).json(&EmbeddingsRequest {
            model: &self.model,
            input: texts,
        });
        if let Some(key) = &self.api_key {
            request = request.bearer_auth(key);
        }
        let response = request.send().await.map_err(|e| CallFailed {
            // reqwest errors carry the URL, never headers.
            error: EmbedError::Unavailable(format!("embeddings request to {url} failed: {e}")),
            again: Attempt::passing(!e.is_builder()),
        })?;
        let status = response.status();
        if !status.is_success() {
            let asked = crate::retry::retry_after(response.headers());
            let body = response.text().await.unwrap_or_default();
            let code = status.as_u16();
            let passing = Attempt::Again { after: asked };
            return Err(match code {
                401 | 403 => CallFailed::fatal(EmbedError::Unavailable(format!(
                    "embeddings API rejected the credentials (HTTP {code})"
                ))),
                408 | 429 => CallFailed {
                    error: EmbedError::Unavailable(format!(
                        "embeddings API rate limit exceeded (HTTP {code}): {}",
                        self.redact(&body)
                    )),
                    again: passing,
                },
                400..=499 => CallFailed::fatal(EmbedError::BadInput(format!(
                    "embeddings API refused the request (HTTP {code}): {}",
                    self.redact(&body)
                ))),
                _ => CallFailed {
                    error: EmbedError::Unavailable(format!(
                        "embeddings API error (HTTP {code}): {}",
                        self.redact(&body)
                    )),
                    again: passing,
                },
            });
        }
        self.read_vectors(response, texts.len())
            .await
            .map_err(CallFailed::fatal)
    }

    /// The vectors of a successful answer, checked against the inputs and the dimension.
    async fn read_vectors(
        &self,
        response: reqwest::Response,
        inputs: usize,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        let parsed: EmbeddingsResponse = response
            .json()
            .await
            .map_err(|e| EmbedError::Internal(format!("malformed embeddings response: {e}")))?;
        if parsed.data.len() != inputs {
            return Err(EmbedError::Internal(format!(
                "embeddings API returned {} vectors for {} inputs",
                parsed.data.len(),
                inputs
            )));
        }
        let mut slots: Vec<Option<Vec<f32>>> = vec![None; inputs];
        for item in parsed.data {
            if item.embedding.len() != self.dimension {
                return Err(EmbedError::Internal(format!(
                    "model {} returned dimension {}, configured {}",
                    self.model,
                    item.embedding.len(),
                    self.dimension
                )));
            }
            if item.embedding.iter().any(|x| !x.is_finite()) {
                return Err(EmbedError::Internal(
                    "embeddings API returned non-finite values".into(),
                ));
            }
            let slot = slots.get_mut(item.index).ok_or_else(|| {
                EmbedError::Internal(format!("embeddings API returned index {}", item.index))
            })?;
            if slot.replace(item.embedding).is_some() {
                return Err(EmbedError::Internal(format!(
                    "embeddings API returned index {} twice",
                    item.index
                )));
            }
        }
        slots
            .into_iter()
            .map(|slot| {
                let mut v = slot.ok_or_else(|| {
                    EmbedError::Internal("embeddings API skipped an input".into())
                })?;
                l2_normalize(&mut v);
                Ok(v)
            })
            .collect()
    }
}

#[async_trait]
impl Embedder for OpenAiEmbedder {
    fn model_id(&self) -> &str {
        &self.model
    }

    fn dimension(&self) -> usize {
        self.dimension
    }

    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_with(texts, &self.passage_prefix).await
    }

    async fn embed_queries(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        self.embed_with(texts, &self.query_prefix).await
    }
}

impl crate::error::HasKind for EmbedError {
    fn kind(&self) -> crate::error::ErrorKind {
        use crate::error::ErrorKind;
        match self {
            EmbedError::Unavailable(_) => ErrorKind::Unavailable,
            EmbedError::BadInput(_) => ErrorKind::BadRequest,
            EmbedError::Internal(_) => ErrorKind::Internal,
        }
    }
}

/// The embedder the settings name: the local model from `embedder.model_dir`, or an
/// OpenAI-compatible `/embeddings` endpoint.
pub async fn from_settings(
    config: &crate::config::EmbedderSettings,
) -> Result<Arc<dyn Embedder>, EmbedError> {
    use secrecy::ExposeSecret as _;
    if config.provider == crate::config::EmbedderProvider::Openai {
        let (Some(base_url), Some(model), Some(dimension)) =
            (&config.base_url, &config.model, config.dimension)
        else {
            return Err(EmbedError::BadInput(
                "embedder.provider = openai needs embedder.base_url, embedder.model and embedder.dimension".into(),
            ));
        };
        let key = config
            .api_key
            .as_ref()
            .map(|key| key.expose_secret().to_string());
        let embedder = OpenAiEmbedder::new(base_url, key, model, dimension)?
            .with_prefixes(
                config.query_prefix.clone().unwrap_or_default(),
                config.passage_prefix.clone().unwrap_or_default(),
            )
            .with_retry(RetryPolicy::new(
                config.max_retries,
                Duration::from_millis(config.retry_backoff_ms),
            ));
        return Ok(Arc::new(embedder));
    }
    let dir = config.model_dir.clone();
    if !is_model_dir(&dir) {
        return Err(EmbedError::Unavailable(format!(
            "no embedding model in {} (run scripts/fetch-model, or set embedder.model_dir)",
            dir.display()
        )));
    }
    let options = LocalOptions {
        threads: config.threads,
        precision: config.precision,
        query_prefix: config.query_prefix.clone(),
        passage_prefix: config.passage_prefix.clone(),
        pooling: config.pooling,
    };
    let embedder = tokio::task::spawn_blocking(move || LocalEmbedder::load_with(&dir, &options))
        .await
        .map_err(|error| EmbedError::Internal(error.to_string()))??;
    Ok(Arc::new(embedder))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    fn model_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("models/all-MiniLM-L6-v2")
    }

    /// The local model with the default settings; a test that needs it fails with a clear
    /// message when it is missing (`scripts/test` fetches it first).
    fn load_model() -> LocalEmbedder {
        load_model_in(mnemo_encoder::Precision::Auto)
    }

    /// The local model with its products in `precision`.
    fn load_model_in(precision: mnemo_encoder::Precision) -> LocalEmbedder {
        let dir = model_dir();
        assert!(
            dir.join("model.safetensors").exists(),
            "the embedding model is missing in {}: run scripts/fetch-model",
            dir.display()
        );
        let options = LocalOptions {
            precision,
            ..LocalOptions::default()
        };
        LocalEmbedder::load_with(&dir, &options).expect("load model")
    }

    fn dot(a: &[f32], b: &[f32]) -> f32 {
        a.iter().zip(b).map(|(x, y)| x * y).sum()
    }

    fn strings(texts: &[&str]) -> Vec<String> {
        texts.iter().map(std::string::ToString::to_string).collect()
    }

    #[tokio::test]
    async fn local_model_semantics() {
        let model = load_model();
        assert_eq!(model.model_id(), "all-MiniLM-L6-v2");
        assert_eq!(model.dimension(), 384);
        assert_eq!(model.pooling(), Pooling::Mean);
        assert_eq!(model.max_seq_len(), 256);

        let texts = strings(&[
            "The weather is lovely today.",
            "It's so sunny outside!",
            "He drove to the stadium.",
            "A man is eating food.",
            "A man is eating a piece of bread.",
            "A man is riding a horse.",
            "我喜欢在周末去爬山",
        ]);
        let v = model.embed(&texts).await.expect("embed");
        assert_eq!(v.len(), texts.len());
        for e in &v {
            assert_eq!(e.len(), 384);
            assert!((dot(e, e) - 1.0).abs() < 1e-4, "not unit length");
        }
        let sim = |a: usize, b: usize| dot(&v[a], &v[b]);
        for a in 0..texts.len() {
            for b in a + 1..texts.len() {
                println!("cos({a},{b}) = {:.4}", sim(a, b));
            }
        }
        // Reference values published for all-MiniLM-L6-v2 by sentence-transformers.
        let reference = [(0, 1, 0.6660), (0, 2, 0.1046), (1, 2, 0.1411)];
        for (a, b, want) in reference {
            let got = sim(a, b);
            assert!(
                (got - want).abs() < 0.005,
                "cos({a},{b}) = {got:.4}, reference {want:.4}"
            );
        }
        // Measured with this implementation.
        let measured = [
            (3, 4, 0.7553),
            (3, 5, 0.2474),
            (4, 5, 0.1442),
            (0, 6, 0.1349),
        ];
        for (a, b, want) in measured {
            let got = sim(a, b);
            assert!(
                (got - want).abs() < 0.01,
                "cos({a},{b}) = {got:.4}, measured earlier {want:.4}"
            );
        }
        assert!(
            sim(3, 4) > sim(3, 5) + 0.3,
            "similar pair must beat unrelated"
        );
        assert!(sim(0, 1) > sim(0, 2) + 0.3);
    }

    /// The encoder of `crates/encoder` against an independent implementation of BERT
    /// (candle-transformers), text by text, unpadded.
    #[tokio::test]
    async fn local_encoder_agrees_with_candle_transformers_bert() {
        use candle_core::{DType, Device, Tensor};
        use candle_transformers::models::bert::{BertModel, Config};
        let ours = load_model_in(mnemo_encoder::Precision::F32);
        let dir = model_dir();
        let config: Config =
            serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
        let weights = std::fs::read(dir.join("model.safetensors")).unwrap();
        let vb =
            candle_nn::VarBuilder::from_buffered_safetensors(weights, DType::F32, &Device::Cpu)
                .unwrap();
        let reference = BertModel::load(vb, &config).unwrap();
        let mut tokenizer = Tokenizer::from_file(dir.join("tokenizer.json")).unwrap();
        tokenizer
            .with_truncation(Some(TruncationParams {
                max_length: ours.max_seq_len(),
                ..Default::default()
            }))
            .unwrap();
        tokenizer.with_padding(None);
        let texts = strings(&[
            "",
            "hi",
            "My sister's birthday is on the 14th of May; she turns thirty.",
            "我喜欢在周末去爬山，也喜欢喝乌龙茶。",
            "Mixed 中文 and English, with punctuation！？",
            &"a long note about the garden and the weather ".repeat(40),
        ]);
        let got = ours.embed(&texts).await.unwrap();
        for (text, got) in texts.iter().zip(&got) {
            let encoding = tokenizer.encode(text.as_str(), true).unwrap();
            let len = encoding.get_ids().len();
            let tensor = |v: &[u32]| Tensor::from_vec(v.to_vec(), (1, len), &Device::Cpu).unwrap();
            let ids = tensor(encoding.get_ids());
            let types = tensor(encoding.get_type_ids());
            let mask = tensor(encoding.get_attention_mask());
            let hidden = reference.forward(&ids, &types, Some(&mask)).unwrap();
            let mut want: Vec<f32> = (hidden.sum(1).unwrap() / len as f64)
                .unwrap()
                .squeeze(0)
                .unwrap()
                .to_vec1()
                .unwrap();
            l2_normalize(&mut want);
            let cosine = dot(got, &want);
            assert!(cosine > 0.99999, "{text:?}: cosine {cosine}");
        }
    }

    /// The products in 8-bit integers against the same model in f32: every vector close, and
    /// the neighbours of each text the same.
    #[tokio::test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    async fn integer_products_keep_the_vectors_of_the_f32_model() {
        assert!(mnemo_encoder::int8::supported());
        reduced_products_keep_the_vectors(mnemo_encoder::Precision::Int8, 0.995).await;
    }

    /// The same for bfloat16 products on AMX tiles, which round less than 8-bit integers.
    #[tokio::test]
    #[cfg_attr(not(cpu_amx), ignore = "needs AMX tiles (x86 amx-tile, amx-bf16)")]
    async fn bf16_products_keep_the_vectors_of_the_f32_model() {
        assert!(
            mnemo_encoder::amx::supported(),
            "this CPU has AMX but Linux did not grant the tile state"
        );
        reduced_products_keep_the_vectors(mnemo_encoder::Precision::Bf16, 0.999).await;
    }

    /// One short search query runs in 8 bits wherever the CPU has an integer kernel; a long
    /// query, several at once and every stored text in the model's arithmetic (bfloat16 with
    /// AMX).
    #[tokio::test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    async fn one_short_query_runs_in_eight_bits_and_stored_texts_in_the_models_arithmetic() {
        use mnemo_encoder::Precision;
        let auto = load_model_in(Precision::Auto);
        let int8 = load_model_in(Precision::Int8);
        let batches = load_model_in(auto.precision());
        assert_eq!(auto.short_query_precision(), Precision::Int8);
        assert_eq!(batches.short_query_precision(), auto.precision());
        let short = strings(&["When is my sister's birthday?"]);
        let long = strings(&[&"what did I say about the garden and the weather ".repeat(4)]);
        let same = |a: &[Vec<f32>], b: &[Vec<f32>]| {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| dot(a, b) > 0.99999)
        };
        let one = auto.embed_queries(&short).await.unwrap();
        assert!(same(&one, &int8.embed_queries(&short).await.unwrap()));
        let one_long = auto.embed_queries(&long).await.unwrap();
        assert!(same(
            &one_long,
            &batches.embed_queries(&long).await.unwrap()
        ));
        let two = [short.clone(), short.clone()].concat();
        assert!(same(
            &auto.embed_queries(&two).await.unwrap(),
            &batches.embed_queries(&two).await.unwrap()
        ));
        let stored = auto.embed(&short).await.unwrap();
        assert!(same(&stored, &batches.embed(&short).await.unwrap()));
        // The query's arithmetic and the stored vectors' are held to f32 by the tests above
        // (int8 ≥ 0.995, bf16 ≥ 0.999), so a query in one finds vectors made in the other.
        assert!(dot(&one[0], &auto.embed_queries(&two).await.unwrap()[0]) > 0.99);
    }

    async fn reduced_products_keep_the_vectors(precision: mnemo_encoder::Precision, least: f32) {
        use mnemo_encoder::Precision;
        let exact = load_model_in(Precision::F32);
        let reduced = load_model_in(precision);
        assert_eq!(
            (exact.precision(), reduced.precision()),
            (Precision::F32, precision)
        );
        let texts = strings(&[
            "hi",
            "My sister's birthday is on the 14th of May; she turns thirty.",
            "When is my sister's birthday?",
            "I adopted a grey cat called Snowball from the shelter last spring.",
            "What is my cat's name?",
            "The quarterly report is due on Friday and the numbers are not in yet.",
            "Caroline went to the LGBTQ support group on 7 May 2023 and felt accepted.",
            "We should try the new ramen place near the station this weekend.",
            &"a long note about the garden and the weather ".repeat(40),
        ]);
        let (a, b) = (
            exact.embed(&texts).await.unwrap(),
            reduced.embed(&texts).await.unwrap(),
        );
        let mut lowest = 1.0f32;
        for (text, (a, b)) in texts.iter().zip(a.iter().zip(&b)) {
            let cosine = dot(a, b);
            lowest = lowest.min(cosine);
            assert!(
                cosine > least,
                "{text:?}: cosine {cosine} between {} and f32",
                precision.name()
            );
        }
        eprintln!(
            "lowest cosine between {} and f32: {lowest:.5}",
            precision.name()
        );
        let nearest = |vectors: &[Vec<f32>], i: usize| {
            (0..vectors.len()).filter(|&j| j != i).max_by(|&x, &y| {
                dot(&vectors[i], &vectors[x]).total_cmp(&dot(&vectors[i], &vectors[y]))
            })
        };
        // The nearest text by the reduced vectors is the f32 model's nearest, or a text the f32
        // model ranks within a hair of it (two unrelated texts can be near-ties).
        for (i, text) in texts.iter().enumerate() {
            let (exact_pick, reduced_pick) = (nearest(&a, i), nearest(&b, i));
            let (Some(exact_pick), Some(reduced_pick)) = (exact_pick, reduced_pick) else {
                panic!("no neighbours");
            };
            let (best, chosen) = (dot(&a[i], &a[exact_pick]), dot(&a[i], &a[reduced_pick]));
            assert!(
                chosen >= best - 0.002,
                "the nearest text to {text:?}: {} picked text {reduced_pick} (f32 similarity \
                 {chosen}), f32 text {exact_pick} ({best})",
                precision.name()
            );
        }
    }

    #[tokio::test]
    async fn local_model_batching_padding_and_truncation() {
        let model = load_model();
        let long = "memory ".repeat(2000);
        let texts = strings(&[
            "short",
            "a much longer sentence with many more tokens in it",
            "",
            &long,
        ]);
        let batched = model.embed(&texts).await.expect("batch");
        for (i, t) in texts.iter().enumerate() {
            let alone = model.embed(std::slice::from_ref(t)).await.expect("single");
            let diff: f32 = alone[0]
                .iter()
                .zip(&batched[i])
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(diff < 1e-4, "padding changed text {i}: max diff {diff}");
        }
        // More than one internal batch keeps order.
        let many: Vec<String> = (0..70).map(|i| format!("sentence number {i}")).collect();
        let out = model.embed(&many).await.expect("many");
        assert_eq!(out.len(), 70);
        let single = model.embed(&many[65..66]).await.expect("single");
        assert!(dot(&single[0], &out[65]) > 0.9999);
        assert!(model.embed(&[]).await.expect("empty").is_empty());
    }

    #[tokio::test]
    #[ignore = "benchmark; run with --ignored --nocapture"]
    async fn local_model_throughput() {
        let model = load_model();
        let texts: Vec<String> = (0..256)
            .map(|i| format!("User note {i}: I prefer green tea over coffee in the morning."))
            .collect();
        model.embed(&texts[..8]).await.expect("warm up");
        let start = std::time::Instant::now();
        model.embed(&texts).await.expect("embed");
        let secs = start.elapsed().as_secs_f64();
        println!("batch of 256: {secs:.3}s = {:.1} sentences/s", 256.0 / secs);
        let one = vec!["What did I say about my sister's birthday?".to_string()];
        let mut best = f64::MAX;
        for _ in 0..10 {
            let start = std::time::Instant::now();
            model.embed(&one).await.expect("embed");
            best = best.min(start.elapsed().as_secs_f64());
        }
        println!("single sentence: {:.2} ms (best of 10)", best * 1000.0);
    }

    #[test]
    fn load_reports_missing_directory() {
        let err = LocalEmbedder::load(Path::new("/nonexistent/model-dir")).expect_err("missing");
        assert!(matches!(err, EmbedError::Unavailable(_)), "{err}");
    }

    /// Serves one canned HTTP response per connection, `count` times, and
    /// returns the raw requests it received.
    async fn fake_server(
        responses: Vec<(u16, String)>,
    ) -> (String, tokio::task::JoinHandle<Vec<String>>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let handle = tokio::spawn(async move {
            let mut seen = Vec::new();
            for (status, body) in responses {
                let (mut sock, _) = listener.accept().await.expect("accept");
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Read headers, then the body by Content-Length.
                let header_end = loop {
                    let n = sock.read(&mut chunk).await.expect("read");
                    assert!(n > 0, "client closed early");
                    buf.extend_from_slice(&chunk[..n]);
                    if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                        break pos + 4;
                    }
                };
                let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                while buf.len() < header_end + len {
                    let n = sock.read(&mut chunk).await.expect("read body");
                    assert!(n > 0, "client closed mid-body");
                    buf.extend_from_slice(&chunk[..n]);
                }
                seen.push(String::from_utf8_lossy(&buf).into_owned());
                let reply = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                );
                sock.write_all(reply.as_bytes()).await.expect("write");
                sock.shutdown().await.ok();
            }
            seen
        });
        (format!("http://{addr}/v1/"), handle)
    }

    #[tokio::test]
    async fn openai_success_reorders_by_index_and_normalises() {
        let body = r#"{"object":"list","data":[
            {"object":"embedding","index":1,"embedding":[0.0,3.0,4.0]},
            {"object":"embedding","index":0,"embedding":[1.0,0.0,0.0]}
        ],"model":"m"}"#;
        let (url, server) = fake_server(vec![(200, body.to_string())]).await;
        let e =
            OpenAiEmbedder::new(url, Some("sk-secret-123".into()), "text-embed", 3).expect("new");
        assert_eq!(e.model_id(), "text-embed");
        assert!(!format!("{e:?}").contains("sk-secret-123"));
        let out = e
            .embed(&strings(&["first", "second"]))
            .await
            .expect("embed");
        assert_eq!(out, vec![vec![1.0, 0.0, 0.0], vec![0.0, 0.6, 0.8]]);
        let requests = server.await.expect("server");
        let req = &requests[0];
        assert!(req.starts_with("POST /v1/embeddings HTTP/1.1"), "{req}");
        assert!(
            req.to_lowercase()
                .contains("authorization: bearer sk-secret-123")
        );
        let json_start = req.find("\r\n\r\n").expect("body") + 4;
        let sent: serde_json::Value = serde_json::from_str(&req[json_start..]).expect("json");
        assert_eq!(
            sent,
            serde_json::json!({"model": "text-embed", "input": ["first", "second"]})
        );
    }

    #[tokio::test]
    async fn openai_prefixes_queries_and_passages_by_role() {
        let body =
            r#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[1.0,0.0]}]}"#;
        let (url, server) =
            fake_server(vec![(200, body.to_string()), (200, body.to_string())]).await;
        let e = OpenAiEmbedder::new(url, None, "e5", 2)
            .expect("new")
            .with_prefixes("query: ".into(), "passage: ".into());
        e.embed(&strings(&["my cat is Tom"])).await.expect("embed");
        e.embed_query("cat name").await.expect("embed a query");
        let requests = server.await.expect("server");
        let inputs: Vec<serde_json::Value> = requests
            .iter()
            .map(|req| {
                let json_start = req.find("\r\n\r\n").expect("body") + 4;
                let sent: serde_json::Value =
                    serde_json::from_str(&req[json_start..]).expect("json");
                sent["input"].clone()
            })
            .collect();
        assert_eq!(
            inputs,
            [
                serde_json::json!(["passage: my cat is Tom"]),
                serde_json::json!(["query: cat name"])
            ]
        );
    }

    #[tokio::test]
    async fn local_prefixes_come_from_the_model_unless_set() {
        // In f32 both lanes compute alike; under `auto` on a CPU with AMX one short query runs
        // in 8 bits and a stored text in bfloat16, and their vectors differ in the last digits
        // (which is not what this test is about).
        let model = load_model_in(mnemo_encoder::Precision::F32);
        assert_eq!(model.prefixes(), ("", ""), "MiniLM declares no prompts");
        let plain = model
            .embed(&strings(&["my cat is Tom"]))
            .await
            .expect("embed");
        assert_eq!(
            model
                .embed_queries(&strings(&["my cat is Tom"]))
                .await
                .expect("embed"),
            plain,
            "no prompt: a query is embedded as the text itself"
        );
        let prefixed = LocalEmbedder::load_with(
            &model_dir(),
            &LocalOptions {
                threads: 1,
                query_prefix: Some("query: ".into()),
                passage_prefix: Some("passage: ".into()),
                pooling: Some(Pooling::Cls),
                ..LocalOptions::default()
            },
        )
        .expect("load with options");
        assert_eq!(prefixed.prefixes(), ("query: ", "passage: "));
        assert_eq!(prefixed.pooling(), Pooling::Cls);
        let as_passage = prefixed
            .embed(&strings(&["my cat is Tom"]))
            .await
            .expect("embed");
        let as_query = prefixed
            .embed_queries(&strings(&["my cat is Tom"]))
            .await
            .expect("embed");
        assert_ne!(
            as_passage, as_query,
            "the prefixes differ, so do the vectors"
        );
        assert_ne!(as_passage, plain);
    }

    #[tokio::test]
    async fn a_rate_limited_embedding_call_is_tried_again_and_a_refused_key_is_not() {
        let ok = r#"{"data":[{"index":0,"embedding":[1.0,0.0,0.0]}]}"#.to_string();
        let (url, server) = fake_server(vec![
            (429, r#"{"error":"slow down"}"#.to_string()),
            (503, r#"{"error":"overloaded"}"#.to_string()),
            (200, ok),
        ])
        .await;
        let retry = RetryPolicy::new(3, Duration::from_millis(1));
        let e = OpenAiEmbedder::new(url, None, "m", 3)
            .expect("new")
            .with_retry(retry);
        let vectors = e.embed(&strings(&["x"])).await.expect("third call answers");
        assert_eq!(vectors, vec![vec![1.0, 0.0, 0.0]]);
        assert_eq!(server.await.expect("server").len(), 3);
        let (url, server) = fake_server(vec![(401, r#"{"error":"bad key"}"#.to_string())]).await;
        let e = OpenAiEmbedder::new(url, None, "m", 3)
            .expect("new")
            .with_retry(retry);
        assert_eq!(
            e.embed(&strings(&["x"]))
                .await
                .expect_err("refused")
                .label(),
            "unavailable"
        );
        // The fake answers once: a second call would find nobody listening, not hang.
        assert_eq!(server.await.expect("server").len(), 1);
    }

    #[tokio::test]
    async fn openai_errors_are_mapped_without_leaking_the_key() {
        let key = "sk-very-secret";
        let cases = vec![
            (
                401,
                format!(r#"{{"error":"Incorrect API key provided: {key}"}}"#),
            ),
            (400, format!(r#"{{"error":"bad input for key {key}"}}"#)),
            (429, r#"{"error":"slow down"}"#.to_string()),
            (503, r#"{"error":"overloaded"}"#.to_string()),
            (
                200,
                r#"{"data":[{"index":0,"embedding":[1.0,2.0]}]}"#.to_string(),
            ),
            (200, r#"{"data":[]}"#.to_string()),
            (200, "not json".to_string()),
        ];
        let expected_kinds = [
            "unavailable",
            "bad_input",
            "unavailable",
            "unavailable",
            "internal",
            "internal",
            "internal",
        ];
        let (url, server) = fake_server(cases).await;
        let e = OpenAiEmbedder::new(url, Some(key.into()), "m", 3).expect("new");
        for want in expected_kinds {
            let err = e.embed(&strings(&["x"])).await.expect_err("must fail");
            let text = err.to_string();
            assert_eq!(err.label(), want, "{text}");
            assert!(!text.contains(key), "key leaked: {text}");
        }
        server.await.expect("server");
        // Nothing listening: unavailable.
        let gone = OpenAiEmbedder::new("http://127.0.0.1:9/v1", None, "m", 3).expect("new");
        let err = gone.embed(&strings(&["x"])).await.expect_err("refused");
        assert_eq!(err.label(), "unavailable");
        assert!(matches!(
            OpenAiEmbedder::new("ftp://x", None, "m", 3),
            Err(EmbedError::BadInput(_))
        ));
    }
}
