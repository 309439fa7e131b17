// The browser tests' world: a fresh mnemo (env MNEMO_BIN) on a temporary data directory with
// one user, the fake model, and Debian's Chromium driven by playwright-core. The page opens
// mnemo's own address (mnemo serves the built app at `/`) through a TCP relay, so that
// `cutConnections()` can drop every connection in flight, as a network failure would.

import { spawn, execFile } from 'node:child_process'
import { createHmac } from 'node:crypto'
import { mkdtempSync, rmSync, mkdirSync, existsSync } from 'node:fs'
import net from 'node:net'
import os from 'node:os'
import path from 'node:path'
import { fileURLToPath } from 'node:url'
import { promisify } from 'node:util'
import { chromium } from 'playwright-core'
import { startFakeOpenAi } from '../fake-openai.mjs'

const run = promisify(execFile)
const here = path.dirname(fileURLToPath(import.meta.url))
export const WEB_DIR = path.resolve(here, '../..')
export const RESULTS_DIR = path.join(WEB_DIR, 'test-results')
const REPO_DIR = path.resolve(WEB_DIR, '..')

const CHROMIUM = process.env.CHROMIUM_BIN ?? '/usr/bin/chromium'
const CHROMIUM_ARGS = [
  '--headless',
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
]

/** The HS256 key mnemo is configured with, so a test can sign in with a JWT. */
export const JWT = {
  secret: 'browser-tests-hs256-secret-0123456789abcdef',
  audience: 'mnemo-web-tests',
  issuer: 'https://tests.invalid',
}

/** A JWT for `sub`, signed with the test key, valid for `seconds`. */
export function signJwt(sub, seconds = 600) {
  const encode = (value) => Buffer.from(JSON.stringify(value)).toString('base64url')
  const now = Math.floor(Date.now() / 1000)
  const head = `${encode({ alg: 'HS256', typ: 'JWT' })}.${encode({ sub, aud: JWT.audience, iss: JWT.issuer, iat: now, exp: now + seconds })}`
  const signature = createHmac('sha256', JWT.secret).update(head).digest('base64url')
  return `${head}.${signature}`
}

function log(...parts) {
  if (process.env.TEST_LOG) console.error('[harness]', ...parts)
}

/** A TCP relay in front of `upstream` whose connections can all be dropped at once. */
export function startRelay(upstream) {
  const target = new URL(upstream)
  const sockets = new Set()
  const server = net.createServer((client) => {
    const backend = net.connect(Number(target.port), target.hostname)
    sockets.add(client)
    sockets.add(backend)
    const forget = () => {
      sockets.delete(client)
      sockets.delete(backend)
    }
    client.on('close', forget)
    backend.on('close', forget)
    client.on('error', () => backend.destroy())
    backend.on('error', () => client.destroy())
    client.pipe(backend)
    backend.pipe(client)
  })
  return new Promise((resolve) => {
    server.listen(0, '127.0.0.1', () => {
      resolve({
        url: `http://127.0.0.1:${server.address().port}`,
        cut() {
          const count = sockets.size
          for (const socket of sockets) socket.destroy()
          sockets.clear()
          return count
        },
        close: () => new Promise((done) => server.close(() => done())),
      })
    })
  })
}

async function waitForAddress(child, timeoutMs) {
  return new Promise((resolve, reject) => {
    let out = ''
    let err = ''
    const timer = setTimeout(() => reject(new Error(`mnemo did not print its address in ${timeoutMs} ms\n${out}\n${err}`)), timeoutMs)
    child.stdout.on('data', (part) => {
      out += part
      const match = /mnemo listening on (http:\/\/[^\s]+)/.exec(out)
      if (match) {
        clearTimeout(timer)
        resolve(match[1])
      }
    })
    child.stderr.on('data', (part) => {
      err += part
      if (process.env.TEST_LOG) process.stderr.write(part)
      if (err.length > 200_000) err = err.slice(-100_000)
    })
    child.on('exit', (code) => {
      clearTimeout(timer)
      reject(new Error(`mnemo exited with ${code} before listening\n${out}\n${err.slice(-4000)}`))
    })
  })
}

async function waitHealthy(url, timeoutMs) {
  const deadline = Date.now() + timeoutMs
  for (;;) {
    try {
      const response = await fetch(`${url}/health`)
      if (response.ok) return
    } catch {
      // Not up yet.
    }
    if (Date.now() > deadline) throw new Error(`mnemo at ${url} was not healthy in ${timeoutMs} ms`)
    await new Promise((resolve) => setTimeout(resolve, 200))
  }
}

/**
 * Starts everything. Resolves the stack; call `stop()` at the end. `contextOptions` are added to
 * the browser context's (playwright-core's `launchPersistentContext` options), `env` to mnemo's
 * environment (`MNEMO__…` settings).
 */
