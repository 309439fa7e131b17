import { createApp } from 'vue'
import App from './App.vue'
import './style.css'
import { onUnauthorized } from './api'
import { applyTheme, appearance, signOut } from './session'
import { startRouter } from './router'

applyTheme(appearance.theme)
onUnauthorized((message) => signOut(message))
startRouter()
createApp(App).mount('#app')
