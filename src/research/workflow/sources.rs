//! The research's sources: what searches found and fetches read, their passages and findings,
//! and the scoring that keeps the best for the report.

use crate::llm::prompts::Prompt;
use crate::runs::events::SourcesFound;
use crate::search::SearchHit;
use crate::search::fetch::FetchedPage;
use std::collections::HashMap;

use super::*;
use crate::memory::relevance::{Corpus, Terms};

#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(super) struct Source {
    pub(super) url: String,
    pub(super) title: String,
    /// The readable text, once fetched (or returned in full by the provider).
    pub(super) text: Option<String>,
    pub(super) relevance: f64,
    pub(super) credibility: f64,
    pub(super) score: f64,
    /// Why the source cannot be read (it is too large, or its text could not be extracted):
    /// kept with the checkpoint, so a resumed research never fetches it again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) refused: Option<String>,
    /// The provider that found it, when the research searches several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) provider: Option<String>,
}

impl Source {
    fn new(url: &str, title: String, text: Option<String>) -> Self {
        Self {
            url: url.to_string(),
            title,
            text,
            relevance: 0.0,
            credibility: 0.0,
            score: 0.0,
            refused: None,
            provider: None,
        }
    }
}

/// The run's sources by URL, and the fetches made (each URL is fetched once per run, even
/// when several researchers ask for it at the same time).
#[derive(Default)]
pub(super) struct Sources {
    pub(super) list: Mutex<Vec<Source>>,
    pub(super) fetches: Mutex<HashMap<String, FetchCell>>,
}

/// One URL's fetch, shared by every researcher asking for it.
type FetchCell = Arc<tokio::sync::OnceCell<Result<Arc<FetchedPage>, String>>>;

impl Sources {
    pub(super) fn lock(&self) -> parking_lot::MutexGuard<'_, Vec<Source>> {
        self.list.lock()
    }

    /// The sources as a checkpoint keeps them: texts cut to what a prompt quotes.
    pub(super) fn snapshot(&self) -> Vec<Source> {
        self.lock()
            .iter()
            .map(|source| Source {
                text: source
                    .text
                    .as_deref()
                    .map(|text| truncate(text, SOURCE_EXCERPT_CHARS)),
                ..source.clone()
            })
            .collect()
    }

    /// Puts back the sources of a checkpoint (before any search of the new attempt).
    pub(super) fn restore(&self, saved: Vec<Source>) {
        *self.lock() = saved;
    }

    /// Adds search hits; returns the ones not seen before.
    pub(super) fn add_hits(&self, hits: &[SearchHit]) -> Vec<SearchHit> {
        let mut list = self.lock();
        let mut new = Vec::new();
        for hit in hits {
            match list.iter_mut().find(|source| source.url == hit.url) {
                Some(known) => {
                    if known.text.is_none() && hit.content.is_some() {
                        known.text = hit.content.clone();
                    }
                }
                None => {
                    list.push(Source {
                        provider: hit.provider.clone(),
                        ..Source::new(
                            &hit.url,
                            hit.title.clone(),
                            hit.content.clone().filter(|text| !text.trim().is_empty()),
                        )
                    });
                    new.push(hit.clone());
                }
            }
        }
        new
    }

    pub(super) fn set_text(&self, url: &str, page: &FetchedPage) {
        let mut list = self.lock();
        let title = page.title.clone().unwrap_or_else(|| url.to_string());
        match list.iter_mut().find(|source| source.url == url) {
            Some(source) => {
                source.text = Some(page.text.clone());
                if source.title.is_empty() || source.title == source.url {
                    source.title = title;
                }
            }
            None => list.push(Source::new(url, title, Some(page.text.clone()))),
        }
    }

    pub(super) fn text_of(&self, url: &str) -> Option<String> {
        self.lock()
            .iter()
            .find(|source| source.url == url)
            .and_then(|source| source.text.clone())
    }

    /// Why `url` was found unreadable, by this research or an earlier attempt of it.
    pub(super) fn refused(&self, url: &str) -> Option<String> {
        self.lock()
            .iter()
            .find(|source| source.url == url)
            .and_then(|source| source.refused.clone())
    }

    /// Remembers `url` as unreadable (it is never fetched again by this research).
    pub(super) fn refuse(&self, url: &str, reason: &str) {
        let mut list = self.lock();
        match list.iter_mut().find(|source| source.url == url) {
            Some(source) => source.refused = Some(reason.to_string()),
            None => list.push(Source {
                refused: Some(reason.to_string()),
                ..Source::new(url, url.to_string(), None)
            }),
        }
    }

    /// Adds a source read by an earlier research (a follow-up starts from them); a URL
    /// already known keeps what it has.
    pub(super) fn seed(&self, url: &str, title: &str, text: &str, provider: Option<String>) {
        let mut list = self.lock();
        if !list.iter().any(|source| source.url == url) {
            list.push(Source {
                provider,
                ..Source::new(url, title.to_string(), Some(text.to_string()))
            });
        }
    }

    pub(super) fn fetch_cell(&self, url: &str) -> FetchCell {
        self.fetches
            .lock()
            .entry(url.to_string())
            .or_default()
            .clone()
    }

    /// Sources whose text was read: only these may be cited.
    pub(super) fn readable(&self) -> Vec<Source> {
        self.lock()
            .iter()
            .filter(|source| source.text.is_some())
            .cloned()
            .collect()
    }
}

