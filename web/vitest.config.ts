import { defineConfig } from 'vitest/config'

// The unit tests (tests/unit/) import the app's TypeScript modules directly; they need no DOM
// (a test stubs the few browser globals a module reads), so they run in plain Node.
export default defineConfig({
  test: {
    include: ['tests/unit/**/*.test.ts'],
    environment: 'node',
  },
})
