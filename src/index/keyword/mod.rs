//! Per-user BM25 keyword index over memory contents, on tantivy 0.27.
//!
//! Owns the tantivy schema, the `mnemo` text analyzer (jieba segmentation for
//! CJK, lowercasing, English stop words and Snowball English stemming), the
//! `mnemo_han` analyzer (the characters and character pairs of every run of Han
//! characters, so a single character or part of a compound is found where jieba
//! keeps it inside a longer word), the single `IndexWriter`, and the reader.
//! Writes arrive as ordered batches of [`KeywordOp`] tagged with the store's
//! sequence number; each batch is one commit whose payload is that number, so
//! after a restart [`KeywordIndex::applied_seq`] tells the caller where to
//! resume replaying.
//!
//! User text never goes through tantivy's query parser: it is run through the
//! same analyzer and turned into an OR of term queries (a Chinese word also
//! through its Han n-grams, weighed lower), so no input can cause use a syntax
//! error. Every search is restricted to one user.
//!
//! The core methods are synchronous (tantivy does blocking I/O and CPU work);
//! from async code use the `*_async` wrappers, which run on tokio's blocking
//! pool.

use std::collections::hash_map::Entry;
use std::collections::{BTreeSet, HashMap};
use std::ops::Bound;
use std::path::Path;
use std::sync::atomic::{AtomicI64, Ordering};
// The writer keeps std's poisoning on purpose: a panic mid-batch marks it, and the next user
// rolls the partial batch back (`writer`). Other locks here are parking_lot's.
use std::sync::{Arc, Mutex, MutexGuard};

use crate::text::script::is_han;
use tantivy::collector::{Count, DocSetCollector, TopDocs};
use tantivy::columnar::Column;
use tantivy::directory::MmapDirectory;
use tantivy::index::SegmentId;
use tantivy::indexer::LogMergePolicy;
use tantivy::query::{
    BooleanQuery, BoostQuery, ConstScoreQuery, Occur, Query, RangeQuery, TermQuery, TermSetQuery,
};
use tantivy::schema::{
    FAST, Field, INDEXED, IndexRecordOption, STRING, Schema, TextFieldIndexing, TextOptions,
};
use tantivy::tokenizer::{
    Language, LowerCaser, RemoveLongFilter, Stemmer, StopWordFilter, TextAnalyzer, Token,
    TokenStream, Tokenizer,
};
use tantivy::{
    DocAddress, Index, IndexReader, IndexSettings, IndexWriter, ReloadPolicy, TantivyError, Term,
    doc,
};
use tantivy_jieba::{JiebaTokenStream, JiebaTokenizer};

use crate::index::vector::{IndexError, KindCondition, MAX_SEARCH_LIMIT, VectorFilter, View};
use crate::store::{MemoryId, UserId};

/// A query term in more than this share of a user's memories (and more than one of them)
/// says little about which one the query is after: it does not count towards a hit's coverage.
const INFORMATIVE_SHARE: f64 = 0.05;

/// tantivy's BM25 idf of a term in `n` of `total` documents.
fn bm25_idf(n: u64, total: u64) -> f64 {
    let x = ((total - n.min(total)) as f64 + 0.5) / (n as f64 + 0.5);
    (1.0 + x).ln()
}

/// The hits of one BM25 search, best first, and (when asked for) how much of the query each
/// covers: the idf of the informative query terms it holds (those in at most 5 % of the
/// user's memories) over the idf of all the query's terms. 0 for a hit that only shares
/// common words with the query, 1 for one holding every term; a memory's length does not
/// matter (its BM25 score does depend on it).
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct ViewHits {
    pub hits: Vec<(MemoryId, f32)>,
    /// One per hit, in the same order; empty unless asked for.
    pub coverage: Vec<f32>,
}

/// The informative words of one query for one user (see [`ViewHits`]), worked out by the
/// first view's search that needs them and reused by the other views' searches of the same
/// recall: they depend on the user's own-view statistics only, and counting them is the
/// costly part of coverage at a user with many memories.
#[derive(Debug, Clone, Default)]
pub(crate) struct InformativeWords(
    Arc<parking_lot::Mutex<Option<Vec<String>>>>,
    /// The same for keyword search on a server, with the words' idf.
    Arc<tokio::sync::OnceCell<sparse::WordStatistics>>,
);

impl InformativeWords {
    /// The words, computed by `compute` unless a search of another view already has. A
    /// second caller waits for the first instead of counting again; after a failure the next
    /// caller tries again.
    fn get_or_compute(
        &self,
        compute: impl FnOnce() -> Result<Vec<String>, IndexError>,
    ) -> Result<Vec<String>, IndexError> {
        let mut words = self.0.lock();
        if let Some(words) = words.as_ref() {
            return Ok(words.clone());
        }
        let computed = compute()?;
        *words = Some(computed.clone());
        Ok(computed)
    }

    /// The statistics of the words on a server, read by `read` unless a search of another
    /// view already has (a second caller waits for the first).
    async fn statistics<F>(
        &self,
        read: impl FnOnce() -> F,
    ) -> Result<sparse::WordStatistics, IndexError>
    where
        F: std::future::Future<Output = Result<sparse::WordStatistics, IndexError>>,
    {
        self.1.get_or_try_init(read).await.cloned()
    }
}

/// `(id, BM25 score)`, best first.
type Hits = Vec<(MemoryId, f32)>;

/// Name under which the analyzer is registered in the index's tokenizer manager.
pub(crate) const TOKENIZER_NAME: &str = "mnemo";
/// Name of the Han n-gram analyzer of the `*_han` fields.
pub(crate) const HAN_TOKENIZER_NAME: &str = "mnemo_han";

/// The weight of a Han n-gram match (a one-character word, or a pair of a longer word)
/// against a word match: a memory that holds the query's Chinese word as jieba segments it
/// scores on both fields and ranks above one that holds it only inside another word (乌龙茶
/// for 茶). Chosen on `eval/zh` with BM25 alone (0.25 and 0.5 lose 3–9 points of recall@5
/// on script variants and mixed queries).
const HAN_GRAM_BOOST: f32 = 1.0;
/// The weight of a lone character of a longer query word (喝 and 茶 of 喝茶), so a word that
/// occurs nowhere in one piece still finds memories holding its characters: on `eval/zh`
/// +5 points of recall@5 on questions, +4 on variants; 0.25 costs 5 on mixed queries.
const HAN_CHARACTER_BOOST: f32 = 0.1;

/// Same restrictions as the vector side.
pub(crate) type KeywordFilter = VectorFilter;

/// Fast-field names of the id's two halves.
const ID_HI: &str = "id_hi";
const ID_LO: &str = "id_lo";

/// Total indexing memory budget of the single writer thread.
const WRITER_MEMORY_BYTES: usize = 32 * 1024 * 1024;
/// Segments of about the same size merged together (tantivy's default is 8). Every search
/// looks each query term up in every segment, so at a few thousand documents the lookups,
/// not the postings, are the search; merging sooner keeps the index at a few segments.
const MERGE_MIN_SEGMENTS: usize = 3;
/// Tokens longer than this (in bytes) are dropped: base64 blobs, URLs, hashes.
const MAX_TOKEN_BYTES: usize = 64;

/// A memory as the keyword index sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeywordDoc {
    pub id: MemoryId,
    pub user_id: UserId,
    /// The memory's own view (for a turn: `[date] Speaker: text`).
    pub content: String,
    /// The context view (for a turn: with its neighbours; otherwise the own view again).
    pub context: String,
    pub kind: String,
    pub created_at_ms: i64,
    pub archived: bool,
    pub valid: bool,
}

/// One change to apply; a batch is applied in order and committed atomically.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeywordOp {
    /// Insert or replace the document with this id.
    Upsert(KeywordDoc),
    /// Remove one document; unknown ids are ignored.
    Delete(MemoryId),
    /// Remove every document of a user.
    DeleteUser(UserId),
}

#[derive(Clone, Copy)]
struct Fields {
    /// The memory id as text: the term that deletes and replaces a document.
    id: Field,
    /// The same id as two fast `u64` columns (high and low half): hits are turned into ids
    /// from columns instead of decompressing stored documents.
    id_hi: Field,
    id_lo: Field,
    user_id: Field,
    content: Field,
    context: Field,
    /// The Han characters and character pairs of `content` and `context`.
    content_han: Field,
    context_han: Field,
    kind: Field,
    created_at_ms: Field,
    archived: Field,
    valid: Field,
}

