//! The HTTP surface: the router, the service endpoints (`/`, `/health`, `/metrics`, `/docs`,
//! `/openapi.json`) and one module per resource. Only this module (and the `AuthUser`
//! extractor) knows axum.

mod accounts;
mod documents;
pub(crate) mod error;
pub(crate) mod extract;
mod guard;
pub(crate) mod limits;
mod mcp;
mod memories;
mod openai;
mod research;
mod runs;
mod sse;
mod state;
mod threads;
mod web;

pub use state::AppState;
pub(crate) use web::app_built as web_app_built;

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;

use axum::Json;
use axum::Router;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use serde::Serialize;
use serde_json::{Value, json};
use tower_http::catch_panic::CatchPanicLayer;
use tower_http::trace::TraceLayer;
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::error::ErrorKind;
use error::ApiError;

/// The document's frame: title, tags, the schemas no operation names (the run events, read
/// from SSE). The paths come from [`api_routes`], the one route table.
#[derive(OpenApi)]
#[openapi(
    info(title = "mnemo", description = "A research assistant that remembers. Authenticate with `Authorization: Bearer <api key or JWT>`, or, in a browser, with the session cookie of `POST /v1/auth/login` (then a request that writes must send `X-Mnemo-CSRF: 1`)."),
    components(schemas(
        error::ErrorBody, error::ErrorDetail, crate::research::export::Format,
        crate::runs::events::RunEvent, crate::runs::events::Envelope,
    )),
    tags(
        (name = "service", description = "Status and documentation"),
        (name = "auth", description = "The web app's sign-in: first administrator, name and password, the session cookie"),
        (name = "admin", description = "Users and their API keys, for administrators"),
        (name = "threads", description = "Conversations (working memory)"),
        (name = "runs", description = "Chat turns and research jobs, with resumable event streams"),
        (name = "memories", description = "The user's long-term memory: hybrid recall, history, export and import"),
        (name = "research", description = "Deep research: streamed, cited reports; history and model comparison"),
        (name = "documents", description = "The user's own documents, searched by local research"),
        (name = "openai", description = "OpenAI-compatible chat completions and model list, with mnemo's memory behind them"),
    )
)]
struct ApiDoc;

/// Every documented operation, routed and described from the same `#[utoipa::path]`: a route
/// cannot be served without being in the document, nor documented without being served.
fn api_routes() -> OpenApiRouter<AppState> {
    OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(root))
        .routes(routes!(health))
        .routes(routes!(models))
        .routes(routes!(me, update_me))
        .routes(routes!(accounts::status))
        .routes(routes!(accounts::setup))
        .routes(routes!(accounts::login))
        .routes(routes!(accounts::logout))
        .routes(routes!(accounts::list_users, accounts::create_user))
        .routes(routes!(accounts::update_user))
        .routes(routes!(accounts::issue_key, accounts::revoke_keys))
        .routes(routes!(threads::create_thread, threads::list_threads))
        .routes(routes!(
            threads::get_thread,
            threads::rename_thread,
            threads::delete_thread
        ))
        .routes(routes!(threads::post_message))
        .routes(routes!(threads::retry_message))
        .routes(routes!(threads::import_conversation))
        .routes(routes!(threads::job_state))
        .routes(routes!(runs::get_run))
        .routes(routes!(runs::run_events))
        .routes(routes!(runs::cancel_run))
        .routes(routes!(runs::run_memory))
        .routes(routes!(research::input))
        .routes(routes!(memories::search))
        .routes(routes!(memories::list, memories::add, memories::delete_all))
        .routes(routes!(memories::export))
        .routes(routes!(memories::forget))
        .routes(routes!(memories::forgotten))
        .routes(routes!(memories::restore))
        .routes(routes!(memories::import))
        .routes(routes!(memories::import_status))
        .routes(routes!(memories::get, memories::patch, memories::delete))
        .routes(routes!(research::models))
        .routes(routes!(research::stream))
        .routes(routes!(research::history))
        .routes(routes!(research::delete))
        .routes(routes!(research::comparison))
        .routes(routes!(research::compare))
        .routes(routes!(research::test))
        .routes(routes!(research::get))
        .routes(routes!(research::follow_up))
        .routes(routes!(research::export))
        .routes(routes!(documents::ingest, documents::list))
        .routes(routes!(documents::get, documents::delete))
        .routes(routes!(openai::completions))
        .routes(routes!(openai::list_models))
        .routes(routes!(openai::get_model))
}

