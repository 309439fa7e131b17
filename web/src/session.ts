// What the browser keeps: an API key or JWT if the user signed in with one (sessionStorage
// only: gone when the tab closes, never in a URL, never in localStorage) — a name-and-password
// sign-in keeps nothing here: its session is the server's HttpOnly cookie, which every tab
// shares —, the live runs to resume after a reload (sessionStorage), and the colour theme
// (localStorage; it is not a secret).

import { reactive } from 'vue'

const CREDENTIAL = 'mnemo.credential'
const THEME = 'mnemo.theme'

export type CredentialKind = 'key' | 'jwt'

export const auth = reactive({
  signedIn: sessionStorage.getItem(CREDENTIAL) !== null,
  kind: (sessionStorage.getItem(`${CREDENTIAL}.kind`) as CredentialKind | null) ?? 'key',
  /** Signed in by the session cookie (name and password, or `--dev`): no token in storage. */
  byCookie: false,
  /** The page is still asking the server whether its cookie signs it in. */
  checking: sessionStorage.getItem(CREDENTIAL) === null,
  /** Why the user was sent back to the sign-in form, if they were. */
  notice: '',
})

export function credential(): string | null {
  return sessionStorage.getItem(CREDENTIAL)
}

export function signIn(token: string, kind: CredentialKind): void {
  sessionStorage.setItem(CREDENTIAL, token)
  sessionStorage.setItem(`${CREDENTIAL}.kind`, kind)
  auth.signedIn = true
  auth.kind = kind
  auth.byCookie = false
  auth.notice = ''
}

/** Signed in by the session cookie the server set (nothing is stored by the page). */
export function signInByCookie(): void {
  auth.signedIn = true
  auth.byCookie = true
  auth.checking = false
  auth.notice = ''
}

/** Who is signed in and their settings, read from `GET /v1/me` at each sign-in. */
export const account = reactive({
  name: '',
  /** May manage users and keys (the Admin view). */
  isAdmin: false,
  /** `--dev`: nobody signs in or out. */
  dev: false,
  /** The memory switch: off, chats neither recall nor store memories. */
  memoryEnabled: true,
})

/** Forgets the credential and every live-run record of this tab. */
export function signOut(notice = ''): void {
  const keys: string[] = []
  for (let i = 0; i < sessionStorage.length; i++) {
    const key = sessionStorage.key(i)
    if (key && key.startsWith('mnemo.')) keys.push(key)
  }
  for (const key of keys) sessionStorage.removeItem(key)
  auth.signedIn = false
  auth.byCookie = false
  auth.checking = false
  auth.notice = notice
}

// ---- live runs (resumed after a reload) ---------------------------------------------------

export interface LiveRun {
  runId: string
  lastSeq: number
  threadId?: string
  userMessageId?: string
  /** The events shown up to `lastSeq`, so a reload resumes after them (replays from 0 without). */
  snapshot?: unknown
}

export function liveRun(slot: 'chat' | 'research'): LiveRun | null {
  const text = sessionStorage.getItem(`mnemo.live.${slot}`)
  if (!text) return null
  try {
    const value = JSON.parse(text) as LiveRun
    return typeof value.runId === 'string' && typeof value.lastSeq === 'number' ? value : null
  } catch {
    return null
  }
}

export function saveLiveRun(slot: 'chat' | 'research', run: LiveRun | null): void {
  const key = `mnemo.live.${slot}`
  if (!run) {
    sessionStorage.removeItem(key)
    return
  }
  try {
    sessionStorage.setItem(key, JSON.stringify(run))
  } catch {
    // Over the storage quota: keep the run without what was shown (a reload replays it all).
    sessionStorage.setItem(key, JSON.stringify({ runId: run.runId, lastSeq: 0, threadId: run.threadId, userMessageId: run.userMessageId }))
  }
}

// ---- theme --------------------------------------------------------------------------------

export type Theme = 'system' | 'light' | 'dark'

export const appearance = reactive({
  theme: ((): Theme => {
    const stored = localStorage.getItem(THEME)
    return stored === 'light' || stored === 'dark' ? stored : 'system'
  })(),
})

export function applyTheme(theme: Theme): void {
  appearance.theme = theme
  if (theme === 'system') {
    localStorage.removeItem(THEME)
    delete document.documentElement.dataset.theme
  } else {
    localStorage.setItem(THEME, theme)
    document.documentElement.dataset.theme = theme
  }
}

/** The theme in effect (the system's when none was chosen). */
export function effectiveTheme(): 'light' | 'dark' {
  if (appearance.theme !== 'system') return appearance.theme
  return window.matchMedia('(prefers-color-scheme: dark)').matches ? 'dark' : 'light'
}
