//! A research request as clients send it (the seed API's field names) and the configuration
//! it resolves to: server defaults filled in, per-request knobs checked against the server's
//! limits, per-role models chosen. The resolved configuration carries no secret.

use std::collections::BTreeMap;

use secrecy::SecretString;
use serde::{Deserialize, Serialize};

use crate::config::ModelRole;
use crate::config::{LlmSettings, ResearchSettings};
use crate::llm::roles::{ModelInfo, Models};
use crate::store::{RunId, ThreadId};

/// Longest accepted query, in characters.
pub(crate) const MAX_QUERY_CHARS: usize = 4_000;
/// Providers one research may search together.
const MAX_PROVIDERS: usize = 5;

/// `POST /research/stream` (and `/research/test`, `/research/compare`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ResearchRequest {
    /// What to research.
    #[serde(default)]
    #[schema(min_length = 1, max_length = 4000, pattern = r"\S")]
    pub query: String,
    /// The model for every role of this research (overrides the server's default model).
    pub model: Option<String>,
    /// Per-role models (`research`, `summarization`, `compression`, `final_report`, `memory`).
    #[serde(default)]
    pub models: BTreeMap<String, String>,
    /// Per-role completion-token caps, each 1 to 131,072.
    #[serde(default)]
    pub max_tokens: BTreeMap<String, u32>,
    /// The user's own provider key, used for this research only; never stored or logged.
    #[schema(value_type = Option<String>)]
    #[serde(default, serialize_with = "never_the_key")]
    pub api_key: Option<SecretString>,
    /// The search provider — `local`, `tavily`, `brave`, `searxng`, `duckduckgo` — or a list
    /// of them searched together (`["local", "searxng"]`: the user's documents and the web in
    /// one research, each source labelled with its provider).
    pub search_api: Option<SearchApiChoice>,
    /// Only sources on these web domains (and their subdomains) are used; the user's own
    /// documents always are.
    #[serde(default)]
    pub include_domains: Vec<String>,
    /// Sources on these web domains (and their subdomains) are never used.
    #[serde(default)]
    pub exclude_domains: Vec<String>,
    /// How the report is written: its type, tone, length and language.
    pub report: Option<ReportOptions>,
    /// What the research may spend on models; when researching reaches its share, the report
    /// is written from what was found, and says so.
    pub budget: Option<BudgetRequest>,
    /// The earlier research (one of the user's, finished) this one follows up: it starts from
    /// that research's question, sources and report. `POST /research/{id}/follow-up` sets it.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub follow_up_of: Option<RunId>,
    pub allow_clarification: Option<bool>,
    pub max_researcher_iterations: Option<u32>,
    pub max_react_tool_calls: Option<u32>,
    pub max_concurrent_research_units: Option<u32>,
    /// Sources kept for the report after scoring.
    pub max_sources: Option<usize>,
    /// Pause after planning with a `plan_review` event until `POST /v1/runs/{id}/input`.
    pub plan_review: Option<bool>,
    /// `supervisor` (default) or `recursive` (breadth/depth).
    pub mode: Option<String>,
    pub breadth: Option<u32>,
    pub depth: Option<u32>,
    pub concurrency: Option<u32>,
    /// Attach the research to one of the user's threads.
    #[schema(value_type = Option<String>)]
    pub thread_id: Option<ThreadId>,
    /// Write the report's conclusions to the user's memory (server default when absent).
    pub remember: Option<bool>,
}

/// One search provider, or several searched together.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
pub enum SearchApiChoice {
    One(String),
    Many(Vec<String>),
}

impl SearchApiChoice {
    /// The provider names, trimmed, each once, in the order given.
    pub(crate) fn names(&self) -> Vec<String> {
        let given: Vec<&String> = match self {
            SearchApiChoice::One(name) => vec![name],
            SearchApiChoice::Many(names) => names.iter().collect(),
        };
        let mut names: Vec<String> = Vec::new();
        for name in given {
            let name = name.trim().to_string();
            if !name.is_empty() && !names.contains(&name) {
                names.push(name);
            }
        }
        names
    }
}

