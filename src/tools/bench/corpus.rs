//! The synthetic corpus: a seeded xorshift PRNG, sentences from a Zipf vocabulary, each
//! with a precomputed bag-of-words unit vector, and the embedder that hands those out.

use super::*;

/// xorshift64* — tiny, seeded, good enough for synthetic text.
#[derive(Clone)]
pub(super) struct Rng(u64);

impl Rng {
    pub(super) fn new(seed: u64) -> Self {
        // splitmix64 of the seed, so nearby seeds give unrelated streams (and never 0).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Self((z ^ (z >> 31)) | 1)
    }

    pub(super) fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(super) fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }

    /// Uniform in `[0, 1)`.
    pub(super) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Uniform in `lo..=hi`.
    pub(super) fn between(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
}

/// Everyday content words (no stop words); they take the most frequent ranks.
pub(super) const ENGLISH: &str = "project paper deadline meeting sister brother mother father friend \
    coffee tea dinner lunch breakfast book novel article chapter research study experiment \
    result data model training dataset benchmark python rust database server cloud budget \
    invoice travel flight hotel train ticket passport visa conference talk slides review \
    draft proposal grant funding team manager colleague student teacher course lecture exam \
    garden plant flower tree dog cat bird walk run bike swim gym doctor appointment medicine \
    allergy peanut gluten vegetarian recipe kitchen oven bread cheese wine beer birthday gift \
    wedding holiday summer winter spring autumn morning evening weekend monday friday music \
    piano guitar song concert film movie series podcast news election policy economy market \
    stock price rent house apartment car bicycle phone laptop keyboard screen camera photo \
    language german french spanish japanese chinese english learn practice lesson paris \
    berlin tokyo london york city country river mountain beach lake forest island museum \
    gallery painting history science physics chemistry biology math statistics algorithm \
    graph network memory storage index search query vector embedding latency throughput \
    cache bug release version feature design architecture contract client customer support \
    email calendar reminder task note list goal habit sleep health diet weight running \
    marathon yoga meditation therapy family child baby school university degree thesis \
    advisor professor lab office desk chair window door light energy solar battery \
    climate weather rain snow storm ocean ship port harbor bridge road map route";
pub(super) const CONSONANTS: &[u8] = b"bdfgklmnprstvz";
pub(super) const VOWELS: &[u8] = b"aeiou";

/// The vocabulary with one fixed random direction and weight per word. A text's vector is the
/// normalised weighted sum of its words' directions, so texts sharing words are near each
/// other, as with a real embedder; rarer words weigh more.
pub(super) struct Corpus {
    pub(super) words: Vec<String>,
    pub(super) english: usize,
    pub(super) index: HashMap<String, usize>,
    pub(super) directions: Vec<f32>,
    pub(super) weights: Vec<f32>,
}

impl Corpus {
    pub(super) fn new(seed: u64) -> Self {
        let mut rng = Rng::new(seed);
        let mut seen: HashSet<String> = HashSet::new();
        let mut words: Vec<String> = Vec::with_capacity(VOCABULARY);
        for word in ENGLISH.split_whitespace() {
            if seen.insert(word.to_string()) {
                words.push(word.to_string());
            }
        }
        let english = words.len();
        while words.len() < VOCABULARY {
            let syllables = rng.between(2, 4);
            let mut word = String::with_capacity(syllables * 2);
            for _ in 0..syllables {
                word.push(char::from(CONSONANTS[rng.below(CONSONANTS.len())]));
                word.push(char::from(VOWELS[rng.below(VOWELS.len())]));
            }
            if seen.insert(word.clone()) {
                words.push(word);
            }
        }
        let directions = (0..VOCABULARY * DIMENSION)
            .map(|_| (rng.unit() * 2.0 - 1.0) as f32)
            .collect();
        let weights = (0..VOCABULARY)
            .map(|rank| (1.0 + (1.0 + rank as f64 / ZIPF_OFFSET).ln()) as f32)
            .collect();
        let index = words
            .iter()
            .enumerate()
            .map(|(rank, word)| (word.clone(), rank))
            .collect();
        Self {
            words,
            english,
            index,
            directions,
            weights,
        }
    }

    /// A word rank from the Zipf–Mandelbrot law over the first `among` words.
    pub(super) fn rank(&self, rng: &mut Rng, among: usize) -> usize {
        let q = ZIPF_OFFSET;
        let x = q * ((among as f64 + q) / q).powf(rng.unit()) - q;
        (x as usize).min(among - 1)
    }

    pub(super) fn ranks(&self, rng: &mut Rng, min: usize, max: usize, among: usize) -> Vec<usize> {
        let n = rng.between(min, max);
        (0..n).map(|_| self.rank(rng, among)).collect()
    }

    pub(super) fn text(&self, ranks: &[usize]) -> String {
        let words: Vec<&str> = ranks
            .iter()
            .map(|&rank| self.words[rank].as_str())
            .collect();
        words.join(" ")
    }

    pub(super) fn vector(&self, ranks: &[usize]) -> Vec<f32> {
        let mut vector = vec![0f32; DIMENSION];
        for &rank in ranks {
            let weight = self.weights[rank];
            let direction = &self.directions[rank * DIMENSION..(rank + 1) * DIMENSION];
            for (value, component) in vector.iter_mut().zip(direction) {
                *value += weight * component;
            }
        }
        normalise(&mut vector);
        vector
    }

