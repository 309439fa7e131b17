// Unit tests of the SSE parser (src/sse.ts).
import { expect, test } from 'vitest'
import { SseParser, readSse, type SseMessage } from '../../src/sse'

function parseAll(pieces: string[]): SseMessage[] {
  const parser = new SseParser()
  const out: SseMessage[] = []
  for (const piece of pieces) out.push(...parser.feed(piece))
  return out
}

test('id, event and data of each event; comments ignored', () => {
  const events = parseAll([
    ': keep-alive\n\nid: 1\nevent: session_start\ndata: {"a":1}\n\nid: 2\nevent: message_delta\ndata: {"content":"hi"}\n\n',
  ])
  expect(events).toStrictEqual([
    { id: '1', event: 'session_start', data: '{"a":1}' },
    { id: '2', event: 'message_delta', data: '{"content":"hi"}' },
  ])
})

test('events split at any byte boundary come out whole, once', () => {
  const text = 'id: 7\nevent: message_delta\ndata: {"content":"a b c"}\n\nid: 8\nevent: done\ndata: {"status":"completed"}\n\n'
  for (let size = 1; size <= text.length; size++) {
    const pieces: string[] = []
    for (let i = 0; i < text.length; i += size) pieces.push(text.slice(i, i + size))
    const events = parseAll(pieces)
    expect(events.length, `chunk size ${size}`).toBe(2)
    expect(events[0].id).toBe('7')
    expect(events[1].event).toBe('done')
  }
})

test('CRLF and CR line endings, also split between chunks', () => {
  const events = parseAll(['id: 1\r', '\nevent: x\r\ndata: one\r\r', 'id: 2\rdata: two\r\n\r\n'])
  expect(events).toStrictEqual([
    { id: '1', event: 'x', data: 'one' },
    { id: '2', event: 'message', data: 'two' },
  ])
})

test('multi-line data is joined with newlines; no space after the colon is fine', () => {
  const events = parseAll(['data:first\ndata: second\ndata\n\n'])
  expect(events).toStrictEqual([{ id: '', event: 'message', data: 'first\nsecond\n' }])
})

test('the id carries over to later events; an event without data is not dispatched', () => {
  const events = parseAll(['id: 5\n\ndata: x\n\nevent: y\n\n'])
  expect(events).toStrictEqual([{ id: '5', event: 'message', data: 'x' }])
})

test('an unterminated last event is dropped; retry is read', () => {
  const parser = new SseParser()
  expect(parser.feed('retry: 3000\nid: 1\ndata: whole\n\nid: 2\ndata: half')).toStrictEqual([{ id: '1', event: 'message', data: 'whole' }])
  expect(parser.retry).toBe(3000)
  expect(parser.end()).toStrictEqual([])
})

test('readSse decodes UTF-8 split across chunks and reports every event', async () => {
  const bytes = new TextEncoder().encode('id: 1\nevent: message_delta\ndata: {"content":"猫 Miso"}\n\n')
  const body = new ReadableStream<Uint8Array>({
    start(controller) {
      for (let i = 0; i < bytes.length; i += 3) controller.enqueue(bytes.slice(i, i + 3))
      controller.close()
    },
  })
  const seen: SseMessage[] = []
  await readSse(body, (message) => seen.push(message))
  expect(seen.length).toBe(1)
  expect(JSON.parse(seen[0].data).content).toBe('猫 Miso')
})

test('readSse rejects with AbortError when aborted mid-stream', async () => {
  const controller = new AbortController()
  const body = new ReadableStream<Uint8Array>({
    start(stream) {
      stream.enqueue(new TextEncoder().encode('id: 1\ndata: x\n\n'))
    },
  })
  const seen: SseMessage[] = []
  const reading = readSse(
    body,
    (message) => {
      seen.push(message)
      controller.abort()
    },
    controller.signal,
  )
  await expect(reading).rejects.toSatisfy((error: Error) => error.name === 'AbortError')
  expect(seen.length).toBe(1)
})
