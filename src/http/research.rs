//! Deep research, with the seed API's routes: start one and stream it, list and read past
//! researches, compare models, validate a request without running it.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::AppState;
use super::error::{ApiError, ApiResult, ErrorBody};
use super::extract::{ApiJson, ApiPath, ApiQuery};
use super::sse::run_event_response;
use crate::auth::AuthUser;
use crate::llm::roles::ModelInfo;
use crate::research::StartError;
use crate::research::export::ExportError;
use crate::research::request::{ResearchRequest, ResolvedConfig};
use crate::store::{ResearchRecord, RunId, UserId};

impl From<StartError> for ApiError {
    fn from(error: StartError) -> Self {
        match error {
            StartError::Invalid(message) => ApiError::bad_request(message),
            StartError::Store(error) => error.into(),
            StartError::NotAdmitted(error) => ApiError::from_error(error),
            StartError::Conflict(message) => {
                ApiError::new(crate::error::ErrorKind::Conflict, message)
            }
        }
    }
}

/// Models sent per `POST /research/compare`, at most.
const MAX_COMPARED_MODELS: usize = 4;

#[utoipa::path(post, path = "/research/stream", tag = "research", request_body = ResearchRequest,
    responses(
        (status = 200, description = "Server-sent events of the research run (resumable at `/v1/runs/{id}/events`)", content_type = "text/event-stream"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`thread_id` names none of your threads")),
    security(("bearer" = [])))]
pub(crate) async fn stream(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(request): ApiJson<ResearchRequest>,
) -> ApiResult<Response> {
    let (run, _) = state.research.start(user.user_id, &request).await?;
    Ok(run_event_response(&state, user.user_id, run.id, 0))
}

#[utoipa::path(post, path = "/research/{id}/follow-up", tag = "research",
    params(("id" = String, Path, format = Uuid, description = "The research to follow up")),
    request_body(content = ResearchRequest, description = "The follow-up question (`query`) and, optionally, any other research option; `follow_up_of` is set from the path"),
    responses(
        (status = 200, description = "Server-sent events of the follow-up research's run", content_type = "text/event-stream"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "No research of yours has this id"),
        (status = 409, body = ErrorBody, description = "That research is still running")),
    security(("bearer" = [])))]
pub(crate) async fn follow_up(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
    ApiJson(request): ApiJson<ResearchRequest>,
) -> ApiResult<Response> {
    let request = ResearchRequest {
        follow_up_of: Some(id),
        ..request
    };
    let (run, _) = state.research.start(user.user_id, &request).await?;
    Ok(run_event_response(&state, user.user_id, run.id, 0))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct ExportQuery {
    /// `markdown` (default; also `md`), `docx` or `pdf`.
    pub format: Option<crate::research::export::Format>,
}

impl From<ExportError> for ApiError {
    fn from(error: ExportError) -> Self {
        use crate::error::ErrorKind;
        let kind = match &error {
            ExportError::NoReport(_) => ErrorKind::Conflict,
            ExportError::Font(_) => ErrorKind::Unsupported,
            ExportError::Write(..) => ErrorKind::Internal,
        };
        ApiError::new(kind, error.to_string())
    }
}

#[utoipa::path(get, path = "/research/{id}/export", tag = "research",
    params(("id" = String, Path, format = Uuid), ExportQuery),
    responses(
        (status = 200, description = "The research as a file (Markdown, DOCX or PDF): the question, date and outcome, the report with its citations linked to their sources, and the numbered sources", content_type = "application/octet-stream"),
        (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The research has no report (it failed or is still running)"),
        (status = 501, body = ErrorBody, description = "No font on the server can write this PDF (the message says what to install)")),
    security(("bearer" = [])))]
