// Browser tests of the model picker, the settings page and the live "Memory updated" notice:
// a real mnemo with two configured models (the chat role's `fake`, and `fake-large` for
// research), the fake model, Debian's Chromium.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { startStack, signedInPage, screenshot, newThread } from '../support/harness.mjs'

let stack

before(async () => {
  stack = await startStack({ env: { MNEMO__LLM__ROLES__RESEARCH__MODEL: 'fake-large' } })
})

after(async () => {
  await stack?.stop()
})

function assertClean() {
  const serious = stack.problems.filter(
    (problem) => /Content Security Policy|Refused to/i.test(problem) || problem.startsWith('pageerror') || problem.startsWith('dialog'),
  )
  assert.deepEqual(serious, [])
}

/** Sends `text` and waits for its stored reply; returns the reply's element. */
async function say(page, text) {
  const before = await page.getByTestId('message-assistant').count()
  await page.getByTestId('composer-input').fill(text)
  await page.getByTestId('send').click()
  const reply = page.getByTestId('message-assistant').nth(before)
  await reply.waitFor({ timeout: 30_000 })
  await page.getByTestId('stop').waitFor({ state: 'detached', timeout: 30_000 })
  return reply
}

/** The chat turns' requests the fake model received for a message saying `text`. */
function chatRequests(text) {
  return stack.fake.state.requests.filter((request) => request.stream && request.said.includes(text))
}

test('model picker: both configured models are offered, the chosen one answers, and the choice is kept', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  const picker = page.getByTestId('model-picker')
  await picker.waitFor()
  const options = await picker.locator('option').allInnerTexts()
  assert.deepEqual(
    options.map((option) => option.trim()),
    ['fake', 'fake-large'],
  )
  assert.equal(await picker.inputValue(), 'fake', 'the chat role’s model first')
  await page.getByLabel('Model', { exact: true }).selectOption('fake-large')

  await say(page, 'Which model answers this one?')
  const asked = chatRequests('Which model answers this one?')
  assert.ok(asked.length > 0, JSON.stringify(stack.fake.state.requests.slice(-3)))
  assert.ok(
    asked.every((request) => request.model === 'fake-large'),
    JSON.stringify(asked),
  )

  // Kept across a reload, and it is the settings page's default model.
  await page.reload()
  await page.getByTestId('model-picker').waitFor()
  assert.equal(await page.getByTestId('model-picker').inputValue(), 'fake-large')
  await page.getByTestId('nav-settings').click()
  const select = page.getByTestId('settings-model-select')
  await select.waitFor()
  assert.equal(await select.inputValue(), 'fake-large')
  // Back to the chat model from the settings: the next message goes to it.
  await page.getByLabel('Model that answers your chats').selectOption('fake')
  await page.getByTestId('nav-chat').click()
  await newThread(page)
  assert.equal(await page.getByTestId('model-picker').inputValue(), 'fake')
  await say(page, 'And this one goes to the default?')
  const second = chatRequests('And this one goes to the default?')
  assert.ok(second.length > 0 && second.every((request) => request.model === 'fake'), JSON.stringify(second))
  await page.close()
  assertClean()
})