export async function startStack({ contextOptions = {}, env: extraEnv = {} } = {}) {
  const bin = process.env.MNEMO_BIN
  if (!bin || !existsSync(bin)) throw new Error(`set MNEMO_BIN to the mnemo binary (got ${bin ?? 'nothing'})`)
  mkdirSync(RESULTS_DIR, { recursive: true })
  const home = mkdtempSync(path.join(os.tmpdir(), 'mnemo-web-test-'))
  const dataDir = path.join(home, 'data')
  mkdirSync(dataDir)
  const fake = await startFakeOpenAi()
  const env = {
    ...process.env,
    MNEMO__LLM__BASE_URL: fake.baseUrl,
    MNEMO__LLM__MODEL: 'fake',
    MNEMO__LLM__API_KEY: 'sk-fake-for-tests',
    MNEMO__LLM__RETRY_BACKOFF_MS: '20',
    MNEMO__EMBEDDER__MODEL_DIR: process.env.MNEMO__EMBEDDER__MODEL_DIR ?? path.join(REPO_DIR, 'models', 'all-MiniLM-L6-v2'),
    MNEMO__LOG__LEVEL: process.env.TEST_LOG ? 'info' : 'warn',
    MNEMO__AUTH__JWT__HS256_SECRET: JWT.secret,
    MNEMO__AUTH__JWT__AUDIENCE: JWT.audience,
    MNEMO__AUTH__JWT__ISSUER: JWT.issuer,
    ...extraEnv,
  }
  // The user is created before the server starts: no second process on the SQLite file.
  const { stdout } = await run(bin, ['--data-dir', dataDir, 'user', 'add', 'alice'], { env, cwd: home })
  const key = stdout.trim().split('\n').pop()
  if (!key) throw new Error('mnemo user add printed no key')
  const server = spawn(bin, ['serve', '--addr', '127.0.0.1:0', '--data-dir', dataDir], {
    env,
    cwd: home,
    stdio: ['ignore', 'pipe', 'pipe'],
  })
  const mnemoUrl = await waitForAddress(server, 120_000)
  await waitHealthy(mnemoUrl, 60_000)
  log('mnemo at', mnemoUrl, 'fake model at', fake.baseUrl)

  const front = await startRelay(mnemoUrl)
  const cut = () => front.cut()

  const profile = mkdtempSync(path.join(os.tmpdir(), 'mnemo-web-chromium-'))
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: CHROMIUM,
    headless: true,
    args: CHROMIUM_ARGS,
    viewport: { width: 1280, height: 900 },
    baseURL: front.url,
    ...contextOptions,
  })

  const problems = []
  context.on('page', (page) => watchPage(page, problems))
  for (const page of context.pages()) watchPage(page, problems)

  return {
    key,
    url: front.url,
    mnemoUrl,
    fake,
    context,
    /** Console errors, CSP violations, page errors and dialogs seen so far. */
    problems,
    cutConnections: cut,
    async api(method, pathname, body) {
      const response = await fetch(`${mnemoUrl}${pathname}`, {
        method,
        headers: { authorization: `Bearer ${key}`, ...(body === undefined ? {} : { 'content-type': 'application/json' }) },
        body: body === undefined ? undefined : JSON.stringify(body),
      })
      const text = await response.text()
      return { status: response.status, body: text ? JSON.parse(text) : undefined }
    },
    async stop() {
      await context.close().catch(() => undefined)
      await front.close().catch(() => undefined)
      server.kill('SIGTERM')
      await new Promise((resolve) => {
        const timer = setTimeout(() => {
          server.kill('SIGKILL')
          resolve()
        }, 15_000)
        server.on('exit', () => {
          clearTimeout(timer)
          resolve()
        })
        if (server.exitCode !== null) resolve()
      })
      await fake.close()
      rmSync(home, { recursive: true, force: true })
      rmSync(profile, { recursive: true, force: true })
    },
  }
}

function watchPage(page, problems) {
  page.on('console', (message) => {
    if (message.type() === 'error') problems.push(`console: ${message.text()}`)
  })
  page.on('pageerror', (error) => problems.push(`pageerror: ${error.message}`))
  page.on('dialog', (dialog) => {
    problems.push(`dialog: ${dialog.type()} ${dialog.message()}`)
    void dialog.dismiss()
  })
}

/** Switches the sign-in page from name and password (or the first admin's form) to an API key. */
export async function useKeyForm(page) {
  await page.getByTestId('signin-use-key').click()
  await page.getByTestId('signin-token').waitFor()
}

/** A new tab, signed in through the form. */
export async function signedInPage(stack, hash = '#/chat') {
  const page = await stack.context.newPage()
  await page.goto(`/${hash}`)
  await useKeyForm(page)
  await page.getByTestId('signin-token').fill(stack.key)
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('nav-chat').waitFor()
  return page
}

/** Saves the whole page as `test-results/NAME.png` (`{ fullPage: false }`: the viewport only). */
/** Starts a new conversation in the chat view (its thread is made by the first message). */
export async function newThread(page) {
  await page.getByTestId('thread-new').click()
  await page.waitForURL((url) => url.href.endsWith('#/chat'))
  await page.getByTestId('thread-title').filter({ hasText: 'New conversation' }).waitFor()
}

export async function screenshot(page, name, { fullPage = true } = {}) {
  await page.screenshot({ path: path.join(RESULTS_DIR, `${name}.png`), fullPage })
}
