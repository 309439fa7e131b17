// Unit tests of the run follower (src/runstream.ts): a stream that ends without `done` (a
// dropped connection, or a server shutting down gracefully to continue the run later) is
// followed again with Last-Event-ID until `done`.
import { assert, expect, test, vi } from 'vitest'
import type { ApiError } from '../../src/api'
import type { ConnectionState } from '../../src/runstream'

// What the modules read from the browser. src/session.ts reads the storages when it is first
// imported, so they are in place before runstream.ts (which imports it through api.ts) loads.
class MemoryStorage implements Storage {
  #items = new Map<string, string>()
  get length(): number {
    return this.#items.size
  }
  key(index: number): string | null {
    return [...this.#items.keys()][index] ?? null
  }
  getItem(key: string): string | null {
    return this.#items.get(key) ?? null
  }
  setItem(key: string, value: string): void {
    this.#items.set(key, String(value))
  }
  removeItem(key: string): void {
    this.#items.delete(key)
  }
  clear(): void {
    this.#items.clear()
  }
}
vi.stubGlobal('sessionStorage', new MemoryStorage())
vi.stubGlobal('localStorage', new MemoryStorage())
vi.stubGlobal('window', new EventTarget())
vi.stubGlobal('navigator', { onLine: true })

const { RunFollower, reconnectDelay } = await import('../../src/runstream')

type SseEvent = [seq: number, type: string, data: Record<string, unknown>]

function sse(events: SseEvent[]): Response {
  const text = events.map(([seq, type, data]) => `id: ${seq}\nevent: ${type}\ndata: ${JSON.stringify({ seq, type, ...data })}\n\n`).join('')
  return new Response(text, { status: 200, headers: { 'content-type': 'text/event-stream' } })
}

test('a stream closed without done is followed again with Last-Event-ID until done', async () => {
  const requests: { url: string; lastEventId: string | undefined }[] = []
  const answers: (() => Response)[] = [
    // The server shuts down gracefully: the stream ends without `done`.
    () =>
      sse([
        [1, 'session_start', { run_id: 'run-1' }],
        [2, 'message_delta', { content: 'a' }],
      ]),
    // While it restarts, nothing answers.
    () => {
      throw new TypeError('fetch failed')
    },
    // Then a replica (or the restarted server) serves the log after seq 2, with a repeat.
    () =>
      sse([
        [2, 'message_delta', { content: 'a' }],
        [3, 'run_resumed', { attempt: 2, superseded_after: 0, resumed_from: null, content: 'attempt 2' }],
        [4, 'message_delta', { content: 'b' }],
        [5, 'done', { status: 'completed' }],
      ]),
  ]
  vi.stubGlobal('fetch', async (url: string, init: RequestInit) => {
    requests.push({ url: String(url), lastEventId: (init.headers as Record<string, string>)['last-event-id'] })
    const answer = answers.shift()
    assert(answer, 'no request after done')
    return answer()
  })
  const seen: [number, string][] = []
  const states: ConnectionState[] = []
  const follower = new RunFollower({
    runId: 'run-1',
    lastSeq: 0,
    onEvent: (event) => seen.push([event.seq, event.type]),
    onConnection: (state) => states.push(state),
  })
  expect(await follower.follow()).toBe('done')
  expect(requests.map((request) => [request.url, request.lastEventId])).toStrictEqual([
    ['/v1/runs/run-1/events', '0'],
    ['/v1/runs/run-1/events', '2'],
    ['/v1/runs/run-1/events', '2'],
  ])
  expect(seen).toStrictEqual([
    [1, 'session_start'],
    [2, 'message_delta'],
    [3, 'run_resumed'],
    [4, 'message_delta'],
    [5, 'done'],
  ])
  expect(states.includes('reconnecting')).toBe(true)
  expect(states.at(-1)).toBe('closed')
})

test('a run gone from the server ends the following with its error', async () => {
  vi.stubGlobal(
    'fetch',
    async () => new Response(JSON.stringify({ error: { code: 'not_found', message: 'no such run' } }), { status: 404 }),
  )
  const follower = new RunFollower({ runId: 'run-2', lastSeq: 3, onEvent: () => undefined })
  await expect(follower.follow()).rejects.toSatisfy((error: ApiError) => error.status === 404)
})

test('reconnections back off from 0.5 s to 5 s and never stop', () => {
  expect([0, 1, 2, 3, 4, 5, 40, 1000].map(reconnectDelay)).toStrictEqual([500, 1000, 2000, 4000, 5000, 5000, 5000, 5000])
})
