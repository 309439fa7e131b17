// The one place that knows mnemo's HTTP API: typed request and response shapes (as the Rust
// handlers in src/http/*.rs serialise them) and one function per endpoint. Every call sends the
// signed-in credential as `Authorization: Bearer …` when the user signed in with a key or a
// token, and otherwise the session cookie (same-origin), with `X-Mnemo-CSRF: 1` on every
// unsafe method (the server refuses a cookie write without it); a 401 anywhere signs the user
// out.

import type { components } from './generated/api'
import { credential } from './session'

// ---- shapes -------------------------------------------------------------------------------
// The server's own types, generated from its OpenAPI document (web/scripts/gen-api), under
// the names the views use; only request shapes the document names otherwise are written here.

type Schemas = components['schemas']

export type Thread = Schemas['Thread']

export type Role = Schemas['Role']

export type Message = Schemas['Message']

export type ThreadList = Schemas['ThreadList']

export type ThreadWithMessages = Schemas['ThreadWithMessages']

export type RunStatus = Schemas['RunStatus']

export type Run = Schemas['Run']

export const MEMORY_KINDS = [
  'turn',
  'preference',
  'fact',
  'event',
  'conclusion',
  'profile',
  'document',
] as const satisfies readonly Schemas['MemoryKind'][]
export type MemoryKind = Schemas['MemoryKind']
export const TRUSTS = ['user', 'assistant', 'document', 'tool', 'web'] as const satisfies readonly Schemas['Trust'][]
export type Trust = Schemas['Trust']
export type MemorySource = Schemas['MemorySource']

export type Memory = Schemas['Memory']

export type MemoryVersion = Schemas['MemoryVersion']

export type MemoryWithHistory = Schemas['MemoryWithHistory']

export type MemoryList = Schemas['MemoryList']

export type Signals = Schemas['Signals']

export type Recalled = Schemas['Recalled']

export type RecallTimings = Schemas['RecallTimings']

export type RecallResponse = Schemas['RecallResponse']

export type RecallMode = Schemas['RecallMode']

export interface SearchRequest {
  query: string
  k?: number
  kinds?: MemoryKind[]
  since?: string
  until?: string
  include_archived?: boolean
  mode?: RecallMode
  decay?: boolean
}

export interface ListMemoriesQuery {
  kinds?: MemoryKind[]
  trust?: Trust
  thread_id?: string
  since?: string
  until?: string
  include_archived?: boolean
  include_invalid?: boolean
  limit?: number
  before?: string
}

export interface MemoryPatch {
  content?: string
  kind?: MemoryKind
  importance?: number
  archived?: boolean
}

export interface NewMemoryBody {
  content: string
  kind?: MemoryKind
  importance?: number
  source_refs?: string[]
}

export type ImportReport = Schemas['ImportReport']

export type DocumentInfo = Schemas['Document']

export type DocumentChunk = Schemas['DocumentChunk']

export type DocumentWithChunks = Schemas['DocumentWithChunks']

export type DocumentList = Schemas['DocumentList']

export type ModelInfo = Schemas['ModelInfo']

/** A chat turn's memory job and, once done, what it stored or changed. */
export type RunMemory = Schemas['RunMemory']

export type ChangedMemory = Schemas['ChangedMemory']

export type ResearchModels = Schemas['ResearchModels']

export type ReportOptions = Schemas['ReportOptions']

export type ExportFormat = 'markdown' | 'docx' | 'pdf'

export type ResearchRequest = Schemas['ResearchRequest']

export type HistoryItem = Schemas['HistoryItem']

export type CitedSource = Schemas['CitedSource']

/**
 * A stored research. The store keeps its configuration and sources as the JSON snapshots the
 * research wrote (a `ResolvedConfig`, numbered `CitedSource`s), which the document leaves open.
 */
export type ResearchRecord = Omit<Schemas['ResearchRecord'], 'config' | 'sources'> & {
  config: Schemas['ResolvedConfig']
  sources: CitedSource[]
}

export type ModelStats = Schemas['ModelStats']

export interface CompareResults {
  query: string
  results: { model: string; research: ResearchRecord }[]
}

export interface RunInputBody {
  approve?: boolean
  topics?: string[]
  content?: string
}

// ---- errors and transport -----------------------------------------------------------------

/** An error answer of the API (`{"error": {"code", "message"}}`), or a transport failure. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message)
    this.name = 'ApiError'
  }
}

let unauthorized: (message: string) => void = () => undefined

/** Called on every 401: the app clears the credential and shows the sign-in form. */
export function onUnauthorized(handler: (message: string) => void): void {
  unauthorized = handler
}