/// A passage of a source, for the extractive path.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(super) struct Passage {
    pub(super) url: String,
    pub(super) text: String,
}

/// What one researcher (or one query of the recursive mode) brought back.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(super) struct Findings {
    pub(super) topic: String,
    /// Compressed findings, each with its source URL.
    pub(super) text: String,
    pub(super) passages: Vec<Passage>,
    /// Why the topic could not be researched, when it could not.
    pub(super) failed: Option<String>,
}

impl Findings {
    /// The findings of a topic that could not be researched, and why.
    pub(super) fn failed(topic: impl Into<String>, why: String) -> Self {
        Self {
            topic: topic.into(),
            text: String::new(),
            passages: Vec::new(),
            failed: Some(why),
        }
    }
}

impl Research {
    /// Scores every read source for relevance (the calibrated probability that it is about
    /// the brief or one of the topics researched, and the model's judgement when one is
    /// configured) and credibility, drops those about none of them and the weakest, and
    /// numbers the rest for citation.
    pub(super) async fn score_sources(
        &self,
        brief: &str,
        topics: &[&str],
    ) -> Result<Vec<(usize, Source)>, RunFailure> {
        let mut sources = self.sources.readable();
        if sources.is_empty() {
            return Ok(Vec::new());
        }
        let texts: Vec<String> = sources
            .iter()
            .map(|source| {
                format!(
                    "{}\n{}",
                    source.title,
                    truncate(source.text.as_deref().unwrap_or(""), SCORE_EXCERPT_CHARS)
                )
            })
            .collect();
        let corpus = Corpus::new(texts.iter().map(|text| Terms::of(text)).collect());
        // The similarity embedding runs while the model judges the sources.
        let embedder = self.deps.memory.embedder().clone();
        let questions: Vec<String> = std::iter::once(brief.to_string())
            .chain(topics.iter().map(ToString::to_string))
            .collect();
        let similarity = async move {
            tokio::try_join!(embedder.embed_queries(&questions), embedder.embed(&texts))
        };
        let judgement = async {
            match self.role(ModelRole::Research) {
                Some(role) => Some(self.curate(role, brief, &sources).await),
                None => None,
            }
        };
        let (similarity, judgement) = tokio::join!(similarity, judgement);
        let calibrated = match similarity {
            Ok((queries, vectors)) => {
                let questions = std::iter::once(brief).chain(topics.iter().copied());
                self.calibrate(&mut sources, questions.zip(queries), &vectors, &corpus)
            }
            Err(error) => {
                self.progress
                    .error(
                        RunErrorType::Internal,
                        &format!("scoring sources by similarity failed: {error}"),
                        true,
                        StepMeta::stage("final_report_generation"),
                    )
                    .await?;
                vec![None; sources.len()]
            }
        };
        for source in &mut sources {
            source.credibility = credibility(&source.url, source.text.as_deref().unwrap_or(""));
        }
        if let Some(judgement) = judgement {
            self.weigh_judgement(&mut sources, judgement).await?;
        }
        let (kept, dropped) = self.choose(sources, calibrated);
        let numbered: Vec<(usize, Source)> = kept
            .into_iter()
            .enumerate()
            .map(|(index, source)| (index + 1, source))
            .collect();
        self.announce_sources(&numbered, &dropped).await?;
        Ok(numbered)
    }

