// Accessibility of every view of the web app: axe-core (WCAG 2.0 and 2.1, levels A and AA) on
// the sign-in form, a chat thread with answers, the memory, the documents, a research report
// and the settings, in the light and the dark theme, at desktop width and at phone width (390 × 844).
//
// axe-core is injected into the page as an inline script, which the server's
// Content-Security-Policy (`script-src 'self'`) refuses: this file's stack has its own browser
// context with `bypassCSP`, so the other browser tests still see every CSP violation.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { RESULTS_DIR, startStack, signedInPage, screenshot } from '../support/harness.mjs'
import { THEMES, WIDTHS, useTheme, violations } from '../support/axe.mjs'

let stack

before(async () => {
  // Two models, so the chat composer shows its model picker and the settings their choice.
  stack = await startStack({ contextOptions: { bypassCSP: true }, env: { MNEMO__LLM__ROLES__RESEARCH__MODEL: 'fake-large' } })
})

after(async () => {
  await stack?.stop()
})

/** Attaches a small text file in the chat composer and waits until it is added. */
async function attachFile(page, name) {
  await page.getByTestId('composer-attach-input').setInputFiles({
    name,
    mimeType: 'text/plain',
    buffer: Buffer.from('Otters sketched at the harbour: three of them, holding hands.\n'),
  })
  await page.locator('[data-testid="composer-file"][data-state="ready"]').first().waitFor({ timeout: 30_000 })
}

/** Opens every disclosure in the main area, so that what it hides is checked too. */
async function openDisclosures(page) {
  await page.evaluate(() => {
    for (const details of document.querySelectorAll('main details')) details.open = true
  })
  // A disclosure may load what it shows (a document's text): give it a moment.
  await page.waitForTimeout(500)
}

test('accessibility: axe-core finds no WCAG 2.1 A or AA violation in any view, theme or width', async () => {
  // Something to show in every view: a thread with answers (markdown, a code block, a tool
  // call, the memories recalled), memories (one archived, shown on its own), a search of them,
  // a document, and a research report that cites it.
  const added = await stack.api('POST', '/v1/memories', { content: 'The user has a cat called Miso.', kind: 'fact' })
  assert.equal(added.status, 201, JSON.stringify(added.body))
  const old = await stack.api('POST', '/v1/memories', { content: 'The user had a goldfish called Bubbles.', kind: 'fact' })
  assert.equal(old.status, 201, JSON.stringify(old.body))
  const archived = await stack.api('PATCH', `/v1/memories/${old.body.id}`, { archived: true })
  assert.equal(archived.status, 200, JSON.stringify(archived.body))
  const notes = await stack.api('POST', '/v1/documents', {
    title: 'Otter notes',
    content: '# Otter notes\n\nSea otters hold hands while they sleep so that they do not drift apart.\n',
    content_type: 'text/markdown',
  })
  assert.equal(notes.status, 201, JSON.stringify(notes.body))

  const page = await signedInPage(stack)
  // The first message attaches a file (the message then links it).
  await attachFile(page, 'otter-sketch.txt')
  for (const message of ['[code] show me some Rust', '[tool] what is my cat called?']) {
    const before = await page.getByTestId('message-assistant').count()
    await page.getByTestId('composer-input').fill(message)
    await page.getByTestId('send').click()
    await page.getByTestId('message-assistant').nth(before).waitFor({ timeout: 30_000 })
    await page.getByTestId('stop').waitFor({ state: 'detached', timeout: 30_000 })
  }
  const threadHash = new URL(page.url()).hash
  assert.match(threadHash, /^#\/chat\/[0-9a-f-]{36}$/)

  await page.getByTestId('nav-research').click()
  await page.getByTestId('research-query').fill('How do sea otters sleep?')
  await page.getByTestId('research-provider').selectOption('local')
  await page.getByTestId('research-start').click()
  await page.locator('[data-testid="research-live"][data-status="completed"]').waitFor({ timeout: 60_000 })
  const researchHash = await page.getByTestId('history-open').first().getAttribute('href')
  assert.match(researchHash, /^#\/research\/[0-9a-f-]{36}$/)

  const views = [
    {
      name: 'chat',
      hash: threadHash,
      async show(p) {
        await p.getByTestId('message-assistant').nth(1).getByTestId('answer').waitFor()
        // What each answer recalled and used, loaded on demand once the turn is stored.
        const answers = await p.getByTestId('message-assistant').count()
        const details = p.getByTestId('message-details')
        for (let left = await details.count(); left > 0; left--) {
          await details.first().click()
          await p.waitForFunction((count) => document.querySelectorAll('[data-testid="message-details"]').length < count, left)
        }
        await p.waitForFunction((count) => document.querySelectorAll('[data-testid="turn-recalled"]').length === count, answers)
        // A file waiting in the composer for the next message.
        if ((await p.getByTestId('composer-file').count()) === 0) await attachFile(p, 'otter-sketch.txt')
      },
    },
    {
      name: 'memory',
      hash: `#/memory/${old.body.id}`,
      async show(p) {
        await p.getByTestId('memory-selected').getByTestId('memory-archived').waitFor()
        await p.getByTestId('memory-search-input').fill('what is my cat called')
        await p.getByTestId('memory-search-submit').click()
        await p.getByTestId('memory-search-result').first().waitFor()
      },
    },
    {
      name: 'documents',
      hash: '#/documents',
      show: (p) => p.getByTestId('document-item').first().waitFor(),
    },
    {
      name: 'research',
      hash: researchHash,
      show: (p) => p.getByTestId('research-record').getByTestId('report-source').first().waitFor(),
    },
    {
      name: 'settings',
      hash: '#/settings',
      show: (p) => p.getByTestId('settings-model-select').waitFor(),
    },
  ]

  const problems = []
  async function check(target, label) {
    await openDisclosures(target)
    await screenshot(target, `a11y-${label.replace(/ /g, '-')}`, { fullPage: false })
    for (const line of await violations(target)) problems.push(`${label}: ${line}`)
  }

  // A tab that is not signed in shows the sign-in form (the credential is kept per tab).
  const signIn = await stack.context.newPage()
  await signIn.goto('/')
  for (const theme of THEMES) {
    await useTheme(signIn, theme)
    await useTheme(page, theme)
    for (const size of WIDTHS) {
      await signIn.setViewportSize(size)
      await signIn.getByTestId('signin-name').waitFor()
      await check(signIn, `sign-in ${theme} ${size.name}`)
      await page.setViewportSize(size)
      for (const view of views) {
        await page.evaluate((hash) => (window.location.hash = hash), view.hash)
        await view.show(page)
        await check(page, `${view.name} ${theme} ${size.name}`)
      }
    }
  }
  await signIn.close()
  await page.close()

  const report = path.join(RESULTS_DIR, 'axe-violations.txt')
  writeFileSync(report, `${problems.join('\n')}\n`)
  assert.deepEqual(problems, [], `axe-core found ${problems.length} violations (also in ${report})`)
})