/// The modifiers run on the whole document, after the route table has added its paths.
fn finish_document(mut openapi: utoipa::openapi::OpenApi) -> utoipa::openapi::OpenApi {
    use utoipa::Modify;
    BearerAuth.modify(&mut openapi);
    CommonErrors.modify(&mut openapi);
    CompareSchema.modify(&mut openapi);
    unique_operation_ids(&mut openapi);
    openapi
}

/// An operation's id is its handler's name, which several resources share (`get`, `list`,
/// `delete`, …); OpenAPI wants them unique (client generators name functions by them), so
/// a shared name gets its tag in front (`memories_get`, `research_get`).
fn unique_operation_ids(openapi: &mut utoipa::openapi::OpenApi) {
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    for operation in operations(openapi) {
        if let Some(id) = &operation.operation_id {
            *seen.entry(id.clone()).or_default() += 1;
        }
    }
    for operation in operations(openapi) {
        let Some(id) = operation.operation_id.as_mut() else {
            continue;
        };
        if seen.get(id.as_str()).is_some_and(|count| *count > 1) {
            let tag = operation
                .tags
                .as_ref()
                .and_then(|tags| tags.first())
                .map_or("api", String::as_str);
            *id = format!("{tag}_{id}");
        }
    }
}

/// Every operation of the document, whatever its method.
fn operations(
    openapi: &mut utoipa::openapi::OpenApi,
) -> impl Iterator<Item = &mut utoipa::openapi::path::Operation> {
    openapi.paths.paths.values_mut().flat_map(|item| {
        [
            &mut item.get,
            &mut item.put,
            &mut item.post,
            &mut item.delete,
            &mut item.patch,
        ]
        .into_iter()
        .flatten()
    })
}

struct BearerAuth;

/// `CompareBody` is a research request whose `models` is a list of model names: derived, it
/// would be `allOf` the request (whose `models` is a per-role map and which allows no other
/// field) and the list, which no body can satisfy. Written out here from the request's schema.
struct CompareSchema;

impl utoipa::Modify for CompareSchema {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::RefOr;
        use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
        let Some(components) = openapi.components.as_mut() else {
            return;
        };
        let Some(RefOr::T(Schema::Object(request))) = components.schemas.get("ResearchRequest")
        else {
            return;
        };
        let mut body = request.clone();
        body.description = Some(
            "A research request run once per model in `models`; every other field as in \
             `POST /research/stream`."
                .into(),
        );
        let models = ArrayBuilder::new()
            .items(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1)),
            )
            .min_items(Some(2))
            .max_items(Some(4))
            .description(Some("The models to compare (2–4 different names)."))
            .build();
        body.properties.insert("models".into(), models.into());
        if !body.required.iter().any(|field| field == "models") {
            body.required.push("models".into());
        }
        components
            .schemas
            .insert("CompareBody".into(), RefOr::T(Schema::Object(body)));
    }
}

/// Statuses every operation can answer, documented once: 401 and 429 on authenticated
/// operations (bad credentials, the per-user request quota or run cap), 403 on authenticated
/// writes (the session cookie's CSRF check), 400 where there is a
/// parameter or body to get wrong, 413 where there is a body, 503 everywhere (a backend is
/// down).
struct CommonErrors;

