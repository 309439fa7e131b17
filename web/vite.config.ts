import { defineConfig } from 'vite'
import vue from '@vitejs/plugin-vue'

// The Rust server embeds dist/ and serves it at `/` under a strict Content-Security-Policy
// (no inline script or style, no eval): every script and stylesheet is an emitted file.
export default defineConfig({
  plugins: [vue()],
  base: '/',
  build: {
    outDir: 'dist',
    emptyOutDir: true,
    target: 'es2022',
    sourcemap: false,
    // Never inline assets as data: URLs into JS (CSS data: images are allowed, but keep one rule).
    assetsInlineLimit: 0,
    cssCodeSplit: false,
    modulePreload: { polyfill: false },
  },
  server: {
    // `npm run dev` against a local mnemo (scripts/serve) on 127.0.0.1:8080.
    proxy: {
      '/v1': { target: 'http://127.0.0.1:8080', changeOrigin: false },
      '/research': { target: 'http://127.0.0.1:8080', changeOrigin: false },
      '/models': { target: 'http://127.0.0.1:8080', changeOrigin: false },
      '/health': { target: 'http://127.0.0.1:8080', changeOrigin: false },
    },
  },
})