/// How a report is written (`report` of a research request).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReportOptions {
    /// `detailed` (default), `summary`, `outline` or `resources` (an annotated list of the
    /// sources).
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// The tone, in a few words ("objective", "formal", "for a newcomer"); at most 60
    /// characters.
    pub tone: Option<String>,
    /// The report's target length in words, 100 to 5,000.
    pub words: Option<u32>,
    /// The language to write in ("English", "zh-CN"; default: the request's); at most 40
    /// characters.
    pub language: Option<String>,
}

/// The report's type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReportKind {
    #[default]
    Detailed,
    Summary,
    Outline,
    Resources,
}

/// `ReportOptions` checked, as a research runs with them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReportStyle {
    #[serde(rename = "type")]
    pub kind: ReportKind,
    pub tone: Option<String>,
    pub words: Option<u32>,
    pub language: Option<String>,
}

/// Spending caps of one research (`budget`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BudgetRequest {
    /// Model tokens (prompt and completion, every call) the whole research may use: 1,000 up
    /// to the server's `research.limits.budget_tokens`.
    pub tokens: Option<u64>,
    /// Dollars it may spend, by the server's price table (a model without a price counts
    /// nothing); above 0, at most 1,000.
    pub cost_usd: Option<f64>,
    /// The share of the budget researching (searching, reading, compressing) may use before
    /// the report is written from what was found; 0.1 to 0.95, default 0.8.
    pub research_share: Option<f64>,
}

/// A research's budget, checked.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Budget {
    pub tokens: Option<u64>,
    pub cost_usd: Option<f64>,
    pub research_share: f64,
}

const DEFAULT_RESEARCH_SHARE: f64 = 0.8;
const MIN_BUDGET_TOKENS: u64 = 1_000;
const MAX_BUDGET_USD: f64 = 1_000.0;

impl BudgetRequest {
    fn resolve(&self, limit: u64) -> Result<Option<Budget>, String> {
        if let Some(tokens) = self.tokens
            && !(MIN_BUDGET_TOKENS..=limit.max(MIN_BUDGET_TOKENS)).contains(&tokens)
        {
            return Err(format!(
                "budget.tokens must be between {MIN_BUDGET_TOKENS} and this server's limit of {limit}"
            ));
        }
        if let Some(cost) = self.cost_usd
            && !(cost > 0.0 && cost <= MAX_BUDGET_USD)
        {
            return Err(format!(
                "budget.cost_usd must be above 0 and at most {MAX_BUDGET_USD}"
            ));
        }
        let share = self.research_share.unwrap_or(DEFAULT_RESEARCH_SHARE);
        if !(0.1..=0.95).contains(&share) {
            return Err("budget.research_share must be between 0.1 and 0.95".into());
        }
        Ok(
            (self.tokens.is_some() || self.cost_usd.is_some()).then_some(Budget {
                tokens: self.tokens,
                cost_usd: self.cost_usd,
                research_share: share,
            }),
        )
    }
}

/// Bounds of `ReportOptions`.
const MIN_REPORT_WORDS: u32 = 100;
const MAX_REPORT_WORDS: u32 = 5_000;
const MAX_TONE_CHARS: usize = 60;
const MAX_LANGUAGE_CHARS: usize = 40;
/// Domains a request may list, per list.
const MAX_DOMAINS: usize = 50;

impl ReportOptions {
    fn resolve(&self) -> Result<ReportStyle, String> {
        let kind = match self.kind.as_deref().map(str::trim) {
            None | Some("" | "detailed") => ReportKind::Detailed,
            Some("summary") => ReportKind::Summary,
            Some("outline") => ReportKind::Outline,
            Some("resources") => ReportKind::Resources,
            Some(other) => {
                return Err(format!(
                    "report.type {other:?} is unknown; use detailed, summary, outline or resources"
                ));
            }
        };
        let text = |name: &str, value: &Option<String>, max: usize| {
            let value = value.as_deref().map(str::trim).filter(|v| !v.is_empty());
            match value {
                Some(v) if v.chars().count() > max => {
                    Err(format!("report.{name} is longer than {max} characters"))
                }
                Some(v) if v.chars().any(char::is_control) => {
                    Err(format!("report.{name} must be one line of text"))
                }
                _ => Ok(value.map(str::to_string)),
            }
        };
        if let Some(words) = self.words
            && !(MIN_REPORT_WORDS..=MAX_REPORT_WORDS).contains(&words)
        {
            return Err(format!(
                "report.words must be between {MIN_REPORT_WORDS} and {MAX_REPORT_WORDS}"
            ));
        }
        Ok(ReportStyle {
            kind,
            tone: text("tone", &self.tone, MAX_TONE_CHARS)?,
            words: self.words,
            language: text("language", &self.language, MAX_LANGUAGE_CHARS)?,
        })
    }
}

