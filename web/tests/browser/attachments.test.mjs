// Browser tests of files attached in the chat: picked in the composer they become the user's
// documents, the message sent next attaches them, the answer reads them (the fake model names
// what it read), the message links them after a reload; a file the server cannot read is
// refused beside the composer and keeps the message from being sent until it is removed.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { startStack, signedInPage, screenshot, newThread } from '../support/harness.mjs'

let stack

before(async () => {
  stack = await startStack()
})

after(async () => {
  await stack?.stop()
})

/** Picks a file in the composer's file chooser. */
function pick(page, name, mimeType, text) {
  return page.getByTestId('composer-attach-input').setInputFiles({ name, mimeType, buffer: Buffer.from(text) })
}

const TRIP = '# Trip to Ljubljana\n\nThe train leaves Vienna at 07:40 and arrives at 13:52.\n'

test('attach: a picked file is added, read by the answer, and linked from the message after a reload', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  await pick(page, 'ljubljana-trip.md', 'text/markdown', TRIP)
  const chip = page.getByTestId('composer-file')
  await page.locator('[data-testid="composer-file"][data-state="ready"]').waitFor({ timeout: 30_000 })
  assert.match(await chip.innerText(), /ljubljana-trip\.md/)
  await screenshot(page, 'chat-attachment', { fullPage: false })

  await page.getByTestId('composer-input').fill('When does my train arrive?')
  await page.getByTestId('send').click()
  const reply = page.getByTestId('message-assistant').first()
  await reply.waitFor({ timeout: 30_000 })
  await page.getByTestId('stop').waitFor({ state: 'detached', timeout: 30_000 })
  const answer = await reply.getByTestId('answer').innerText()
  assert.match(answer, /I read “ljubljana-trip” \(# Trip to Ljubljana\)/, answer)
  assert.equal(await page.getByTestId('composer-file').count(), 0, 'the composer is cleared once sent')
  const asked = stack.fake.state.requests.filter((request) => request.stream && request.said.includes('When does my train arrive?'))
  assert.ok(
    asked.some((request) => request.said.includes('arrives at 13:52')),
    JSON.stringify(asked),
  )

  // The message keeps its attachment: after a reload it still links the document.
  await page.reload()
  const link = page.getByTestId('message-attachment').getByRole('link', { name: 'ljubljana-trip' })
  await link.waitFor()
  await link.click()
  await page.waitForFunction(() => window.location.hash.startsWith('#/documents/'))
  await page.getByTestId('document-item').filter({ hasText: 'ljubljana-trip' }).waitFor()
  const listed = await stack.api('GET', '/v1/documents')
  assert.deepEqual(
    listed.body.documents.map((document) => document.title),
    ['ljubljana-trip'],
  )
  await page.close()
})

test('attach: a file the server cannot read is refused beside the composer and blocks sending until removed', async () => {
  const page = await signedInPage(stack)
  await newThread(page)
  await pick(page, 'tool.exe', 'application/octet-stream', 'MZ not a document')
  const failed = page.locator('[data-testid="composer-file"][data-state="failed"]')
  await failed.waitFor()
  assert.match(await failed.innerText(), /Unsupported type/)
  await page.getByTestId('composer-input').fill('What is in the file?')
  await page.getByTestId('send').click()
  const error = page.getByTestId('composer-error')
  await error.waitFor()
  assert.match(await error.innerText(), /tool\.exe.*could not be attached/)
  assert.equal(await page.getByTestId('composer-input').inputValue(), 'What is in the file?', 'the text is kept')
  assert.equal(await page.getByTestId('message-user').count(), 0, 'nothing was sent')

  await page.getByRole('button', { name: 'Remove tool.exe' }).click()
  await page.getByTestId('send').click()
  await page.getByTestId('message-assistant').first().waitFor({ timeout: 30_000 })
  assert.equal(await page.getByTestId('message-attachment').count(), 0)
  await page.close()
})
