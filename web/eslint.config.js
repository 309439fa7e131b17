// ESLint (flat config): the recommended rules of ESLint, typescript-eslint and eslint-plugin-vue
// for the app, its tests and its tooling. Formatting is Prettier's job (.prettierrc.json):
// eslint-config-prettier, last, turns off every rule that would argue with it.
import js from '@eslint/js'
import { defineConfig } from 'eslint/config'
import prettier from 'eslint-config-prettier'
import vue from 'eslint-plugin-vue'
import globals from 'globals'
import tseslint from 'typescript-eslint'

export default defineConfig(
  { ignores: ['dist/', 'node_modules/', 'src/generated/', 'test-results/'] },
  js.configs.recommended,
  tseslint.configs.recommended,
  vue.configs['flat/recommended'],
  {
    // <script lang="ts"> in single-file components goes to the TypeScript parser.
    files: ['**/*.vue'],
    languageOptions: { parserOptions: { parser: tseslint.parser } },
  },
  {
    rules: {
      // `const { [key]: _dropped, ...rest } = object` is how a key is left out of a copy.
      '@typescript-eslint/no-unused-vars': ['error', { ignoreRestSiblings: true }],
    },
  },
  {
    // The app runs in the browser.
    files: ['src/**/*.{ts,vue}'],
    languageOptions: { globals: globals.browser },
  },
  {
    // Tests, the fake model, the test harness and the config files run in Node.
    files: ['tests/**', '*.config.{js,ts}'],
    languageOptions: { globals: globals.node },
  },
  {
    // The functions the browser tests pass to page.evaluate() run in the page.
    files: ['tests/browser/**'],
    languageOptions: { globals: { ...globals.node, ...globals.browser } },
  },
  prettier,
)