/// Domain names as a filter compares them: lowercased, without a scheme, `www.` or path.
fn domains(name: &str, given: &[String]) -> Result<Vec<String>, String> {
    if given.len() > MAX_DOMAINS {
        return Err(format!("{name} lists more than {MAX_DOMAINS} domains"));
    }
    let mut out = Vec::new();
    for domain in given {
        let trimmed = domain.trim().to_ascii_lowercase();
        let bare = trimmed
            .trim_start_matches("https://")
            .trim_start_matches("http://")
            .split('/')
            .next()
            .unwrap_or("")
            .trim_start_matches("www.")
            .trim_end_matches('.');
        let valid = !bare.is_empty()
            && bare.len() <= 253
            && bare
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
            && !bare.starts_with('.');
        if !valid {
            return Err(format!("{name}: {domain:?} is not a domain name"));
        }
        if !out.iter().any(|known: &String| known == bare) {
            out.push(bare.to_string());
        }
    }
    Ok(out)
}

/// A request is serialised (a run's checkpoint keeps it) without the key: always `null`.
fn never_the_key<S: serde::Serializer>(
    _: &Option<SecretString>,
    serializer: S,
) -> Result<S::Ok, S::Error> {
    serializer.serialize_none()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    Supervisor,
    Recursive,
}

/// What a research runs with, after defaults and limits.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct ResolvedConfig {
    pub query: String,
    pub mode: Mode,
    pub allow_clarification: bool,
    pub max_researcher_iterations: u32,
    pub max_react_tool_calls: u32,
    pub max_concurrent_research_units: u32,
    pub max_sources: usize,
    pub min_source_score: f64,
    pub search_results: usize,
    /// The provider, or the providers searched together.
    pub search_api: SearchApiChoice,
    /// Web domains sources must be on (empty: any) and may not be on.
    pub include_domains: Vec<String>,
    pub exclude_domains: Vec<String>,
    pub report: ReportStyle,
    /// The spending cap, when the request set one.
    pub budget: Option<Budget>,
    #[schema(value_type = Option<String>, format = Uuid)]
    pub follow_up_of: Option<RunId>,
    pub plan_review: bool,
    pub breadth: u32,
    pub depth: u32,
    pub concurrency: u32,
    pub remember: bool,
    /// The model of each role; empty when no LLM is configured (an extractive digest is
    /// written instead).
    pub models: Vec<ModelInfo>,
    /// Whose provider key the models use: `request`, `server`, or `none`.
    pub api_key: String,
    #[schema(value_type = Option<String>)]
    pub thread_id: Option<ThreadId>,
}

impl ResolvedConfig {
    /// The search providers' names.
    pub(crate) fn providers(&self) -> Vec<String> {
        self.search_api.names()
    }

    /// Whether a source at `url` may be used: the user's own documents always; a web page
    /// when its host is on no excluded domain and, when domains are included, on one of them.
    pub(crate) fn allows(&self, url: &str) -> bool {
        let Ok(parsed) = url::Url::parse(url) else {
            return true;
        };
        if !matches!(parsed.scheme(), "http" | "https") {
            return true;
        }
        let host = parsed.host_str().unwrap_or("").to_ascii_lowercase();
        let host = host.trim_end_matches('.');
        let on = |domain: &String| {
            host == domain
                || host
                    .strip_suffix(domain.as_str())
                    .is_some_and(|rest| rest.ends_with('.'))
        };
        !self.exclude_domains.iter().any(on)
            && (self.include_domains.is_empty() || self.include_domains.iter().any(on))
    }

    /// The model named in events and history: the final-report model, else any.
    pub(crate) fn headline_model(&self) -> Option<String> {
        self.models
            .iter()
            .find(|model| model.role == ModelRole::FinalReport)
            .or_else(|| self.models.first())
            .map(|model| model.model.clone())
    }
}

