// Browser tests of mnemo's web app: a real mnemo, the fake model, Debian's Chromium.
// Run with scripts/browser-tests (or `MNEMO_BIN=… npm run test:browser` after a build).

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFileSync, readFileSync } from 'node:fs'
import os from 'node:os'
import path from 'node:path'
import { RESULTS_DIR, startStack, signedInPage, screenshot, signJwt, useKeyForm, newThread } from '../support/harness.mjs'
import { SLOW_WORDS, XSS_REPLY } from '../fake-openai.mjs'

const XSS = '<img src=x onerror=alert(1)> and <script>alert(1)</script>'

let stack

before(async () => {
  stack = await startStack()
})

after(async () => {
  if (stack) writeFileSync(path.join(RESULTS_DIR, 'console.log'), `${stack.problems.join('\n')}\n`)
  await stack?.stop()
})

/** Problems that always fail a test: CSP violations, script errors, dialogs (an XSS fired). */
function seriousProblems() {
  return stack.problems.filter(
    (problem) => /Content Security Policy|Refused to/i.test(problem) || problem.startsWith('pageerror') || problem.startsWith('dialog'),
  )
}

function assertClean() {
  assert.deepEqual(seriousProblems(), [])
}

/** Sends a message; returns how many stored replies the thread showed before. */
async function sendMessage(page, text) {
  const before = await page.getByTestId('message-assistant').count()
  await page.getByTestId('composer-input').fill(text)
  await page.getByTestId('send').click()
  return before
}

/** The text of the answer being streamed (or the last one). */
async function liveAnswer(page) {
  const answer = page.getByTestId('message-live').last().getByTestId('answer')
  if ((await answer.count()) === 0) return ''
  return (await answer.innerText({ timeout: 1000 }).catch(() => '')).trim()
}

/** The text of the last stored reply, or '' (without waiting for one to appear). */
async function storedAnswer(page) {
  const answer = page.getByTestId('message-assistant').last().getByTestId('answer')
  if ((await answer.count()) === 0) return ''
  return (await answer.innerText({ timeout: 1000 }).catch(() => '')).trim()
}

async function waitForAnswerText(page, predicate, timeout = 20_000) {
  const deadline = Date.now() + timeout
  for (;;) {
    const live = await liveAnswer(page)
    if (predicate(live)) return
    const stored = await storedAnswer(page)
    if (predicate(stored)) return
    if (Date.now() > deadline) throw new Error(`answer never matched; live: ${live.slice(0, 200)} stored: ${stored.slice(0, 200)}`)
    await page.waitForTimeout(50)
  }
}

/** Waits until a new stored reply is shown (more than `before`) and returns its text. */
async function finishedAnswer(page, before, timeout = 30_000) {
  await page.getByTestId('message-assistant').nth(before).waitFor({ timeout })
  await page.getByTestId('stop').waitFor({ state: 'detached', timeout })
  return (await page.getByTestId('message-assistant').nth(before).getByTestId('answer').innerText()).trim()
}

/** Records the page's resume requests (`GET /v1/runs/{id}/events` with `Last-Event-ID`). */
function resumeRequests(page) {
  const seen = []
  page.on('request', (request) => {
    const match = /\/v1\/runs\/([^/]+)\/events/.exec(request.url())
    if (match) seen.push({ runId: match[1], lastEventId: Number(request.headers()['last-event-id'] ?? -1) })
  })
  return seen
}

function words(text) {
  return text.split(/\s+/).filter(Boolean)
}

test('sign in: a wrong key is refused, the right one opens the app, a 401 sends back to sign-in', async () => {
  const page = await stack.context.newPage()
  await page.goto('/')
  await useKeyForm(page)
  await screenshot(page, 'signin')
  await page.getByTestId('signin-token').fill('not-a-key')
  await page.getByTestId('signin-submit').click()
  await page.getByText('The server did not accept this API key.').waitFor()
  await page.getByTestId('signin-token').fill(stack.key)
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('nav-chat').waitFor()
  // The key lives in sessionStorage only, never in the URL or localStorage.
  assert.ok(!page.url().includes(stack.key))
  assert.equal(await page.evaluate(() => JSON.stringify(localStorage).includes('mnemo.credential')), false)
  // A key the server no longer accepts: the next request sends the user back to sign-in.
  await page.evaluate(() => sessionStorage.setItem('mnemo.credential', 'revoked-key'))
  await page.getByTestId('nav-memory').click()
  await page.getByTestId('signin-notice').waitFor()
  assert.match(await page.getByTestId('signin-notice').innerText(), /did not accept your credentials/)
  // Sign in again, then sign out.
  await useKeyForm(page)
  await page.getByTestId('signin-token').fill(stack.key)
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('sign-out').click()
  await page.getByTestId('signin-form').waitFor()
  assert.equal(await page.evaluate(() => sessionStorage.getItem('mnemo.credential')), null)
  await page.close()
  assertClean()
})

