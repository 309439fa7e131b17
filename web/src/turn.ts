// A chat turn as the browser builds it from the run's events: the streamed answer, the
// memories recalled for it, the tool calls with their results, usage, errors and the end.

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

export type TurnStatus =
  | 'starting'
  | 'streaming'
  | 'reconnecting'
  | 'completed'
  | 'failed'
  | 'cancelled'
  | 'interrupted'
  | 'stopped'

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
}

/** What is kept of a live turn in sessionStorage to continue it after a reload. */
export type TurnSnapshot = Pick<Turn, 'text' | 'items' | 'usage' | 'model' | 'errors'>

export function snapshotOf(turn: Turn): TurnSnapshot {
  return { text: turn.text, items: turn.items, usage: turn.usage, model: turn.model, errors: turn.errors }
}

export function restoreSnapshot(turn: Turn, snapshot: unknown): boolean {
  if (!snapshot || typeof snapshot !== 'object') return false
  const value = snapshot as Partial<TurnSnapshot>
  if (typeof value.text !== 'string' || !Array.isArray(value.items) || !Array.isArray(value.errors)) return false
  turn.text = value.text
  turn.items = value.items
  turn.usage = value.usage ?? null
  turn.model = value.model ?? null
  turn.errors = value.errors
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
  }
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
      signals:
        item.signals && typeof item.signals === 'object' ? (item.signals as Record<string, number | null>) : undefined,
    }))
}

/** Applies one event of the turn's run. */
export function applyChatEvent(turn: Turn, event: RunEvent): void {
  const data = event.data
  switch (event.type) {
    case 'session_start':
      turn.runId = String(data.run_id ?? turn.runId ?? '')
      if (typeof data.user_message_id === 'string') turn.userMessageId = data.user_message_id
      if (typeof data.model === 'string') turn.model = data.model
      turn.status = 'streaming'
      break
    case 'memory_recalled':
      turn.items.push({ kind: 'recalled', seq: event.seq, query: String(data.query ?? ''), memories: recalled(data.memories) })
      break
    case 'tool_call':
      turn.items.push({
        kind: 'tool',
        seq: event.seq,
        id: String(data.id ?? event.seq),
        name: String(data.name ?? data.tool ?? 'tool'),
        arguments: data.arguments,
      })
      break
    case 'tool_result': {
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
      turn.text += typeof data.content === 'string' ? data.content : ''
      break
    case 'usage':
      turn.usage = (data.total ?? data.usage ?? null) as TurnUsage | null
      if (typeof data.model === 'string') turn.model = data.model
      break
    case 'message_complete':
      if (typeof data.message_id === 'string') turn.messageId = data.message_id
      if (data.usage && typeof data.usage === 'object') turn.usage = data.usage as TurnUsage
      break
    case 'error':
      turn.errors.push({
        error_type: String(data.error_type ?? 'internal'),
        message: String(data.message ?? data.content ?? 'error'),
        retryable: data.retryable === true,
      })
      break
    case 'done': {
      const status = String(data.status ?? 'completed')
      turn.status = (['completed', 'failed', 'cancelled', 'interrupted'].includes(status) ? status : 'completed') as TurnStatus
      turn.connection = ''
      break
    }
    default:
      break
  }
}
