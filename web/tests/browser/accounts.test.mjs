// Accounts in the browser: on a server without accounts the first visitor creates the
// administrator, who adds a person and issues them an API key; signed out, the person signs in
// with their name and password, a new tab is signed in too (the session is the server's HttpOnly
// cookie, nothing is in the page's storage), and signing out ends the session for every tab.

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { RESULTS_DIR, startStack, screenshot } from '../support/harness.mjs'

const ADMIN_PASSWORD = 'admin password 1'
const BEA_PASSWORD = 'bea password 22'

let stack

before(async () => {
  stack = await startStack()
})

after(async () => {
  if (stack) writeFileSync(path.join(RESULTS_DIR, 'accounts-console.log'), `${stack.problems.join('\n')}\n`)
  await stack?.stop()
})

function assertClean() {
  const serious = stack.problems.filter(
    (problem) => /Content Security Policy|Refused to/i.test(problem) || problem.startsWith('pageerror') || problem.startsWith('dialog'),
  )
  assert.deepEqual(serious, [])
}

/** What the page itself can see of the sign-in: its storage and its cookies. */
async function pageSecrets(page) {
  return page.evaluate(() => ({
    credential: sessionStorage.getItem('mnemo.credential'),
    cookies: document.cookie,
    local: JSON.stringify(localStorage),
  }))
}

test('first run: the admin is created, adds a person with a key; the person signs in, a new tab stays signed in, sign-out ends it', async () => {
  const page = await stack.context.newPage()
  await page.goto('/')
  await page.getByTestId('signin-title').filter({ hasText: 'Create the admin account' }).waitFor()
  // A mistyped repeat is caught before anything is sent.
  await page.getByTestId('signin-name').fill('root')
  await page.getByTestId('signin-password').fill(ADMIN_PASSWORD)
  await page.getByTestId('signin-repeat').fill('something else')
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('signin-error').filter({ hasText: 'The two passwords differ.' }).waitFor()
  await page.getByTestId('signin-repeat').fill(ADMIN_PASSWORD)
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('nav-chat').waitFor()
  await page.getByTestId('signed-in-as').filter({ hasText: 'root' }).waitFor()
  await page.getByTestId('signed-in-admin').waitFor()
  const secrets = await pageSecrets(page)
  assert.equal(secrets.credential, null, 'a password sign-in keeps no token in the page')
  assert.ok(!secrets.cookies.includes('mnemo_session'), 'the session cookie is HttpOnly')

  // The admin adds bea and issues her a key, shown once with a copy button.
  await page.getByTestId('nav-admin').click()
  await page.getByTestId('admin-create').waitFor()
  await page.getByTestId('admin-new-name').fill('bea')
  await page.getByTestId('admin-new-password').fill('short')
  await page.getByTestId('admin-create-submit').click()
  await page.getByTestId('admin-create-error').filter({ hasText: 'at least 8 characters' }).waitFor()
  await page.getByTestId('admin-new-password').fill(BEA_PASSWORD)
  await page.getByTestId('admin-create-submit').click()
  const bea = page.locator('[data-testid="admin-user"][data-user="bea"]')
  await bea.waitFor()
  assert.equal(await bea.getByTestId('admin-user-admin').count(), 0)
  await bea.getByTestId('admin-issue-key').click()
  const key = (await page.getByTestId('issued-key-value').innerText()).trim()
  assert.match(key, /^mnemo_[0-9a-f]{64}$/)
  await page.getByTestId('issued-key').getByTestId('message-copy').waitFor()
  const me = await fetch(`${stack.mnemoUrl}/v1/me`, { headers: { authorization: `Bearer ${key}` } })
  assert.equal(me.status, 200)
  assert.equal((await me.json()).name, 'bea')
  await page.getByTestId('issued-key-dismiss').click()
  await bea.filter({ hasText: '1 API key' }).waitFor()
  await screenshot(page, 'accounts-admin')

  // Signed out, the form asks for a name and password (the setup is done).
  await page.getByTestId('sign-out').click()
  await page.getByTestId('signin-title').filter({ hasText: 'Sign in to mnemo' }).waitFor()
  assert.equal(await page.getByTestId('signin-repeat').count(), 0)
  await page.getByTestId('signin-name').fill('bea')
  await page.getByTestId('signin-password').fill('wrong password')
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('signin-error').filter({ hasText: 'wrong name or password' }).waitFor()
  await page.getByTestId('signin-password').fill(BEA_PASSWORD)
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('signed-in-as').filter({ hasText: 'bea' }).waitFor()
  assert.equal(await page.getByTestId('nav-admin').count(), 0, 'no Admin link for a person who is not one')
  assert.equal(await page.getByTestId('signed-in-admin').count(), 0)

  // A new tab is signed in by the cookie, without a form.
  const second = await stack.context.newPage()
  await second.goto('/#/memory')
  await second.getByTestId('signed-in-as').filter({ hasText: 'bea' }).waitFor()
  assert.equal(await second.getByTestId('signin-form').count(), 0)
  assert.equal((await pageSecrets(second)).credential, null)
  // A write from the page works (the CSRF header is sent).
  await second.getByTestId('nav-chat').click()
  await second.getByTestId('composer-input').fill('Hello from the second tab')
  await second.getByTestId('send').click()
  await second.getByTestId('message-assistant').first().waitFor({ timeout: 30_000 })

  // Signing out in one tab ends the session: the other tab is sent to the sign-in form on its
  // next request, and a reload stays signed out.
  await second.getByTestId('sign-out').click()
  await second.getByTestId('signin-form').waitFor()
  await page.reload()
  await page.getByTestId('signin-form').waitFor()
  assert.equal(await page.getByTestId('nav-chat').count(), 0)
  await second.close()
  await page.close()
  assertClean()
})