impl utoipa::Modify for CommonErrors {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::{Content, Ref, RefOr, ResponseBuilder};
        let error = |description: &str| -> RefOr<utoipa::openapi::Response> {
            ResponseBuilder::new()
                .description(description)
                .content(
                    "application/json",
                    Content::new(Some(Ref::from_schema_name("ErrorBody"))),
                )
                .build()
                .into()
        };
        for operation in operations(openapi) {
            let responses = &mut operation.responses.responses;
            if operation.security.as_ref().is_some_and(|s| !s.is_empty()) {
                responses
                    .entry("401".into())
                    .or_insert_with(|| error("Missing or invalid credentials"));
                responses.entry("429".into()).or_insert_with(|| {
                    error("Too many requests or running runs for this user (see `Retry-After`)")
                });
            }
            let has_parameters = operation.parameters.as_ref().is_some_and(|p| !p.is_empty());
            if has_parameters || operation.request_body.is_some() {
                responses.entry("400".into()).or_insert_with(|| {
                        error("The request is malformed: a path id that is not a UUID, a query parameter or body out of its bounds, a NUL character")
                    });
            }
            if operation.request_body.is_some() {
                responses
                    .entry("413".into())
                    .or_insert_with(|| error("The body is larger than `server.max_body_bytes`"));
            }
            responses
                .entry("503".into())
                .or_insert_with(|| error("A backend is unavailable; try again later"));
        }
        // A write signed in by the session cookie is refused without `X-Mnemo-CSRF` or from
        // another origin.
        for item in openapi.paths.paths.values_mut() {
            let writes = [
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ];
            for operation in writes.into_iter().flatten() {
                if operation.security.as_ref().is_some_and(|s| !s.is_empty()) {
                    operation.responses.responses.entry("403".into()).or_insert_with(|| {
                        error("Signed in by the session cookie, the request lacks `X-Mnemo-CSRF` or comes from another origin")
                    });
                }
            }
        }
    }
}

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

/// Serves until `state.shutdown` is cancelled, then shuts down in order.
pub async fn serve(listener: TcpListener, state: AppState) -> std::io::Result<()> {
    let app = router(state.clone());
    let shutdown = state.shutdown.clone();
    let runs = state.runs.clone();
    let streams_stop = state.streams_stop.clone();
    let grace = state.grace();
    let signal = async move {
        shutdown.cancelled().await;
        tracing::info!("shutting down: finishing runs and closing streams");
        runs.shutdown(grace).await;
        streams_stop.cancel();
    };
    let limits = ConnectionLimits {
        header_read_timeout: Duration::from_secs(state.settings.server.header_read_timeout_secs),
        max_connections: state.settings.server.max_connections,
    };
    serve_connections(listener, app, limits, signal).await;
    state.close_backends().await;
    Ok(())
}

/// What one connection may hold.
struct ConnectionLimits {
    header_read_timeout: Duration,
    max_connections: usize,
}

/// Accepts connections until `signal` completes, then waits for the open ones (their streams
/// were ended by the signal) for a few seconds. A connection that has not sent a whole request
/// head within the header-read timeout is closed (slowloris); past `max_connections`, new
/// ones wait in the listen queue for a free slot.
async fn serve_connections(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    signal: impl std::future::Future<Output = ()>,
) {
    use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
    use hyper_util::server::conn::auto::Builder;
    use hyper_util::server::graceful::GracefulShutdown;
    use hyper_util::service::TowerToHyperService;

    let slots = Arc::new(tokio::sync::Semaphore::new(limits.max_connections));
    let graceful = GracefulShutdown::new();
    let mut builder = Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    tokio::pin!(signal);
    loop {
        let slot = tokio::select! {
            slot = slots.clone().acquire_owned() => slot,
            () = &mut signal => break,
        };
        let Ok(slot) = slot else { break };
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Out of file descriptors and the like: back off, do not spin.
                    tracing::warn!(%error, "accepting a connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut signal => break,
        };
        let service = TowerToHyperService::new(app.clone());
        let connection = builder
            .serve_connection_with_upgrades(TokioIo::new(stream), service)
            .into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            if let Err(error) = connection.await {
                tracing::debug!(%error, "connection closed with an error");
            }
            drop(slot);
        });
    }
    drop(listener);
    if tokio::time::timeout(Duration::from_secs(5), graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!("connections still open after shutdown; closing them");
    }
}

