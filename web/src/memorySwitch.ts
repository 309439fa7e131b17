// The account's memory switch (`PATCH /v1/me`), shared by the Memory and Settings views: off,
// chats neither recall nor store memories (what is remembered stays).

import { ref } from 'vue'
import { updateMe } from './api'
import { account } from './session'
import { fail, notify } from './notify'

/** True while a change of the switch is on its way. */
export const switching = ref(false)

export async function setMemoryEnabled(enabled: boolean): Promise<void> {
  switching.value = true
  try {
    account.memoryEnabled = (await updateMe({ memory_enabled: enabled })).memory_enabled
    notify(enabled ? 'Memory is on: chats are recalled and remembered again.' : 'Memory is off: chats are neither recalled nor remembered.')
  } catch (error) {
    fail(error, 'Changing the memory switch')
  } finally {
    switching.value = false
  }
}