fn build_schema() -> (Schema, Fields) {
    let mut builder = Schema::builder();
    let content_options = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(TOKENIZER_NAME)
            // BM25 needs term frequencies only; no phrase queries are ever built.
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let han_options = TextOptions::default().set_indexing_options(
        TextFieldIndexing::default()
            .set_tokenizer(HAN_TOKENIZER_NAME)
            .set_index_option(IndexRecordOption::WithFreqs),
    );
    let fields = Fields {
        id: builder.add_text_field("id", STRING),
        id_hi: builder.add_u64_field(ID_HI, FAST),
        id_lo: builder.add_u64_field(ID_LO, FAST),
        user_id: builder.add_text_field("user_id", STRING | FAST),
        content: builder.add_text_field("content", content_options.clone()),
        context: builder.add_text_field("context", content_options),
        content_han: builder.add_text_field("content_han", han_options.clone()),
        context_han: builder.add_text_field("context_han", han_options),
        kind: builder.add_text_field("kind", STRING),
        created_at_ms: builder.add_i64_field("created_at_ms", INDEXED | FAST),
        archived: builder.add_bool_field("archived", INDEXED | FAST),
        valid: builder.add_bool_field("valid", INDEXED | FAST),
    };
    (builder.build(), fields)
}

/// Deletes the files of the index in `dir` (the directory itself stays).
fn remove_index_files(dir: &Path) -> Result<(), IndexError> {
    let failed = |e: std::io::Error| {
        IndexError::Unavailable(format!("clear keyword index dir {}: {e}", dir.display()))
    };
    for entry in std::fs::read_dir(dir).map_err(failed)? {
        let path = entry.map_err(failed)?.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path).map_err(failed)?;
        } else {
            std::fs::remove_file(&path).map_err(failed)?;
        }
    }
    Ok(())
}

mod analyzer;
pub(crate) mod sparse;
use analyzer::*;
pub(crate) use analyzer::{
    analyze, han_analyzer, informative_words, mnemo_analyzer, split_compounds,
};

fn tantivy_err(context: &str, err: TantivyError) -> IndexError {
    match err {
        TantivyError::LockFailure(..)
        | TantivyError::IoError(_)
        | TantivyError::OpenDirectoryError(_) => {
            IndexError::Unavailable(format!("{context}: {err}"))
        }
        TantivyError::SchemaError(_) | TantivyError::InvalidArgument(_) => {
            IndexError::BadInput(format!("{context}: {err}"))
        }
        other => IndexError::Internal(format!("{context}: {other}")),
    }
}

fn parse_seq(payload: Option<&str>) -> Result<i64, IndexError> {
    match payload {
        None => Ok(0),
        Some(p) => p.trim().parse::<i64>().map_err(|e| {
            IndexError::Internal(format!(
                "keyword index commit payload {p:?} is not a seq: {e}"
            ))
        }),
    }
}

/// The two fields of one view: its jieba words and its Han n-grams.
#[derive(Clone, Copy)]
struct ViewFields {
    words: Field,
    han: Field,
}

/// Documents whose view holds `word`: as the word itself, or (a Chinese word) as every one
/// of its Han n-grams — 茶 inside 乌龙茶, 咖啡 inside 咖啡机.
fn holding_query(fields: ViewFields, word: &QueryWord) -> Box<dyn Query> {
    let whole: Box<dyn Query> = Box::new(TermQuery::new(
        Term::from_field_text(fields.words, &word.word),
        IndexRecordOption::Basic,
    ));
    if word.grams.is_empty() {
        return whole;
    }
    let every_gram = word
        .grams
        .iter()
        .map(|gram| {
            let q: Box<dyn Query> = Box::new(TermQuery::new(
                Term::from_field_text(fields.han, gram),
                IndexRecordOption::Basic,
            ));
            (Occur::Must, q)
        })
        .collect();
    Box::new(BooleanQuery::new(vec![
        (Occur::Should, whole),
        (Occur::Should, Box::new(BooleanQuery::new(every_gram))),
    ]))
}

/// Where a deployment's keyword search runs.
#[derive(Clone, Debug)]
pub enum KeywordSearch {
    /// This process's tantivy index (the embedded default: one per data directory).
    Local(KeywordIndex),
    /// The vector index's keyword vectors, which the indexer writes with each point's
    /// vectors, made by this analyser ([`sparse`]): nothing held by the process.
    Beside(sparse::SparseAnalyzer),
}

impl KeywordSearch {
    /// This process's tantivy index, if keyword search runs there.
    pub fn local(&self) -> Option<&KeywordIndex> {
        match self {
            KeywordSearch::Local(local) => Some(local),
            KeywordSearch::Beside(_) => None,
        }
    }

    /// Where it runs, in a few words.
    pub fn place(&self) -> &'static str {
        match self {
            KeywordSearch::Local(_) => "in the replica (tantivy)",
            KeywordSearch::Beside(_) => "on the Qdrant server",
        }
    }
}

/// Tantivy index plus its writer and reader. Cheap to clone (shared state).
#[derive(Clone)]
pub struct KeywordIndex {
    inner: Arc<Inner>,
}

struct Inner {
    reader: IndexReader,
    writer: Mutex<IndexWriter>,
    analyzer: TextAnalyzer,
    fields: Fields,
    applied_seq: AtomicI64,
    /// Each segment's id columns, opened once: a segment's columns never change (a delete
    /// only marks its documents), and opening them decodes their metadata, which cost a
    /// small user's search as much as scoring it. Pruned to the live segments at each reload.
    id_columns: parking_lot::Mutex<HashMap<SegmentId, IdColumns>>,
}

/// The high and low halves of the memory ids of one segment's documents.
type IdColumns = (Column<u64>, Column<u64>);

impl std::fmt::Debug for KeywordIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeywordIndex")
            .field("applied_seq", &self.applied_seq())
            .finish_non_exhaustive()
    }
}

impl KeywordIndex {
    /// Opens the index in `dir` (created if missing) or, with `None`, a fresh
    /// in-memory index (tests, ephemeral use).
    pub fn open(dir: Option<&Path>) -> Result<Self, IndexError> {
        let (schema, fields) = build_schema();
        let index = match dir {
            None => Index::create_in_ram(schema),
            Some(dir) => {
                std::fs::create_dir_all(dir).map_err(|e| {
                    IndexError::Unavailable(format!(
                        "create keyword index dir {}: {e}",
                        dir.display()
                    ))
                })?;
                let directory = MmapDirectory::open(dir).map_err(|e| {
                    IndexError::Unavailable(format!(
                        "open keyword index dir {}: {e}",
                        dir.display()
                    ))
                })?;
                match Index::open_or_create(directory.clone(), schema.clone()) {
                    // An index written by an older mnemo: the index is derived data, so it
                    // is started afresh (applied seq 0) and the indexer refills it from the
                    // memory log.
                    Err(TantivyError::SchemaError(reason)) => {
                        tracing::warn!(
                            dir = %dir.display(),
                            %reason,
                            "keyword index has another schema; rebuilding it from the memory log"
                        );
                        remove_index_files(dir)?;
                        Index::create(directory, schema, IndexSettings::default())
                            .map_err(|e| tantivy_err("recreate keyword index", e))?
                    }
                    opened => opened.map_err(|e| tantivy_err("open keyword index", e))?,
                }
            }
        };
        let analyzer = mnemo_analyzer()?;
        index
            .tokenizers()
            .register(TOKENIZER_NAME, analyzer.clone());
        index
            .tokenizers()
            .register(HAN_TOKENIZER_NAME, han_analyzer());
        let writer: IndexWriter = index
            .writer_with_num_threads(1, WRITER_MEMORY_BYTES)
            .map_err(|e| tantivy_err("open keyword index writer", e))?;
        let mut merges = LogMergePolicy::default();
        merges.set_min_num_segments(MERGE_MIN_SEGMENTS);
        writer.set_merge_policy(Box::new(merges));
        // A process killed in the middle of a commit can leave files that no `meta.json`
        // references (e.g. a new delete file); replaying the batch would then collide with
        // them. Remove them before anything is applied.
        writer
            .garbage_collect_files()
            .wait()
            .map_err(|e| tantivy_err("clean up keyword index files", e))?;
        let reader = index
            .reader_builder()
            .reload_policy(ReloadPolicy::Manual)
            .try_into()
            .map_err(|e| tantivy_err("open keyword index reader", e))?;
        let metas = index
            .load_metas()
            .map_err(|e| tantivy_err("read keyword index metadata", e))?;
        let applied = parse_seq(metas.payload.as_deref())?;
        Ok(Self {
            inner: Arc::new(Inner {
                reader,
                writer: Mutex::new(writer),
                analyzer,
                fields,
                applied_seq: AtomicI64::new(applied),
                id_columns: parking_lot::Mutex::new(HashMap::new()),
            }),
        })
    }

    /// Sequence number recorded by the last commit (0 for a new index).
    pub fn applied_seq(&self) -> i64 {
        self.inner.applied_seq.load(Ordering::Acquire)
    }