/// The OpenAPI document of the whole HTTP surface.
pub fn openapi() -> utoipa::openapi::OpenApi {
    finish_document(api_routes().into_openapi())
}

pub(crate) fn router(state: AppState) -> Router {
    let max_body = state.settings.server.max_body_bytes;
    let (api, _) = api_routes().split_for_parts();
    api.route("/assets/{*path}", get(web::asset))
        .route("/favicon.svg", get(web::favicon))
        .route("/metrics", get(metrics_text))
        .route("/openapi.json", get(openapi_json))
        .route("/docs", get(docs_page))
        .route("/redoc", get(web::reference_page))
        .route("/redoc/reference.js", get(web::reference_script))
        .route("/redoc/reference.css", get(web::reference_style))
        .merge(mcp::routes(&state))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(max_body))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            guard::check_request,
        ))
        .layer(middleware::from_fn(error::log_errors))
        .layer(middleware::from_fn(record_metrics))
        .layer(TraceLayer::new_for_http())
        .layer(CatchPanicLayer::custom(panic_response))
        .with_state(state)
}

async fn not_found(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::not_found(format!("no route for {method} {}", uri.path()))
}

async fn method_not_allowed(method: Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        ErrorKind::MethodNotAllowed,
        format!("method {method} is not allowed on {}", uri.path()),
    )
}

fn panic_response(_: Box<dyn std::any::Any + Send + 'static>) -> Response {
    ApiError::new(ErrorKind::Internal, "handler panicked").into_response()
}

/// Request count and latency per route and status; the matched route (not the raw path) is
/// the label, so ids do not explode the series.
async fn record_metrics(request: Request, next: Next) -> Response {
    let started = Instant::now();
    let method = request.method().as_str().to_string();
    let route = request
        .extensions()
        .get::<MatchedPath>()
        .map(|path| path.as_str().to_string())
        .unwrap_or_else(|| "unmatched".to_string());
    let response = next.run(request).await;
    let status = response.status().as_u16().to_string();
    let labels = [("method", method), ("route", route), ("status", status)];
    metrics::counter!("mnemo_http_requests_total", &labels).increment(1);
    metrics::histogram!("mnemo_http_request_duration_seconds", &labels)
        .record(started.elapsed().as_secs_f64());
    response
}

#[derive(Serialize, utoipa::ToSchema)]
struct RootInfo {
    name: &'static str,
    version: &'static str,
    docs: &'static str,
    /// The read-only API reference.
    reference: &'static str,
    openapi: &'static str,
    health: &'static str,
    /// Where the web app is served (`/` for a browser), or "not built" when this binary was
    /// built without it.
    app: &'static str,
}

/// A browser (`Accept: text/html`) gets the web app; any other client this description.
#[utoipa::path(get, path = "/", tag = "service",
    responses((status = 200, body = RootInfo,
        description = "The service description; with `Accept: text/html`, the web app's page")))]
async fn root(headers: axum::http::HeaderMap) -> Response {
    if web::wants_html(&headers) {
        return web::index_page();
    }
    Json(RootInfo {
        name: "mnemo",
        version: env!("CARGO_PKG_VERSION"),
        docs: "/docs",
        reference: "/redoc",
        openapi: "/openapi.json",
        health: "/health",
        app: if web::app_built() { "/" } else { "not built" },
    })
    .into_response()
}

#[utoipa::path(get, path = "/health", tag = "service",
    description = "Each component's status. The details (backends, index lag, the memory \
        writer's recent failures, models) only for an administrator's key \
        (`server.admin_users`): they can quote users' words.",
    responses((status = 200, description = "Every component is up"),
        (status = 503, description = "A required component is down")))]
