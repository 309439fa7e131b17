// Short messages for the user, announced by an aria-live region in App.vue.

import { reactive } from 'vue'

export interface Notice {
  id: number
  kind: 'info' | 'error'
  text: string
}

export const notices = reactive<Notice[]>([])
let next = 1

export function notify(text: string, kind: 'info' | 'error' = 'info'): void {
  const notice = { id: next++, kind, text }
  notices.push(notice)
  if (notices.length > 4) notices.splice(0, notices.length - 4)
  if (kind === 'info') setTimeout(() => dismiss(notice.id), 6000)
}

export function dismiss(id: number): void {
  const index = notices.findIndex((notice) => notice.id === id)
  if (index >= 0) notices.splice(index, 1)
}

/** The message of an error, for a notice. */
export function messageOf(error: unknown): string {
  if (error instanceof Error) return error.message
  return String(error)
}

export function fail(error: unknown, what?: string): void {
  const message = messageOf(error)
  notify(what ? `${what}: ${message}` : message, 'error')
}