/// Roles a research uses (the chat role is not one of them).
const RESEARCH_ROLES: [ModelRole; 5] = [
    ModelRole::Research,
    ModelRole::Summarization,
    ModelRole::Compression,
    ModelRole::FinalReport,
    ModelRole::Memory,
];

fn within(name: &str, value: Option<u32>, default: u32, limit: u32) -> Result<u32, String> {
    let value = value.unwrap_or(default);
    if value == 0 {
        return Err(format!("{name} must be at least 1"));
    }
    if value > limit {
        return Err(format!(
            "{name} is {value}, above this server's limit of {limit}"
        ));
    }
    Ok(value)
}

impl ResearchRequest {
    /// Checks the request and fills in the server's defaults; also builds the models it will
    /// use (with the request's key when it brings one). Errors are client mistakes.
    /// `server` are the server's models, reused when the request chooses no model, role
    /// model, token cap or key (otherwise the request's models are built from `llm`).
    pub(crate) fn resolve(
        &self,
        settings: &ResearchSettings,
        llm: &LlmSettings,
        default_search: &str,
        server: Option<&Models>,
    ) -> Result<(ResolvedConfig, Models), String> {
        let query = self.query.trim().to_string();
        if query.is_empty() {
            return Err("query must not be empty".into());
        }
        if query.chars().count() > MAX_QUERY_CHARS {
            return Err(format!("query is longer than {MAX_QUERY_CHARS} characters"));
        }
        let limits = &settings.limits;
        let mode = self.checked_mode()?;
        self.check_roles()?;
        let max_sources = self.max_sources.unwrap_or(settings.max_sources);
        if max_sources == 0 || max_sources > limits.max_sources {
            return Err(format!(
                "max_sources must be between 1 and {}",
                limits.max_sources
            ));
        }
        let models = self.models_for(llm, server)?;
        let config = ResolvedConfig {
            query,
            mode,
            allow_clarification: self
                .allow_clarification
                .unwrap_or(settings.allow_clarification),
            max_researcher_iterations: within(
                "max_researcher_iterations",
                self.max_researcher_iterations,
                settings.max_researcher_iterations,
                limits.max_researcher_iterations,
            )?,
            max_react_tool_calls: within(
                "max_react_tool_calls",
                self.max_react_tool_calls,
                settings.max_react_tool_calls,
                limits.max_react_tool_calls,
            )?,
            max_concurrent_research_units: within(
                "max_concurrent_research_units",
                self.max_concurrent_research_units,
                settings.max_concurrent_research_units,
                limits.max_concurrent_research_units,
            )?,
            max_sources,
            min_source_score: settings.min_source_score,
            search_results: settings.search_results.max(1),
            search_api: self.checked_search_api(default_search)?,
            include_domains: domains("include_domains", &self.include_domains)?,
            exclude_domains: domains("exclude_domains", &self.exclude_domains)?,
            report: self
                .report
                .as_ref()
                .map(ReportOptions::resolve)
                .transpose()?
                .unwrap_or_default(),
            budget: match &self.budget {
                Some(budget) => budget.resolve(limits.budget_tokens)?,
                None => None,
            },
            follow_up_of: self.follow_up_of,
            plan_review: self.plan_review.unwrap_or(false),
            breadth: within("breadth", self.breadth, settings.breadth, limits.breadth)?,
            depth: within("depth", self.depth, settings.depth, limits.depth)?,
            concurrency: within(
                "concurrency",
                self.concurrency,
                settings.concurrency,
                limits.concurrency,
            )?,
            remember: self.remember.unwrap_or(settings.remember_conclusions),
            models: models
                .list()
                .into_iter()
                .filter(|model| RESEARCH_ROLES.contains(&model.role))
                .collect(),
            api_key: if !models.configured() {
                "none"
            } else if self.api_key.is_some() {
                "request"
            } else {
                "server"
            }
            .to_string(),
            thread_id: self.thread_id,
        };
        Ok((config, models))
    }
}

impl ResearchRequest {
    /// `mode`, `supervisor` when not given.
    fn checked_mode(&self) -> Result<Mode, String> {
        match self.mode.as_deref().map(str::trim) {
            None | Some("" | "supervisor") => Ok(Mode::Supervisor),
            Some("recursive") => Ok(Mode::Recursive),
            Some(other) => Err(format!(
                "mode {other:?} is unknown; use \"supervisor\" or \"recursive\""
            )),
        }
    }

