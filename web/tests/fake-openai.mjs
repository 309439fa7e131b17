// A fake OpenAI-compatible model for the browser tests: `POST /v1/chat/completions`, streamed
// (SSE chunks in OpenAI's format, ending with `data: [DONE]`) or as one JSON answer. Replies
// are chosen by the prompt, as mnemo's own Rust fake does (tests/support/fake_llm.rs):
// the chat model (its request offers the `recall_memory` tool) answers by markers in the
// user's message, and every JSON step of the memory writer and of deep research gets an
// answer of its expected shape.
//
// Chat markers: `[slow]` streams 40 numbered words ("w01 … w40") one per chunk, 120 ms apart
// (time to press Stop or to cut the connection); `[xss]` answers with HTML and script tags;
// `[tool]` first calls `recall_memory`, then answers; `[code]` answers with a Rust code block;
// a message with attached documents (mnemo adds them as `[document ID | TITLE]` and the quoted
// text) is answered with the titles and the first line of each text. Anything else gets a
// short reply.
//
// Use: `node tests/fake-openai.mjs` prints `fake-openai listening on http://127.0.0.1:PORT`;
// or import { startFakeOpenAi } and call it. FAKE_OPENAI_LOG=FILE appends every request and
// the reply chosen for it to FILE (JSON lines), to see what mnemo asked.

import { appendFileSync } from 'node:fs'
import http from 'node:http'

export const SLOW_WORDS = Array.from({ length: 40 }, (_, i) => `w${String(i + 1).padStart(2, '0')}`)
export const CODE_REPLY = 'Here it is:\n\n```rust\nfn main() {\n    let answer = 42; // the answer\n    println!("{answer}");\n}\n```\n'
export const XSS_REPLY = 'Here it is: <img src=x onerror=alert(1)> and <script>alert(2)</script> and [click](javascript:alert(3)) — done.'
export const REPORT_TEXT =
  '# Otters\n\nSea otters hold hands while they sleep so they do not drift apart [1]. ' +
  'A group of resting otters is called a raft [1].\n\n## Uncertain\n\nHow long a raft stays together varies.'

function promptText(request) {
  return (request.messages ?? []).map((message) => (typeof message.content === 'string' ? message.content : '')).join('\n')
}

function lastUser(request) {
  const users = (request.messages ?? []).filter((message) => message.role === 'user')
  const last = users[users.length - 1]
  return typeof last?.content === 'string' ? last.content : ''
}

function toolResults(request) {
  return (request.messages ?? []).filter((message) => message.role === 'tool')
}

function text(content, options = {}) {
  return { kind: 'text', content, chunk: options.chunk ?? 6, delayMs: options.delayMs ?? 15, words: options.words ?? false }
}

function tools(calls) {
  return { kind: 'tools', calls }
}

/** "…remember that my cat is called Miso…" → "The user's cat is called Miso." */
function extracted(prompt) {
  const cleaned = prompt.replace(/^>\s?/gm, '')
  const match = /remember that\s+(?:my\s+)?([^\n.!?"]+)/i.exec(cleaned)
  if (!match) return []
  const clause = match[1].trim()
  const content = /^(?:i|i'm|i am)\b/i.test(clause) ? `The user ${clause.replace(/^i('m| am)?\s*/i, '')}` : `The user's ${clause}`
  return [{ should_remember: true, kind: 'fact', content: `${content}.`, importance: 4 }]
}

