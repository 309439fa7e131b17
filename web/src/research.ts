// A deep research as the browser builds it from its run's events (src/research/workflow.rs):
// stages, researchers, sources, the streamed report, usage, errors, and the pauses that wait
// for the user (plan review, a clarifying question).
//
// The events applied are kept with the state. When the replica executing the run stops, another
// one continues it under the same run id after the last step finished and says so with
// `run_resumed`: the events after its `superseded_after` (and before it) belong to the attempt
// cut short (a partial report, the activity of an unfinished step), so the state is rebuilt
// from the kept events up to `superseded_after` and goes on with the new attempt's events.

import type { CitedSource } from './api'
import type { components } from './generated/api'
import type { RunEvent } from './runstream'

type StepMeta = components['schemas']['StepMeta']
type ResearchStats = components['schemas']['ResearchStats']
type Usage = components['schemas']['Usage']

export const STAGES = [
  { name: 'clarification', label: 'Clarification' },
  { name: 'research_brief', label: 'Brief' },
  { name: 'research_execution', label: 'Research' },
  { name: 'final_report_generation', label: 'Report' },
  { name: 'completed', label: 'Completed' },
] as const

export interface Researcher {
  number: number
  topic: string
  activity: string[]
  sources: number
  failed: string | null
}

export interface FoundSource {
  url: string
  title: string
  snippet?: string
}

export interface ResearchUsage {
  step: string
  model: string
  prompt_tokens: number
  completion_tokens: number
  cost_usd: number | null
}

/** A new attempt continued the run (`run_resumed`). */
export interface ResumedNotice {
  seq: number
  attempt: number
  /** The last step finished, which the new attempt goes on after (null: it started over). */
  resumedFrom: string | null
  content: string
}

export interface ResearchState {
  runId: string | null
  query: string
  stage: string
  stageNotes: Record<string, string>
  researchers: Researcher[]
  found: FoundSource[]
  /** The numbered sources the report may cite (`sources_found` curated, then `research_complete`). */
  numbered: CitedSource[]
  report: string
  brief: string
  log: { seq: number; text: string }[]
  usage: ResearchUsage[]
  errors: { error_type: string; message: string; retryable: boolean }[]
  recalled: { id: string; kind: string; content: string; score?: number }[]
  planReview: { topics: string[]; content: string } | null
  clarification: string | null
  complete: ResearchStats | null
  /** The budget (`usage` events) and what the research has spent of it. */
  budget: { tokens: number | null; costUsd: number | null; spentTokens: number; spentUsd: number | null } | null
  status: 'starting' | 'running' | 'reconnecting' | 'completed' | 'failed' | 'cancelled' | 'interrupted' | 'stopped'
  connection: string
  model: string | null
  /** Every `run_resumed` that stands, oldest first. */
  notices: ResumedNotice[]
  /** The events applied, in order, without those a `run_resumed` superseded. */
  events: RunEvent[]
  /** The sequence number of the last event applied (0: none); a repeat is ignored. */
  lastSeq: number
}

export function newResearch(query: string, runId: string | null = null): ResearchState {
  return {
    runId,
    query,
    stage: '',
    stageNotes: {},
    researchers: [],
    found: [],
    numbered: [],
    report: '',
    brief: '',
    log: [],
    usage: [],
    errors: [],
    recalled: [],
    planReview: null,
    clarification: null,
    complete: null,
    budget: null,
    status: 'starting',
    connection: '',
    model: null,
    notices: [],
    events: [],
    lastSeq: 0,
  }
}

/** Forgets what the events built (the run id, query, status and connection stay). */
function resetResearch(state: ResearchState): void {
  const { status, connection } = state
  Object.assign(state, newResearch(state.query, state.runId), { status, connection })
}

/** What is kept of a live research in sessionStorage to continue it after a reload. */
export interface ResearchSnapshot {
  query: string
  events: RunEvent[]
}

export function researchSnapshot(state: ResearchState): ResearchSnapshot {
  return { query: state.query, events: state.events }
}

function isEvent(value: unknown): value is RunEvent {
  if (!value || typeof value !== 'object') return false
  const event = value as Partial<RunEvent>
  return (
    typeof event.seq === 'number' &&
    typeof event.type === 'string' &&
    event.data !== null &&
    typeof event.data === 'object' &&
    !Array.isArray(event.data)
  )
}

/**
 * Rebuilds the research from a snapshot's events. False (nothing changed) for anything else,
 * an older page's snapshot included: the research is then replayed from the run's first event.
 */