    /// Each source's relevance: the calibrated probability (`memory::relevance`, never a raw
    /// cosine) that it is about the brief or a topic, the best of them; returned per source too,
    /// since a source below the `source` point is dropped whatever else is said of it.
    fn calibrate<'q>(
        &self,
        sources: &mut [Source],
        questions: impl Iterator<Item = (&'q str, Vec<f32>)>,
        vectors: &[Vec<f32>],
        corpus: &Corpus,
    ) -> Vec<Option<f64>> {
        let relevance = self.deps.memory.relevance();
        let profiles: Vec<_> = questions
            .map(|(text, vector)| relevance.profile(text, vector))
            .collect();
        let mut calibrated = vec![None; sources.len()];
        for (((source, vector), slot), terms) in sources
            .iter_mut()
            .zip(vectors)
            .zip(&mut calibrated)
            .zip(corpus.texts())
        {
            let p = profiles
                .iter()
                .map(|profile| relevance.score_text(profile, terms, vector, Some(corpus)))
                .fold(0.0, f64::max);
            source.relevance = p;
            *slot = Some(p);
        }
        calibrated
    }

    /// Averages the model's relevance and credibility judgement into the sources' own, or says
    /// why there is none.
    async fn weigh_judgement(
        &self,
        sources: &mut [Source],
        judgement: Result<Vec<(usize, f64, f64)>, LlmError>,
    ) -> Result<(), RunFailure> {
        match judgement {
            Ok(items) => {
                for (id, relevance, credibility) in items {
                    if let Some(source) = id.checked_sub(1).and_then(|i| sources.get_mut(i)) {
                        source.relevance = 0.5 * source.relevance + 0.5 * relevance;
                        source.credibility = 0.5 * source.credibility + 0.5 * credibility;
                    }
                }
            }
            Err(error) if unusable(&error) => {
                self.progress
                    .fallback(
                        "final_report_generation",
                        "curate_sources",
                        "Sources are scored by similarity, domain and length only",
                        &error.message,
                        None,
                    )
                    .await?;
            }
            Err(error) => {
                self.progress
                    .error(
                        RunErrorType::Llm,
                        &format!(
                            "curating sources failed: {}; using similarity scores",
                            error.message
                        ),
                        error.retryable(),
                        StepMeta::stage("final_report_generation"),
                    )
                    .await?;
            }
        }
        Ok(())
    }

    /// The sources kept for the report, best first, and those dropped: below the relevance
    /// point, below `min_source_score`, or past `max_sources`.
    fn choose(
        &self,
        sources: Vec<Source>,
        calibrated: Vec<Option<f64>>,
    ) -> (Vec<Source>, Vec<Source>) {
        let point = self.deps.memory.settings().relevance.source;
        let mut about: Vec<(Source, bool)> = sources
            .into_iter()
            .zip(calibrated)
            .map(|(mut source, p)| {
                source.score = 0.7 * source.relevance + 0.3 * source.credibility;
                // Without the similarity (its embedding failed) the model's judgement decides.
                (source, p.is_none_or(|p| p >= point))
            })
            .collect();
        about.sort_by(|a, b| b.0.score.total_cmp(&a.0.score));
        let mut kept = Vec::new();
        let mut dropped = Vec::new();
        for (source, relevant) in about {
            let keep = relevant
                && source.score >= self.config.min_source_score
                && kept.len() < self.config.max_sources;
            if keep {
                kept.push(source);
            } else {
                dropped.push(source);
            }
        }
        (kept, dropped)
    }