export function chooseReply(request) {
  const prompt = promptText(request)
  const offered = (request.tools ?? []).map((tool) => tool.function?.name)
  if (offered.includes('recall_memory')) {
    const message = lastUser(request)
    if (message.includes('[slow]')) return text(SLOW_WORDS.join(' '), { words: true, delayMs: 120 })
    if (message.includes('[xss]')) return text(XSS_REPLY)
    if (message.includes('[code]')) return text(CODE_REPLY)
    if (message.includes('[tool]')) {
      if (toolResults(request).length === 0) return tools([['recall_memory', { query: 'cat' }]])
      return text('I looked in your memories: your cat is called Miso.')
    }
    const attached = [...message.matchAll(/^\[document [0-9a-f-]{36} \| (.+)\]\n> (.*)$/gm)]
    if (attached.length) return text(`I read ${attached.map(([, title, first]) => `“${title}” (${first})`).join(' and ')}.`)
    if (/remember that/i.test(message)) return text('I will remember that.')
    return text('Hello! This is the **fake** model answering.')
  }
  // Deep research (src/research/workflow.rs and prompts/research_*.md).
  if (prompt.includes('You are the clarification step')) return text(JSON.stringify({ need_clarification: false, question: '' }))
  // A question about ferrets researches the ferret document (the XSS test's), anything else otters.
  const ferrets = /ferrets/i.test(prompt)
  if (prompt.includes('You write the research brief')) {
    return text(JSON.stringify({ brief: ferrets ? 'Find out what the document says about ferrets.' : 'Find out how sea otters sleep.' }))
  }
  if (prompt.includes('You are the research supervisor')) {
    if (toolResults(request).length > 0) return tools([['research_complete', {}]])
    return tools([['conduct_research', { research_topic: ferrets ? 'dangerous document ferrets' : 'otters sleeping' }]])
  }
  if (prompt.includes('You are a researcher')) {
    if (toolResults(request).length === 0) {
      const topic = request.messages?.[1]?.content ?? 'otters'
      return tools([['web_search', { query: typeof topic === 'string' ? topic : 'otters' }]])
    }
    return text('Sea otters hold hands while sleeping [doc].')
  }
  if (prompt.includes('You compress')) return text('- Sea otters hold hands while sleeping [doc]')
  if (prompt.includes('You score the sources')) return text(JSON.stringify({ sources: [] }))
  if (prompt.includes('You write the final report')) return text(REPORT_TEXT, { chunk: 12, delayMs: 20 })
  if (prompt.includes('worth remembering from a finished research')) return text(JSON.stringify({ conclusions: [] }))
  if (prompt.includes('You plan web searches')) return text(JSON.stringify({ queries: [{ query: 'otters sleeping', goal: 'habits' }] }))
  if (prompt.includes('You read the sources found')) {
    return text(JSON.stringify({ learnings: ['Sea otters hold hands while sleeping.'], follow_up_questions: [] }))
  }
  // The memory writer (prompts/extract_memories.md, consolidate_memory.md, build_profile.md).
  if (prompt.includes('Decide what is worth remembering about the user')) return text(JSON.stringify({ memories: extracted(prompt) }))
  if (prompt.includes('A new statement about the user is about to be stored')) return text(JSON.stringify({ action: 'add' }))
  if (prompt.includes('Write a short profile of the user')) return text('The user has a cat.')
  if (prompt.includes('Summarise the conversation')) return text('The user and the assistant talked.')
  return text('ok')
}

const USAGE = { prompt_tokens: 100, completion_tokens: 20, total_tokens: 120 }

function chunk(model, delta, finish = null) {
  return `data: ${JSON.stringify({
    id: 'chatcmpl-fake',
    object: 'chat.completion.chunk',
    created: Math.floor(Date.now() / 1000),
    model,
    choices: [{ index: 0, delta, finish_reason: finish }],
  })}\n\n`
}

function pieces(reply) {
  if (reply.words) return reply.content.split(' ').map((word, i) => (i === 0 ? word : ` ${word}`))
  const chars = [...reply.content]
  const out = []
  for (let i = 0; i < chars.length; i += reply.chunk) out.push(chars.slice(i, i + reply.chunk).join(''))
  return out
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms))

