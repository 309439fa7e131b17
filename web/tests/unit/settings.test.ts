// Unit tests of the browser's preferences (src/settings.ts): the composer's model choices from
// the configured roles, and which model a message is sent with.
import { beforeAll, expect, test } from 'vitest'
import type { ModelInfo } from '../../src/api'

const stored = new Map<string, string>()
let settings: typeof import('../../src/settings')

beforeAll(async () => {
  // The module reads localStorage when it loads: a small stand-in for Node.
  Object.assign(globalThis, {
    localStorage: {
      getItem: (key: string) => stored.get(key) ?? null,
      setItem: (key: string, value: string) => void stored.set(key, value),
      removeItem: (key: string) => void stored.delete(key),
    },
  })
  settings = await import('../../src/settings')
})

function role(role: ModelInfo['role'], model: string): ModelInfo {
  return { role, model, max_tokens: 1024, context_tokens: 8192, provider: 'localhost:8000' }
}

test('the choices are the distinct configured models, the chat role’s first', () => {
  const models = [role('research', 'big'), role('chat', 'small'), role('memory', 'small'), role('final_report', 'big')]
  expect(settings.modelChoices(models)).toEqual(['small', 'big'])
  expect(settings.modelChoices([])).toEqual([])
})

test('a message names its model only when there is a choice and the chosen one is offered', () => {
  settings.setDefaultModel('big')
  expect(stored.get('mnemo.model')).toBe('big')
  expect(settings.modelToSend(['small', 'big'])).toBe('big')
  expect(settings.modelToSend(['big'])).toBeUndefined()
  expect(settings.modelToSend(['small', 'other'])).toBeUndefined()
  settings.setDefaultModel('')
  expect(stored.has('mnemo.model')).toBe(false)
  expect(settings.modelToSend(['small', 'big'])).toBeUndefined()
})