type Query = Record<string, string | number | boolean | undefined | null>

function withQuery(path: string, query?: Query): string {
  if (!query) return path
  const params = new URLSearchParams()
  for (const [key, value] of Object.entries(query)) {
    if (value === undefined || value === null || value === '') continue
    params.set(key, String(value))
  }
  const text = params.toString()
  return text ? `${path}?${text}` : path
}

interface RequestOptions {
  json?: unknown
  body?: BodyInit
  contentType?: string
  query?: Query
  headers?: Record<string, string>
  signal?: AbortSignal
  /** Use this credential instead of the signed-in one (the sign-in check). */
  token?: string
  /** A 401 is the answer itself (a wrong password), not a sign-out. */
  expect401?: boolean
}

const SAFE_METHODS = ['GET', 'HEAD', 'OPTIONS']

/** Sends a request with the credential and returns the raw response (after error checks). */
export async function send(method: string, path: string, options: RequestOptions = {}): Promise<Response> {
  const headers: Record<string, string> = { accept: 'application/json', ...options.headers }
  const token = options.token ?? credential()
  if (token) headers.authorization = `Bearer ${token}`
  if (!SAFE_METHODS.includes(method.toUpperCase())) headers['x-mnemo-csrf'] = '1'
  let body: BodyInit | undefined = options.body
  if (options.json !== undefined) {
    body = JSON.stringify(options.json)
    headers['content-type'] = 'application/json'
  } else if (options.contentType) {
    headers['content-type'] = options.contentType
  }
  let response: Response
  try {
    response = await fetch(withQuery(path, options.query), {
      method,
      headers,
      body,
      signal: options.signal,
      credentials: 'same-origin',
      cache: 'no-store',
    })
  } catch (error) {
    if (error instanceof DOMException && error.name === 'AbortError') throw error
    throw new ApiError(0, 'network', 'The server could not be reached. Check your connection.')
  }
  if (!response.ok) throw await errorOf(response, options.token === undefined && !options.expect401)
  return response
}

async function errorOf(response: Response, signOutOn401: boolean): Promise<ApiError> {
  let code = `http_${response.status}`
  let message = `${response.status} ${response.statusText}`.trim()
  try {
    const body = (await response.json()) as { error?: { code?: string; message?: string } }
    if (body.error?.code) code = body.error.code
    if (body.error?.message) message = body.error.message
  } catch {
    // Not a JSON error body (a proxy's page, say): keep the status line.
  }
  if (response.status === 401 && signOutOn401) {
    unauthorized('The server did not accept your credentials (it may have been revoked or the token expired). Sign in again.')
  }
  return new ApiError(response.status, code, message)
}

async function json<T>(method: string, path: string, options: RequestOptions = {}): Promise<T> {
  const response = await send(method, path, options)
  if (response.status === 204) return undefined as T
  const text = await response.text()
  return (text ? JSON.parse(text) : undefined) as T
}

const id = encodeURIComponent

// ---- service ------------------------------------------------------------------------------

/** Checks a credential without signing in with it (the sign-in form). */
/** The signed-in user (`GET /v1/me`). */
export function whoAmI(): Promise<Schemas['Me']> {
  return json<Schemas['Me']>('GET', '/v1/me')
}

/** Changes the signed-in user's settings (`PATCH /v1/me`). */
export function updateMe(patch: Schemas['UpdateMe']): Promise<Schemas['Me']> {
  return json<Schemas['Me']>('PATCH', '/v1/me', { json: patch })
}

export function checkCredential(token: string): Promise<ResearchModels> {
  return json('GET', '/models', { token })
}

// ---- accounts -----------------------------------------------------------------------------

export type AuthStatus = Schemas['AuthStatus']
export type SignedInUser = Schemas['SignedInUser']
export type AdminUser = Schemas['AdminUser']
export type IssuedKey = Schemas['IssuedKey']

export const accounts = {
  /** Whether the server needs its first administrator, and whether it runs with `--dev`. */
  status: () => json<AuthStatus>('GET', '/v1/auth/status', { expect401: true }),
  /** Creates the first administrator and signs them in (the server sets the cookie). */
  setup: (name: string, password: string) => json<SignedInUser>('POST', '/v1/auth/setup', { json: { name, password }, expect401: true }),
  /** Signs in with a name and a password (the server sets the cookie). */
  login: (name: string, password: string) => json<SignedInUser>('POST', '/v1/auth/login', { json: { name, password }, expect401: true }),
  /** Ends the cookie's session on the server (and clears the cookie). */
  logout: () => json<void>('POST', '/v1/auth/logout', { expect401: true }),
  /** `GET /v1/me` without signing out on a 401 (is this page signed in by its cookie?). */
  probe: () => json<Schemas['Me']>('GET', '/v1/me', { expect401: true }),
}