    /// A memory of 6–14 words with its precomputed vector, made up to a year ago.
    pub(super) fn memory(&self, rng: &mut Rng) -> (NewMemory, Embedded) {
        let ranks = self.ranks(rng, 6, 14, VOCABULARY);
        let kind = MemoryKind::ALL[rng.below(MemoryKind::ALL.len())];
        let age = chrono::Duration::seconds(rng.below(365 * 24 * 3600) as i64);
        let memory = NewMemory {
            kind,
            content: self.text(&ranks),
            source: MemorySource::User,
            trust: Trust::User,
            importance: rng.between(1, 5) as u8,
            thread_id: None,
            source_refs: Vec::new(),
            created_at: Some(Utc::now() - age),
            supersedes: None,
        };
        let embedded = Embedded {
            vector: self.vector(&ranks),
            model: MODEL_ID.to_string(),
        };
        (memory, embedded)
    }

    /// A recall query of 2–5 words from the same distribution.
    pub(super) fn query(&self, rng: &mut Rng) -> String {
        let ranks = self.ranks(rng, 2, 5, VOCABULARY);
        self.text(&ranks)
    }

    /// Text from the English words only (for the real model).
    pub(super) fn english_text(&self, rng: &mut Rng, min: usize, max: usize) -> String {
        let ranks = self.ranks(rng, min, max, self.english);
        self.text(&ranks)
    }

    /// The vector of any text: known words as in `vector`, unknown ones ignored; a text with
    /// no known word gets a direction derived from its hash.
    pub(super) fn embed(&self, text: &str) -> Vec<f32> {
        let ranks: Vec<usize> = text
            .split_whitespace()
            .filter_map(|word| self.index.get(word).copied())
            .collect();
        if !ranks.is_empty() {
            return self.vector(&ranks);
        }
        // FNV-1a of the text seeds a random direction.
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |hash, byte| {
            (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
        });
        let mut rng = Rng::new(hash);
        let mut vector: Vec<f32> = (0..DIMENSION)
            .map(|_| (rng.unit() * 2.0 - 1.0) as f32)
            .collect();
        normalise(&mut vector);
        vector
    }
}

pub(super) fn normalise(vector: &mut [f32]) {
    let norm = vector.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > f32::EPSILON {
        vector.iter_mut().for_each(|x| *x /= norm);
    }
}

/// The main engine's embedder. Queries the benchmark prepared come from a cache, so
/// recall's own embedding takes microseconds and the searches run in parallel as they would
/// with a vector at hand. Other texts: the model's vectors when the big user has them
/// (`model`), the corpus's bag-of-words vectors otherwise.
pub(super) struct BenchEmbedder {
    pub(super) corpus: Arc<Corpus>,
    pub(super) model: Option<Arc<dyn Embedder>>,
    pub(super) cache: parking_lot::Mutex<HashMap<String, Vec<f32>>>,
}

impl BenchEmbedder {
    pub(super) fn cached(&self) -> parking_lot::MutexGuard<'_, HashMap<String, Vec<f32>>> {
        self.cache.lock()
    }

    /// The vectors of `texts`, computed: the model's when `model_vectors` and there is a
    /// model, the corpus's otherwise.
    pub(super) async fn compute(
        &self,
        texts: &[String],
        model_vectors: bool,
    ) -> Result<Vec<Vec<f32>>, EmbedError> {
        match &self.model {
            Some(model) if model_vectors => {
                let mut vectors = Vec::with_capacity(texts.len());
                for chunk in texts.chunks(EMBED_CHUNK) {
                    vectors.extend(model.embed(chunk).await?);
                }
                Ok(vectors)
            }
            _ => Ok(texts.iter().map(|text| self.corpus.embed(text)).collect()),
        }
    }

    /// Caches the vectors of `texts`: the model's for queries against the big user (`big`)
    /// when the big user has model vectors, the corpus's otherwise.
    pub(super) async fn prepare(&self, texts: &[String], big: bool) -> Result<(), EmbedError> {
        let missing: Vec<String> = {
            let cache = self.cached();
            let missing: HashSet<&String> =
                texts.iter().filter(|t| !cache.contains_key(*t)).collect();
            missing.into_iter().cloned().collect()
        };
        let vectors = self.compute(&missing, big).await?;
        self.cached().extend(missing.into_iter().zip(vectors));
        Ok(())
    }
}

#[async_trait]
impl Embedder for BenchEmbedder {
    fn model_id(&self) -> &str {
        MODEL_ID
    }

    fn dimension(&self) -> usize {
        DIMENSION
    }

    /// Prepared texts from the cache; any other with the big user's kind of vector.
    async fn embed(&self, texts: &[String]) -> Result<Vec<Vec<f32>>, EmbedError> {
        let found: Vec<Option<Vec<f32>>> = {
            let cache = self.cached();
            texts.iter().map(|text| cache.get(text).cloned()).collect()
        };
        let missing: Vec<String> = texts
            .iter()
            .zip(&found)
            .filter(|(_, vector)| vector.is_none())
            .map(|(text, _)| text.clone())
            .collect();
        let mut computed = self.compute(&missing, true).await?.into_iter();
        Ok(found
            .into_iter()
            .map(|vector| vector.or_else(|| computed.next()).unwrap_or_default())
            .collect())
    }
}