test('chat: a streamed answer as sanitised markdown, with recalled memories, tool calls and usage', async () => {
  const page = await signedInPage(stack)
  assert.match(await page.getByTestId('signed-in-as').innerText(), /alice/)
  let before = await sendMessage(page, 'Hello there')
  const text = await finishedAnswer(page, before)
  assert.match(text, /This is the fake model answering/)
  const answer = page.getByTestId('message-assistant').nth(before)
  assert.equal(await answer.locator('strong').innerText(), 'fake')
  await answer.getByTestId('turn-usage').waitFor()
  assert.match(await answer.getByTestId('turn-usage').innerText(), /100 prompt \+ 20 completion tokens/)
  await answer.getByTestId('turn-recalled').waitFor()
  // The thread was created with the first message as its title.
  await page.getByTestId('thread-item').filter({ hasText: 'Hello there' }).waitFor()

  before = await sendMessage(page, '[tool] what is my cat called?')
  await finishedAnswer(page, before)
  const tool = page.getByTestId('message-assistant').nth(before).getByTestId('turn-tool')
  await tool.waitFor()
  assert.match(await tool.innerText(), /recall_memory/)
  await tool.locator('summary').click()
  await tool.getByTestId('turn-tool-result').waitFor()
  await screenshot(page, 'chat')
  await page.close()
  assertClean()
})

test('chat: Stop ends the answer and cancels the run', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  await sendMessage(page, '[slow] count for me')
  await waitForAnswerText(page, (text) => text.includes('w03'))
  const runId = await page.getByTestId('message-live').last().getAttribute('data-run-id')
  assert.ok(runId, 'the live turn knows its run')
  await page.getByTestId('stop').click()
  await page.getByTestId('turn-status').filter({ hasText: 'Stopped.' }).waitFor()
  const stopped = await liveAnswer(page)
  await page.waitForTimeout(1000)
  assert.equal(await liveAnswer(page), stopped, 'no word arrives after Stop')
  assert.ok(!stopped.includes('w40'))
  const deadline = Date.now() + 10_000
  let status
  do {
    status = (await stack.api('GET', `/v1/runs/${runId}`)).body.status
    if (status === 'cancelled') break
    await page.waitForTimeout(200)
  } while (Date.now() < deadline)
  assert.equal(status, 'cancelled')
  await page.close()
  assertClean()
})

test('chat: a dropped connection resumes from the last event, without a duplicated word', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  const resumes = resumeRequests(page)
  const before = await sendMessage(page, '[slow] keep counting')
  await waitForAnswerText(page, (text) => text.includes('w05'))
  const cut = stack.cutConnections()
  assert.ok(cut > 0, 'a stream was cut')
  const text = await finishedAnswer(page, before, 40_000)
  assert.deepEqual(words(text), SLOW_WORDS)
  assert.ok(
    resumes.some((request) => request.lastEventId > 0),
    `resumed with Last-Event-ID after the last event seen: ${JSON.stringify(resumes)}`,
  )
  await page.close()
  assertClean()
})

test('chat: a reload mid-answer continues the same run', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  await sendMessage(page, '[slow] through a reload')
  await waitForAnswerText(page, (text) => text.includes('w06'))
  const runId = await page.getByTestId('message-live').last().getAttribute('data-run-id')
  const resumes = resumeRequests(page)
  await page.reload()
  await page.getByTestId('message-live').or(page.getByTestId('message-assistant')).first().waitFor()
  const text = await finishedAnswer(page, 0, 40_000)
  assert.deepEqual(words(text), SLOW_WORDS)
  assert.equal(await page.getByTestId('message-assistant').last().getAttribute('data-run-id'), runId)
  assert.equal(await page.getByTestId('message-user').count(), 1)
  assert.ok(
    resumes.some((request) => request.runId === runId && request.lastEventId > 0),
    `after the reload the run was followed from where the page was: ${JSON.stringify(resumes)}`,
  )
  await page.close()
  assertClean()
})

