// Adding a file from the user's disk as one of their documents: the Documents view's uploads
// and the chat composer's attachments both go through here.
import { documents, type DocumentInfo, type InlineType } from './api'

/** The file types the server extracts text from, as the file picker's `accept`. */
export const ACCEPTED_FILES = '.md,.markdown,.txt,.html,.htm,.pdf,text/markdown,text/plain,text/html,application/pdf'

/** How the file is sent: a text type inline as JSON, a PDF as the raw body; `null` when the
 * server cannot read it. */
export function uploadType(file: File): InlineType | 'application/pdf' | null {
  const name = file.name.toLowerCase()
  if (file.type === 'application/pdf' || name.endsWith('.pdf')) return 'application/pdf'
  if (name.endsWith('.md') || name.endsWith('.markdown') || file.type === 'text/markdown') return 'text/markdown'
  if (name.endsWith('.html') || name.endsWith('.htm') || file.type === 'text/html') return 'text/html'
  if (name.endsWith('.txt') || file.type === 'text/plain') return 'text/plain'
  return null
}

/** The document's title: the file's name without its extension. */
export function titleOf(file: File): string {
  return file.name.replace(/\.[^.]+$/, '')
}

/** Why `file` cannot be uploaded before anything is sent (type, the server's body limit), or ''. */
export function uploadRefusal(file: File, maxBytes: number): string {
  if (!uploadType(file)) return 'Unsupported type: use .md, .markdown, .txt, .html, .htm or .pdf.'
  if (file.size > maxBytes) return `Larger than ${(maxBytes / 1024 / 1024).toFixed(1)} MiB, the server's upload limit.`
  return ''
}

/** Stores `file` as one of the user's documents (the same file again is kept, not doubled: its
 * name is the document's source). Throws with the reason when it is refused. */
export async function uploadFile(file: File, maxBytes: number): Promise<DocumentInfo> {
  const refusal = uploadRefusal(file, maxBytes)
  if (refusal) throw new Error(refusal)
  const type = uploadType(file)!
  return type === 'application/pdf'
    ? documents.addRaw(titleOf(file), file, type, file.name)
    : documents.addText(titleOf(file), await file.text(), type, file.name)
}
