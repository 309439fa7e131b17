// Following a run's event stream to its `done`, across dropped connections. The server keeps
// every event in the run's log with a per-run sequence number (`id:` of each SSE event), so
// after a network error, or a stream that ends without `done`, the follower reconnects with
// `GET /v1/runs/{id}/events` and `Last-Event-ID: <last seq seen>`; the log is replayed from
// there. Events at or below the last seen sequence are dropped, so nothing is shown twice.
//
// A stream may also end without `done` on purpose: a server shutting down gracefully closes
// the streams of the runs it will continue later (on another replica, or after it restarts).
// So the follower keeps reconnecting, backing off from 0.5 s to 5 s, until `done`; it gives up
// only on an error that retrying cannot fix (the run is gone, the credential refused). A run
// continued by a new attempt says so with a `run_resumed` event, which the views' reducers
// (src/turn.ts, src/research.ts) apply.

import { ApiError, runs } from './api'
import type { components } from './generated/api'
import { readSse, type SseMessage } from './sse'

type Schemas = components['schemas']

/** The name of an event (`event:`), one per `RunEvent` variant of the server. */
export type EventType = Schemas['RunEvent']['type']

/**
 * An event's JSON (`data:`): the payload of its type, with the envelope (`run_id`, `seq`,
 * `timestamp`, a research's `research_id`; research events also name the `model`).
 */
export type EventData<K extends EventType = EventType> = Extract<Schemas['RunEvent'], { type: K }> &
  Partial<Schemas['Envelope']> & { model?: string | null }

/**
 * One event of a run: its sequence number, its type and its payload, as a union over the
 * types, so that `switch (event.type)` narrows `event.data` to that type's fields. The types
 * are generated from the server's OpenAPI document (src/generated/api.ts).
 */
export type RunEvent = { [K in EventType]: { seq: number; type: K; data: EventData<K> } }[EventType]

export type ConnectionState = 'connecting' | 'open' | 'reconnecting' | 'closed'

export interface FollowOptions {
  /** Opens the first stream (a POST that starts the run). Omitted to resume a known run. */
  start?: (signal: AbortSignal) => Promise<Response>
  /** The run to resume, and the last sequence number already shown (0 replays everything). */
  runId?: string
  lastSeq?: number
  onEvent: (event: RunEvent) => void
  /** After every event: where to resume from (the caller persists it for a reload). */
  onProgress?: (runId: string, lastSeq: number) => void
  onConnection?: (state: ConnectionState, detail?: string) => void
}

export type FollowOutcome = 'done' | 'aborted'

/** The pause before the next reconnection: 0.5 s, 1 s, 2 s, 4 s, then 5 s for as long as it takes. */
export function reconnectDelay(attempt: number): number {
  return Math.min(500 * 2 ** Math.min(attempt, 10), 5000)
}

/** Sleeps `ms`, waking early when the browser comes back online; rejects on abort. */
function pause(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const finish = () => {
      clearTimeout(timer)
      window.removeEventListener('online', early)
      signal.removeEventListener('abort', aborted)
    }
    const early = () => {
      finish()
      resolve()
    }
    const aborted = () => {
      finish()
      reject(new DOMException('aborted', 'AbortError'))
    }
    const timer = setTimeout(early, ms)
    window.addEventListener('online', early)
    signal.addEventListener('abort', aborted)
  })
}

function isAbort(error: unknown): boolean {
  return error instanceof DOMException && error.name === 'AbortError'
}

/** Statuses after which the same request may succeed later. */
function retryable(error: unknown): boolean {
  if (!(error instanceof ApiError)) return true
  return error.status === 0 || error.status === 502 || error.status === 503 || error.status === 504
}

export class RunFollower {
  runId: string | null
  lastSeq: number
  private done = false
  private readonly controller = new AbortController()

  constructor(private readonly options: FollowOptions) {
    this.runId = options.runId ?? null
    this.lastSeq = options.lastSeq ?? 0
  }

  /** Stops reading (the run goes on on the server unless it is cancelled). */
  abort(): void {
    this.controller.abort()
  }

  get aborted(): boolean {
    return this.controller.signal.aborted
  }

  /** Reads until `done` (resolves 'done') or `abort()` (resolves 'aborted'); throws ApiError. */
  async follow(): Promise<FollowOutcome> {
    const signal = this.controller.signal
    const state = this.options.onConnection ?? (() => undefined)
    let attempt = 0
    state('connecting')
    for (;;) {
      if (signal.aborted) return 'aborted'
      let response: Response | null = null
      try {
        if (this.runId === null) {
          if (!this.options.start) throw new ApiError(0, 'internal', 'nothing to follow')
          response = await this.options.start(signal)
          const header = response.headers.get('x-run-id')
          if (header) this.runId = header
        } else {
          response = await runs.events(this.runId, this.lastSeq, signal)
        }
      } catch (error) {
        if (isAbort(error) || signal.aborted) return 'aborted'
        // Without a run id nothing can be resumed: the start itself failed.
        if (this.runId === null || !retryable(error)) {
          state('closed')
          throw error
        }
      }
      if (response?.body) {
        state('open')
        const before = this.lastSeq
        try {
          await readSse(response.body, (message) => this.handle(message), signal)
        } catch (error) {
          if (isAbort(error) || signal.aborted) return 'aborted'
          // A network error mid-stream: reconnect below.
        }
        if (this.lastSeq > before) attempt = 0
      }
      if (this.done) {
        state('closed')
        return 'done'
      }
      if (this.runId === null) {
        state('closed')
        throw new ApiError(0, 'network', 'The connection closed before the run started. Try again.')
      }
      // No `done` yet: the connection dropped, or the server closed the stream to continue the
      // run later (a graceful shutdown). Either way the run is followed again until its `done`.
      state('reconnecting', navigator.onLine ? 'reconnecting…' : 'offline, waiting for the network…')
      try {
        await pause(reconnectDelay(attempt), signal)
      } catch {
        return 'aborted'
      }
      attempt++
    }
  }

  private handle(message: SseMessage): void {
    let data: Record<string, unknown>
    try {
      const parsed: unknown = JSON.parse(message.data)
      if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) return
      data = parsed as Record<string, unknown>
    } catch {
      return
    }
    const fromId = Number.parseInt(message.id, 10)
    const seq = Number.isFinite(fromId) ? fromId : typeof data.seq === 'number' ? data.seq : NaN
    if (!Number.isFinite(seq)) return
    // Already shown (a replay after reconnecting): never show it twice.
    if (seq <= this.lastSeq) return
    this.lastSeq = seq
    if (this.runId === null && typeof data.run_id === 'string') this.runId = data.run_id
    const type = message.event !== 'message' ? message.event : String(data.type ?? 'message')
    // The server's JSON, trusted to be what its OpenAPI document says (the reducers ignore
    // an event of a type they do not know).
    this.options.onEvent({ seq, type, data: { ...data, type } } as RunEvent)
    if (this.runId) this.options.onProgress?.(this.runId, seq)
    if (type === 'done') this.done = true
  }
}