test('memory: a remembered fact appears after the turn; editing it makes a version', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  const before = await sendMessage(page, 'Please remember that my cat is called Miso')
  await finishedAnswer(page, before)
  // The chat says what the turn stored, once the background writer has stored it.
  const notice = page.getByTestId('message-assistant').nth(before).getByTestId('memory-notice')
  await notice.waitFor({ timeout: 25_000 })
  assert.match(await notice.innerText(), /Memory updated:[\s\S]*Miso/)
  assert.match(await notice.getByTestId('memory-notice-item').first().getAttribute('href'), /^#\/memory\/[0-9a-f-]{36}$/)
  await page.getByTestId('nav-memory').click()
  const fact = page.getByTestId('memory-list').getByTestId('memory-item').filter({ hasText: "The user's cat is called Miso." })
  const deadline = Date.now() + 20_000
  while ((await fact.count()) === 0) {
    assert.ok(Date.now() < deadline, 'the fact was remembered')
    await page.getByTestId('memory-refresh').click()
    await page.waitForTimeout(400)
  }
  // Provenance in words: the conversation by its title, the message by its date (no id prefixes).
  await fact.getByTestId('memory-thread').waitFor()
  // The titles are read in the background: the card shows the date until they arrive.
  await fact
    .getByTestId('memory-thread')
    .filter({ hasText: /^conversation “Please remember that my cat is called Miso”$/ })
    .waitFor()
  assert.ok((await fact.getByTestId('memory-ref').count()) >= 1)
  assert.match(await fact.getByTestId('memory-ref').first().innerText(), /^your message of \S.*\d{4}$/)
  const memoryId = await fact.getAttribute('data-memory-id')
  const card = page.getByTestId('memory-list').locator(`[data-memory-id="${memoryId}"]`)
  await card.getByTestId('memory-edit').click()
  await card.getByTestId('memory-edit-content').fill("The user's cat is called Miso the Brave.")
  await card.getByTestId('memory-edit-save').click()
  const edited = card.filter({ hasText: 'Miso the Brave' })
  await edited.waitFor()
  await edited.getByTestId('memory-history').click()
  const versions = edited.getByTestId('memory-versions')
  await versions.getByTestId('memory-version').nth(1).waitFor()
  const history = await versions.innerText()
  assert.match(history, /v2\s+updated/)
  assert.match(history, /v1\s+created/)
  assert.match(history, /Miso the Brave/)
  assert.match(history, /The user's cat is called Miso\./)

  // Search shows the per-signal details.
  await page.getByTestId('memory-search-input').fill('what is my cat called')
  await page.getByTestId('memory-search-submit').click()
  const result = page.getByTestId('memory-search-result').filter({ hasText: 'Miso the Brave' }).first()
  await result.waitFor()
  // First in words (rank, how likely it is about the question, how it was found), the
  // numbers behind a second disclosure.
  const signals = result.getByTestId('memory-signals')
  assert.match(await signals.locator('summary').first().innerText(), /^Why this result: #1/)
  await signals.locator('summary').first().click()
  assert.match(await signals.getByTestId('signals-words').innerText(), /Found by meaning \(#\d+\) and by its words \(#\d+\)/)
  await signals.getByText('The numbers').click()
  assert.match(await signals.innerText(), /Vector \(meaning\)[\s\S]*BM25 \(words\)[\s\S]*Fused[\s\S]*Trust ×/)
  await screenshot(page, 'memory')
  await screenshot(page, 'memory-viewport', { fullPage: false })

  // Export, then import the export back: nothing new (the same contents are skipped).
  const [download] = await Promise.all([page.waitForEvent('download'), page.getByTestId('memory-export').click()])
  const exported = readFileSync(await download.path(), 'utf8')
  assert.match(exported, /Miso the Brave/)
  const file = path.join(os.tmpdir(), `mnemo-import-${Date.now()}.jsonl`)
  writeFileSync(file, `${exported}${JSON.stringify({ kind: 'preference', content: 'The user prefers green tea.' })}\n`)
  await page.getByTestId('memory-import-file').setInputFiles(file)
  await page.getByTestId('memory-import-report').waitFor()
  assert.match(await page.getByTestId('memory-import-report').innerText(), /Imported 1,/)
  // Archive, then restore.
  await card.getByTestId('memory-archive').click()
  await card.getByTestId('memory-archived').waitFor()
  await card.getByTestId('memory-restore').click()
  await card.getByTestId('memory-archived').waitFor({ state: 'detached' })
  // Provenance: the reference opens the thread at the message the fact came from.
  const ref = card.getByTestId('memory-ref').first()
  const target = await ref.getAttribute('href')
  assert.match(target, /^#\/chat\/[0-9a-f-]{36}\/[0-9a-f-]{36}$/)
  await ref.click()
  const messageId = target.split('/').pop()
  await page.locator(`#msg-${messageId}.highlight`).waitFor()
  assert.match(await page.locator(`#msg-${messageId}`).innerText(), /remember that my cat is called Miso/)

  // The chat shows why it remembered: the edited fact, with its rank in each signal.
  await newThread(page)
  const asked = await sendMessage(page, 'What is my cat called?')
  await finishedAnswer(page, asked)
  const recalled = page.getByTestId('message-assistant').nth(asked).getByTestId('turn-recalled')
  await recalled.locator('summary').first().click()
  const why = recalled.getByTestId('turn-recalled-memory').filter({ hasText: 'Miso the Brave' })
  await why.waitFor()
  assert.match(await why.getByTestId('signals-words').innerText(), /^Found by meaning/)
  await why.getByText('The numbers').click()
  assert.match(await why.locator('table.signals').innerText(), /Vector \(meaning\)\s+#\d/)
  await page.close()
  assertClean()
})

test('documents and research: ingest, research with local search, follow a citation', async () => {
  const page = await signedInPage(stack, '#/documents')
  const notes = path.join(os.tmpdir(), `otters-${Date.now()}.md`)
  writeFileSync(
    notes,
    '# Otter notes\n\nSea otters hold hands while they sleep so that they do not drift apart. ' +
      'A group of resting sea otters is called a raft. Otters wrap themselves in kelp.\n',
  )
  await page.getByTestId('document-file').setInputFiles(notes)
  await page.getByTestId('document-upload').filter({ hasText: 'added' }).waitFor()
  // Drag and drop works too.
  await page.evaluate(() => {
    const transfer = new DataTransfer()
    transfer.items.add(new File(['Plain notes about kelp forests.'], 'kelp.txt', { type: 'text/plain' }))
    const zone = document.querySelector('[data-testid="document-dropzone"]')
    zone.dispatchEvent(new DragEvent('drop', { dataTransfer: transfer, bubbles: true, cancelable: true }))
  })
  await page.getByTestId('document-item').filter({ hasText: 'kelp' }).waitFor()
  const otterDoc = page.getByTestId('document-item').filter({ hasText: 'otters-' })
  const documentId = await otterDoc.getAttribute('data-document-id')
  // Its text, as the chunks research cites.
  await otterDoc.getByTestId('document-text').locator('summary').click()
  await otterDoc.getByTestId('document-chunk').filter({ hasText: 'Sea otters hold hands' }).waitFor()
  await screenshot(page, 'documents')

  await page.getByTestId('nav-research').click()
  await page.getByTestId('research-query').fill('How do sea otters sleep?')
  await page.getByTestId('research-provider').selectOption('local')
  // The report's options: a length and a tone.
  await page.getByTestId('research-options').locator('summary').click()
  await page.getByTestId('research-words').fill('300')
  await page.getByTestId('research-tone').fill('plain')
  await screenshot(page, 'research-options')
  await page.getByTestId('research-plan-review').check()
  await page.getByTestId('research-start').click()
  await page.getByTestId('plan-review').waitFor({ timeout: 30_000 })
  assert.match(await page.getByTestId('plan-topics').inputValue(), /otters sleeping/)
  // A reload while the research waits for the plan's approval shows the plan again.
  await page.reload()
  await page.getByTestId('plan-review').waitFor({ timeout: 30_000 })
  assert.match(await page.getByTestId('plan-topics').inputValue(), /otters sleeping/)
  await page.getByTestId('plan-approve').click()
  await page.locator('[data-testid="research-live"][data-status="completed"]').waitFor({ timeout: 60_000 })
  const report = page.getByTestId('research-live').getByTestId('report')
  assert.match(await report.getByTestId('report-body').innerText(), /Sea otters hold hands/)
  await page.getByTestId('researcher').first().waitFor()
  // The citation [1] links to source 1, which links to the document.
  const cite = report.locator('a.cite[data-cite="1"]').first()
  await cite.click()
  await page.waitForFunction(() => document.activeElement?.id === 'source-1')
  assert.ok(page.url().endsWith('#/research'), `the route stays: ${page.url()}`)
  const sourceLink = report.getByTestId('report-source').first().getByTestId('report-source-link')
  assert.equal(await sourceLink.getAttribute('href'), `#/documents/${documentId}`)
  // Download the report as Markdown.
  const [download] = await Promise.all([page.waitForEvent('download'), report.getByTestId('report-download').click()])
  assert.match(download.suggestedFilename(), /\.md$/)
  assert.match(readFileSync(await download.path(), 'utf8'), /Sea otters hold hands/)
  await screenshot(page, 'research')
  // History, and a past report opened from it.
  const item = page.getByTestId('history-item').filter({ hasText: 'How do sea otters sleep?' })
  await item.waitFor()
  await item.getByTestId('history-open').click()
  await page.getByTestId('research-record').waitFor()
  assert.match(await page.getByTestId('research-record').innerText(), /Sea otters hold hands/)
  // The stored research downloads as DOCX and PDF, read back.
  const [docx] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-docx').click()])
  assert.match(docx.suggestedFilename(), /\.docx$/)
  assert.equal(
    readFileSync(await docx.path())
      .subarray(0, 2)
      .toString(),
    'PK',
  )
  const [pdf] = await Promise.all([page.waitForEvent('download'), page.getByTestId('export-pdf').click()])
  assert.match(pdf.suggestedFilename(), /\.pdf$/)
  assert.equal(
    readFileSync(await pdf.path())
      .subarray(0, 5)
      .toString(),
    '%PDF-',
  )
  // A follow-up starts from it, and history links the two.
  await page.getByTestId('research-plan-review').uncheck()
  await page.getByTestId('follow-up-query').fill('Do otters use tools?')
  await screenshot(page, 'research-record')
  await page.getByTestId('follow-up-start').click()
  await page.locator('[data-testid="research-live"][data-status="completed"]').waitFor({ timeout: 60_000 })
  await page.getByTestId('history-item').filter({ hasText: 'Do otters use tools?' }).filter({ hasText: 'follow-up' }).waitFor()
  await screenshot(page, 'research-follow-up')
  await item.getByTestId('history-open').click()
  await page.getByTestId('research-record').getByTestId('report-source-link').first().waitFor()
  await page.getByTestId('research-record').getByTestId('report-source-link').first().click()
  await page.locator(`[data-testid="document-item"][data-document-id="${documentId}"].highlight`).waitFor()
  await page.close()
  assertClean()
})

test('xss: markup in a memory, a model answer and a document shows as text', async () => {
  const page = await signedInPage(stack)
  // A model answer.
  await newThread(page)
  const before = await sendMessage(page, '[xss] show me some html')
  const text = await finishedAnswer(page, before)
  assert.ok(text.includes('<img src=x onerror=alert(1)>'), text)
  assert.ok(text.includes('<script>alert(2)</script>'), text)
  const answer = page.getByTestId('message-assistant').nth(before)
  assert.equal(await answer.locator('img, script').count(), 0)
  // The javascript: link lost its href.
  const links = await answer.locator('a').evaluateAll((nodes) => nodes.map((node) => node.getAttribute('href')))
  assert.ok(
    links.every((href) => href === null || /^(https?:|mailto:|#)/.test(href)),
    JSON.stringify(links),
  )
  assert.ok(XSS_REPLY.includes('javascript:'))

  // A memory.
  await page.getByTestId('nav-memory').click()
  await page.getByTestId('memory-add-content').fill(`Memory with ${XSS}`)
  await page.getByTestId('memory-add-submit').click()
  await page.getByTestId('memory-list').getByText(`Memory with ${XSS}`).waitFor()

  // A document: its title in the list, its text in a search of document chunks.
  await page.getByTestId('nav-documents').click()
  await page.getByTestId('document-paste-title').fill(`Doc ${XSS}`)
  await page.getByTestId('document-paste-type').selectOption('text/markdown')
  await page.getByTestId('document-paste-content').fill(`Dangerous document text ${XSS} about ferrets.`)
  await page.getByTestId('document-paste-submit').click()
  await page
    .getByTestId('document-title')
    .filter({ hasText: `Doc ${XSS}` })
    .waitFor()
  await page.getByTestId('nav-memory').click()
  await page.getByTestId('memory-search-input').fill('dangerous document ferrets')
  await page.getByTestId('memory-search-options').click()
  await page.getByTestId('memory-search-kind-document').check()
  await page.getByTestId('memory-search-submit').click()
  await page.getByTestId('memory-search-results').getByText('Dangerous document text').first().waitFor()

  // A source found by research: its title and text came from the document, as a fetched
  // page's would.
  await page.getByTestId('nav-research').click()
  await page.getByTestId('research-query').fill('What does the document say about ferrets?')
  await page.getByTestId('research-provider').selectOption('local')
  await page.getByTestId('research-start').click()
  await page.locator('[data-testid="research-live"][data-status="completed"]').waitFor({ timeout: 60_000 })
  const sources = page.getByTestId('research-live').getByTestId('report').getByTestId('report-source')
  await sources
    .filter({ hasText: `Doc ${XSS}` })
    .first()
    .waitFor()

  await page.waitForTimeout(500)
  assert.equal(await page.locator('img[src="x"]').count(), 0)
  assert.equal(await page.evaluate(() => document.querySelectorAll('script').length), 1, 'only the app bundle')
  assert.ok(!stack.problems.some((problem) => problem.startsWith('dialog')), stack.problems.join('\n'))
  await page.close()
  assertClean()
})

test('chat: a message too long keeps its text, says why, and leaves no thread', async () => {
  const threadCount = async () => (await stack.api('GET', '/v1/threads?limit=200')).body.threads.length
  const huge = 'paste '.repeat(166_667).trim() // 1,000,001 characters: over the server's limit
  // With the server's limits known (GET /models), the composer refuses before sending.
  let page = await signedInPage(stack)
  await newThread(page)
  await page.locator('form.composer[data-max-chars]').waitFor()
  const threadsBefore = await threadCount()
  let posted = 0
  page.on('request', (request) => {
    if (request.method() === 'POST' && /\/v1\/threads/.test(request.url())) posted++
  })
  await page.getByTestId('composer-input').fill(huge)
  await page.getByTestId('send').click()
  const error = page.getByTestId('composer-error')
  await error.waitFor()
  assert.match(await error.innerText(), /1,000,001 characters.*at most 1,000,000/)
  assert.equal((await page.getByTestId('composer-input').inputValue()).length, huge.length)
  assert.equal(posted, 0, 'nothing was sent')
  assert.equal(await page.getByTestId('message-user').count(), 0)
  await screenshot(page, 'chat-too-long', { fullPage: false })
  await page.close()

  // Without them (GET /models failed), the server's refusal does the same: the text comes
  // back to the composer, the reason beside it, and the thread made for it is gone again.
  page = await signedInPage(stack, '#/memory')
  await page.route('**/models', (route) => route.abort())
  await page.getByTestId('nav-chat').click()
  await page.getByTestId('composer-input').fill(huge)
  await page.getByTestId('send').click()
  await page.getByTestId('composer-error').waitFor()
  assert.match(await page.getByTestId('composer-error').innerText(), /Not sent: .*longer than 1000000 characters/)
  assert.equal((await page.getByTestId('composer-input').inputValue()).length, huge.length)
  assert.equal(await page.getByTestId('message-user').count(), 0)
  await page.waitForURL((url) => url.href.endsWith('#/chat'))
  assert.equal(await threadCount(), threadsBefore, 'the thread made for the refused message was deleted')
  // Typing again clears the reason.
  await page.getByTestId('composer-input').fill('A short one')
  assert.equal(await page.getByTestId('composer-error').count(), 0)
  await page.close()
  assertClean()
})

test('chat: a long message shows its start until expanded', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  const long = `Start of a long note. ${'Every line of it matters. '.repeat(120)}The end.`
  const before = await sendMessage(page, long)
  await finishedAnswer(page, before)
  const message = page.getByTestId('message-user').last()
  const text = message.getByTestId('message-text')
  assert.ok((await text.innerText()).length < 1300, 'collapsed')
  assert.doesNotMatch(await text.innerText(), /The end\./)
  await message.getByTestId('message-expand').click()
  assert.match(await text.innerText(), /The end\.$/)
  assert.equal(await message.getByTestId('message-expand').getAttribute('aria-expanded'), 'true')
  await page.close()
  assertClean()
})

test('threads: grouped by day, searched by title; a message copied', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  const before = await sendMessage(page, 'Planning a walk along the Mur')
  await finishedAnswer(page, before)
  // Today's threads are under "Today"; the search keeps only matching titles.
  const today = page.getByTestId('thread-list').locator('section', { hasText: 'Today' })
  await today.getByTestId('thread-item').filter({ hasText: 'Planning a walk along the Mur' }).waitFor()
  assert.match(await page.getByTestId('thread-group').first().innerText(), /^today$/i)
  await page.getByTestId('thread-search').fill('walk along')
  await page.getByTestId('thread-item').filter({ hasText: 'Planning a walk along the Mur' }).waitFor()
  for (const title of await page.getByTestId('thread-item').allInnerTexts()) {
    assert.match(title.toLowerCase(), /walk along/)
  }
  await page.getByTestId('thread-search').fill('no such title anywhere')
  await page.getByTestId('thread-search-empty').waitFor()
  await page.getByTestId('thread-search').fill('')
  // A code block is highlighted and has its own Copy button.
  const coded = await sendMessage(page, '[code] show me some Rust')
  await finishedAnswer(page, coded)
  const block = page.getByTestId('message-assistant').nth(coded).locator('.code-block')
  await block.locator('.hljs-keyword', { hasText: 'fn' }).first().waitFor()
  assert.ok((await block.locator('.hljs-comment').count()) >= 1, 'the comment is marked')
  await stack.context.grantPermissions(['clipboard-read', 'clipboard-write'])
  await block.getByTestId('code-copy').click()
  await block.getByTestId('code-copy').filter({ hasText: 'Copied' }).waitFor()
  assert.match(await page.evaluate(() => navigator.clipboard.readText()), /^fn main\(\) \{\n {4}let answer = 42;/)
  await screenshot(page, 'chat-code', { fullPage: false })
  // Copy: the answer's text reaches the clipboard.
  const answer = page.getByTestId('message-assistant').nth(before)
  await answer.getByTestId('message-copy').click()
  await answer.getByTestId('message-copy').filter({ hasText: 'Copied' }).waitFor()
  const clipboard = await page.evaluate(() => navigator.clipboard.readText())
  // The markdown as written, as other chat apps copy it.
  assert.match(clipboard, /This is the \*\*fake\*\* model answering/)
  await page.close()
  assertClean()
})

/** Watches the user's memories for a while (the writer takes about a second for a turn): the
 * text never shows up. (tests/api/memory_switch.rs proves the same with the writer drained.) */
async function neverRemembered(pattern) {
  const until = Date.now() + 6_000
  while (Date.now() < until) {
    assert.doesNotMatch(await allMemoryText(), pattern)
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
}

async function allMemoryText() {
  const { status, body } = await stack.api('GET', '/v1/memories?limit=500')
  assert.equal(status, 200)
  return JSON.stringify(body)
}

test('memory switch and temporary chat: nothing recalled, nothing remembered', async () => {
  const page = await signedInPage(stack)
  // A temporary chat says so before and after its first message, and keeps nothing.
  await page.getByTestId('thread-new-temporary').click()
  await page.getByTestId('memory-off').filter({ hasText: 'Temporary chat' }).waitFor()
  const first = await sendMessage(page, 'Please remember that my dog is called Rexford')
  await finishedAnswer(page, first)
  await page
    .getByTestId('thread-item')
    .filter({ hasText: 'Please remember that my dog is called Rexford' })
    .getByTestId('thread-temporary')
    .waitFor()
  await page.getByTestId('memory-off').filter({ hasText: 'Temporary chat' }).waitFor()
  await neverRemembered(/Rexford/)
  // An ordinary chat is not temporary.
  await newThread(page)
  assert.equal(await page.getByTestId('memory-off').count(), 0)

  // The memory switch: off on the Memory page, for every chat, and it stays off.
  await page.getByTestId('nav-memory').click()
  await page.getByTestId('memory-switch-input').uncheck()
  await page.getByTestId('memory-switch').filter({ hasText: 'Off:' }).waitFor()
  assert.equal((await stack.api('GET', '/v1/me')).body.memory_enabled, false)
  await page.reload()
  await page.getByTestId('memory-switch').filter({ hasText: 'Off:' }).waitFor()
  assert.equal(await page.getByTestId('memory-switch-input').isChecked(), false)
  await page.getByTestId('nav-chat').click()
  await newThread(page)
  await page.getByTestId('memory-off').filter({ hasText: 'Memory is off' }).waitFor()
  const second = await sendMessage(page, 'Please remember that my hamster is called Hamish')
  await finishedAnswer(page, second)
  await neverRemembered(/Hamish/)
  await screenshot(page, 'chat-memory-off', { fullPage: false })

  // On again.
  await page.getByTestId('nav-memory').click()
  await page.getByTestId('memory-switch-input').check()
  await page.getByTestId('memory-switch').filter({ hasText: 'On:' }).waitFor()
  assert.equal((await stack.api('GET', '/v1/me')).body.memory_enabled, true)
  // …and the same kind of message is remembered again, within the time watched above.
  await page.getByTestId('nav-chat').click()
  await newThread(page)
  const third = await sendMessage(page, 'Please remember that my parrot is called Polly')
  await finishedAnswer(page, third)
  const deadline = Date.now() + 6_000
  while (!/Polly/.test(await allMemoryText())) {
    assert.ok(Date.now() < deadline, 'remembered once memory is on')
    await new Promise((resolve) => setTimeout(resolve, 500))
  }
  await page.close()
  assertClean()
})

test('chat: edit a message and resend it; regenerate the last answer', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  const first = await sendMessage(page, 'What is the tallest tree in Graz?')
  await finishedAnswer(page, first)
  const second = await sendMessage(page, 'And the oldest bridge?')
  await finishedAnswer(page, second)
  const userMessages = page.getByTestId('message-user')
  assert.equal(await userMessages.count(), 2)
  // Edit the first message: it and everything after it are replaced by one new turn.
  await userMessages.first().getByTestId('message-edit').click()
  await page.getByTestId('message-edit-input').fill('What is the tallest tree in Vienna?')
  await page.getByTestId('message-edit-send').click()
  await page.getByTestId('message-user').filter({ hasText: 'tallest tree in Vienna' }).waitFor()
  await finishedAnswer(page, 0)
  assert.equal(await page.getByTestId('message-user').count(), 1)
  assert.equal(await page.getByTestId('message-assistant').count(), 1)
  assert.equal(await page.getByTestId('messages').getByText('And the oldest bridge?').count(), 0)
  // The server has the same: one message pair, the edited text.
  const threadId = new URL(page.url()).hash.split('/').pop()
  const thread = (await stack.api('GET', `/v1/threads/${threadId}`)).body
  assert.deepEqual(
    thread.messages.map((m) => [m.role, m.role === 'user' ? m.content : '…']),
    [
      ['user', 'What is the tallest tree in Vienna?'],
      ['assistant', '…'],
    ],
  )
  // Regenerate: the same question answered by a new run.
  const answer = page.getByTestId('message-assistant').first()
  const oldRun = await answer.getAttribute('data-run-id')
  await answer.getByTestId('message-regenerate').click()
  await page.waitForFunction(
    (old) => {
      const replies = document.querySelectorAll('[data-testid="message-assistant"]')
      return replies.length === 1 && replies[0].getAttribute('data-run-id') && replies[0].getAttribute('data-run-id') !== old
    },
    oldRun,
    { timeout: 30_000 },
  )
  assert.equal(await page.getByTestId('message-user').count(), 1)
  await page.close()
  assertClean()
})

test('api reference: /redoc renders the OpenAPI document under the strict policy, and finds operations', async () => {
  const page = await stack.context.newPage()
  await page.goto(`${stack.mnemoUrl}/redoc`)
  const retry = page.locator('article.operation', { hasText: '/v1/threads/{id}/messages/{message_id}/retry' })
  await retry.waitFor()
  assert.match(await retry.innerText(), /POST[\s\S]*Edit-and-resend[\s\S]*Request body[\s\S]*content[\s\S]*202/)
  // The schemas are unfolded: the thread's fields are listed under its creation.
  const create = page.locator('article.operation', { hasText: 'POST /v1/threads' }).first()
  assert.match(await create.innerText(), /temporary/)
  const operations = await page.locator('article.operation').count()
  assert.ok(operations > 40, `${operations} operations`)
  await screenshot(page, 'api-reference', { fullPage: false })
  // The filter keeps what matches.
  await page.getByLabel('Find an operation').fill('forgotten')
  await page.waitForFunction(() => [...document.querySelectorAll('article.operation')].filter((a) => !a.hidden).length <= 3)
  for (const text of await page.locator('article.operation:not([hidden]) h3').allInnerTexts()) {
    assert.match(text, /forgotten/)
  }
  await page.close()
  // No script refused by the policy, no console error.
  assertClean()
})

test('threads: rename, delete', async () => {
  const page = await signedInPage(stack)
  const before = await sendMessage(page, 'A thread to rename')
  await finishedAnswer(page, before)
  const item = page.getByTestId('thread-item').filter({ hasText: 'A thread to rename' })
  await item.getByTestId('thread-rename').click()
  await page.getByTestId('thread-rename-input').fill('Renamed thread')
  await page.getByTestId('thread-rename-save').click()
  const renamed = page.getByTestId('thread-item').filter({ hasText: 'Renamed thread' })
  await renamed.waitFor()
  // The server kept the new title.
  const threads = (await stack.api('GET', '/v1/threads')).body.threads
  assert.ok(
    threads.some((thread) => thread.title === 'Renamed thread'),
    JSON.stringify(threads),
  )
  await renamed.getByTestId('thread-delete').click()
  await renamed.getByTestId('thread-delete-confirm').click()
  await renamed.waitFor({ state: 'detached' })
  await page.close()
  assertClean()
})

test('layout: phone width, dark theme, keyboard', async () => {
  const page = await signedInPage(stack)
  await page.setViewportSize({ width: 375, height: 740 })
  await page.getByTestId('threads-toggle').click()
  await page.getByTestId('thread-list').waitFor()
  await screenshot(page, 'chat-phone-threads')
  await page.getByTestId('thread-link').first().click()
  await page.getByTestId('message-assistant').first().waitFor()
  const chatOverflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  assert.ok(chatOverflow <= 1, `no horizontal scrolling in a thread at 375 px (${chatOverflow} px)`)
  await page.getByTestId('nav-memory').click()
  // Measured once the memory view has replaced the chat (whose layout is checked above).
  await page.getByTestId('memory-item').first().waitFor()
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth)
  assert.ok(overflow <= 1, `no horizontal scrolling at 375 px (${overflow} px)`)
  await screenshot(page, 'memory-phone')
  await page.getByTestId('nav-research').click()
  await screenshot(page, 'research-phone')
  // The theme toggle: auto → light → dark.
  await page.getByTestId('theme-toggle').click()
  await page.getByTestId('theme-toggle').click()
  assert.equal(await page.evaluate(() => document.documentElement.dataset.theme), 'dark')
  await page.setViewportSize({ width: 1280, height: 900 })
  await page.getByTestId('nav-chat').click()
  await page.getByTestId('thread-link').first().click()
  await screenshot(page, 'chat-dark')
  // Keyboard: the composer sends with Enter.
  const before = await page.getByTestId('message-assistant').count()
  await page.getByTestId('composer-input').focus()
  await page.keyboard.type('Typed with the keyboard')
  await page.keyboard.press('Enter')
  await finishedAnswer(page, before)
  await page.getByTestId('theme-toggle').click()
  await page.close()
  assertClean()
})

test('memory: forget shows what would go, forgets only what is chosen, and can be undone', async () => {
  for (const content of ['My passport number is X1234567.', 'My sister lives in Lisbon.', 'I play the cello in a community orchestra.']) {
    const added = await stack.api('POST', '/v1/memories', { content, kind: 'fact' })
    assert.equal(added.status, 201, JSON.stringify(added.body))
  }
  const page = await signedInPage(stack, '#/memory')
  await page.getByTestId('memory-forget-input').fill('Forget everything about my passport')
  await page.getByTestId('memory-forget-submit').click()
  const preview = page.getByTestId('memory-forget-preview')
  await preview.waitFor()
  // The preview names the passport and nothing else, and nothing is gone yet.
  assert.match(await preview.innerText(), /X1234567/)
  assert.doesNotMatch(await preview.innerText(), /Lisbon|cello/)
  let listed = (await stack.api('GET', '/v1/memories?kinds=fact')).body.memories.map((m) => m.content)
  assert.ok(listed.includes('My passport number is X1234567.'), listed.join(' | '))
  await screenshot(page, 'memory-forget-preview')
  await page.getByTestId('memory-forget-confirm').click()
  await page.getByTestId('memory-forgotten').waitFor()
  listed = (await stack.api('GET', '/v1/memories?kinds=fact')).body.memories.map((m) => m.content)
  assert.ok(!listed.includes('My passport number is X1234567.'), listed.join(' | '))
  assert.ok(
    listed.includes('My sister lives in Lisbon.') && listed.includes('I play the cello in a community orchestra.'),
    listed.join(' | '),
  )
  await page.getByTestId('memory-restorable').getByText('X1234567').waitFor()
  // Undo brings it back.
  await page.getByTestId('memory-forget-undo').click()
  await page.getByTestId('memory-forgotten').waitFor({ state: 'detached' })
  listed = (await stack.api('GET', '/v1/memories?kinds=fact')).body.memories.map((m) => m.content)
  assert.ok(listed.includes('My passport number is X1234567.'), listed.join(' | '))
  // A request naming nothing the user said shows that nothing would go.
  await page.getByTestId('memory-forget-input').fill('my dog')
  await page.getByTestId('memory-forget-submit').click()
  await page.getByTestId('memory-forget-preview').getByText('nothing will be forgotten').waitFor()
  await page.close()
  assertClean()
})

test('research: compare two models side by side', async () => {
  const page = await signedInPage(stack, '#/research')
  await page.getByTestId('research-provider').selectOption('local')
  await page.getByTestId('compare-models').fill('fake, fake-b')
  await page.getByTestId('compare-query').fill('Where do otters rest?')
  await page.getByTestId('compare-start').click()
  const results = page.getByTestId('compare-results')
  await results.waitFor({ timeout: 60_000 })
  assert.equal(await results.locator('article').count(), 2)
  assert.match(await results.innerText(), /fake-b/)
  await page.getByTestId('comparison-table').getByText('fake-b').waitFor()
  await screenshot(page, 'research-compare')
  await page.close()
  assertClean()
})

test("sign in with a JWT: another user, who sees none of alice's threads; an expired token is refused", async () => {
  const page = await stack.context.newPage()
  await page.goto('/')
  await useKeyForm(page)
  await page.getByTestId('signin-kind-jwt').check()
  await page.getByTestId('signin-token').fill(signJwt('bob', -120))
  await page.getByTestId('signin-submit').click()
  await page.getByText('The server did not accept this token').waitFor()
  await page.getByTestId('signin-token').fill(signJwt('bob'))
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('nav-chat').waitFor()
  // Who is signed in is always shown.
  await page.getByTestId('signed-in-as').filter({ hasText: 'bob' }).waitFor()
  // A new user's memory page says how to tell mnemo something, not "no match".
  await page.getByTestId('nav-memory').click()
  await page.getByTestId('memory-empty').waitFor()
  assert.match(await page.getByTestId('memory-empty').innerText(), /does not know anything about you yet[\s\S]*Remember that/)
  await page.getByTestId('nav-chat').click()
  const before = await sendMessage(page, 'Hello, I am bob')
  await finishedAnswer(page, before)
  await page.getByTestId('thread-item').filter({ hasText: 'Hello, I am bob' }).waitFor()
  assert.equal(await page.getByTestId('thread-item').filter({ hasText: 'Hello there' }).count(), 0)
  await page.close()
  assertClean()
})
