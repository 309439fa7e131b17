// Test-only helper: serves web/dist the way the Rust server is meant to (index.html at `/`,
// hashed assets under /assets/, the strict Content-Security-Policy on every response) and
// proxies the API paths to a mnemo server, so the app can be tested before mnemo embeds it.
// Streams are piped as they come (no buffering). `cutStreams()` destroys every event stream
// in flight, as a dropped network connection would.

import http from 'node:http'
import { readFile } from 'node:fs/promises'
import path from 'node:path'

export const CSP =
  "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; " +
  "object-src 'none'; frame-ancestors 'none'"

const API_PREFIXES = ['/v1/', '/research/', '/models', '/health', '/docs', '/openapi.json', '/metrics']

const TYPES = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.ico': 'image/x-icon',
  '.json': 'application/json',
  '.woff2': 'font/woff2',
}

function securityHeaders() {
  return {
    'content-security-policy': CSP,
    'x-content-type-options': 'nosniff',
    'referrer-policy': 'no-referrer',
    'x-frame-options': 'DENY',
  }
}

/**
 * Starts the helper on 127.0.0.1:0. `dist` is the built app, `upstream` mnemo's base URL.
 * Resolves { url, cutStreams, close }.
 */
export function startStaticServer({ dist, upstream }) {
  const target = new URL(upstream)
  const streams = new Set()

  async function serveFile(req, res) {
    const url = new URL(req.url, 'http://x')
    let file
    if (url.pathname === '/' || url.pathname === '/index.html') file = 'index.html'
    else if (url.pathname.startsWith('/assets/') || url.pathname === '/favicon.svg') file = url.pathname.slice(1)
    else {
      res.writeHead(404, { 'content-type': 'application/json', ...securityHeaders() })
      res.end(JSON.stringify({ error: { code: 'not_found', message: `no route for ${req.method} ${url.pathname}` } }))
      return
    }
    const full = path.join(dist, path.normalize(file).replace(/^(\.\.[/\\])+/, ''))
    if (!full.startsWith(path.resolve(dist))) {
      res.writeHead(404)
      res.end()
      return
    }
    try {
      const body = await readFile(full)
      const immutable = file.startsWith('assets/')
      res.writeHead(200, {
        'content-type': TYPES[path.extname(full)] ?? 'application/octet-stream',
        'cache-control': immutable ? 'public, max-age=31536000, immutable' : 'no-cache',
        ...securityHeaders(),
      })
      res.end(req.method === 'HEAD' ? undefined : body)
    } catch {
      res.writeHead(404, securityHeaders())
      res.end()
    }
  }

  function proxy(req, res) {
    const headers = { ...req.headers, host: target.host }
    delete headers.connection
    const upstreamRequest = http.request(
      { hostname: target.hostname, port: target.port, method: req.method, path: req.url, headers },
      (upstreamResponse) => {
        const responseHeaders = { ...upstreamResponse.headers, ...securityHeaders() }
        res.writeHead(upstreamResponse.statusCode ?? 502, responseHeaders)
        res.flushHeaders()
        const isStream = String(upstreamResponse.headers['content-type'] ?? '').startsWith('text/event-stream')
        if (isStream) {
          const entry = { req, res, upstreamResponse }
          streams.add(entry)
          res.on('close', () => streams.delete(entry))
        }
        upstreamResponse.pipe(res)
      },
    )
    upstreamRequest.on('error', () => {
      if (!res.headersSent) {
        res.writeHead(502, { 'content-type': 'application/json' })
        res.end(JSON.stringify({ error: { code: 'unavailable', message: 'mnemo is not reachable' } }))
      } else {
        res.destroy()
      }
    })
    res.on('close', () => upstreamRequest.destroy())
    req.pipe(upstreamRequest)
  }

  const server = http.createServer((req, res) => {
    const pathname = (req.url ?? '/').split('?')[0]
    if (API_PREFIXES.some((prefix) => pathname === prefix.replace(/\/$/, '') || pathname.startsWith(prefix))) proxy(req, res)
    else void serveFile(req, res)
  })

  return new Promise((resolve, reject) => {
    server.once('error', reject)
    server.listen(0, '127.0.0.1', () => {
      const { port } = server.address()
      resolve({
        url: `http://127.0.0.1:${port}`,
        /** Destroys every event stream in flight; returns how many. */
        cutStreams() {
          const count = streams.size
          for (const entry of streams) {
            entry.upstreamResponse.destroy()
            entry.res.socket?.destroy()
          }
          streams.clear()
          return count
        },
        openStreams: () => streams.size,
        close: () =>
          new Promise((done) => {
            server.closeAllConnections?.()
            server.close(() => done())
          }),
      })
    })
  })
}