    /// The roles `models` and `max_tokens` name are research's, and each token cap is within
    /// the completion limit.
    fn check_roles(&self) -> Result<(), String> {
        for role in self.models.keys().chain(self.max_tokens.keys()) {
            if !RESEARCH_ROLES.iter().any(|known| known == &role.as_str()) {
                let names: Vec<&str> = RESEARCH_ROLES.iter().map(|role| role.as_str()).collect();
                return Err(format!(
                    "role {role:?} is unknown; roles are {}",
                    names.join(", ")
                ));
            }
        }
        for (role, tokens) in &self.max_tokens {
            if *tokens == 0 || *tokens > crate::config::MAX_COMPLETION_TOKENS {
                return Err(format!(
                    "max_tokens.{role} must be between 1 and {}",
                    crate::config::MAX_COMPLETION_TOKENS
                ));
            }
        }
        Ok(())
    }

    /// The models the research uses: the server's when the request changes none of them,
    /// else built from the request's choices and key over the server's settings. A key or a
    /// model name on a server without an LLM endpoint is refused, never silently replaced by
    /// the extractive path.
    fn models_for(&self, llm: &LlmSettings, server: Option<&Models>) -> Result<Models, String> {
        let has_endpoint = llm.base_url.as_deref().is_some_and(|url| !url.is_empty());
        if self.api_key.is_some() && !has_endpoint {
            return Err(
                "api_key was given, but this server has no LLM endpoint (llm.base_url) to use it with"
                    .into(),
            );
        }
        let overrides = self.model.as_deref().is_some_and(|m| !m.trim().is_empty())
            || !self.models.is_empty()
            || !self.max_tokens.is_empty()
            || self.api_key.is_some();
        let models = match server {
            Some(server) if !overrides => server.clone(),
            _ => Models::from_settings(&request_llm(llm, self)),
        };
        let named = self
            .model
            .iter()
            .chain(self.models.values())
            .map(|name| name.trim())
            .find(|name| !name.is_empty());
        if let Some(name) = named
            && !models.configured()
        {
            return Err(format!(
                "model {name:?} was asked for, but this server has no LLM endpoint (llm.base_url); leave the model out to research without one"
            ));
        }
        Ok(models)
    }

    /// The search providers: the server's default when none is named, at most
    /// `MAX_PROVIDERS`.
    fn checked_search_api(&self, default_search: &str) -> Result<SearchApiChoice, String> {
        let names = self
            .search_api
            .as_ref()
            .map(SearchApiChoice::names)
            .unwrap_or_default();
        match names.len() {
            0 => Ok(SearchApiChoice::One(default_search.to_string())),
            1 => Ok(SearchApiChoice::One(names[0].clone())),
            n if n > MAX_PROVIDERS => Err(format!(
                "search_api lists more than {MAX_PROVIDERS} providers"
            )),
            _ => Ok(SearchApiChoice::Many(names)),
        }
    }
}

/// The LLM settings of one request: its model choices and key over the server's.
fn request_llm(llm: &LlmSettings, request: &ResearchRequest) -> LlmSettings {
    let mut llm = llm.clone();
    if let Some(model) = request.model.as_deref().filter(|m| !m.trim().is_empty()) {
        llm.model = Some(model.trim().to_string());
        // One model named for the whole research replaces the per-role defaults.
        for role in RESEARCH_ROLES {
            if let Some(own) = llm.roles.get_mut(&role) {
                own.model = None;
            }
        }
    }
    // Role names were checked by `resolve`.
    for (role, model) in &request.models {
        if let Ok(role) = role.parse::<ModelRole>() {
            llm.roles.entry(role).or_default().model = Some(model.clone());
        }
    }
    for (role, tokens) in &request.max_tokens {
        if let Ok(role) = role.parse::<ModelRole>() {
            llm.roles.entry(role).or_default().max_tokens = Some(*tokens);
        }
    }
    if let Some(key) = &request.api_key {
        llm.api_key = Some(key.clone());
    }
    llm
}

#[cfg(test)]
mod tests {
    use super::*;

    fn llm() -> LlmSettings {
        LlmSettings {
            base_url: Some("http://127.0.0.1:9/v1".into()),
            model: Some("server-model".into()),
            ..LlmSettings::default()
        }
    }