export function restoreResearch(state: ResearchState, snapshot: unknown): boolean {
  if (!snapshot || typeof snapshot !== 'object') return false
  const value = snapshot as Partial<ResearchSnapshot>
  if (!Array.isArray(value.events) || !value.events.every(isEvent)) return false
  if (typeof value.query === 'string' && value.query) state.query = value.query
  resetResearch(state)
  for (const event of value.events) applyResearchEvent(state, event)
  return true
}

export function researchLive(state: ResearchState): boolean {
  return state.status === 'starting' || state.status === 'running' || state.status === 'reconnecting'
}

function researcher(state: ResearchState, number: number, topic = ''): Researcher {
  let found = state.researchers.find((item) => item.number === number)
  if (!found) {
    found = { number, topic, activity: [], sources: 0, failed: null }
    state.researchers.push(found)
    state.researchers.sort((a, b) => a.number - b.number)
  }
  if (topic && !found.topic) found.topic = topic
  return found
}

function text(value: unknown): string {
  return typeof value === 'string' ? value : value === undefined || value === null ? '' : JSON.stringify(value)
}

function numbered(value: unknown): CitedSource[] | null {
  if (!Array.isArray(value)) return null
  const out: CitedSource[] = []
  for (const item of value) {
    if (!item || typeof item !== 'object') continue
    const source = item as Record<string, unknown>
    const n = Number(source.n)
    if (!Number.isInteger(n)) continue
    out.push({
      n,
      url: text(source.url),
      title: text(source.title) || text(source.url),
      relevance: typeof source.relevance === 'number' ? source.relevance : 0,
      credibility: typeof source.credibility === 'number' ? source.credibility : 0,
      score: typeof source.score === 'number' ? source.score : 0,
    })
  }
  return out.sort((a, b) => a.n - b.n)
}

/**
 * Applies one event of the research's run: an event at or below the last one applied is a
 * repeat and changes nothing; a `run_resumed` first rebuilds the state from the events it lets
 * stand.
 */
export function applyResearchEvent(state: ResearchState, event: RunEvent): void {
  if (event.seq <= state.lastSeq) return
  if (event.type === 'run_resumed') {
    const value = event.data.superseded_after
    const after = typeof value === 'number' && Number.isFinite(value) ? value : null
    if (after !== null && after < state.lastSeq) {
      const kept = state.events.filter((item) => item.seq <= after)
      resetResearch(state)
      for (const item of kept) record(state, item)
    }
  }
  record(state, event)
}

function record(state: ResearchState, event: RunEvent): void {
  reduce(state, event)
  state.events.push(event)
  state.lastSeq = event.seq
}

/** Events of a research going on: a plan shown for review before them was answered. */
const PROGRESS = new Set(['stage_update', 'thinking', 'tool_call', 'sources_found', 'report_delta'])

/** What a research event says about its step (`metadata`); empty for the events without one. */
function stepOf(event: RunEvent): StepMeta {
  switch (event.type) {
    case 'stage_update':
    case 'thinking':
    case 'plan_review':
    case 'tool_call':
    case 'stage_fallback':
    case 'error':
    case 'sources_found':
      return event.data.metadata ?? {}
    default:
      return {}
  }
}

