// Small helpers shared by the views: dates, numbers, downloads, and the links a memory's
// provenance refers to.

import { href } from './router'
import { madeOn, quoted, type Titles } from './titles'

export function formatDate(value: string | null | undefined): string {
  if (!value) return ''
  const date = new Date(value)
  if (Number.isNaN(date.getTime())) return value
  return date.toLocaleString(undefined, { dateStyle: 'medium', timeStyle: 'short' })
}

export function shortId(id: string): string {
  return id.length > 8 ? id.slice(0, 8) : id
}

export function fixed(value: number | null | undefined, digits = 3): string {
  if (value === null || value === undefined || Number.isNaN(value)) return '–'
  return value.toFixed(digits)
}

export function money(value: number | null | undefined): string {
  if (value === null || value === undefined) return ''
  return `$${value < 0.01 ? value.toFixed(5) : value.toFixed(4)}`
}

/**
 * Puts `text` on the clipboard: the clipboard API, else a selection the browser copies (a page
 * without the clipboard permission). False when the browser allowed neither.
 */
export async function copyToClipboard(text: string): Promise<boolean> {
  try {
    await navigator.clipboard.writeText(text)
    return true
  } catch {
    const area = document.createElement('textarea')
    area.value = text
    area.setAttribute('readonly', '')
    area.style.position = 'fixed'
    area.style.opacity = '0'
    document.body.appendChild(area)
    area.select()
    const done = document.execCommand('copy')
    area.remove()
    return done
  }
}

/** Offers `text` as a file download (a Blob URL with a `download` link). */
export function download(filename: string, text: string, type: string): void {
  const url = URL.createObjectURL(new Blob([text], { type }))
  const link = document.createElement('a')
  link.href = url
  link.download = filename
  link.rel = 'noopener'
  document.body.appendChild(link)
  link.click()
  link.remove()
  setTimeout(() => URL.revokeObjectURL(url), 10_000)
}

export function slug(text: string, fallback = 'report'): string {
  const cleaned = text
    .toLowerCase()
    .replace(/[^\p{L}\p{N}]+/gu, '-')
    .replace(/^-+|-+$/g, '')
    .slice(0, 60)
  return cleaned || fallback
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i

export interface RefLink {
  label: string
  /** In-app hash or external URL; absent for references with nowhere to go. */
  href?: string
  external?: boolean
}

/**
 * Where one of a memory's `source_refs` points, in words: `doc:<id>[#n]` → the document by its
 * title, `research:<id>` → the research by its question, an http(s) URL → the page, a bare
 * UUID → the message of the memory's thread it came from (when it has a thread) or another
 * memory (a profile's sources), by date. Titles come from `titles` when known.
 */
export function refLink(ref: string, threadId: string | null, titles?: Titles): RefLink {
  const doc = /^doc:([0-9a-f-]{36})(?:#(\d+))?$/i.exec(ref)
  if (doc) {
    const title = titles?.documents.get(doc[1])
    const name = title ? `document ${quoted(title)}` : `a document of ${madeOn(doc[1]) || shortId(doc[1])}`
    const label = doc[2] !== undefined ? `${name}, part ${Number(doc[2]) + 1}` : name
    return { label, href: href('documents', doc[1]) }
  }
  const research = /^research:([0-9a-f-]{36})$/i.exec(ref)
  if (research) {
    const query = titles?.research.get(research[1])
    return {
      label: query ? `research ${quoted(query)}` : `a research of ${madeOn(research[1]) || shortId(research[1])}`,
      href: href('research', research[1]),
    }
  }
  if (/^https?:\/\//i.test(ref)) return { label: ref, href: ref, external: true }
  if (UUID.test(ref)) {
    const on = madeOn(ref) || shortId(ref)
    if (threadId) return { label: `your message of ${on}`, href: href('chat', threadId, ref) }
    return { label: `a memory of ${on}`, href: href('memory', ref) }
  }
  return { label: ref }
}

/** A thread in words: its title when known, else when it was started. */
export function threadLabel(id: string, titles?: Titles): string {
  const title = titles?.threads.get(id)
  return title ? `conversation ${quoted(title)}` : `a conversation of ${madeOn(id) || shortId(id)}`
}

/** A source URL of a research: documents of `local` search link into the app. */
export function sourceLink(url: string): RefLink {
  const doc = /^doc:([0-9a-f-]{36})(?:#(\d+))?$/i.exec(url)
  if (doc) return { label: url, href: href('documents', doc[1]) }
  if (/^https?:\/\//i.test(url)) return { label: url, href: url, external: true }
  return { label: url }
}

/** `<input type="date">` value → RFC 3339 at the start (or end) of that local day. */
export function dayBound(value: string, end: boolean): string | undefined {
  if (!value) return undefined
  const date = new Date(`${value}T${end ? '23:59:59.999' : '00:00:00'}`)
  return Number.isNaN(date.getTime()) ? undefined : date.toISOString()
}
