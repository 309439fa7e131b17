// axe-core in a page: the WCAG 2.0 and 2.1 A and AA rules, one line per violation and element,
// and the theme chosen the way the app's toggle stores it. axe-core is injected as an inline
// script, which the server's CSP refuses: use these in a stack started with `bypassCSP`.

/* global window, document -- the functions given to page.evaluate() run in the page */

import { readFileSync } from 'node:fs'
import { createRequire } from 'node:module'

const AXE_SOURCE = readFileSync(createRequire(import.meta.url).resolve('axe-core/axe.min.js'), 'utf8')
const WCAG_TAGS = ['wcag2a', 'wcag2aa', 'wcag21a', 'wcag21aa']
export const THEMES = ['light', 'dark']
export const WIDTHS = [
  { name: 'desktop', width: 1280, height: 900 },
  { name: 'phone', width: 390, height: 844 },
]

/** The violations axe-core finds in the page as it is now, one line per rule and element. */
export async function violations(page) {
  if (!(await page.evaluate(() => 'axe' in window))) {
    await page.addScriptTag({ content: AXE_SOURCE })
  }
  const found = await page.evaluate(
    (tags) =>
      window.axe.run(document, { runOnly: { type: 'tag', values: tags }, resultTypes: ['violations'] }).then((results) =>
        results.violations.map((violation) => ({
          id: violation.id,
          impact: violation.impact,
          help: violation.help,
          nodes: violation.nodes.map((node) => ({ target: node.target.join(' '), summary: node.failureSummary ?? '' })),
        })),
      ),
    WCAG_TAGS,
  )
  return found.flatMap((violation) =>
    violation.nodes.map(
      (node) =>
        `${violation.id} (${violation.impact}): ${violation.help}\n    at ${node.target}\n    ${node.summary.replace(/\n/g, '\n    ')}`,
    ),
  )
}

/** Chooses the theme the way the toggle stores it, and reloads so the page starts with it. */
export async function useTheme(page, theme) {
  await page.evaluate((value) => localStorage.setItem('mnemo.theme', value), theme)
  await page.reload()
  await page.waitForFunction((value) => document.documentElement.dataset.theme === value, theme)
}
