// What the ids in a memory's provenance are called: the title of a thread or a document, the
// question of a research, read once from the lists the API already has and shared by every
// memory card. An id the lists do not hold (an older item past the first pages, or one just
// made) still shows when it was made: mnemo's ids are UUIDv7, whose first 48 bits are the
// creation time in milliseconds.

import { reactive } from 'vue'
import { documents, research, threads } from './api'

export interface Titles {
  threads: Map<string, string>
  documents: Map<string, string>
  research: Map<string, string>
}

const titles: Titles = reactive({ threads: new Map(), documents: new Map(), research: new Map() })
let loading: Promise<void> | null = null

/** The shared titles; the first call (and `refresh`) reads the lists in the background. */
export function useTitles(refresh = false): Titles {
  if (!loading || refresh) loading = load()
  return titles
}

async function load(): Promise<void> {
  const [threadList, documentList, history] = await Promise.allSettled([
    threads.list(undefined, 200),
    documents.list(undefined, 200),
    research.history(200),
  ])
  if (threadList.status === 'fulfilled') {
    for (const thread of threadList.value.threads) titles.threads.set(thread.id, thread.title)
  }
  if (documentList.status === 'fulfilled') {
    for (const document of documentList.value.documents) titles.documents.set(document.id, document.title)
  }
  if (history.status === 'fulfilled') {
    for (const item of history.value.research) titles.research.set(item.id, item.query)
  }
}

/** When a UUIDv7 was made, as a short local date; '' for another kind of id. */
export function madeOn(id: string): string {
  const match = /^([0-9a-f]{8})-([0-9a-f]{4})-7/i.exec(id)
  if (!match) return ''
  const date = new Date(Number.parseInt(match[1] + match[2], 16))
  if (Number.isNaN(date.getTime())) return ''
  return date.toLocaleDateString(undefined, { day: 'numeric', month: 'short', year: 'numeric' })
}

/** `“Title”`, cut to a readable length. */
export function quoted(title: string, max = 60): string {
  const chars = [...title.trim()]
  return `“${chars.length > max ? `${chars.slice(0, max - 1).join('')}…` : chars.join('')}”`
}
