// Hash routing (`#/chat`, `#/research`, `#/memory`, `#/documents`, `#/settings`, `#/admin`, each
// with optional path parameters such as `#/chat/<thread id>`), so the server only serves
// index.html at `/`.
// A hash that does not start with `#/` is an in-page anchor and leaves the route alone.

import { reactive } from 'vue'

export const VIEWS = ['chat', 'research', 'memory', 'documents', 'settings', 'admin'] as const
export type View = (typeof VIEWS)[number]

export const route = reactive({ view: 'chat' as View, params: [] as string[] })

function parse(hash: string): { view: View; params: string[] } | null {
  if (hash === '' || hash === '#' || hash === '#/') return { view: 'chat', params: [] }
  if (!hash.startsWith('#/')) return null
  const path = hash.slice(2).split('?')[0]
  const segments = path
    .split('/')
    .filter((segment) => segment !== '')
    .map((segment) => {
      try {
        return decodeURIComponent(segment)
      } catch {
        return segment
      }
    })
  const view = (VIEWS as readonly string[]).includes(segments[0] ?? '') ? (segments[0] as View) : 'chat'
  return { view, params: view === segments[0] ? segments.slice(1) : [] }
}

function sync(): void {
  const next = parse(window.location.hash)
  if (!next) return
  route.view = next.view
  route.params = next.params
}

export function startRouter(): void {
  sync()
  window.addEventListener('hashchange', sync)
}

/** The hash of a route, e.g. `href('chat', id)` → `#/chat/<id>`. */
export function href(view: View, ...params: string[]): string {
  return `#/${[view, ...params.map(encodeURIComponent)].join('/')}`
}

export function navigate(view: View, ...params: string[]): void {
  const target = href(view, ...params)
  if (window.location.hash !== target) window.location.hash = target
  else sync()
}

/** Changes the hash without adding a history entry (canonical forms, selections). */
export function replace(view: View, ...params: string[]): void {
  const target = href(view, ...params)
  if (window.location.hash === target) return
  history.replaceState(history.state, '', target)
  sync()
}
