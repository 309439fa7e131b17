// Markdown from the model, the web or the user's documents, rendered for `v-html`:
// markdown-it with raw HTML off (any `<tag>` in the source stays text), then DOMPurify on the
// output. Links keep only http, https, mailto and in-page `#` targets, and external ones open
// with `rel="noopener noreferrer"`. Images are shown as links (the page's CSP blocks foreign
// images anyway, and an image is a tracking beacon). Citation numbers `[n]` can become links
// to the numbered sources of a research report.

import MarkdownIt, { type StateCore, type Token } from 'markdown-it'
import DOMPurify from 'dompurify'
import hljs from 'highlight.js/lib/core'
import bash from 'highlight.js/lib/languages/bash'
import c from 'highlight.js/lib/languages/c'
import cpp from 'highlight.js/lib/languages/cpp'
import css from 'highlight.js/lib/languages/css'
import go from 'highlight.js/lib/languages/go'
import java from 'highlight.js/lib/languages/java'
import javascript from 'highlight.js/lib/languages/javascript'
import json from 'highlight.js/lib/languages/json'
import python from 'highlight.js/lib/languages/python'
import rust from 'highlight.js/lib/languages/rust'
import sql from 'highlight.js/lib/languages/sql'
import typescript from 'highlight.js/lib/languages/typescript'
import xml from 'highlight.js/lib/languages/xml'
import yaml from 'highlight.js/lib/languages/yaml'

export interface RenderOptions {
  /** Source numbers that exist: `[n]` for these becomes a link to `#<citePrefix><n>`. */
  citations?: ReadonlySet<number>
  citePrefix?: string
}

// Code blocks with a language are highlighted (highlight.js escapes the code and wraps tokens
// in `<span class="hljs-…">`, which the sanitiser keeps); others stay plain text.
for (const [name, language] of Object.entries({
  bash,
  c,
  cpp,
  css,
  go,
  java,
  javascript,
  json,
  python,
  rust,
  sql,
  typescript,
  xml,
  yaml,
})) {
  hljs.registerLanguage(name, language)
}

function highlight(code: string, language: string): string {
  const name = language.trim().toLowerCase()
  if (!name || !hljs.getLanguage(name)) return ''
  try {
    return hljs.highlight(code, { language: name, ignoreIllegals: true }).value
  } catch {
    return ''
  }
}

const md = new MarkdownIt({ html: false, linkify: true, typographer: false, breaks: false, highlight })

// Images become plain links with the alt text.
md.renderer.rules.image = (tokens, index, _options, _env, self) => {
  const token = tokens[index]
  const src = String(token.attrGet('src') ?? '')
  const alt = self.renderInlineAsText(token.children ?? [], _options, _env) || src
  const escaped = md.utils.escapeHtml
  return `<a href="${escaped(src)}">${escaped(String(alt))}</a>`
}

const CITATION = /\[(\d{1,3})\]/g
const HAS_CITATION = /\[\d{1,3}\]/

// `[n]` in text (not inside a link) → a link to the source, when the source exists.
md.core.ruler.push('citations', (state) => {
  const env = state.env as RenderOptions | undefined
  const known = env?.citations
  if (!known || known.size === 0) return
  const prefix = env?.citePrefix ?? 'source-'
  for (const block of state.tokens) {
    if (block.type !== 'inline' || !block.children) continue
    const out: Token[] = []
    let inLink = 0
    for (const child of block.children) {
      if (child.type === 'link_open') inLink++
      if (child.type === 'link_close') inLink--
      if (child.type !== 'text' || inLink > 0 || !HAS_CITATION.test(child.content)) {
        out.push(child)
        continue
      }
      let last = 0
      const text = child.content
      for (const match of text.matchAll(CITATION)) {
        const n = Number(match[1])
        const at = match.index ?? 0
        if (!known.has(n)) continue
        if (at > last) out.push(textToken(state, text.slice(last, at)))
        const open = new state.Token('link_open', 'a', 1)
        open.attrs = [
          ['href', `#${prefix}${n}`],
          ['class', 'cite'],
          ['data-cite', String(n)],
          ['aria-label', `source ${n}`],
        ]
        out.push(open, textToken(state, `[${n}]`), new state.Token('link_close', 'a', -1))
        last = at + match[0].length
      }
      if (last < text.length) out.push(textToken(state, text.slice(last)))
    }
    block.children = out
  }
})

function textToken(state: StateCore, content: string): Token {
  const token = new state.Token('text', '', 0)
  token.content = content
  return token
}

const SAFE_URL = /^(?:https?:|mailto:|#)/i

DOMPurify.addHook('afterSanitizeAttributes', (node) => {
  if (node.nodeName !== 'A') return
  const href = node.getAttribute('href')
  if (href === null) return
  if (!SAFE_URL.test(href)) {
    node.removeAttribute('href')
    return
  }
  if (href.startsWith('#')) {
    node.removeAttribute('target')
    return
  }
  node.setAttribute('rel', 'noopener noreferrer')
  node.setAttribute('target', '_blank')
})

const PURIFY = {
  ALLOWED_URI_REGEXP: SAFE_URL,
  FORBID_TAGS: ['style', 'img', 'svg', 'math', 'form', 'input', 'button', 'textarea', 'select', 'iframe', 'object', 'embed'],
  FORBID_ATTR: ['style', 'srcset', 'src'],
  ADD_ATTR: ['target'],
}

/** Sanitised HTML for `v-html`. */
export function renderMarkdown(source: string, options: RenderOptions = {}): string {
  const html = md.render(source, { ...options })
  return DOMPurify.sanitize(html, PURIFY) as string
}

/** The citation numbers `[n]` a text uses. */
export function citedNumbers(source: string): number[] {
  const found = new Set<number>()
  for (const match of source.matchAll(CITATION)) found.add(Number(match[1]))
  return [...found].sort((a, b) => a - b)
}