test('settings: the theme and the memory switch change and are kept across a reload', async () => {
  const page = await signedInPage(stack)
  await page.getByTestId('nav-settings').click()
  await page.getByRole('heading', { name: 'Settings', level: 1 }).waitFor()
  assert.equal(await page.title(), 'Settings · mnemo')
  // The API reference is linked.
  assert.equal(await page.getByTestId('settings-api-docs').getAttribute('href'), '/docs')
  assert.equal(await page.getByTestId('settings-api-redoc').getAttribute('href'), '/redoc')

  await page.getByLabel('Light', { exact: true }).check()
  await page.waitForFunction(() => document.documentElement.dataset.theme === 'light')
  await screenshot(page, 'settings')
  await page.getByLabel('Dark', { exact: true }).check()
  await page.waitForFunction(() => document.documentElement.dataset.theme === 'dark')
  await screenshot(page, 'settings-dark')

  const memory = page.getByLabel('Use memory in chats')
  assert.equal(await memory.isChecked(), true)
  await memory.uncheck()
  await page.getByTestId('settings-memory-help').filter({ hasText: 'Off: chats neither recall nor store memories' }).waitFor()
  const me = await stack.api('GET', '/v1/me')
  assert.equal(me.body.memory_enabled, false)

  await page.reload()
  await page.getByTestId('settings-memory-input').waitFor()
  await page.waitForFunction(() => document.documentElement.dataset.theme === 'dark')
  assert.equal(await page.getByTestId('settings-theme-dark').isChecked(), true)
  // The switch is read from the server after the reload.
  await page.waitForFunction(() => !document.querySelector('[data-testid="settings-memory-input"]').checked)
  // The chat says memory is off.
  await page.getByTestId('nav-chat').click()
  await page.getByTestId('memory-off').filter({ hasText: 'Memory is off' }).waitFor()

  await page.getByTestId('nav-settings').click()
  await page.getByLabel('Use memory in chats').check()
  await page.getByTestId('settings-memory-help').filter({ hasText: 'On: mnemo recalls' }).waitFor()
  assert.equal((await stack.api('GET', '/v1/me')).body.memory_enabled, true)
  await page.getByLabel('System', { exact: true }).check()
  await page.waitForFunction(() => document.documentElement.dataset.theme === undefined)

  // At phone width: everything in one column, nothing wider than the screen.
  await page.setViewportSize({ width: 390, height: 844 })
  await page.getByLabel('Light', { exact: true }).check()
  const overflow = await page.evaluate(() => document.documentElement.scrollWidth - document.documentElement.clientWidth)
  assert.ok(overflow <= 0, `the page is ${overflow}px wider than a phone`)
  await screenshot(page, 'settings-phone')
  await page.getByLabel('System', { exact: true }).check()
  await page.close()
  assertClean()
})

test('memory notice: after "Remember that …" the chat says what was stored, from the writer’s job, linking to it', async () => {
  const page = await signedInPage(stack)
  const asked = []
  page.on('request', (request) => {
    const url = new URL(request.url())
    if (/^\/v1\/runs\/[^/]+\/memory$/.test(url.pathname)) asked.push(`memory ${url.searchParams.get('wait')}`)
    if (url.pathname === '/v1/memories') asked.push('memories list')
  })
  await newThread(page)
  const reply = await say(page, 'Remember that my sister lives in Graz')
  const notice = reply.getByTestId('memory-notice')
  await notice.waitFor({ timeout: 35_000 })
  assert.match(await notice.innerText(), /Memory updated:[\s\S]*sister lives in Graz/)
  assert.ok(asked.includes('memory 30'), `the page waited on the turn's job: ${asked.join(', ')}`)
  assert.ok(!asked.includes('memories list'), `and did not poll the memory list: ${asked.join(', ')}`)

  const item = notice.getByTestId('memory-notice-item').first()
  const href = await item.getAttribute('href')
  const id = /^#\/memory\/([0-9a-f-]{36})$/.exec(href ?? '')?.[1]
  assert.ok(id, href)
  const stored = await stack.api('GET', `/v1/memories/${id}`)
  assert.equal(stored.status, 200)
  assert.match(await item.innerText(), new RegExp(stored.body.memory.content.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')))
  await item.click()
  await page.getByTestId('memory-selected').filter({ hasText: stored.body.memory.content }).waitFor()

  // A question stores nothing: no notice.
  await page.getByTestId('nav-chat').click()
  await newThread(page)
  const question = await say(page, 'What is the weather like?')
  const runId = await question.getAttribute('data-run-id')
  const done = await stack.api('GET', `/v1/runs/${runId}/memory?wait=30`)
  assert.equal(done.body.status, 'done')
  assert.deepEqual(done.body.result.memories, [])
  await page.waitForTimeout(500)
  assert.equal(await question.getByTestId('memory-notice').count(), 0)
  await page.close()
  assertClean()
})