async function answer(request, response, state) {
  const reply = chooseReply(request)
  const model = request.model ?? 'fake'
  state.requests.push({
    at: Date.now(),
    kind: reply.kind,
    stream: request.stream === true,
    model: request.model ?? null,
    said: lastUser(request).slice(0, 4000),
  })
  if (process.env.FAKE_OPENAI_LOG) {
    appendFileSync(process.env.FAKE_OPENAI_LOG, `${JSON.stringify({ reply, request })}\n`)
  }
  const toolCalls =
    reply.kind === 'tools'
      ? reply.calls.map(([name, args], index) => ({
          index,
          id: `call_${index}_${name}`,
          type: 'function',
          function: { name, arguments: JSON.stringify(args) },
        }))
      : []
  if (!request.stream) {
    const message =
      reply.kind === 'tools'
        ? { role: 'assistant', content: null, tool_calls: toolCalls.map(({ index: _index, ...call }) => call) }
        : { role: 'assistant', content: reply.content }
    response.writeHead(200, { 'content-type': 'application/json' })
    response.end(
      JSON.stringify({
        id: 'chatcmpl-fake',
        object: 'chat.completion',
        created: Math.floor(Date.now() / 1000),
        model,
        choices: [{ index: 0, finish_reason: reply.kind === 'tools' ? 'tool_calls' : 'stop', message }],
        usage: USAGE,
      }),
    )
    return
  }
  response.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache' })
  let closed = false
  response.on('close', () => {
    closed = true
  })
  const write = (frame) => {
    if (!closed) response.write(frame)
  }
  if (reply.kind === 'tools') {
    for (const call of toolCalls) {
      const args = call.function.arguments
      const half = Math.floor(args.length / 2)
      write(chunk(model, { tool_calls: [{ ...call, function: { name: call.function.name, arguments: args.slice(0, half) } }] }))
      write(chunk(model, { tool_calls: [{ index: call.index, function: { arguments: args.slice(half) } }] }))
    }
    write(chunk(model, {}, 'tool_calls'))
  } else {
    write(chunk(model, { role: 'assistant', content: '' }))
    for (const piece of pieces(reply)) {
      if (closed) return
      await sleep(reply.delayMs)
      write(chunk(model, { content: piece }))
    }
    write(chunk(model, {}, 'stop'))
  }
  write(`data: ${JSON.stringify({ id: 'chatcmpl-fake', object: 'chat.completion.chunk', model, choices: [], usage: USAGE })}\n\n`)
  write('data: [DONE]\n\n')
  if (!closed) response.end()
}

/** Starts the fake on 127.0.0.1 (port 0 picks a free one). Resolves { url, baseUrl, state, close }. */
export function startFakeOpenAi(port = 0) {
  const state = { requests: [] }
  const server = http.createServer((req, res) => {
    if (req.method === 'GET' && req.url === '/stats') {
      res.writeHead(200, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ requests: state.requests.length }))
      return
    }
    if (req.method !== 'POST' || !req.url?.startsWith('/v1/chat/completions')) {
      res.writeHead(404, { 'content-type': 'application/json' })
      res.end(JSON.stringify({ error: { message: 'not found', type: 'invalid_request_error' } }))
      return
    }
    const body = []
    req.on('data', (part) => body.push(part))
    req.on('end', () => {
      let request
      try {
        request = JSON.parse(Buffer.concat(body).toString('utf8'))
      } catch {
        res.writeHead(400, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { message: 'invalid JSON', type: 'invalid_request_error' } }))
        return
      }
      answer(request, res, state).catch(() => res.destroy())
    })
  })
  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(port, '127.0.0.1', () => {
      const { port: actual } = server.address()
      const url = `http://127.0.0.1:${actual}`
      resolve({
        url,
        baseUrl: `${url}/v1`,
        state,
        close: () =>
          new Promise((done) => {
            server.closeAllConnections?.()
            server.close(() => done())
          }),
      })
    })
  })
}

if (import.meta.url === `file://${process.argv[1]}`) {
  const fake = await startFakeOpenAi(Number(process.env.PORT ?? 0))
  console.log(`fake-openai listening on ${fake.url}`)
}
