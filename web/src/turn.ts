// A chat turn as the browser builds it from the run's events: the streamed answer, the
// memories recalled for it, the tool calls with their results, usage, errors and the end.
//
// The events applied are kept with the turn. When the replica executing the run stops, another
// one continues it under the same run id and says so with `run_resumed`: the events after its
// `superseded_after` (and before it) belong to the attempt cut short, so the turn is rebuilt
// from the kept events up to `superseded_after` (for a chat turn, which starts over, none) and
// goes on with the new attempt's events.

import type { RunEvent } from './runstream'

export interface RecalledMemory {
  id: string
  kind: string
  content: string
  source?: string
  trust?: string
  created_at?: string
  score?: number
  /** Why it was recalled: rank and score per signal, the fused score, decay. */
  signals?: Record<string, number | null>
}

export type TurnItem =
  | { kind: 'recalled'; seq: number; query: string; memories: RecalledMemory[] }
  | {
      kind: 'tool'
      seq: number
      id: string
      name: string
      arguments: unknown
      result?: unknown
      ok?: boolean
    }
  /** The run was continued by a new attempt (`run_resumed`); what the cut attempt streamed is gone. */
  | { kind: 'notice'; seq: number; attempt: number; content: string }

export interface TurnUsage {
  prompt_tokens?: number
  completion_tokens?: number
  total_tokens?: number
  cost_usd?: number | null
}

export interface TurnError {
  error_type: string
  message: string
  retryable: boolean
}

export type TurnStatus = 'starting' | 'streaming' | 'reconnecting' | 'completed' | 'failed' | 'cancelled' | 'interrupted' | 'stopped'

export interface Turn {
  runId: string | null
  userMessageId: string | null
  threadId: string
  text: string
  items: TurnItem[]
  usage: TurnUsage | null
  model: string | null
  status: TurnStatus
  /** Connection state shown while live ("reconnecting…"). */
  connection: string
  errors: TurnError[]
  messageId: string | null
  /** Followed live in this page (its text is what was streamed), not replayed for details. */
  streamed: boolean
  /** The events applied, in order, without those a `run_resumed` superseded. */
  events: RunEvent[]
  /** The sequence number of the last event applied (0: none); a repeat is ignored. */
  lastSeq: number
}

/**
 * What is kept of a live turn in sessionStorage to continue it after a reload: its events, so
 * that the turn is rebuilt exactly, and rebuilt again if a `run_resumed` supersedes some.
 */
export interface TurnSnapshot {
  events: RunEvent[]
}