export const admin = {
  users: () => json<{ users: AdminUser[] }>('GET', '/v1/admin/users'),
  create: (name: string, password: string, isAdmin: boolean) =>
    json<AdminUser>('POST', '/v1/admin/users', { json: { name, password, is_admin: isAdmin } }),
  update: (userId: string, patch: Schemas['UserPatch']) => json<AdminUser>('PATCH', `/v1/admin/users/${id(userId)}`, { json: patch }),
  issueKey: (userId: string) => json<IssuedKey>('POST', `/v1/admin/users/${id(userId)}/keys`),
  revokeKeys: (userId: string) => json<{ revoked: number }>('DELETE', `/v1/admin/users/${id(userId)}/keys`),
}

// ---- threads ------------------------------------------------------------------------------

export const threads = {
  list: (before?: string, limit = 50) => json<ThreadList>('GET', '/v1/threads', { query: { limit, before } }),
  /** A temporary thread's turns neither recall nor store memories. */
  create: (title?: string, temporary = false) =>
    json<Thread>('POST', '/v1/threads', { json: { ...(title ? { title } : {}), ...(temporary ? { temporary } : {}) } }),
  get: (threadId: string) => json<ThreadWithMessages>('GET', `/v1/threads/${id(threadId)}`),
  /** `PATCH /v1/threads/{id}` `{"title"}` → Thread. */
  rename: (threadId: string, title: string) => json<Thread>('PATCH', `/v1/threads/${id(threadId)}`, { json: { title } }),
  remove: (threadId: string, forgetMemories = false) =>
    json<void>('DELETE', `/v1/threads/${id(threadId)}`, {
      query: { forget_memories: forgetMemories ? true : undefined },
    }),
  /** Starts a chat turn (answered by `model`, one of the configured ones, when given); the
   * response is the run's event stream (SSE). */
  postMessage: (threadId: string, content: string, signal?: AbortSignal, model?: string, attachments: string[] = []) =>
    send('POST', `/v1/threads/${id(threadId)}/messages`, {
      json: { content, ...(model ? { model } : {}), ...(attachments.length ? { attachments } : {}) },
      headers: { accept: 'text/event-stream' },
      signal,
    }),
  /** Edit-and-resend (`content`) or regenerate (no content): the user's message and what
   * follows it are replaced by a new turn; the response is its event stream (SSE). */
  retry: (threadId: string, messageId: string, content?: string, signal?: AbortSignal, model?: string) =>
    send('POST', `/v1/threads/${id(threadId)}/messages/${id(messageId)}/retry`, {
      json: { ...(content === undefined ? {} : { content }), ...(model ? { model } : {}) },
      headers: { accept: 'text/event-stream' },
      signal,
    }),
}

// ---- runs ---------------------------------------------------------------------------------

export const runs = {
  get: (runId: string) => json<Run>('GET', `/v1/runs/${id(runId)}`),
  /** The run's events after `lastSeq` (replayed from the log, then live until `done`). */
  events: (runId: string, lastSeq: number, signal?: AbortSignal) =>
    send('GET', `/v1/runs/${id(runId)}/events`, {
      headers: { accept: 'text/event-stream', 'last-event-id': String(lastSeq) },
      signal,
    }),
  cancel: (runId: string) => json<Run>('POST', `/v1/runs/${id(runId)}/cancel`),
  /** What the memory writer did with a chat turn; waits up to `wait` seconds (≤ 30) for it. */
  memory: (runId: string, wait = 0, signal?: AbortSignal) =>
    json<RunMemory>('GET', `/v1/runs/${id(runId)}/memory`, { query: { wait: wait || undefined }, signal }),
  input: (runId: string, body: RunInputBody) => json<void>('POST', `/v1/runs/${id(runId)}/input`, { json: body }),
}

// ---- memories -----------------------------------------------------------------------------

export type ForgetMatch = Schemas['ForgetMatch']

export type ForgetResponse = Schemas['ForgetResponse']

export type ForgottenMemory = Schemas['ForgottenMemory']