    #[test]
    fn a_serialised_request_never_holds_its_key() {
        let request = ResearchRequest {
            query: "tides".into(),
            api_key: Some(SecretString::from("sk-user-secret-4242")),
            ..ResearchRequest::default()
        };
        let value = serde_json::to_value(&request).unwrap();
        assert_eq!(value["api_key"], serde_json::Value::Null);
        assert!(!value.to_string().contains("sk-user-secret-4242"));
        let back: ResearchRequest = serde_json::from_value(value).unwrap();
        assert_eq!(back.query, "tides");
        assert!(back.api_key.is_none());
    }

    #[test]
    fn defaults_fill_in_and_limits_refuse() {
        let settings = ResearchSettings::default();
        let request = ResearchRequest {
            query: "  tides  ".into(),
            ..ResearchRequest::default()
        };
        let (config, models) = request.resolve(&settings, &llm(), "local", None).unwrap();
        assert_eq!(config.query, "tides");
        assert_eq!(config.mode, Mode::Supervisor);
        assert_eq!(
            config.max_concurrent_research_units,
            settings.max_concurrent_research_units
        );
        assert_eq!(config.search_api, SearchApiChoice::One("local".into()));
        assert_eq!(config.api_key, "server");
        assert!(models.configured());
        assert!(config.models.iter().all(|m| m.model == "server-model"));
        assert!(!config.models.iter().any(|m| m.role == "chat"));

        let too_many = ResearchRequest {
            query: "q".into(),
            max_concurrent_research_units: Some(99),
            ..ResearchRequest::default()
        };
        let error = too_many
            .resolve(&settings, &llm(), "local", None)
            .unwrap_err();
        assert!(
            error.contains("max_concurrent_research_units is 99"),
            "{error}"
        );
        for bad in [
            ResearchRequest::default(),
            ResearchRequest {
                query: "q".into(),
                mode: Some("sideways".into()),
                ..ResearchRequest::default()
            },
            ResearchRequest {
                query: "q".into(),
                depth: Some(0),
                ..ResearchRequest::default()
            },
            ResearchRequest {
                query: "q".into(),
                models: BTreeMap::from([("chef".into(), "m".into())]),
                ..ResearchRequest::default()
            },
        ] {
            assert!(bad.resolve(&settings, &llm(), "local", None).is_err());
        }
    }

    #[test]
    fn request_models_and_key_override_the_server() {
        let request = ResearchRequest {
            query: "q".into(),
            model: Some("their-model".into()),
            models: BTreeMap::from([("final_report".into(), "writer".into())]),
            max_tokens: BTreeMap::from([("compression".into(), 123)]),
            api_key: Some(SecretString::from("sk-user-own-key")),
            ..ResearchRequest::default()
        };
        let (config, _) = request
            .resolve(&ResearchSettings::default(), &llm(), "local", None)
            .unwrap();
        let role = |name: &str| config.models.iter().find(|m| m.role == name).unwrap();
        assert_eq!(role("research").model, "their-model");
        assert_eq!(role("final_report").model, "writer");
        assert_eq!(role("compression").max_tokens, 123);
        assert_eq!(config.api_key, "request");
        assert_eq!(config.headline_model().as_deref(), Some("writer"));
        let shown = serde_json::to_string(&config).unwrap();
        assert!(!shown.contains("sk-user-own-key"));

        // A key without an endpoint to use it with is refused.
        let error = request
            .resolve(
                &ResearchSettings::default(),
                &LlmSettings::default(),
                "local",
                None,
            )
            .unwrap_err();
        assert!(error.contains("no LLM endpoint"));
        assert!(!error.contains("sk-user"));

        // A model named on a server without one is refused, not silently ignored.
        for request in [
            ResearchRequest {
                query: "q".into(),
                model: Some("gpt-4o".into()),
                ..ResearchRequest::default()
            },
            ResearchRequest {
                query: "q".into(),
                models: BTreeMap::from([("research".into(), "gpt-4o".into())]),
                ..ResearchRequest::default()
            },
        ] {
            let error = request
                .resolve(
                    &ResearchSettings::default(),
                    &LlmSettings::default(),
                    "local",
                    None,
                )
                .unwrap_err();
            assert!(error.contains("\"gpt-4o\" was asked for"), "{error}");
        }
    }
}