    /// Applies `ops` in order and commits them as one unit recording `seq`.
    ///
    /// Upserts delete any previous document with the same id first, so
    /// re-applying a batch is harmless. The changes are searchable as soon as
    /// this returns. On error nothing of the batch is kept.
    pub fn apply(&self, ops: &[KeywordOp], seq: i64) -> Result<(), IndexError> {
        let f = self.inner.fields;
        let mut writer = self.writer()?;
        let staged = (|| -> Result<(), IndexError> {
            for op in ops {
                match op {
                    KeywordOp::Upsert(d) => {
                        let (hi, lo) = d.id.as_uuid().as_u64_pair();
                        let id = d.id.as_uuid().to_string();
                        writer.delete_term(Term::from_field_text(f.id, &id));
                        writer
                            .add_document(doc!(
                                f.id => id,
                                f.id_hi => hi,
                                f.id_lo => lo,
                                f.user_id => d.user_id.as_uuid().to_string(),
                                f.content => split_compounds(&d.content),
                                f.context => split_compounds(&d.context),
                                f.content_han => d.content.as_str(),
                                f.context_han => d.context.as_str(),
                                f.kind => d.kind.as_str(),
                                f.created_at_ms => d.created_at_ms,
                                f.archived => d.archived,
                                f.valid => d.valid,
                            ))
                            .map_err(|e| tantivy_err("add document", e))?;
                    }
                    KeywordOp::Delete(id) => {
                        writer.delete_term(Term::from_field_text(f.id, &id.as_uuid().to_string()));
                    }
                    KeywordOp::DeleteUser(user) => {
                        writer.delete_term(Term::from_field_text(
                            f.user_id,
                            &user.as_uuid().to_string(),
                        ));
                    }
                }
            }
            let mut prepared = writer
                .prepare_commit()
                .map_err(|e| tantivy_err("prepare commit", e))?;
            prepared.set_payload(&seq.to_string());
            prepared.commit().map_err(|e| tantivy_err("commit", e))?;
            Ok(())
        })();
        if let Err(err) = staged {
            // Best effort: drop the half-staged batch so the next apply starts clean.
            let _ = writer.rollback();
            return Err(err);
        }
        self.inner.applied_seq.store(seq, Ordering::Release);
        drop(writer);
        self.reload()
    }

    /// Removes every document and resets the applied seq to 0 (for rebuilds).
    pub(crate) fn clear(&self) -> Result<(), IndexError> {
        let mut writer = self.writer()?;
        writer
            .delete_all_documents()
            .map_err(|e| tantivy_err("delete all documents", e))?;
        let mut prepared = writer
            .prepare_commit()
            .map_err(|e| tantivy_err("prepare commit", e))?;
        prepared.set_payload("0");
        prepared.commit().map_err(|e| tantivy_err("commit", e))?;
        self.inner.applied_seq.store(0, Ordering::Release);
        drop(writer);
        self.reload()
    }

    /// Makes the last commit searchable, and forgets the id columns of the segments it no
    /// longer has (merged away or cleared).
    fn reload(&self) -> Result<(), IndexError> {
        self.inner
            .reader
            .reload()
            .map_err(|e| tantivy_err("reload keyword reader", e))?;
        let live: std::collections::HashSet<SegmentId> = self
            .inner
            .reader
            .searcher()
            .segment_readers()
            .iter()
            .map(tantivy::SegmentReader::segment_id)
            .collect();
        self.inner
            .id_columns
            .lock()
            .retain(|id, _| live.contains(id));
        Ok(())
    }

    /// BM25 search of `query` over `user`'s memories that pass `filter`.
    /// Returns `(id, score)` best first; an empty or all-stop-word query
    /// returns nothing. `limit` is clamped to [`MAX_SEARCH_LIMIT`].
    pub fn search(
        &self,
        user: UserId,
        query: &str,
        filter: &KeywordFilter,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, IndexError> {
        self.search_view(user, query, View::Own, filter, limit)
    }

    /// BM25 search of `query` over one view of `user`'s memories.
    pub(crate) fn search_view(
        &self,
        user: UserId,
        query: &str,
        view: View,
        filter: &KeywordFilter,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, IndexError> {
        Ok(self
            .search_view_covered(user, query, view, filter, limit, false)?
            .hits)
    }

    /// [`Self::search_view`], and with `covered` how much of the query each hit covers
    /// ([`ViewHits::coverage`]).
    pub(crate) fn search_view_covered(
        &self,
        user: UserId,
        query: &str,
        view: View,
        filter: &KeywordFilter,
        limit: usize,
        covered: bool,
    ) -> Result<ViewHits, IndexError> {
        let informative = covered.then(InformativeWords::default);
        self.search_view_sharing(user, query, view, filter, limit, informative.as_ref())
    }

    /// [`Self::search_view_covered`] with the coverage's informative words shared with the
    /// searches of the other views of the same query and user (`None`: no coverage).
    pub(crate) fn search_view_sharing(
        &self,
        user: UserId,
        query: &str,
        view: View,
        filter: &KeywordFilter,
        limit: usize,
        informative: Option<&InformativeWords>,
    ) -> Result<ViewHits, IndexError> {
        if limit == 0 || filter.is_unsatisfiable() {
            return Ok(ViewHits::default());
        }
        let words = self.query_terms(query);
        if words.is_empty() {
            return Ok(ViewHits::default());
        }
        let fields = self.view_fields(view);
        let searcher = self.inner.reader.searcher();
        let (addresses, hits) = self.top_hits(&searcher, user, fields, &words, filter, limit)?;
        let Some(informative) = informative.filter(|_| !hits.is_empty()) else {
            return Ok(ViewHits {
                hits,
                coverage: Vec::new(),
            });
        };
        // Each word weighs its idf (the index's statistics; a word the index has never seen
        // weighs the most), and a hit covers the weight of the informative words it holds —
        // as a word, or (a Chinese word) as its characters inside other words.
        let total = tantivy::query::Bm25StatisticsProvider::total_num_docs(&searcher)
            .map_err(|e| tantivy_err("keyword statistics", e))?;
        let mut query_weight = 0.0f64;
        let mut weights = HashMap::new();
        for word in &words {
            let n = searcher
                .doc_freq(&Term::from_field_text(fields.words, &word.word))
                .map_err(|e| tantivy_err("keyword statistics", e))?;
            let weight = bm25_idf(n, total);
            query_weight += weight;
            weights.insert(word.word.as_str(), weight);
        }
        let mut held = vec![0.0f64; addresses.len()];
        // The hits in index order, so each word's postings are read forward once.
        let mut order: Vec<usize> = (0..addresses.len()).collect();
        order.sort_unstable_by_key(|&i| (addresses[i].segment_ord, addresses[i].doc_id));
        let informative = informative.get_or_compute(|| {
            Ok(self
                .informative_terms(&searcher, user, &words)?
                .into_iter()
                .map(|word| word.word.clone())
                .collect())
        })?;
        for word in words.iter().filter(|word| informative.contains(&word.word)) {
            let weight = weights.get(word.word.as_str()).copied().unwrap_or_default();
            for i in Self::hits_holding(&searcher, fields, word, &addresses, &order)? {
                held[i] += weight;
            }
        }
        let coverage = held
            .into_iter()
            .map(|held| (held / query_weight) as f32)
            .collect();
        Ok(ViewHits { hits, coverage })
    }

    /// Which of the hits (`addresses`, visited in `order`: by segment, then document) hold
    /// `word` in the view (`fields`): each segment's postings of the word are sought forward
    /// to the hits alone. The hits are the user's live documents already, so neither the
    /// user's postings nor the word's other holders are read.
    fn hits_holding(
        searcher: &tantivy::Searcher,
        fields: ViewFields,
        word: &QueryWord,
        addresses: &[DocAddress],
        order: &[usize],
    ) -> Result<Vec<usize>, IndexError> {
        use tantivy::DocSet as _;
        let weight = holding_query(fields, word)
            .weight(tantivy::query::EnableScoring::disabled_from_searcher(
                searcher,
            ))
            .map_err(|e| tantivy_err("keyword coverage", e))?;
        let mut holding = Vec::new();
        let mut scorer: Option<(u32, Box<dyn tantivy::query::Scorer>)> = None;
        for &i in order {
            let address = addresses[i];
            let segment = match &mut scorer {
                Some((ord, scorer)) if *ord == address.segment_ord => scorer,
                _ => {
                    let reader = searcher.segment_reader(address.segment_ord);
                    let opened = weight
                        .scorer(reader, 1.0)
                        .map_err(|e| tantivy_err("keyword coverage", e))?;
                    &mut scorer.insert((address.segment_ord, opened)).1
                }
            };
            let mut doc = segment.doc();
            if doc < address.doc_id {
                doc = segment.seek(address.doc_id);
            }
            if doc == address.doc_id {
                holding.push(i);
            }
        }
        Ok(holding)
    }

    /// The query's informative words ([`informative_words`]), each with the Han n-grams
    /// that find it inside other words.
    fn query_terms(&self, query: &str) -> Vec<QueryWord> {
        let mut analyzer = self.inner.analyzer.clone();
        informative_words(&mut analyzer, query)
            .into_iter()
            .map(QueryWord::new)
            .collect()
    }

    fn view_fields(&self, view: View) -> ViewFields {
        let f = self.inner.fields;
        match view {
            View::Own => ViewFields {
                words: f.content,
                han: f.content_han,
            },
            View::Context => ViewFields {
                words: f.context,
                han: f.context_han,
            },
        }
    }

    /// The best `limit` of `user`'s memories passing `filter` for an OR of `words` in the
    /// view's word field and of their Han n-grams, weighed [`HAN_GRAM_BOOST`], in its Han
    /// field.
    fn top_hits(
        &self,
        searcher: &tantivy::Searcher,
        user: UserId,
        fields: ViewFields,
        words: &[QueryWord],
        filter: &KeywordFilter,
        limit: usize,
    ) -> Result<(Vec<DocAddress>, Hits), IndexError> {
        let grams: BTreeSet<&str> = words
            .iter()
            .flat_map(|word| word.grams.iter().map(String::as_str))
            .collect();
        // The lone characters of longer words, weighed least: 喝茶 finds 喝…乌龙茶.
        let characters: BTreeSet<String> = words
            .iter()
            .filter(|word| !word.grams.is_empty() && word.word.chars().count() > 1)
            .flat_map(|word| word.word.chars().map(String::from))
            .filter(|character| !grams.contains(character.as_str()))
            .collect();
        let text: Vec<(Occur, Box<dyn Query>)> = words
            .iter()
            .map(|word| {
                let q: Box<dyn Query> = Box::new(TermQuery::new(
                    Term::from_field_text(fields.words, &word.word),
                    IndexRecordOption::WithFreqs,
                ));
                (Occur::Should, q)
            })
            .chain(grams.into_iter().map(|gram| {
                let q: Box<dyn Query> = Box::new(BoostQuery::new(
                    Box::new(TermQuery::new(
                        Term::from_field_text(fields.han, gram),
                        IndexRecordOption::WithFreqs,
                    )),
                    HAN_GRAM_BOOST,
                ));
                (Occur::Should, q)
            }))
            .chain(characters.iter().map(|character| {
                let q: Box<dyn Query> = Box::new(BoostQuery::new(
                    Box::new(TermQuery::new(
                        Term::from_field_text(fields.han, character),
                        IndexRecordOption::WithFreqs,
                    )),
                    HAN_CHARACTER_BOOST,
                ));
                (Occur::Should, q)
            }))
            .collect();
        let mut clauses: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, Box::new(BooleanQuery::new(text)))];
        for (occur, filter_query) in self.filter_queries(user, filter) {
            // Filters must not add to the BM25 score.
            clauses.push((occur, Box::new(ConstScoreQuery::new(filter_query, 0.0))));
        }
        let query = BooleanQuery::new(clauses);
        let top = searcher
            .search(
                &query,
                &TopDocs::with_limit(limit.min(MAX_SEARCH_LIMIT)).order_by_score(),
            )
            .map_err(|e| tantivy_err("keyword search", e))?;
        let addresses: Vec<DocAddress> = top.iter().map(|(_, addr)| *addr).collect();
        let ids = self.memory_ids(searcher, addresses.iter().copied())?;
        let hits = ids
            .into_iter()
            .zip(top)
            .map(|(id, (score, _))| (id, score))
            .collect();
        Ok((addresses, hits))
    }