export const memories = {
  search: (request: SearchRequest) => json<RecallResponse>('POST', '/v1/memories/search', { json: request }),
  list: (query: ListMemoriesQuery = {}) =>
    json<MemoryList>('GET', '/v1/memories', {
      query: {
        kinds: query.kinds && query.kinds.length ? query.kinds.join(',') : undefined,
        trust: query.trust,
        thread_id: query.thread_id,
        since: query.since,
        until: query.until,
        include_archived: query.include_archived || undefined,
        include_invalid: query.include_invalid || undefined,
        limit: query.limit,
        before: query.before,
      },
    }),
  add: (body: NewMemoryBody) => json<Memory>('POST', '/v1/memories', { json: body }),
  get: (memoryId: string) => json<MemoryWithHistory>('GET', `/v1/memories/${id(memoryId)}`),
  patch: (memoryId: string, patch: MemoryPatch) => json<Memory>('PATCH', `/v1/memories/${id(memoryId)}`, { json: patch }),
  remove: (memoryId: string) => json<void>('DELETE', `/v1/memories/${id(memoryId)}`),
  removeAll: () => json<{ deleted: number }>('DELETE', '/v1/memories', { query: { confirm: true } }),
  /** JSON lines, one memory per line. */
  export: async () => (await send('GET', '/v1/memories/export', { headers: { accept: 'application/x-ndjson' } })).text(),
  import: (jsonLines: string) =>
    json<ImportReport>('POST', '/v1/memories/import', { body: jsonLines, contentType: 'application/x-ndjson' }),
  /** What `forget` would remove for a description, most relevant first (nothing is removed). */
  forgetPreview: (query: string) => json<ForgetResponse>('POST', '/v1/memories/forget', { json: { query, dry_run: true } }),
  /** Forgets exactly these memories (restorable until `restorable_until`). */
  forget: (ids: string[], query: string) =>
    json<ForgetResponse>('POST', '/v1/memories/forget', { json: { ids, query: query || undefined } }),
  forgotten: () => json<{ forgotten: ForgottenMemory[] }>('GET', '/v1/memories/forgotten'),
  restore: (memoryId: string) => json<Memory>('POST', `/v1/memories/forgotten/${id(memoryId)}/restore`),
}

// ---- documents ----------------------------------------------------------------------------

export type InlineType = 'text/markdown' | 'text/plain' | 'text/html'

export const documents = {
  list: (before?: string, limit = 100) => json<DocumentList>('GET', '/v1/documents', { query: { limit, before } }),
  /** The document with its chunks in order (what local research searches and cites). */
  get: (documentId: string) => json<DocumentWithChunks>('GET', `/v1/documents/${id(documentId)}`),
  /** A text document sent inline as JSON. */
  addText: (title: string, content: string, contentType: InlineType, source?: string) =>
    json<DocumentInfo>('POST', '/v1/documents', {
      json: { title: title || undefined, content, content_type: contentType, source: source || undefined },
    }),
  /** A raw document (a PDF) as the body, its type in Content-Type, the title in the query. */
  addRaw: (title: string, body: Blob, contentType: string, source?: string) =>
    json<DocumentInfo>('POST', '/v1/documents', {
      body,
      contentType,
      query: { title: title || undefined, source: source || undefined },
    }),
  remove: (documentId: string) => json<void>('DELETE', `/v1/documents/${id(documentId)}`),
}

// ---- research -----------------------------------------------------------------------------

export const research = {
  models: () => json<ResearchModels>('GET', '/models'),
  /** Starts a research; the response is its run's event stream (SSE). */
  stream: (request: ResearchRequest, signal?: AbortSignal) =>
    send('POST', '/research/stream', { json: request, headers: { accept: 'text/event-stream' }, signal }),
  history: (limit = 50) => json<{ research: HistoryItem[] }>('GET', '/research/history', { query: { limit } }),
  get: (researchId: string) => json<ResearchRecord>('GET', `/research/${id(researchId)}`),
  /** Starts a follow-up of a finished research; the response is its run's event stream. */
  followUp: (researchId: string, request: ResearchRequest, signal?: AbortSignal) =>
    send('POST', `/research/${id(researchId)}/follow-up`, { json: request, headers: { accept: 'text/event-stream' }, signal }),
  /** The research as a file (Markdown, DOCX or PDF). */
  export: (researchId: string, format: ExportFormat) => send('GET', `/research/${id(researchId)}/export`, { query: { format } }),
  remove: (researchId: string) => json<void>('DELETE', `/research/history/${id(researchId)}`),
  comparison: () => json<Schemas['Comparison']>('GET', '/research/comparison'),
  compare: (models: string[], request: ResearchRequest) =>
    json<CompareResults>('POST', '/research/compare', { json: { ...request, models } }),
}
