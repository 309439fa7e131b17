// The API reference (/redoc): renders the server's own OpenAPI document, read-only. Served
// from the binary under the web app's Content-Security-Policy: no inline script or style, and
// every text from the document is set as text, never as HTML.
'use strict'

const METHODS = ['get', 'post', 'put', 'patch', 'delete']
/** How deep nested schemas are unfolded before "…" (the document has cycles). */
const MAX_DEPTH = 4

function element(tag, attributes = {}, ...children) {
  const node = document.createElement(tag)
  for (const [name, value] of Object.entries(attributes)) {
    if (value !== undefined && value !== null) node.setAttribute(name, value)
  }
  for (const child of children) {
    if (child === null || child === undefined) continue
    node.append(typeof child === 'string' ? document.createTextNode(child) : child)
  }
  return node
}

/** `#/components/schemas/Name` → the schema, and its name. */
function resolve(doc, schema) {
  if (schema && typeof schema.$ref === 'string') {
    const name = schema.$ref.split('/').pop()
    return { name, schema: doc.components?.schemas?.[name] ?? {} }
  }
  return { name: null, schema: schema ?? {} }
}

/** A schema's type in a few words: `string (uuid)`, `array of Memory`, `Thread | null`. */
function typeOf(doc, raw) {
  const { name, schema } = resolve(doc, raw)
  if (name) return name
  const variants = schema.oneOf ?? schema.anyOf
  if (variants) return variants.map((variant) => typeOf(doc, variant)).join(' | ')
  if (schema.allOf && schema.allOf.length === 1) return typeOf(doc, schema.allOf[0])
  if (schema.enum) return schema.enum.map((value) => JSON.stringify(value)).join(' | ')
  let type = Array.isArray(schema.type) ? schema.type.join(' | ') : (schema.type ?? 'object')
  if (schema.type === 'array' || (Array.isArray(schema.type) && schema.type.includes('array'))) {
    type = type.replace('array', `array of ${typeOf(doc, schema.items)}`)
  }
  if (schema.format) type += ` (${schema.format})`
  return type
}

/** The properties of an object schema as a nested list, unfolded to `MAX_DEPTH`. */
function schemaTree(doc, raw, depth = 0, seen = new Set()) {
  const { name, schema } = resolve(doc, raw)
  if (name && seen.has(name)) return element('p', { class: 'muted' }, `${name} (as above)`)
  const inner = name ? new Set([...seen, name]) : seen
  const target = schema.allOf && schema.allOf.length === 1 ? resolve(doc, schema.allOf[0]).schema : schema
  const variants = target.oneOf ?? target.anyOf
  if (variants && depth < MAX_DEPTH) {
    const list = element('ul', { class: 'schema' })
    for (const variant of variants) {
      const item = element('li', {}, element('span', { class: 'type' }, typeOf(doc, variant)))
      const { schema: resolved } = resolve(doc, variant)
      if (resolved.properties) item.append(schemaTree(doc, variant, depth + 1, inner))
      list.append(item)
    }
    return list
  }
  if (target.type === 'array' && target.items) return schemaTree(doc, target.items, depth, inner)
  if (!target.properties) return element('span', { class: 'type' }, typeOf(doc, raw))
  if (depth >= MAX_DEPTH) return element('span', { class: 'muted' }, '…')
  const required = new Set(target.required ?? [])
  const list = element('ul', { class: 'schema' })
  for (const [property, value] of Object.entries(target.properties)) {
    const { schema: resolved } = resolve(doc, value)
    const item = element(
      'li',
      {},
      element('code', {}, property),
      ' ',
      element('span', { class: 'type' }, typeOf(doc, value)),
      required.has(property) ? element('span', { class: 'required' }, ' required') : null,
    )
    const description = value.description ?? resolved.description
    if (description) item.append(' — ', description)
    const nested = resolved.type === 'array' ? resolve(doc, resolved.items).schema : resolved
    if (nested.properties || nested.oneOf || nested.anyOf) item.append(schemaTree(doc, value, depth + 1, inner))
    list.append(item)
  }
  return list
}

function parametersTable(doc, parameters) {
  const table = element('table', {}, element('tr', {}, element('th', {}, 'Name'), element('th', {}, 'In'), element('th', {}, 'Type'), element('th', {}, 'About')))
  for (const raw of parameters) {
    const parameter = raw.$ref ? resolve(doc, raw).schema : raw
    table.append(
      element(
        'tr',
        {},
        element('td', {}, element('code', {}, parameter.name ?? ''), parameter.required ? element('span', { class: 'required' }, ' required') : null),
        element('td', {}, parameter.in ?? ''),
        element('td', {}, element('span', { class: 'type' }, typeOf(doc, parameter.schema))),
        element('td', {}, parameter.description ?? ''),
      ),
    )
  }
  return table
}