pub(crate) async fn export(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
    ApiQuery(query): ApiQuery<ExportQuery>,
) -> ApiResult<Response> {
    use crate::research::export::{self, Format};
    let record = state.store.user(user.user_id).get_research(id).await?;
    let format = query.format.unwrap_or(Format::Markdown);
    let name = export::file_name(&record, format);
    let fonts = state.research.fonts();
    // Laying out a PDF is CPU work: off the async workers.
    let bytes = tokio::task::spawn_blocking(move || export::export(&record, format, &fonts))
        .await
        .map_err(|error| ApiError::new(crate::error::ErrorKind::Internal, error.to_string()))??;
    Ok((
        [
            (
                axum::http::header::CONTENT_TYPE,
                format.content_type().to_string(),
            ),
            (
                axum::http::header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        bytes,
    )
        .into_response())
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ResearchModels {
    pub llm_configured: bool,
    /// The server's default model (a request may name another with `model`).
    pub default_model: Option<String>,
    pub models: Vec<ModelInfo>,
    /// Every provider name, also those that are not configured.
    pub search_providers: Vec<&'static str>,
    /// Each provider and whether it can run on this server (a web provider needs its key or
    /// URL); `reason` says what is missing.
    pub search_provider_status: Vec<SearchProviderStatus>,
    pub default_search_api: String,
    /// The largest request body the server accepts (uploads included), in bytes.
    pub max_body_bytes: usize,
    /// The longest chat message the server accepts, in characters (a client checks before
    /// sending, so that nothing the user typed is lost to a refusal).
    pub max_message_chars: usize,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct SearchProviderStatus {
    pub name: &'static str,
    pub configured: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

#[utoipa::path(get, path = "/models", tag = "research",
    responses((status = 200, body = ResearchModels)), security(("bearer" = [])))]
pub(crate) async fn models(State(state): State<AppState>, _user: AuthUser) -> Json<ResearchModels> {
    Json(ResearchModels {
        llm_configured: state.models.configured(),
        default_model: state.settings.llm.model.clone(),
        models: state.models.list(),
        search_providers: crate::search::provider_names(),
        search_provider_status: state
            .research
            .search_providers()
            .into_iter()
            .map(|(name, reason)| SearchProviderStatus {
                name,
                configured: reason.is_none(),
                reason,
            })
            .collect(),
        default_search_api: state.research.default_search_api().to_string(),
        max_body_bytes: state.settings.server.max_body_bytes,
        max_message_chars: crate::store::MAX_MESSAGE_CHARS,
    })
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
pub(crate) struct HistoryQuery {
    /// 1–200, default 50.
    pub limit: Option<i64>,
}

/// One research in the history (the report itself is at `GET /research/{id}`).
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct HistoryItem {
    #[schema(value_type = String)]
    pub id: RunId,
    #[schema(value_type = String)]
    pub run_id: RunId,
    pub query: String,
    pub model: Option<String>,
    pub status: crate::store::RunStatus,
    pub word_count: i64,
    pub source_count: i64,
    pub duration_ms: Option<i64>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// The research this one follows up.
    #[schema(value_type = Option<String>, format = Uuid)]
    pub follow_up_of: Option<RunId>,
    /// The researches that follow this one up (among those listed).
    #[schema(value_type = Vec<String>)]
    pub follow_ups: Vec<RunId>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct History {
    pub research: Vec<HistoryItem>,
}

#[utoipa::path(get, path = "/research/history", tag = "research", params(HistoryQuery),
    responses((status = 200, body = History), (status = 400, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn history(
    State(state): State<AppState>,
    user: AuthUser,
    ApiQuery(query): ApiQuery<HistoryQuery>,
) -> ApiResult<Json<History>> {
    let limit = super::extract::page_limit(query.limit, 200)?;
    let records = state.store.user(user.user_id).list_research(limit).await?;
    let follows = |record: &ResearchRecord| -> Option<RunId> {
        record.config["follow_up_of"]
            .as_str()
            .and_then(|id| id.parse().ok())
    };
    let links: Vec<(RunId, RunId)> = records
        .iter()
        .filter_map(|record| follows(record).map(|earlier| (earlier, record.id)))
        .collect();
    Ok(Json(History {
        research: records
            .into_iter()
            .map(|record| HistoryItem {
                follow_up_of: follows(&record),
                follow_ups: links
                    .iter()
                    .filter(|(earlier, _)| *earlier == record.id)
                    .map(|(_, later)| *later)
                    .collect(),
                id: record.id,
                run_id: record.run_id,
                query: record.query,
                model: record.model,
                status: record.status,
                word_count: record.word_count,
                source_count: record.source_count,
                duration_ms: record.duration_ms,
                created_at: record.created_at,
            })
            .collect(),
    }))
}

#[utoipa::path(get, path = "/research/{id}", tag = "research",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 200, body = ResearchRecord), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn get(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
) -> ApiResult<Json<ResearchRecord>> {
    Ok(Json(state.store.user(user.user_id).get_research(id).await?))
}

#[utoipa::path(delete, path = "/research/history/{id}", tag = "research",
    params(("id" = String, Path, format = Uuid)),
    responses((status = 204), (status = 404, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn delete(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
) -> ApiResult<StatusCode> {
    state.store.user(user.user_id).delete_research(id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// How one model has done over the user's researches.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct ModelStats {
    pub model: String,
    pub runs: usize,
    pub completed: usize,
    /// Researches that wrote a report with some topics not covered (not counted as success).
    pub partial: usize,
    /// Completed researches over all that ended (partial and failed ones are not successes).
    pub success_rate: f64,
    pub mean_duration_seconds: Option<f64>,
    pub mean_sources: Option<f64>,
    pub mean_words: Option<f64>,
    /// Mean seconds per stage over researches that wrote a report (completed or partial).
    pub mean_stage_seconds: BTreeMap<String, f64>,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct Comparison {
    pub models: Vec<ModelStats>,
}

#[utoipa::path(get, path = "/research/comparison", tag = "research",
    responses((status = 200, body = Comparison)), security(("bearer" = [])))]
pub(crate) async fn comparison(
    State(state): State<AppState>,
    user: AuthUser,
) -> ApiResult<Json<Comparison>> {
    let records = state.store.user(user.user_id).list_research(10_000).await?;
    Ok(Json(Comparison {
        models: model_stats(&records),
    }))
}

fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// Per-model statistics; researches still running are left out.
pub(crate) fn model_stats(records: &[ResearchRecord]) -> Vec<ModelStats> {
    let mut by_model: BTreeMap<String, Vec<&ResearchRecord>> = BTreeMap::new();
    for record in records.iter().filter(|r| r.status != "running") {
        let model = record.model.clone().unwrap_or_else(|| "(no model)".into());
        by_model.entry(model).or_default().push(record);
    }
    by_model
        .into_iter()
        .map(|(model, records)| {
            let count = |status: &str| records.iter().filter(|r| r.status == status).count();
            let (completed, partial) = (count("completed"), count("partial"));
            let reported: Vec<&&ResearchRecord> = records
                .iter()
                .filter(|r| r.status == "completed" || r.status == "partial")
                .collect();
            let of = |get: fn(&ResearchRecord) -> f64| -> Option<f64> {
                mean(&reported.iter().map(|r| get(r)).collect::<Vec<_>>())
            };
            let mut stages: BTreeMap<String, Vec<f64>> = BTreeMap::new();
            for record in &reported {
                if let Some(timings) = record.stage_timings.as_object() {
                    for (stage, seconds) in timings {
                        if let Some(seconds) = seconds.as_f64() {
                            stages.entry(stage.clone()).or_default().push(seconds);
                        }
                    }
                }
            }
            ModelStats {
                model,
                runs: records.len(),
                completed,
                partial,
                success_rate: completed as f64 / records.len().max(1) as f64,
                mean_duration_seconds: of(|r| r.duration_ms.unwrap_or(0) as f64 / 1000.0),
                mean_sources: of(|r| r.source_count as f64),
                mean_words: of(|r| r.word_count as f64),
                mean_stage_seconds: stages
                    .into_iter()
                    .filter_map(|(stage, values)| mean(&values).map(|m| (stage, m)))
                    .collect(),
            }
        })
        .collect()
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct CompareBody {
    /// The models to compare (2–4); every other field is a research request.
    pub models: Vec<String>,
    #[serde(flatten)]
    pub request: ResearchRequest,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CompareResult {
    pub model: String,
    pub research: ResearchRecord,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct CompareResults {
    pub query: String,
    pub results: Vec<CompareResult>,
}

#[utoipa::path(post, path = "/research/compare", tag = "research", request_body = CompareBody,
    responses((status = 200, body = CompareResults), (status = 400, body = ErrorBody),
        (status = 404, body = ErrorBody, description = "`thread_id` names none of your threads")),
    security(("bearer" = [])))]
pub(crate) async fn compare(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(body): ApiJson<CompareBody>,
) -> ApiResult<Json<CompareResults>> {
    let mut models: Vec<String> = body
        .models
        .iter()
        .map(|m| m.trim().to_string())
        .filter(|m| !m.is_empty())
        .collect();
    models.dedup();
    if models.len() < 2 || models.len() > MAX_COMPARED_MODELS {
        return Err(ApiError::bad_request(format!(
            "models must name 2 to {MAX_COMPARED_MODELS} different models"
        )));
    }
    if !state.models.configured() {
        return Err(ApiError::bad_request(
            "comparing models needs an LLM endpoint (llm.base_url)",
        ));
    }
    // Every request is checked before any starts.
    let requests: Vec<ResearchRequest> = models
        .iter()
        .map(|model| ResearchRequest {
            model: Some(model.clone()),
            models: Default::default(),
            ..body.request.clone()
        })
        .collect();
    let prepared = requests
        .iter()
        .map(|request| state.research.prepare(request))
        .collect::<Result<Vec<_>, _>>()?;
    let mut started = Vec::new();
    for prepared in prepared {
        let (run, _) = state
            .research
            .start_prepared(user.user_id, prepared)
            .await?;
        started.push(run.id);
    }
    let finished = futures::future::join_all(
        started
            .iter()
            .map(|run| wait_for(&state, user.user_id, *run)),
    )
    .await;
    let mut results = Vec::new();
    for (model, outcome) in models.into_iter().zip(finished) {
        results.push(CompareResult {
            model,
            research: outcome?,
        });
    }
    Ok(Json(CompareResults {
        query: body.request.query.trim().to_string(),
        results,
    }))
}

/// Follows a research run to its end (as a reader, so it is not abandoned) and reads its
/// record.
async fn wait_for(state: &AppState, user: UserId, run: RunId) -> ApiResult<ResearchRecord> {
    let events = state.runs.follow(user, run, 0, state.streams_stop.clone());
    futures::pin_mut!(events);
    while events.next().await.is_some() {}
    // The record is written just before the run's end; a cancelled one is marked by a task.
    for _ in 0..50 {
        let record = state.store.user(user).get_research(run).await?;
        if record.status != "running" {
            return Ok(record);
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    Ok(state.store.user(user).get_research(run).await?)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub(crate) struct TestResult {
    pub valid: bool,
    /// What is wrong with the request, when it is not valid.
    pub error: Option<String>,
    /// What the research would run with.
    pub config: Option<ResolvedConfig>,
}

#[utoipa::path(post, path = "/research/test", tag = "research", request_body = ResearchRequest,
    responses((status = 200, body = TestResult)), security(("bearer" = [])))]
pub(crate) async fn test(
    State(state): State<AppState>,
    user: AuthUser,
    ApiJson(request): ApiJson<ResearchRequest>,
) -> ApiResult<Response> {
    let prepared = state.research.prepare(&request);
    let result = match prepared {
        Ok(prepared) => {
            let thread_ok = match prepared.config.thread_id {
                Some(thread) => state
                    .store
                    .user(user.user_id)
                    .get_thread(thread)
                    .await
                    .is_ok(),
                None => true,
            };
            if thread_ok {
                TestResult {
                    valid: true,
                    error: None,
                    config: Some(prepared.config),
                }
            } else {
                TestResult {
                    valid: false,
                    error: Some("thread_id does not name one of your threads".into()),
                    config: None,
                }
            }
        }
        Err(StartError::Invalid(message)) => TestResult {
            valid: false,
            error: Some(message),
            config: None,
        },
        Err(
            error @ (StartError::Store(_) | StartError::NotAdmitted(_) | StartError::Conflict(_)),
        ) => {
            return Err(error.into());
        }
    };
    Ok((StatusCode::OK, Json(result)).into_response())
}

/// `POST /v1/runs/{id}/input`: approve or edit a plan, answer a clarifying question.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
pub(crate) struct RunInput {
    /// `false` rejects the plan (the research ends).
    pub approve: Option<bool>,
    /// An edited list of research topics replacing the plan.
    pub topics: Option<Vec<String>>,
    /// An answer to a clarifying question.
    pub content: Option<String>,
}

#[utoipa::path(post, path = "/v1/runs/{id}/input", tag = "runs",
    params(("id" = String, Path, format = Uuid)), request_body = RunInput,
    responses((status = 202), (status = 404, body = ErrorBody), (status = 409, body = ErrorBody)),
    security(("bearer" = [])))]
pub(crate) async fn input(
    State(state): State<AppState>,
    user: AuthUser,
    ApiPath(id): ApiPath<RunId>,
    ApiJson(body): ApiJson<RunInput>,
) -> ApiResult<StatusCode> {
    state.store.user(user.user_id).get_run(id).await?;
    let value: Value = json!({
        "approve": body.approve, "topics": body.topics, "content": body.content,
    });
    state
        .runs
        .request_input(user.user_id, id, value)
        .await?
        .map_err(|refused| {
            let message = match refused {
                crate::runs::InputRefused::NotLive => "the run is not running",
                crate::runs::InputRefused::NotAwaiting => "the run is not waiting for input",
            };
            ApiError::new(crate::error::ErrorKind::Conflict, message)
        })?;
    Ok(StatusCode::ACCEPTED)
}
