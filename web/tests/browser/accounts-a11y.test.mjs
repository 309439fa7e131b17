// Accessibility of the accounts views: axe-core (WCAG 2.0 and 2.1, A and AA) on the first
// administrator's form, the name-and-password sign-in and the Admin view, in the light and the
// dark theme, at desktop and at phone width; each is saved as a screenshot (a11y-*.png) too.
// The stack bypasses the CSP, which refuses the injected axe-core (see tests/support/axe.mjs).

import { after, before, test } from 'node:test'
import assert from 'node:assert/strict'
import { writeFileSync } from 'node:fs'
import path from 'node:path'
import { RESULTS_DIR, startStack, screenshot } from '../support/harness.mjs'
import { THEMES, WIDTHS, useTheme, violations } from '../support/axe.mjs'

let stack

before(async () => {
  stack = await startStack({ contextOptions: { bypassCSP: true } })
})

after(async () => {
  await stack?.stop()
})

test('accessibility: the setup form, the sign-in form and the Admin view have no WCAG 2.1 A or AA violation', async () => {
  const problems = []
  async function check(page, label) {
    await screenshot(page, `a11y-${label.replace(/ /g, '-')}`, { fullPage: false })
    for (const line of await violations(page)) problems.push(`${label}: ${line}`)
  }

  const page = await stack.context.newPage()
  await page.goto('/')
  for (const theme of THEMES) {
    await useTheme(page, theme)
    for (const size of WIDTHS) {
      await page.setViewportSize(size)
      await page.getByTestId('signin-repeat').waitFor()
      await check(page, `setup ${theme} ${size.name}`)
    }
  }
  await page.setViewportSize(WIDTHS[0])
  await page.getByTestId('signin-name').fill('root')
  await page.getByTestId('signin-password').fill('admin password 1')
  await page.getByTestId('signin-repeat').fill('admin password 1')
  await page.getByTestId('signin-submit').click()
  await page.getByTestId('nav-admin').click()
  await page.getByTestId('admin-new-name').fill('bea')
  await page.getByTestId('admin-new-password').fill('bea password 22')
  await page.getByTestId('admin-create-submit').click()
  const bea = page.locator('[data-testid="admin-user"][data-user="bea"]')
  await bea.waitFor()

  // The Admin view with a key just issued (shown once, with its copy button).
  for (const theme of THEMES) {
    await useTheme(page, theme)
    for (const size of WIDTHS) {
      await page.setViewportSize(size)
      await bea.waitFor()
      if ((await page.getByTestId('issued-key').count()) === 0) {
        await bea.getByTestId('admin-issue-key').click()
        await page.getByTestId('issued-key').waitFor()
      }
      await check(page, `admin ${theme} ${size.name}`)
    }
  }
  // Signed out, every tab shows the name-and-password form.
  await page.getByTestId('sign-out').click()
  await page.getByTestId('signin-form').waitFor()
  const signIn = await stack.context.newPage()
  await signIn.goto('/')
  for (const theme of THEMES) {
    await useTheme(signIn, theme)
    for (const size of WIDTHS) {
      await signIn.setViewportSize(size)
      await signIn.getByTestId('signin-name').waitFor()
      await check(signIn, `sign-in-password ${theme} ${size.name}`)
    }
  }
  await signIn.close()
  await page.close()

  const report = path.join(RESULTS_DIR, 'axe-accounts-violations.txt')
  writeFileSync(report, `${problems.join('\n')}\n`)
  assert.deepEqual(problems, [], `axe-core found ${problems.length} violations (also in ${report})`)
})