    /// The words in at most [`INFORMATIVE_SHARE`] of the user's memories (own view, as a word
    /// or as Han n-grams): the ones that say which memory a query is about. Counting stops at
    /// the share, so a common word costs no more than that many postings.
    fn informative_terms<'w>(
        &self,
        searcher: &tantivy::Searcher,
        user: UserId,
        words: &'w [QueryWord],
    ) -> Result<Vec<&'w QueryWord>, IndexError> {
        let fields = self.view_fields(View::Own);
        let user_term =
            Term::from_field_text(self.inner.fields.user_id, &user.as_uuid().to_string());
        let memories = searcher
            .doc_freq(&user_term)
            .map_err(|e| tantivy_err("keyword statistics", e))?;
        // A word of a single memory singles it out however few the user has.
        let most = ((INFORMATIVE_SHARE * memories as f64).floor() as u64).max(1);
        let statistics = |field: Field, text: &str| {
            searcher
                .doc_freq(&Term::from_field_text(field, text))
                .map_err(|e| tantivy_err("keyword statistics", e))
        };
        let mut informative = Vec::new();
        for word in words {
            // At most this many documents of all users hold the word in either form.
            let mut anywhere = statistics(fields.words, &word.word)?;
            if !word.grams.is_empty() {
                let mut rarest = u64::MAX;
                for gram in &word.grams {
                    rarest = rarest.min(statistics(fields.han, gram)?);
                }
                anywhere += rarest;
            }
            if anywhere <= most
                || self.user_docs_with(searcher, user, holding_query(fields, word), most)? <= most
            {
                informative.push(word);
            }
        }
        Ok(informative)
    }

    /// How many of `user`'s live documents match `query`, counted up to `stop + 1`.
    fn user_docs_with(
        &self,
        searcher: &tantivy::Searcher,
        user: UserId,
        query: Box<dyn Query>,
        stop: u64,
    ) -> Result<u64, IndexError> {
        use tantivy::{DocSet as _, TERMINATED};
        let both = BooleanQuery::new(vec![
            (Occur::Must, query),
            (Occur::Must, Box::new(self.user_query(user))),
        ]);
        let weight = both
            .weight(tantivy::query::EnableScoring::disabled_from_searcher(
                searcher,
            ))
            .map_err(|e| tantivy_err("keyword statistics", e))?;
        let mut count = 0u64;
        for reader in searcher.segment_readers() {
            let mut scorer = weight
                .scorer(reader, 1.0)
                .map_err(|e| tantivy_err("keyword statistics", e))?;
            let alive = reader.alive_bitset();
            let mut doc = scorer.doc();
            while doc != TERMINATED {
                if alive.is_none_or(|alive| alive.is_alive(doc)) {
                    count += 1;
                    if count > stop {
                        return Ok(count);
                    }
                }
                doc = scorer.advance();
            }
        }
        Ok(count)
    }

    /// Number of documents stored for `user`.
    pub(crate) fn count(&self, user: UserId) -> Result<u64, IndexError> {
        let searcher = self.inner.reader.searcher();
        let n = searcher
            .search(&self.user_query(user), &Count)
            .map_err(|e| tantivy_err("keyword count", e))?;
        Ok(n as u64)
    }

    /// Segments a search visits now (each query term is looked up in every one).
    pub fn segments(&self) -> usize {
        self.inner.reader.searcher().segment_readers().len()
    }

    /// Every document id stored for `user`.
    pub fn ids(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
        let searcher = self.inner.reader.searcher();
        let docs = searcher
            .search(&self.user_query(user), &DocSetCollector)
            .map_err(|e| tantivy_err("keyword ids", e))?;
        let mut docs: Vec<DocAddress> = docs.into_iter().collect();
        docs.sort();
        self.memory_ids(&searcher, docs)
    }

    /// [`Self::apply`] on the blocking pool.
    pub(crate) async fn apply_async(
        &self,
        ops: Vec<KeywordOp>,
        seq: i64,
    ) -> Result<(), IndexError> {
        self.blocking(move |k| k.apply(&ops, seq)).await
    }

    /// [`Self::search`] on the blocking pool.
    pub async fn search_async(
        &self,
        user: UserId,
        query: String,
        filter: KeywordFilter,
        limit: usize,
    ) -> Result<Vec<(MemoryId, f32)>, IndexError> {
        self.blocking(move |k| k.search(user, &query, &filter, limit))
            .await
    }

    /// [`Self::search_view_sharing`] on the blocking pool.
    pub(crate) async fn search_view_sharing_async(
        &self,
        user: UserId,
        query: String,
        view: View,
        filter: KeywordFilter,
        limit: usize,
        informative: Option<InformativeWords>,
    ) -> Result<ViewHits, IndexError> {
        self.blocking(move |k| {
            k.search_view_sharing(user, &query, view, &filter, limit, informative.as_ref())
        })
        .await
    }

    /// [`Self::count`] on the blocking pool.
    pub async fn count_async(&self, user: UserId) -> Result<u64, IndexError> {
        self.blocking(move |k| k.count(user)).await
    }

    /// [`Self::ids`] on the blocking pool.
    pub async fn ids_async(&self, user: UserId) -> Result<Vec<MemoryId>, IndexError> {
        self.blocking(move |k| k.ids(user)).await
    }

    /// [`Self::clear`] on the blocking pool.
    pub(crate) async fn clear_async(&self) -> Result<(), IndexError> {
        self.blocking(KeywordIndex::clear).await
    }

    async fn blocking<T, F>(&self, f: F) -> Result<T, IndexError>
    where
        T: Send + 'static,
        F: FnOnce(&KeywordIndex) -> Result<T, IndexError> + Send + 'static,
    {
        let this = self.clone();
        tokio::task::spawn_blocking(move || f(&this))
            .await
            .map_err(IndexError::from_join)?
    }

    /// Locks the writer; after a panic mid-batch, discards the partial batch.
    fn writer(&self) -> Result<MutexGuard<'_, IndexWriter>, IndexError> {
        match self.inner.writer.lock() {
            Ok(guard) => Ok(guard),
            Err(poisoned) => {
                let mut guard = poisoned.into_inner();
                guard
                    .rollback()
                    .map_err(|e| tantivy_err("roll back after panic", e))?;
                self.inner.writer.clear_poison();
                Ok(guard)
            }
        }
    }

    fn user_query(&self, user: UserId) -> TermQuery {
        TermQuery::new(
            Term::from_field_text(self.inner.fields.user_id, &user.as_uuid().to_string()),
            IndexRecordOption::Basic,
        )
    }

    /// The restrictions every search carries, as `Must` / `MustNot` clauses. Exclusions are
    /// preferred where they are equivalent: their posting lists are short (archived or
    /// invalid memories, the few kinds left out), while the matching lists (not archived,
    /// every ordinary kind) span nearly the whole index.
    fn filter_queries(&self, user: UserId, filter: &KeywordFilter) -> Vec<(Occur, Box<dyn Query>)> {
        let f = self.inner.fields;
        let mut out: Vec<(Occur, Box<dyn Query>)> =
            vec![(Occur::Must, Box::new(self.user_query(user)))];
        let kind_terms = |kinds: Vec<String>| {
            kinds
                .into_iter()
                .map(move |k| Term::from_field_text(f.kind, &k))
        };
        match filter.kind_condition() {
            KindCondition::Any => {}
            KindCondition::OneOf(kinds) => {
                out.push((Occur::Must, Box::new(TermSetQuery::new(kind_terms(kinds)))));
            }
            KindCondition::NoneOf(kinds) => {
                for term in kind_terms(kinds) {
                    out.push((
                        Occur::MustNot,
                        Box::new(TermQuery::new(term, IndexRecordOption::Basic)),
                    ));
                }
            }
        }
        if filter.since_ms.is_some() || filter.until_ms.is_some() {
            let lower = filter.since_ms.map_or(Bound::Unbounded, |ms| {
                Bound::Included(Term::from_field_i64(f.created_at_ms, ms))
            });
            let upper = filter.until_ms.map_or(Bound::Unbounded, |ms| {
                Bound::Excluded(Term::from_field_i64(f.created_at_ms, ms))
            });
            out.push((Occur::Must, Box::new(RangeQuery::new(lower, upper))));
        }
        if !filter.include_archived {
            out.push((
                Occur::MustNot,
                Box::new(TermQuery::new(
                    Term::from_field_bool(f.archived, true),
                    IndexRecordOption::Basic,
                )),
            ));
        }
        if !filter.include_invalid {
            out.push((
                Occur::MustNot,
                Box::new(TermQuery::new(
                    Term::from_field_bool(f.valid, false),
                    IndexRecordOption::Basic,
                )),
            ));
        }
        out
    }

    /// Memory ids of `addrs`, in order, read from the id columns.
    fn memory_ids(
        &self,
        searcher: &tantivy::Searcher,
        addrs: impl IntoIterator<Item = DocAddress>,
    ) -> Result<Vec<MemoryId>, IndexError> {
        let mut columns: HashMap<u32, IdColumns> = HashMap::new();
        addrs
            .into_iter()
            .map(|addr| {
                let (hi, lo) = match columns.entry(addr.segment_ord) {
                    Entry::Occupied(entry) => entry.into_mut(),
                    Entry::Vacant(entry) => {
                        entry.insert(self.id_columns_of(searcher, addr.segment_ord)?)
                    }
                };
                match (hi.first(addr.doc_id), lo.first(addr.doc_id)) {
                    (Some(hi), Some(lo)) => {
                        Ok(MemoryId::from_uuid(uuid::Uuid::from_u64_pair(hi, lo)))
                    }
                    _ => Err(IndexError::Internal(
                        "keyword document without an id".into(),
                    )),
                }
            })
            .collect()
    }

    /// The id columns of the searcher's segment `ord`, from the cache or opened (and kept).
    fn id_columns_of(
        &self,
        searcher: &tantivy::Searcher,
        ord: u32,
    ) -> Result<IdColumns, IndexError> {
        let segment = searcher.segment_reader(ord);
        let mut cache = self.inner.id_columns.lock();
        if let Some(columns) = cache.get(&segment.segment_id()) {
            return Ok(columns.clone());
        }
        let fast = segment.fast_fields();
        let column = |name: &str| {
            fast.u64(name)
                .map_err(|e| tantivy_err("open the id column", e))
        };
        let columns = (column(ID_HI)?, column(ID_LO)?);
        cache.insert(segment.segment_id(), columns.clone());
        Ok(columns)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn analysis_never_panics_and_splitting_keeps_length(text in "\\PC{0,200}") {
            let split = split_compounds(&text);
            proptest::prop_assert_eq!(split.chars().count(), text.chars().count());
            let mut analyzer = mnemo_analyzer().unwrap();
            for token in analyze(&mut analyzer, &split) {
                proptest::prop_assert!(!token.is_empty());
            }
        }
    }

    fn user() -> UserId {
        UserId::for_tests()
    }

    fn mem() -> MemoryId {
        MemoryId::new()
    }

    fn kdoc(id: MemoryId, user: UserId, content: &str) -> KeywordDoc {
        KeywordDoc {
            id,
            user_id: user,
            content: content.into(),
            context: content.to_string(),
            kind: "fact".into(),
            created_at_ms: 1000,
            archived: false,
            valid: true,
        }
    }

    fn ids(hits: &[(MemoryId, f32)]) -> Vec<MemoryId> {
        hits.iter().map(|h| h.0).collect()
    }

    #[test]
    fn analyzer_table() {
        let mut analyzer = mnemo_analyzer().expect("analyzer");
        let cases: &[(&str, &[&str])] = &[
            (
                "The Runners were running quickly to the mountains!",
                &["runner", "were", "run", "quick", "mountain"],
            ),
            (
                "I like hiking, cats & dogs.",
                &["i", "like", "hike", "cat", "dog"],
            ),
            (
                "我喜欢在周末去爬山",
                &["我", "喜欢", "在", "周末", "去", "爬山"],
            ),
            (
                "我们明天去北京大学",
                &["我们", "明天", "去", "北京", "大学", "北京大学"],
            ),
            // Search mode also emits the dictionary sub-words of long words.
            (
                "用Rust写服务器",
                &["用", "rust", "写", "服务", "务器", "服务器"],
            ),
            ("foo:bar \"unbalanced (", &["foo", "bar", "unbalanc"]),
            ("   ,,, !!! ", &[]),
        ];
        let mut mismatches = Vec::new();
        for (text, expected) in cases {
            let got = analyze(&mut analyzer, text);
            if &got != expected {
                mismatches.push(format!("{text:?}: got {got:?}, want {expected:?}"));
            }
        }
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    }

    #[tokio::test]
    async fn english_and_chinese_search_with_user_isolation() {
        let index = KeywordIndex::open(None).expect("open");
        let (alice, bob) = (user(), user());
        let (hike_en, cook_en, hike_zh, bob_hike) = (mem(), mem(), mem(), mem());
        index
            .apply(
                &[
                    KeywordOp::Upsert(kdoc(
                        hike_en,
                        alice,
                        "Alice loves hiking in the Alps every summer",
                    )),
                    KeywordOp::Upsert(kdoc(
                        cook_en,
                        alice,
                        "Alice is learning to cook Sichuan food",
                    )),
                    KeywordOp::Upsert(kdoc(hike_zh, alice, "我喜欢在周末去爬山")),
                    KeywordOp::Upsert(kdoc(bob_hike, bob, "Bob hikes too, and 也喜欢爬山")),
                ],
                1,
            )
            .expect("apply");
        // Visible immediately after apply returns.
        let hits = index
            .search(alice, "hikes", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![hike_en]);
        assert!(hits[0].1 > 0.0);
        let hits = index
            .search(alice, "爬山", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![hike_zh]);
        let hits = index
            .search(alice, "周末有什么活动", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![hike_zh]);
        // OR semantics, more matching terms rank higher.
        let hits = index
            .search(alice, "cooking food hiking", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![cook_en, hike_en]);
        // Bob only ever sees Bob's documents.
        let hits = index
            .search(bob, "hiking 爬山 alice cook", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![bob_hike]);
        assert_eq!(index.count(alice).expect("count"), 3);
        assert_eq!(index.count(bob).expect("count"), 1);
        let mut expected = vec![hike_en, cook_en, hike_zh];
        expected.sort();
        let mut got = index.ids(alice).expect("ids");
        got.sort();
        assert_eq!(got, expected);
        // Async wrappers.
        let hits = index
            .search_async(alice, "alps".into(), KeywordFilter::default(), 5)
            .await
            .expect("search_async");
        assert_eq!(ids(&hits), vec![hike_en]);
        assert_eq!(index.count_async(bob).await.expect("count_async"), 1);
    }

    /// Forty of `user`'s memories sharing "like", and `boat` (`text`) among them.
    fn liked_items_and_boat(user: UserId, boat: MemoryId, text: &str) -> Vec<KeywordOp> {
        let mut ops: Vec<KeywordOp> = (0..40)
            .map(|i| KeywordOp::Upsert(kdoc(mem(), user, &format!("Alice: I like item {i}"))))
            .collect();
        ops.push(KeywordOp::Upsert(kdoc(boat, user, text)));
        ops
    }

    /// Coverage counts only the informative query terms: a word in most of the user's
    /// memories covers nothing, a rare one a share in line with its weight in the query.
    #[test]
    fn coverage_counts_the_terms_that_single_memories_out() {
        let index = KeywordIndex::open(None).expect("open");
        let (alice, bob) = (user(), user());
        let boat = mem();
        let mut ops = liked_items_and_boat(
            alice,
            boat,
            "Alice: I like my boat Seabiscuit, Seabiscuit is fast",
        );
        // Bob's memories count in the index's statistics, not in Alice's shares.
        ops.extend((0..40).map(|_| KeywordOp::Upsert(kdoc(mem(), bob, "Bob: Seabiscuit"))));
        index.apply(&ops, 1).expect("apply");
        let covered = |query: &str| {
            index
                .search_view_covered(alice, query, View::Own, &KeywordFilter::default(), 50, true)
                .expect("search")
        };
        let found = covered("Do I like Seabiscuit?");
        assert_eq!(found.hits.len(), 41, "every memory shares \"like\"");
        assert_eq!(found.coverage.len(), found.hits.len());
        assert_eq!(found.hits[0].0, boat);
        let boat_coverage = found.coverage[0];
        assert!(
            boat_coverage > 0.1 && boat_coverage < 1.0,
            "{boat_coverage}"
        );
        assert!(
            found.coverage[1..].iter().all(|coverage| *coverage == 0.0),
            "\"like\" is in every memory: {:?}",
            found.coverage
        );
        // A query word no memory holds pulls coverage down: it could have matched.
        let with_unknown = covered("Seabiscuit zanzibar");
        assert!(with_unknown.coverage[0] < covered("Seabiscuit").coverage[0]);
        // Not asked for, not computed.
        let plain = index
            .search_view_covered(
                alice,
                "Seabiscuit",
                View::Own,
                &KeywordFilter::default(),
                50,
                false,
            )
            .expect("search");
        assert!(plain.coverage.is_empty() && plain.hits.len() == 1);
    }

    /// The searches of both views share one query's informative words: each view's coverage
    /// is what it is alone, and the words are worked out once (the second view's search reuses
    /// the first's even after the index has changed in between).
    #[test]
    fn views_share_the_informative_words() {
        let index = KeywordIndex::open(None).expect("open");
        let alice = user();
        let (boat, next) = (mem(), mem());
        let mut ops = liked_items_and_boat(alice, boat, "Alice: I like my boat Seabiscuit");
        let mut turn = kdoc(next, alice, "Alice: it is fast");
        turn.context = "Alice: I like my boat Seabiscuit\nAlice: it is fast".into();
        ops.push(KeywordOp::Upsert(turn));
        index.apply(&ops, 1).expect("apply");
        let query = "Do I like Seabiscuit?";
        let alone = |view| {
            index
                .search_view_covered(alice, query, view, &KeywordFilter::default(), 50, true)
                .expect("search")
        };
        let shared = InformativeWords::default();
        let sharing = |view| {
            index
                .search_view_sharing(
                    alice,
                    query,
                    view,
                    &KeywordFilter::default(),
                    50,
                    Some(&shared),
                )
                .expect("search")
        };
        let own = sharing(View::Own);
        assert_eq!(own, alone(View::Own));
        let context = sharing(View::Context);
        assert_eq!(context, alone(View::Context));
        let position = context
            .hits
            .iter()
            .position(|(id, _)| *id == next)
            .expect("the next turn holds Seabiscuit in its context view");
        assert!(context.coverage[position] > 0.0, "{context:?}");
        // Seabiscuit in every memory makes it common for a fresh count, not for this query's.
        let common: Vec<KeywordOp> = (0..40)
            .map(|i| KeywordOp::Upsert(kdoc(mem(), alice, &format!("Alice: Seabiscuit {i}"))))
            .collect();
        index.apply(&common, 2).expect("apply");
        let fresh = alone(View::Context);
        let reused = sharing(View::Context);
        let coverage_of = |found: &ViewHits| {
            let at = found
                .hits
                .iter()
                .position(|(id, _)| *id == next)
                .expect("hit");
            found.coverage[at]
        };
        assert_eq!(coverage_of(&fresh), 0.0, "{fresh:?}");
        assert!(coverage_of(&reused) > 0.0, "{reused:?}");
    }

    /// Coverage reads each word's postings at the hits alone: hits spread over segments, in
    /// any score order, each get the weights of exactly the words they hold.
    #[test]
    fn coverage_is_right_for_hits_in_several_segments() {
        let index = KeywordIndex::open(None).expect("open");
        let alice = user();
        let (both, kayak_first, kayak_second, red, gone) = (mem(), mem(), mem(), mem(), mem());
        let filler = |from: usize| -> Vec<KeywordOp> {
            (from..from + 40)
                .map(|i| KeywordOp::Upsert(kdoc(mem(), alice, &format!("Alice: note {i}"))))
                .collect()
        };
        let mut first = filler(0);
        first.push(KeywordOp::Upsert(kdoc(
            kayak_first,
            alice,
            "Alice: a kayak trip",
        )));
        first.push(KeywordOp::Upsert(kdoc(gone, alice, "Alice: the red kayak")));
        first.push(KeywordOp::Upsert(kdoc(red, alice, "Alice: a red scarf")));
        index.apply(&first, 1).expect("apply");
        let mut second = filler(40);
        second.push(KeywordOp::Upsert(kdoc(both, alice, "Alice: my red kayak")));
        second.push(KeywordOp::Upsert(kdoc(
            kayak_second,
            alice,
            "Alice: kayak lessons",
        )));
        second.push(KeywordOp::Delete(gone));
        index.apply(&second, 2).expect("apply");
        assert!(index.segments() >= 2, "{} segments", index.segments());
        let found = index
            .search_view_covered(
                alice,
                "red kayak",
                View::Own,
                &KeywordFilter::default(),
                50,
                true,
            )
            .expect("search");
        let coverage: HashMap<MemoryId, f32> = found
            .hits
            .iter()
            .map(|(id, _)| *id)
            .zip(found.coverage.iter().copied())
            .collect();
        assert_eq!(coverage.len(), 4, "{coverage:?}");
        assert!(!coverage.contains_key(&gone), "a deleted memory is no hit");
        assert!((coverage[&both] - 1.0).abs() < 1e-6, "{coverage:?}");
        let kayak = coverage[&kayak_first];
        assert_eq!(kayak, coverage[&kayak_second], "{coverage:?}");
        assert!(kayak > 0.0 && kayak < 1.0, "{coverage:?}");
        assert!((kayak + coverage[&red] - 1.0).abs() < 1e-6, "{coverage:?}");
    }

    #[test]
    fn filters() {
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        let mk = |kind: &str, created: i64, archived: bool, valid: bool| {
            let mut d = kdoc(mem(), u, "coffee every morning");
            d.kind = kind.into();
            d.created_at_ms = created;
            d.archived = archived;
            d.valid = valid;
            d
        };
        let docs = [
            mk("fact", 1000, false, true),
            mk("preference", 2000, false, true),
            mk("fact", 3000, true, true),
            mk("event", 4000, false, false),
            mk("document", 5000, false, true),
        ];
        let ops: Vec<KeywordOp> = docs.iter().cloned().map(KeywordOp::Upsert).collect();
        index.apply(&ops, 7).expect("apply");
        let run = |filter: KeywordFilter| {
            let mut got = ids(&index.search(u, "coffee", &filter, 10).expect("search"));
            got.sort();
            got
        };
        let pick = |idx: &[usize]| {
            let mut v: Vec<MemoryId> = idx.iter().map(|i| docs[*i].id).collect();
            v.sort();
            v
        };
        let all = KeywordFilter {
            include_archived: true,
            include_invalid: true,
            ..KeywordFilter::default()
        };
        assert_eq!(run(KeywordFilter::default()), pick(&[0, 1, 4]));
        assert_eq!(run(all.clone()), pick(&[0, 1, 2, 3, 4]));
        // The ordinary kinds (every kind but `document`) are searched as an exclusion.
        let ordinary = KeywordFilter {
            kinds: Some(
                crate::store::MemoryKind::ordinary()
                    .into_iter()
                    .map(|kind| kind.as_str().to_string())
                    .collect(),
            ),
            ..KeywordFilter::default()
        };
        assert!(matches!(
            ordinary.kind_condition(),
            KindCondition::NoneOf(_)
        ));
        assert_eq!(run(ordinary), pick(&[0, 1]));
        assert_eq!(
            run(KeywordFilter {
                include_archived: true,
                ..KeywordFilter::default()
            }),
            pick(&[0, 1, 2, 4])
        );
        assert_eq!(
            run(KeywordFilter {
                kinds: Some(vec!["fact".into(), "event".into()]),
                ..all.clone()
            }),
            pick(&[0, 2, 3])
        );
        assert_eq!(
            run(KeywordFilter {
                since_ms: Some(2000),
                until_ms: Some(4000),
                ..all.clone()
            }),
            pick(&[1, 2])
        );
        assert!(
            run(KeywordFilter {
                kinds: Some(vec![]),
                ..all
            })
            .is_empty()
        );
    }

    #[test]
    fn ids_stay_right_while_segments_come_and_merge() {
        // Each commit is a segment; merges replace them with new ones while the id columns of
        // the old ones stay cached. Every search must still name the right memories.
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        let words = [
            "amber", "basalt", "cobalt", "dune", "ember", "fjord", "garnet", "heath", "indigo",
            "jasper", "kelp", "lagoon",
        ];
        let mut live: Vec<(MemoryId, &str)> = Vec::new();
        for (seq, word) in words.iter().enumerate() {
            let id = mem();
            let mut batch = vec![KeywordOp::Upsert(kdoc(id, u, &format!("{word} stone")))];
            // Every third commit also rewrites the oldest memory under a new word.
            if seq % 3 == 2 {
                let (old, _) = live.remove(0);
                batch.push(KeywordOp::Upsert(kdoc(old, u, &format!("{word}-again"))));
                live.push((old, "again"));
            }
            index.apply(&batch, seq as i64 + 1).expect("apply");
            live.push((id, word));
            for (id, word) in &live {
                let hits = index
                    .search(u, word, &KeywordFilter::default(), 10)
                    .expect("search");
                assert!(ids(&hits).contains(id), "{word}: {hits:?}");
            }
            let mut all = index.ids(u).expect("ids");
            let mut expected: Vec<MemoryId> = live.iter().map(|(id, _)| *id).collect();
            all.sort();
            expected.sort();
            assert_eq!(all, expected);
        }
        // The reload after a clear forgets the columns of the segments it removed.
        index.clear().expect("clear");
        let cached = index.inner.id_columns.lock().len();
        assert_eq!(cached, 0);
    }

    #[test]
    fn idempotent_reapply_delete_and_delete_user() {
        let index = KeywordIndex::open(None).expect("open");
        let (u, other) = (user(), user());
        let (a, b, c) = (mem(), mem(), mem());
        let batch = vec![
            KeywordOp::Upsert(kdoc(a, u, "red apples")),
            KeywordOp::Upsert(kdoc(b, u, "green apples")),
            KeywordOp::Upsert(kdoc(c, other, "apples for the other user")),
        ];
        index.apply(&batch, 1).expect("apply");
        index.apply(&batch, 1).expect("re-apply");
        assert_eq!(index.count(u).expect("count"), 2);
        assert_eq!(index.applied_seq(), 1);
        // Upsert replaces content.
        index
            .apply(&[KeywordOp::Upsert(kdoc(a, u, "yellow bananas"))], 2)
            .expect("apply");
        let hits = index
            .search(u, "apples", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![b]);
        assert_eq!(index.count(u).expect("count"), 2);
        // Delete (unknown ids fine), then delete-user, then upsert in the same batch.
        index
            .apply(&[KeywordOp::Delete(b), KeywordOp::Delete(mem())], 3)
            .expect("delete");
        assert_eq!(index.ids(u).expect("ids"), vec![a]);
        let d = mem();
        index
            .apply(
                &[
                    KeywordOp::DeleteUser(u),
                    KeywordOp::Upsert(kdoc(d, u, "fresh start")),
                ],
                4,
            )
            .expect("delete user");
        assert_eq!(index.ids(u).expect("ids"), vec![d]);
        assert_eq!(index.count(other).expect("count"), 1);
        assert_eq!(index.applied_seq(), 4);
        index.clear().expect("clear");
        assert_eq!(index.count(u).expect("count"), 0);
        assert_eq!(index.count(other).expect("count"), 0);
        assert_eq!(index.applied_seq(), 0);
    }

    #[test]
    fn applied_seq_and_docs_survive_reopen() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keyword");
        let u = user();
        let a = mem();
        {
            let index = KeywordIndex::open(Some(&path)).expect("open");
            assert_eq!(index.applied_seq(), 0);
            index
                .apply(&[KeywordOp::Upsert(kdoc(a, u, "persistent memory"))], 41)
                .expect("apply");
            index.apply(&[], 42).expect("empty batch still records seq");
        }
        let index = KeywordIndex::open(Some(&path)).expect("reopen");
        assert_eq!(index.applied_seq(), 42);
        let hits = index
            .search(u, "persistent", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![a]);
    }

    #[test]
    fn an_index_with_another_schema_is_started_afresh() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keyword");
        {
            // An index as an older mnemo might have left it: another schema, a recorded seq.
            std::fs::create_dir_all(&path).expect("mkdir");
            let mut builder = Schema::builder();
            let id = builder.add_text_field("id", STRING);
            let old = Index::create_in_dir(&path, builder.build()).expect("old index");
            let mut writer: IndexWriter = old.writer(15_000_000).expect("writer");
            writer.add_document(doc!(id => "x")).expect("add");
            let mut prepared = writer.prepare_commit().expect("prepare");
            prepared.set_payload("17");
            prepared.commit().expect("commit");
        }
        let index = KeywordIndex::open(Some(&path)).expect("open despite the old schema");
        assert_eq!(
            index.applied_seq(),
            0,
            "the log must be replayed from the start"
        );
        let (u, a) = (user(), mem());
        index
            .apply(&[KeywordOp::Upsert(kdoc(a, u, "rebuilt from the log"))], 1)
            .expect("apply");
        let hits = index
            .search(u, "rebuilt", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![a]);
        drop(index);
        assert_eq!(
            KeywordIndex::open(Some(&path))
                .expect("reopen")
                .applied_seq(),
            1
        );
    }

    #[test]
    fn han_grams_table() {
        let mut analyzer = han_analyzer();
        let cases: &[(&str, &[&str])] = &[
            ("乌龙茶", &["乌", "乌龙", "龙", "龙茶", "茶"]),
            // Punctuation, full-width or not, ends a run and is never a term.
            (
                "《三体》，好看！对吗？：；“书”",
                &[
                    "三", "三体", "体", "好", "好看", "看", "对", "对吗", "吗", "书",
                ],
            ),
            // Latin words, digits and spaces end a run; English leaves the field empty.
            (
                "我用Rust写 VS Code插件2024年",
                &["我", "我用", "用", "写", "插", "插件", "件", "年"],
            ),
            ("The cat sat on the mat.", &[]),
            // Traditional characters are Han characters like any other.
            (
                "我週末常去圖書館",
                &[
                    "我", "我週", "週", "週末", "末", "末常", "常", "常去", "去", "去圖", "圖",
                    "圖書", "書", "書館", "館",
                ],
            ),
            ("", &[]),
        ];
        let mut mismatches = Vec::new();
        for (text, expected) in cases {
            let got = analyze(&mut analyzer, text);
            if &got != expected {
                mismatches.push(format!("{text:?}: got {got:?}, want {expected:?}"));
            }
        }
        assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
        // A query word asks for itself when it is one character, for its pairs when longer.
        let query_grams = |word: &str| QueryWord::new(word.to_string()).grams;
        assert_eq!(query_grams("茶"), ["茶"]);
        assert_eq!(query_grams("乌龙茶"), ["乌龙", "龙茶"]);
        assert!(query_grams("rust").is_empty());
    }

    /// Jieba keeps 猫 inside 猫叫 or 橘猫 and 茶 inside 乌龙茶; the Han n-grams find them.
    #[test]
    fn a_single_character_finds_the_words_that_hold_it() {
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        let (cat, oolong, coffee, english) = (mem(), mem(), mem(), mem());
        index
            .apply(
                &[
                    KeywordOp::Upsert(kdoc(cat, u, "我的猫叫小白")),
                    KeywordOp::Upsert(kdoc(oolong, u, "我喜欢喝乌龙茶")),
                    KeywordOp::Upsert(kdoc(coffee, u, "我下午一般喝美式咖啡，不加糖。")),
                    KeywordOp::Upsert(kdoc(english, u, "I drink tea with my cat")),
                ],
                1,
            )
            .expect("apply");
        let search = |query: &str| {
            ids(&index
                .search(u, query, &KeywordFilter::default(), 10)
                .expect("search"))
        };
        assert_eq!(search("猫"), vec![cat]);
        assert_eq!(search("茶"), vec![oolong]);
        assert_eq!(search("咖啡"), vec![coffee]);
        // The oolong memory ranks above the coffee one, which shares only 喝 with the query.
        let tea = search("喝茶");
        assert_eq!(tea.first(), Some(&oolong), "{tea:?}");
        assert!(tea.contains(&coffee));
        // Punctuation in a query is no term; a query of punctuation alone finds nothing.
        assert_eq!(search("“茶”？！"), vec![oolong]);
        assert!(search("，。《》！？：；“”").is_empty());
        // The other view has the same fields.
        let context = index
            .search_view(u, "茶", View::Context, &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&context), vec![oolong]);
        // Coverage counts a word held inside another word.
        let covered = index
            .search_view_covered(u, "茶", View::Own, &KeywordFilter::default(), 10, true)
            .expect("search");
        assert_eq!(covered.coverage, [1.0]);
    }

    /// A memory holding the query's word as jieba cuts it ranks above ones holding its
    /// characters only inside other words.
    #[test]
    fn a_whole_word_match_ranks_first() {
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        let (oolong, milk_tea, green_tea, machine, coffee, plain_tea) =
            (mem(), mem(), mem(), mem(), mem(), mem());
        index
            .apply(
                &[
                    KeywordOp::Upsert(kdoc(milk_tea, u, "周五下午同事请大家喝奶茶。")),
                    KeywordOp::Upsert(kdoc(green_tea, u, "我不喝绿茶，喝了胃会不舒服。")),
                    KeywordOp::Upsert(kdoc(oolong, u, "我每天早上喝一杯乌龙茶。")),
                    KeywordOp::Upsert(kdoc(machine, u, "我家里有一台意式咖啡机。")),
                    KeywordOp::Upsert(kdoc(coffee, u, "我下午一般喝美式咖啡，不加糖。")),
                    KeywordOp::Upsert(kdoc(plain_tea, u, "客人来了我泡茶。")),
                ],
                1,
            )
            .expect("apply");
        let search = |query: &str| {
            ids(&index
                .search(u, query, &KeywordFilter::default(), 10)
                .expect("search"))
        };
        let found = search("乌龙茶");
        assert_eq!(found.first(), Some(&oolong), "{found:?}");
        // The short memory with 茶 first, then 茶 inside 奶茶, 绿茶, 乌龙茶.
        let found = search("茶");
        assert_eq!(found.len(), 4, "{found:?}");
        assert_eq!(found[0], plain_tea, "{found:?}");
        // jieba's search mode cuts 咖啡 out of 咖啡机 itself: both are found.
        let found = search("咖啡");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found.contains(&coffee) && found.contains(&machine));
        let found = search("绿茶");
        assert_eq!(found.first(), Some(&green_tea), "{found:?}");
    }

    /// Mixed Chinese and English: the English words keep their analysis, the Chinese ones
    /// gain their n-grams; English queries never touch the Han fields.
    #[test]
    fn mixed_chinese_and_english() {
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        let (rust, go) = (mem(), mem());
        index
            .apply(
                &[
                    KeywordOp::Upsert(kdoc(rust, u, "我每天用 VS Code 写 Rust，编辑器插件很多。")),
                    KeywordOp::Upsert(kdoc(go, u, "Our services are written in Go.")),
                ],
                1,
            )
            .expect("apply");
        let search = |query: &str| {
            ids(&index
                .search(u, query, &KeywordFilter::default(), 10)
                .expect("search"))
        };
        assert_eq!(search("我用什么 editor 写 Rust？"), vec![rust]);
        assert_eq!(search("插件"), vec![rust]);
        assert_eq!(search("services written"), vec![go]);
        assert_eq!(search("service"), vec![go], "English stemming as before");
        assert!(
            index
                .query_terms("services written in Go")
                .iter()
                .all(|word| word.grams.is_empty())
        );
        // Chinese question words are no terms, like "what" and "did".
        let words: Vec<String> = index
            .query_terms("我对什么过敏吗？")
            .into_iter()
            .map(|word| word.word)
            .collect();
        assert_eq!(words, ["对", "我", "过敏"]);
    }

    #[derive(serde::Deserialize)]
    struct ZhMemory {
        id: String,
        content: String,
        kind: String,
    }

    #[derive(serde::Deserialize)]
    struct ZhQuery {
        id: String,
        query: String,
        #[serde(rename = "type")]
        kind: String,
        relevant: Vec<String>,
    }

    /// `eval/zh` with BM25 alone: every `single_char` query finds every memory holding its
    /// character; recall@5 per query type is printed (`--nocapture`).
    #[test]
    fn zh_eval_set_single_characters_are_found() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("eval/zh");
        let read = |name: &str| std::fs::read_to_string(root.join(name)).expect("read eval/zh");
        let memories: Vec<ZhMemory> =
            serde_json::from_str(&read("memories.json")).expect("memories.json");
        let queries: Vec<ZhQuery> =
            serde_json::from_str(&read("queries.json")).expect("queries.json");
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        let mut by_name = HashMap::new();
        let ops: Vec<KeywordOp> = memories
            .iter()
            .map(|memory| {
                let id = mem();
                by_name.insert(id, memory.id.as_str());
                let mut doc = kdoc(id, u, &memory.content);
                doc.kind = memory.kind.clone();
                KeywordOp::Upsert(doc)
            })
            .collect();
        index.apply(&ops, 1).expect("apply");
        let mut per_type: std::collections::BTreeMap<&str, (f64, usize)> = Default::default();
        let mut missed = Vec::new();
        for query in &queries {
            let found: Vec<&str> = index
                .search(u, &query.query, &KeywordFilter::default(), MAX_SEARCH_LIMIT)
                .expect("search")
                .iter()
                .filter_map(|(id, _)| by_name.get(id).copied())
                .collect();
            let top5 = &found[..found.len().min(5)];
            let hit = query
                .relevant
                .iter()
                .filter(|id| top5.contains(&id.as_str()))
                .count();
            let entry = per_type.entry(query.kind.as_str()).or_default();
            entry.0 += hit as f64 / query.relevant.len() as f64;
            entry.1 += 1;
            if query.kind == "single_char" {
                for relevant in &query.relevant {
                    if !found.contains(&relevant.as_str()) {
                        missed.push(format!("{} {:?}: {relevant}", query.id, query.query));
                    }
                }
            }
        }
        let recall: std::collections::BTreeMap<&str, f64> = per_type
            .iter()
            .map(|(kind, (sum, n))| (*kind, sum / *n as f64))
            .collect();
        for (kind, value) in &recall {
            println!("eval/zh BM25 recall@5 {kind}: {value:.3}");
        }
        assert!(
            missed.is_empty(),
            "single_char misses:\n{}",
            missed.join("\n")
        );
        assert_eq!(recall.get("single_char"), Some(&1.0), "{recall:?}");
    }

    /// The index as mnemo wrote it before the Han fields: opened, it is started afresh and
    /// refilled from the log, after which the n-gram search works.
    #[test]
    fn an_index_without_the_han_fields_is_rebuilt() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("keyword");
        {
            std::fs::create_dir_all(&path).expect("mkdir");
            let text = TextOptions::default().set_indexing_options(
                TextFieldIndexing::default()
                    .set_tokenizer(TOKENIZER_NAME)
                    .set_index_option(IndexRecordOption::WithFreqs),
            );
            let mut builder = Schema::builder();
            let id = builder.add_text_field("id", STRING);
            builder.add_u64_field(ID_HI, FAST);
            builder.add_u64_field(ID_LO, FAST);
            builder.add_text_field("user_id", STRING | FAST);
            builder.add_text_field("content", text.clone());
            builder.add_text_field("context", text);
            builder.add_text_field("kind", STRING);
            builder.add_i64_field("created_at_ms", INDEXED | FAST);
            builder.add_bool_field("archived", INDEXED | FAST);
            builder.add_bool_field("valid", INDEXED | FAST);
            let old = Index::create_in_dir(&path, builder.build()).expect("old index");
            old.tokenizers()
                .register(TOKENIZER_NAME, mnemo_analyzer().expect("analyzer"));
            let mut writer: IndexWriter = old.writer(15_000_000).expect("writer");
            writer.add_document(doc!(id => "x")).expect("add");
            let mut prepared = writer.prepare_commit().expect("prepare");
            prepared.set_payload("23");
            prepared.commit().expect("commit");
        }
        let index = KeywordIndex::open(Some(&path)).expect("open the old index");
        assert_eq!(index.applied_seq(), 0, "the log must be replayed");
        let (u, cat) = (user(), mem());
        index
            .apply(&[KeywordOp::Upsert(kdoc(cat, u, "我的猫叫小白"))], 23)
            .expect("apply");
        drop(index);
        let index = KeywordIndex::open(Some(&path)).expect("reopen");
        assert_eq!(index.applied_seq(), 23);
        let hits = index
            .search(u, "猫", &KeywordFilter::default(), 10)
            .expect("search");
        assert_eq!(ids(&hits), vec![cat]);
    }

    #[test]
    fn hostile_queries_never_error() {
        let index = KeywordIndex::open(None).expect("open");
        let u = user();
        index
            .apply(&[KeywordOp::Upsert(kdoc(mem(), u, "foo bar baz"))], 1)
            .expect("apply");
        let long = "a".repeat(10_000);
        let hostile = [
            "foo:bar",
            "\"unbalanced",
            "(((",
            ")",
            "AND OR NOT",
            "*",
            "?",
            "~2^3",
            "id:1 OR user_id:*",
            "[1 TO 2}",
            "",
            "   ",
            "\\",
            "\u{0}\u{1}",
            "🤖🔥",
            long.as_str(),
            "the a an of",
        ];
        for q in hostile {
            let res = index.search(u, q, &KeywordFilter::default(), 10);
            assert!(res.is_ok(), "query {q:?} failed: {res:?}");
        }
        let hits = index
            .search(u, "foo:bar", &KeywordFilter::default(), usize::MAX)
            .expect("search");
        assert_eq!(hits.len(), 1);
    }
}
