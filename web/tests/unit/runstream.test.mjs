// Unit tests of the run follower (src/runstream.ts, compiled to .unit-build/ by `npm run
// test:unit`): a stream that ends without `done` (a dropped connection, or a server shutting
// down gracefully to continue the run later) is followed again with Last-Event-ID until `done`.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { register } from 'node:module'

// The compiled modules import each other without an extension, as the bundler resolves them.
register(
  'data:text/javascript,' +
    encodeURIComponent(`
export async function resolve(specifier, context, next) {
  try {
    return await next(specifier, context)
  } catch (error) {
    if (specifier.startsWith('.') && !specifier.endsWith('.js')) return next(specifier + '.js', context)
    throw error
  }
}`),
)

// What the modules read from the browser.
class MemoryStorage {
  #items = new Map()
  get length() {
    return this.#items.size
  }
  key(index) {
    return [...this.#items.keys()][index] ?? null
  }
  getItem(key) {
    return this.#items.has(key) ? this.#items.get(key) : null
  }
  setItem(key, value) {
    this.#items.set(key, String(value))
  }
  removeItem(key) {
    this.#items.delete(key)
  }
}
globalThis.sessionStorage = new MemoryStorage()
globalThis.localStorage = new MemoryStorage()
globalThis.window = new EventTarget()
Object.defineProperty(globalThis, 'navigator', { value: { onLine: true }, configurable: true })

const { RunFollower, reconnectDelay } = await import('../../.unit-build/runstream.js')

function sse(events) {
  const text = events.map(([seq, type, data]) => `id: ${seq}\nevent: ${type}\ndata: ${JSON.stringify({ seq, type, ...data })}\n\n`).join('')
  return new Response(text, { status: 200, headers: { 'content-type': 'text/event-stream' } })
}

test('a stream closed without done is followed again with Last-Event-ID until done', async () => {
  const requests = []
  const answers = [
    // The server shuts down gracefully: the stream ends without `done`.
    () => sse([
      [1, 'session_start', { run_id: 'run-1' }],
      [2, 'message_delta', { content: 'a' }],
    ]),
    // While it restarts, nothing answers.
    () => {
      throw new TypeError('fetch failed')
    },
    // Then a replica (or the restarted server) serves the log after seq 2, with a repeat.
    () => sse([
      [2, 'message_delta', { content: 'a' }],
      [3, 'run_resumed', { attempt: 2, superseded_after: 0, resumed_from: null, content: 'attempt 2' }],
      [4, 'message_delta', { content: 'b' }],
      [5, 'done', { status: 'completed' }],
    ]),
  ]
  globalThis.fetch = async (url, init) => {
    requests.push({ url: String(url), lastEventId: init.headers['last-event-id'] })
    const answer = answers.shift()
    assert.ok(answer, 'no request after done')
    return answer()
  }
  const seen = []
  const states = []
  const follower = new RunFollower({
    runId: 'run-1',
    lastSeq: 0,
    onEvent: (event) => seen.push([event.seq, event.type]),
    onConnection: (state) => states.push(state),
  })
  assert.equal(await follower.follow(), 'done')
  assert.deepEqual(
    requests.map((request) => [request.url, request.lastEventId]),
    [
      ['/v1/runs/run-1/events', '0'],
      ['/v1/runs/run-1/events', '2'],
      ['/v1/runs/run-1/events', '2'],
    ],
  )
  assert.deepEqual(seen, [
    [1, 'session_start'],
    [2, 'message_delta'],
    [3, 'run_resumed'],
    [4, 'message_delta'],
    [5, 'done'],
  ])
  assert.ok(states.includes('reconnecting'))
  assert.equal(states.at(-1), 'closed')
})

test('a run gone from the server ends the following with its error', async () => {
  globalThis.fetch = async () =>
    new Response(JSON.stringify({ error: { code: 'not_found', message: 'no such run' } }), { status: 404 })
  const follower = new RunFollower({ runId: 'run-2', lastSeq: 3, onEvent: () => undefined })
  await assert.rejects(follower.follow(), (error) => error.status === 404)
})

test('reconnections back off from 0.5 s to 5 s and never stop', () => {
  assert.deepEqual(
    [0, 1, 2, 3, 4, 5, 40, 1000].map(reconnectDelay),
    [500, 1000, 2000, 4000, 5000, 5000, 5000, 5000],
  )
})