function reduce(state: ResearchState, event: RunEvent): void {
  // The page clears the plan when the user answers it; a rebuild or a replay clears it here.
  if (state.planReview && PROGRESS.has(event.type)) state.planReview = null
  const meta = stepOf(event)
  const number = typeof meta.researcher === 'number' ? meta.researcher : null
  // Each case sees its type's fields (RunEvent is a union over `type`); the fallbacks keep
  // the page usable when an older server left a field out.
  switch (event.type) {
    case 'session_start': {
      const data = event.data
      state.runId = text(data.research_id ?? data.run_id) || state.runId
      if (typeof data.query === 'string') state.query = data.query
      state.status = 'running'
      break
    }
    case 'stage_update': {
      const stage = text(event.data.stage)
      state.stage = stage
      if (event.data.content) state.stageNotes[stage] = text(event.data.content)
      // A clarifying question waits for `POST /v1/runs/{id}/input {"content"}`.
      state.clarification = stage === 'clarification' && meta.awaiting_input === true ? text(event.data.content) : null
      state.log.push({ seq: event.seq, text: `${stage}: ${text(event.data.content)}` })
      break
    }
    case 'thinking': {
      const content = text(event.data.content)
      if (event.data.stage === 'research_brief') state.brief = content
      if (number !== null) {
        const item = researcher(state, number, text(meta.topic))
        if (!content.startsWith(`Researcher ${number} started`)) item.activity.push(content)
      }
      state.log.push({ seq: event.seq, text: content })
      break
    }
    case 'tool_call': {
      const data = event.data
      const line = text(data.content) || `${text(data.tool ?? data.name)} ${text(data.arguments)}`
      if (number !== null) researcher(state, number, text(meta.topic)).activity.push(line)
      state.log.push({ seq: event.seq, text: line })
      break
    }
    case 'sources_found': {
      const sources: unknown = event.data.sources
      const curated = numbered(sources)
      if (meta.curated === true && curated) {
        state.numbered = curated
      } else if (Array.isArray(sources)) {
        for (const item of sources as Record<string, unknown>[]) {
          const url = text(item?.url)
          if (url && !state.found.some((source) => source.url === url)) {
            state.found.push({ url, title: text(item.title) || url, snippet: text(item.snippet) })
          }
        }
        if (number !== null) researcher(state, number).sources += sources.length
      }
      state.log.push({ seq: event.seq, text: text(event.data.content) })
      break
    }
    case 'plan_review':
      state.planReview = {
        topics: Array.isArray(meta.topics) ? meta.topics.map(text) : [],
        content: text(event.data.content),
      }
      break
    case 'report_delta':
      state.report += text(event.data.content)
      break
    case 'usage': {
      const data = event.data
      const usage: Partial<Usage> = data.usage ?? {}
      state.usage.push({
        step: text(data.step),
        model: text(data.model),
        prompt_tokens: Number(usage.prompt_tokens ?? 0),
        completion_tokens: Number(usage.completion_tokens ?? 0),
        cost_usd: typeof usage.cost_usd === 'number' ? usage.cost_usd : null,
      })
      if (typeof data.model === 'string' && data.model) state.model = data.model
      // The research's budget, when it has one, and what it has used so far.
      const cap = data.budget ?? null
      const total = data.total ?? null
      if (cap && total) {
        state.budget = {
          tokens: typeof cap.tokens === 'number' ? cap.tokens : null,
          costUsd: typeof cap.cost_usd === 'number' ? cap.cost_usd : null,
          spentTokens: Number(total.total_tokens ?? 0),
          spentUsd: typeof total.cost_usd === 'number' ? total.cost_usd : null,
        }
      }
      break
    }
    case 'memory_recalled': {
      const memories: unknown = event.data.memories
      if (Array.isArray(memories)) {
        state.recalled = (memories as Record<string, unknown>[]).map((memory) => ({
          id: text(memory.id),
          kind: text(memory.kind),
          content: text(memory.content),
          score: typeof memory.score === 'number' ? memory.score : undefined,
        }))
      }
      break
    }
    case 'stage_fallback':
      // A step whose model reply could not be used, done the extractive way instead.
      state.log.push({
        seq: event.seq,
        text: `${text(event.data.step)}: ${text(event.data.content)} (${text(event.data.reason)})`,
      })
      break
    case 'error': {
      const data = event.data
      const message = text(data.message ?? data.content)
      state.errors.push({ error_type: text(data.error_type) || 'internal', message, retryable: data.retryable === true })
      if (number !== null) researcher(state, number).failed = message
      break
    }
    case 'research_complete': {
      const stats: ResearchStats | undefined = event.data.metadata
      state.complete = stats ?? null
      const cited = numbered(stats?.sources)
      if (cited && cited.length) state.numbered = cited
      // The stored report replaces what streamed: citations its check could not find in
      // their sources are marked there ("[2: not found in the source]").
      if (typeof event.data.content === 'string' && event.data.content) state.report = event.data.content
      state.planReview = null
      break
    }
    case 'run_resumed': {
      const data = event.data
      const notice: ResumedNotice = {
        seq: event.seq,
        attempt: typeof data.attempt === 'number' ? data.attempt : 2,
        resumedFrom: typeof data.resumed_from === 'string' ? data.resumed_from : null,
        content: text(data.content) || 'The run was continued by a new attempt.',
      }
      state.notices.push(notice)
      state.log.push({ seq: event.seq, text: notice.content })
      if (state.status === 'starting') state.status = 'running'
      break
    }
    case 'done': {
      const status = text(event.data.status)
      state.status = (
        ['completed', 'failed', 'cancelled', 'interrupted'].includes(status) ? status : 'completed'
      ) as ResearchState['status']
      state.planReview = null
      state.clarification = null
      state.connection = ''
      break
    }
    default:
      break
  }
}

export function totalUsage(usage: ResearchUsage[]): { prompt: number; completion: number; cost: number | null } {
  let prompt = 0
  let completion = 0
  let cost: number | null = null
  for (const item of usage) {
    prompt += item.prompt_tokens
    completion += item.completion_tokens
    if (item.cost_usd !== null) cost = (cost ?? 0) + item.cost_usd
  }
  return { prompt, completion, cost }
}