    /// The `sources_found` event: the numbered sources with their scores, and those dropped.
    async fn announce_sources(
        &self,
        numbered: &[(usize, Source)],
        dropped: &[Source],
    ) -> Result<(), RunFailure> {
        let listed: Vec<FoundSource> = numbered
            .iter()
            .map(|(n, source)| FoundSource {
                n: Some(*n),
                relevance: Some(round3(source.relevance)),
                credibility: Some(round3(source.credibility)),
                score: Some(round3(source.score)),
                ..FoundSource::new(&source.url, &source.title)
            })
            .collect();
        let dropped: Vec<DroppedSource> = dropped
            .iter()
            .map(|source| DroppedSource {
                url: source.url.clone(),
                score: round3(source.score),
            })
            .collect();
        self.progress
            .emit(RunEvent::SourcesFound(SourcesFound {
                stage: "final_report_generation".into(),
                content: format!(
                    "{} sources kept for the report, {} dropped",
                    listed.len(),
                    dropped.len()
                ),
                sources: listed,
                metadata: StepMeta {
                    curated: Some(true),
                    dropped: Some(dropped),
                    ..Default::default()
                },
            }))
            .await?;
        Ok(())
    }

    /// The model's relevance and credibility judgement of each source (1-based ids).
    pub(super) async fn curate(
        &self,
        role: &RoleModel,
        brief: &str,
        sources: &[Source],
    ) -> Result<Vec<(usize, f64, f64)>, LlmError> {
        let listed: Vec<String> = sources
            .iter()
            .enumerate()
            .map(|(index, source)| {
                format!(
                    "Source {} — {} ({})\n{}",
                    index + 1,
                    source.title,
                    source.url,
                    quote(&truncate(
                        source.text.as_deref().unwrap_or(""),
                        CURATE_EXCERPT_CHARS
                    ))
                )
            })
            .collect();
        let text = Prompt::ResearchCurate
            .render(&[("brief", brief), ("sources", &listed.join("\n\n"))])?;
        self.json("curate_sources", role, text, |value| {
            let items = value["sources"]
                .as_array()
                .ok_or("sources must be a list")?;
            Ok(items
                .iter()
                .filter_map(|item| {
                    Some((
                        item["id"].as_u64()? as usize,
                        item["relevance"].as_f64()?.clamp(0.0, 1.0),
                        item["credibility"].as_f64()?.clamp(0.0, 1.0),
                    ))
                })
                .collect::<Vec<_>>())
        })
        .await
    }
}

/// A source's credibility from what can be seen without a model: the user's own documents
/// rank highest, then institutional domains, https, and pages with substance.
pub(super) fn credibility(url: &str, text: &str) -> f64 {
    if url.starts_with("doc:") {
        return 0.9;
    }
    let mut score: f64 = 0.4;
    let host = url::Url::parse(url)
        .ok()
        .and_then(|parsed| parsed.host_str().map(str::to_ascii_lowercase))
        .unwrap_or_default();
    if url.starts_with("https://") {
        score += 0.1;
    }
    if [".gov", ".edu", ".int", ".mil"]
        .iter()
        .any(|suffix| host.ends_with(suffix) || host.contains(&format!("{suffix}.")))
    {
        score += 0.3;
    } else if host.ends_with(".org") || host.contains("wikipedia") {
        score += 0.15;
    }
    let length = text.chars().count();
    if length >= 2_000 {
        score += 0.15;
    } else if length < 200 {
        score -= 0.2;
    }
    score.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A resumed research fetched again the page that had killed its server. A source found
    /// unreadable travels with the checkpoint, so the next attempt knows it without a fetch.
    #[test]
    fn unreadable_sources_are_kept_by_the_checkpoint() {
        let sources = Sources::default();
        let url = "https://example.com/bomb.pdf";
        sources.refuse(
            url,
            "reading the document needs more than 1024 MiB of memory",
        );
        let saved = serde_json::to_value(sources.snapshot()).unwrap();
        let resumed = Sources::default();
        resumed.restore(serde_json::from_value(saved).unwrap());
        assert!(resumed.refused(url).unwrap().contains("MiB of memory"));
        assert!(resumed.readable().is_empty(), "never cited");
        // Checkpoints written before the field existed still load.
        let old = serde_json::json!([{ "url": "https://a.example", "title": "A", "text": null,
            "relevance": 0.0, "credibility": 0.0, "score": 0.0 }]);
        let restored: Vec<Source> = serde_json::from_value(old).unwrap();
        assert!(restored[0].refused.is_none());
    }
}