async fn health(State(state): State<AppState>, headers: axum::http::HeaderMap) -> Response {
    let admin = is_admin(&state, &headers).await;
    let database = match state.store.ping().await {
        Ok(()) => {
            json!({ "status": "ok", "backend": state.store.backend(), "url": state.database_display })
        }
        Err(error) => {
            tracing::warn!(%error, "health: database ping failed");
            json!({ "status": "down", "backend": state.store.backend(), "url": state.database_display })
        }
    };
    let lag = state.memory.indexer().lag().await;
    let memory = state.memory.status();
    let indexes = match &lag {
        Ok(lag) => {
            metrics::gauge!("mnemo_index_lag", "index" => "vector").set(lag.vector_lag() as f64);
            metrics::gauge!("mnemo_index_lag", "index" => "keyword").set(lag.keyword_lag() as f64);
            json!({
                "status": "ok",
                "log_head": lag.log_head,
                "vector": { "backend": memory.vector_backend, "applied": lag.vector_applied, "lag": lag.vector_lag() },
                "keyword": { "backend": "tantivy", "applied": lag.keyword_applied, "lag": lag.keyword_lag() },
            })
        }
        Err(error) => json!({ "status": "down", "error": error.to_string() }),
    };
    let healthy = database["status"] == "ok" && lag.is_ok();
    // A model that does not answer degrades the server (chat answers from memory only) but
    // does not take it out of a load balancer: the status says so, the code stays 200.
    let (llm, llm_down) = match state.models.reachability().await {
        None => (json!({ "status": "not_configured" }), false),
        Some(crate::llm::roles::Reachability::Ok) => (
            json!({ "status": "ok", "models": state.models.list() }),
            false,
        ),
        Some(crate::llm::roles::Reachability::Down { error }) => (
            json!({ "status": "down", "error": error, "models": state.models.list() }),
            true,
        ),
    };
    // A configured search provider that cannot be reached degrades research the same way.
    let search = state.research.search_health().await;
    let search_down = search["status"] == "down";
    let body: Value = json!({
        "status": if healthy && !llm_down && !search_down { "ok" } else { "degraded" },
        "version": env!("CARGO_PKG_VERSION"),
        "uptime_secs": state.started_at.elapsed().as_secs(),
        "components": {
            "database": database,
            "embedder": { "status": "ok", "model": memory.embedder_model, "dimension": memory.dimension },
            "vector_index": { "status": indexes["status"], "backend": memory.vector_backend },
            "keyword_index": { "status": indexes["status"], "backend": "tantivy" },
            "indexes": indexes,
            "llm": llm,
            "search": search,
            "runs": { "status": "ok", "active": state.runs.active() },
            "web": { "status": if web::app_built() { "ok" } else { "not_built" }, "build": web::dist_stamp() },
            "memory_writer": state.writer.health().await,
            "auth": {
                "status": "ok",
                "api_keys": true,
                "jwt": state.auth.jwt_enabled(),
                "dev_mode": state.settings.server.dev,
            },
        },
    });
    let status = if healthy {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let body = if admin { body } else { states_only(body) };
    (status, Json(body)).into_response()
}

/// Whether the request carries the credential of an administrator: a user with the admin flag
/// or named in `server.admin_users` (the local user in `--dev`).
async fn is_admin(state: &AppState, headers: &axum::http::HeaderMap) -> bool {
    let authorization = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    if authorization.is_none() && !state.settings.server.dev {
        return false;
    }
    match state.auth.authenticate(authorization).await {
        Ok(user) => {
            state.settings.server.dev && authorization.is_none()
                || user.is_admin
                || state.settings.server.is_admin(&user.name)
        }
        Err(_) => false,
    }
}

/// The health body without details: the overall status, the version and each component's
/// status.
fn states_only(body: Value) -> Value {
    let components: serde_json::Map<String, Value> = body["components"]
        .as_object()
        .map(|components| {
            components
                .iter()
                .map(|(name, component)| {
                    (
                        name.clone(),
                        json!({ "status": component["status"].clone() }),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    json!({
        "status": body["status"],
        "version": body["version"],
        "components": components,
    })
}

#[derive(Serialize, utoipa::ToSchema)]
struct ModelsInfo {
    /// False when no LLM endpoint is configured (chat then answers from memory alone).
    llm_configured: bool,
    models: Vec<crate::llm::roles::ModelInfo>,
    embedder: String,
    embedding_dimension: usize,
}

/// Who the credential of a request belongs to, and their settings.
#[derive(Serialize, utoipa::ToSchema)]
struct Me {
    #[schema(value_type = String, format = Uuid)]
    id: crate::store::UserId,
    name: String,
    /// The memory switch: off, chats neither recall nor store memories (what is remembered
    /// stays, and can still be read, searched and edited).
    memory_enabled: bool,
    /// May manage users and keys (`/v1/admin/*`).
    is_admin: bool,
    /// How this request signed in.
    signed_in_via: crate::auth::SignedInVia,
}

impl Me {
    async fn of(state: &AppState, user: crate::auth::AuthUser) -> error::ApiResult<Self> {
        let memory_enabled = state.store.user(user.user_id).memory_enabled().await?;
        Ok(Self {
            is_admin: accounts::is_admin(state, &user),
            signed_in_via: user.via,
            id: user.user_id,
            name: user.name,
            memory_enabled,
        })
    }
}

/// The signed-in user: what the web app shows as "signed in as", and their settings. Signed in
/// by the session cookie, the answer renews the cookie.
#[utoipa::path(get, path = "/v1/me", tag = "service",
    responses((status = 200, body = Me)), security(("bearer" = [])))]
async fn me(
    State(state): State<AppState>,
    headers: axum::http::HeaderMap,
    user: crate::auth::AuthUser,
) -> error::ApiResult<Response> {
    let cookie = accounts::renewed_cookie(&headers, &user);
    let mut response = Json(Me::of(&state, user).await?).into_response();
    if let Some(cookie) = cookie {
        response.headers_mut().insert(header::SET_COOKIE, cookie);
    }
    Ok(response)
}

/// The settings a user changes for themselves.
#[derive(serde::Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UpdateMe {
    /// Turns the memory switch on or off.
    memory_enabled: Option<bool>,
}

/// Changes the signed-in user's settings.
#[utoipa::path(patch, path = "/v1/me", tag = "service", request_body = UpdateMe,
    responses((status = 200, body = Me), (status = 400, body = error::ErrorBody)),
    security(("bearer" = [])))]
async fn update_me(
    State(state): State<AppState>,
    user: crate::auth::AuthUser,
    extract::ApiJson(body): extract::ApiJson<UpdateMe>,
) -> error::ApiResult<Json<Me>> {
    if let Some(enabled) = body.memory_enabled {
        state
            .store
            .user(user.user_id)
            .set_memory_enabled(enabled)
            .await?;
    }
    Ok(Json(Me::of(&state, user).await?))
}

#[utoipa::path(get, path = "/v1/roles", tag = "service",
    responses((status = 200, body = ModelsInfo)), security(("bearer" = [])))]
async fn models(State(state): State<AppState>, _user: crate::auth::AuthUser) -> Json<ModelsInfo> {
    let memory = state.memory.status();
    Json(ModelsInfo {
        llm_configured: state.models.configured(),
        models: state.models.list(),
        embedder: memory.embedder_model,
        embedding_dimension: memory.dimension,
    })
}

async fn metrics_text(State(state): State<AppState>) -> Response {
    let _ = state.writer.health().await;
    if let Ok(lag) = state.memory.indexer().lag().await {
        metrics::gauge!("mnemo_index_lag", "index" => "vector").set(lag.vector_lag() as f64);
        metrics::gauge!("mnemo_index_lag", "index" => "keyword").set(lag.keyword_lag() as f64);
    }
    let mut response = state.metrics.render().into_response();
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

async fn openapi_json() -> Json<utoipa::openapi::OpenApi> {
    static DOCUMENT: std::sync::LazyLock<utoipa::openapi::OpenApi> =
        std::sync::LazyLock::new(openapi);
    Json(DOCUMENT.clone())
}

async fn docs_page() -> Html<&'static str> {
    Html(include_str!("docs.html"))
}
