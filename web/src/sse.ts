// Server-sent events over `fetch`: EventSource can neither POST nor send an Authorization
// header, so the stream is read from a ReadableStream and parsed here, following the
// event-stream format of the HTML standard (fields `id`, `event`, `data`, `retry`; comment
// lines start with a colon; an empty line dispatches; CR, LF and CRLF all end a line).

/** One dispatched event. `id` is the last `id:` seen on the stream (it carries over). */
export interface SseMessage {
  id: string
  event: string
  data: string
}

/** An incremental parser: feed it decoded text in pieces of any size, get whole events. */
export class SseParser {
  private buffer = ''
  private pendingCR = false
  private data: string[] = []
  private eventType = ''
  private lastId = ''
  private sawField = false
  /** The last `retry:` value in milliseconds, if the server sent one. */
  retry: number | null = null

  /** Parses `chunk` and returns the events it completed. */
  feed(chunk: string): SseMessage[] {
    const out: SseMessage[] = []
    let text = chunk
    // A CR at the end of the previous chunk may be the first half of a CRLF.
    if (this.pendingCR) {
      this.pendingCR = false
      if (text.startsWith('\n')) text = text.slice(1)
    }
    this.buffer += text
    let start = 0
    for (let i = 0; i < this.buffer.length; i++) {
      const c = this.buffer.charCodeAt(i)
      if (c !== 10 && c !== 13) continue
      const line = this.buffer.slice(start, i)
      if (c === 13) {
        if (i + 1 < this.buffer.length) {
          if (this.buffer.charCodeAt(i + 1) === 10) i++
        } else {
          this.pendingCR = true
        }
      }
      start = i + 1
      const message = this.line(line)
      if (message) out.push(message)
    }
    this.buffer = this.buffer.slice(start)
    return out
  }

  /** The event left unterminated at the end of the stream is dropped, as the standard says. */
  end(): SseMessage[] {
    this.buffer = ''
    this.data = []
    this.eventType = ''
    this.sawField = false
    return []
  }

  private line(line: string): SseMessage | null {
    if (line === '') return this.dispatch()
    if (line.startsWith(':')) return null
    const colon = line.indexOf(':')
    let field: string
    let value: string
    if (colon === -1) {
      field = line
      value = ''
    } else {
      field = line.slice(0, colon)
      value = line.slice(colon + 1)
      if (value.startsWith(' ')) value = value.slice(1)
    }
    switch (field) {
      case 'data':
        this.data.push(value)
        this.sawField = true
        break
      case 'event':
        this.eventType = value
        this.sawField = true
        break
      case 'id':
        // An id with a NUL is ignored by the standard.
        if (!value.includes('\u0000')) this.lastId = value
        this.sawField = true
        break
      case 'retry':
        if (/^\d+$/.test(value)) this.retry = Number(value)
        break
      default:
        break
    }
    return null
  }

  private dispatch(): SseMessage | null {
    const had = this.sawField
    const data = this.data
    const eventType = this.eventType
    this.data = []
    this.eventType = ''
    this.sawField = false
    if (!had || data.length === 0) return null
    return { id: this.lastId, event: eventType || 'message', data: data.join('\n') }
  }
}

/**
 * Reads an event-stream body to its end, calling `onMessage` for every event. Resolves when
 * the body ends; rejects on a network error or when `signal` aborts.
 */
export async function readSse(
  body: ReadableStream<Uint8Array>,
  onMessage: (message: SseMessage) => void,
  signal?: AbortSignal,
): Promise<void> {
  const reader = body.getReader()
  const decoder = new TextDecoder('utf-8')
  const parser = new SseParser()
  const onAbort = () => {
    reader.cancel().catch(() => undefined)
  }
  signal?.addEventListener('abort', onAbort, { once: true })
  try {
    for (;;) {
      if (signal?.aborted) throw new DOMException('aborted', 'AbortError')
      const { value, done } = await reader.read()
      // A cancelled reader reports `done`; an abort must not look like the end of the stream.
      if (signal?.aborted) throw new DOMException('aborted', 'AbortError')
      if (done) {
        for (const message of parser.feed(decoder.decode())) onMessage(message)
        parser.end()
        return
      }
      for (const message of parser.feed(decoder.decode(value, { stream: true }))) {
        onMessage(message)
      }
    }
  } finally {
    signal?.removeEventListener('abort', onAbort)
    try {
      reader.releaseLock()
    } catch {
      // The reader is already released when the stream errored.
    }
  }
}