export function snapshotOf(turn: Turn): TurnSnapshot {
  return { events: turn.events }
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
 * Rebuilds the turn from a snapshot's events. False (nothing changed) for anything else, an
 * older page's snapshot included: the turn is then replayed from the run's first event.
 */
export function restoreSnapshot(turn: Turn, snapshot: unknown): boolean {
  if (!snapshot || typeof snapshot !== 'object') return false
  const events = (snapshot as Partial<TurnSnapshot>).events
  if (!Array.isArray(events) || !events.every(isEvent)) return false
  resetTurn(turn)
  for (const event of events) applyChatEvent(turn, event)
  return true
}

export function newTurn(threadId: string, userMessageId: string | null, runId: string | null = null): Turn {
  return {
    runId,
    userMessageId,
    threadId,
    text: '',
    items: [],
    usage: null,
    model: null,
    status: 'starting',
    connection: '',
    errors: [],
    messageId: null,
    streamed: false,
    events: [],
    lastSeq: 0,
  }
}

/** Forgets what the events built (the turn's identity, status and connection stay). */
function resetTurn(turn: Turn): void {
  turn.text = ''
  turn.items = []
  turn.usage = null
  turn.model = null
  turn.errors = []
  turn.messageId = null
  turn.events = []
  turn.lastSeq = 0
}

/** `superseded_after` of a `run_resumed` event; null when it is not a usable number. */
export function supersededAfter(event: RunEvent): number | null {
  if (event.type !== 'run_resumed') return null
  const value: unknown = event.data.superseded_after
  return typeof value === 'number' && Number.isFinite(value) ? value : null
}

export function isLive(turn: Turn): boolean {
  return turn.status === 'starting' || turn.status === 'streaming' || turn.status === 'reconnecting'
}

function recalled(value: unknown): RecalledMemory[] {
  if (!Array.isArray(value)) return []
  return value
    .filter((item): item is Record<string, unknown> => item !== null && typeof item === 'object')
    .map((item) => ({
      id: String(item.id ?? ''),
      kind: String(item.kind ?? ''),
      content: String(item.content ?? ''),
      source: item.source === undefined ? undefined : String(item.source),
      trust: item.trust === undefined ? undefined : String(item.trust),
      created_at: item.created_at === undefined ? undefined : String(item.created_at),
      score: typeof item.score === 'number' ? item.score : undefined,
      signals: item.signals && typeof item.signals === 'object' ? (item.signals as Record<string, number | null>) : undefined,
    }))
}

/**
 * Applies one event of the turn's run: an event at or below the last one applied is a repeat
 * and changes nothing; a `run_resumed` first rebuilds the turn from the events it lets stand.
 */
export function applyChatEvent(turn: Turn, event: RunEvent): void {
  if (event.seq <= turn.lastSeq) return
  if (event.type === 'run_resumed') {
    const after = supersededAfter(event)
    if (after !== null && after < turn.lastSeq) {
      const kept = turn.events.filter((item) => item.seq <= after)
      resetTurn(turn)
      for (const item of kept) record(turn, item)
    }
  }
  record(turn, event)
}

function record(turn: Turn, event: RunEvent): void {
  reduce(turn, event)
  turn.events.push(event)
  turn.lastSeq = event.seq
}

function reduce(turn: Turn, event: RunEvent): void {
  // Each case sees its type's fields (RunEvent is a union over `type`); the `??` fallbacks
  // keep a turn usable when an older server left a field out.
  switch (event.type) {
    case 'session_start': {
      const data = event.data
      turn.runId = String(data.run_id ?? turn.runId ?? '')
      if (typeof data.user_message_id === 'string') turn.userMessageId = data.user_message_id
      if (typeof data.model === 'string') turn.model = data.model
      turn.status = 'streaming'
      break
    }
    case 'memory_recalled':
      turn.items.push({
        kind: 'recalled',
        seq: event.seq,
        query: event.data.query ?? '',
        memories: recalled(event.data.memories),
      })
      break
    case 'tool_call': {
      const data = event.data
      turn.items.push({
        kind: 'tool',
        seq: event.seq,
        id: String(data.id ?? event.seq),
        name: String(data.name ?? data.tool ?? 'tool'),
        arguments: data.arguments,
      })
      break
    }
    case 'tool_result': {
      const data = event.data
      const call = [...turn.items]
        .reverse()
        .find((item) => item.kind === 'tool' && item.id === String(data.id ?? '') && item.result === undefined)
      if (call && call.kind === 'tool') {
        call.result = data.result
        call.ok = data.ok !== false
      } else {
        turn.items.push({
          kind: 'tool',
          seq: event.seq,
          id: String(data.id ?? event.seq),
          name: String(data.name ?? 'tool'),
          arguments: undefined,
          result: data.result,
          ok: data.ok !== false,
        })
      }
      break
    }
    case 'message_delta':
      turn.status = 'streaming'
      turn.text += typeof event.data.content === 'string' ? event.data.content : ''
      break
    case 'usage':
      turn.usage = event.data.total ?? event.data.usage ?? null
      if (typeof event.data.model === 'string') turn.model = event.data.model
      break
    case 'message_complete':
      if (typeof event.data.message_id === 'string') turn.messageId = event.data.message_id
      if (event.data.usage && typeof event.data.usage === 'object') turn.usage = event.data.usage
      break
    case 'error': {
      const data = event.data
      turn.errors.push({
        error_type: String(data.error_type ?? 'internal'),
        message: String(data.message ?? data.content ?? 'error'),
        retryable: data.retryable === true,
      })
      break
    }
    case 'run_resumed':
      turn.items.push({
        kind: 'notice',
        seq: event.seq,
        attempt: typeof event.data.attempt === 'number' ? event.data.attempt : 2,
        content: String(event.data.content ?? 'The run was continued by a new attempt.'),
      })
      if (turn.status === 'starting') turn.status = 'streaming'
      break
    case 'done': {
      const status = String(event.data.status ?? 'completed')
      turn.status = (['completed', 'failed', 'cancelled', 'interrupted'].includes(status) ? status : 'completed') as TurnStatus
      turn.connection = ''
      break
    }
    default:
      break
  }
}