function bodySchemas(doc, content) {
  const out = []
  for (const [mediaType, media] of Object.entries(content ?? {})) {
    out.push(element('p', {}, element('code', {}, mediaType)))
    if (media.schema) out.push(schemaTree(doc, media.schema))
  }
  return out
}

function operationId(method, path) {
  return `op-${method}-${path.replace(/[^a-zA-Z0-9]+/g, '-')}`
}

function renderOperation(doc, method, path, operation) {
  const article = element(
    'article',
    { class: 'operation', id: operationId(method, path), 'data-search': `${method} ${path} ${operation.summary ?? ''} ${operation.description ?? ''}`.toLowerCase() },
    element('h3', {}, element('span', { class: `method ${method}` }, method.toUpperCase()), ' ', path),
  )
  if (operation.summary) article.append(element('p', {}, operation.summary))
  if (operation.description && operation.description !== operation.summary) article.append(element('p', {}, operation.description))
  if (operation.security && operation.security.length) article.append(element('p', { class: 'muted' }, 'Needs a bearer credential (API key or JWT).'))
  if (operation.parameters?.length) article.append(element('h4', {}, 'Parameters'), parametersTable(doc, operation.parameters))
  if (operation.requestBody) {
    const body = operation.requestBody.$ref ? resolve(doc, operation.requestBody).schema : operation.requestBody
    article.append(element('h4', {}, 'Request body'), ...bodySchemas(doc, body.content))
  }
  const responses = Object.entries(operation.responses ?? {})
  if (responses.length) {
    article.append(element('h4', {}, 'Responses'))
    const list = element('ul', { class: 'schema' })
    for (const [status, raw] of responses) {
      const response = raw.$ref ? resolve(doc, raw).schema : raw
      list.append(element('li', {}, element('code', {}, status), ' ', response.description ?? '', ...bodySchemas(doc, response.content)))
    }
    article.append(list)
  }
  return article
}

function render(doc) {
  const main = document.getElementById('operations')
  const toc = document.getElementById('toc')
  main.replaceChildren()
  toc.replaceChildren()
  const byTag = new Map()
  for (const [path, item] of Object.entries(doc.paths ?? {})) {
    for (const method of METHODS) {
      const operation = item[method]
      if (!operation) continue
      const tag = operation.tags?.[0] ?? 'other'
      if (!byTag.has(tag)) byTag.set(tag, [])
      byTag.get(tag).push({ method, path, operation })
    }
  }
  const title = doc.info?.title ? `${doc.info.title} ${doc.info.version ?? ''}`.trim() : 'API'
  main.append(element('p', { class: 'muted' }, `${title}: ${[...byTag.values()].reduce((n, ops) => n + ops.length, 0)} operations.`))
  for (const [tag, operations] of byTag) {
    const section = element('section', { class: 'tag', 'aria-labelledby': `tag-${tag}` }, element('h2', { id: `tag-${tag}` }, tag))
    const links = element('ul')
    for (const { method, path, operation } of operations) {
      section.append(renderOperation(doc, method, path, operation))
      links.append(element('li', {}, element('a', { href: `#${operationId(method, path)}` }, `${method.toUpperCase()} ${path}`)))
    }
    main.append(section)
    toc.append(element('h2', {}, tag), links)
  }
}

function filter(words) {
  const wanted = words.trim().toLowerCase()
  for (const article of document.querySelectorAll('article.operation')) {
    article.hidden = wanted !== '' && !article.dataset.search.includes(wanted)
  }
  for (const section of document.querySelectorAll('section.tag')) {
    section.hidden = [...section.querySelectorAll('article.operation')].every((article) => article.hidden)
  }
}

async function start() {
  document.getElementById('filter').addEventListener('input', (event) => filter(event.target.value))
  try {
    const response = await fetch('/openapi.json')
    if (!response.ok) throw new Error(`the server answered ${response.status}`)
    render(await response.json())
    if (location.hash) document.getElementById(location.hash.slice(1))?.scrollIntoView()
  } catch (error) {
    document.getElementById('operations').replaceChildren(element('p', { role: 'alert' }, `Could not read /openapi.json: ${error.message}`))
  }
}

start()
