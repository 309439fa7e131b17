// The web app's own preferences, kept in this browser (localStorage; none is a secret): the
// model the chat composer starts with. The theme is `session.ts`'s `appearance`; the memory
// switch is the server's (`PATCH /v1/me`), the same in every browser.

import { reactive } from 'vue'
import type { ModelInfo } from './api'

const MODEL = 'mnemo.model'

export const preferences = reactive({
  /** The model chat messages are sent to; '' is the server's chat model. */
  model: localStorage.getItem(MODEL) ?? '',
})

export function setDefaultModel(model: string): void {
  preferences.model = model
  if (model) localStorage.setItem(MODEL, model)
  else localStorage.removeItem(MODEL)
}

/** The distinct configured model names (`GET /models`' roles), the chat role's first. */
export function modelChoices(models: readonly ModelInfo[]): string[] {
  const names: string[] = []
  const chat = models.filter((model) => model.role === 'chat')
  for (const model of [...chat, ...models]) {
    if (!names.includes(model.model)) names.push(model.model)
  }
  return names
}

/** The model to send with a message: the chosen one while the server still offers it. */
export function modelToSend(choices: readonly string[]): string | undefined {
  return choices.length > 1 && choices.includes(preferences.model) ? preferences.model : undefined
}
