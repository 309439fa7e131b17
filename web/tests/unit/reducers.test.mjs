// Unit tests of the chat turn and research reducers (src/turn.ts, src/research.ts, compiled to
// .unit-build/ by `npm run test:unit`): repeats ignored, `run_resumed` dropping what the attempt
// cut short showed, rebuilding from a saved snapshot.
import { test } from 'node:test'
import assert from 'node:assert/strict'
import { applyChatEvent, newTurn, restoreSnapshot, snapshotOf } from '../../.unit-build/turn.js'
import { applyResearchEvent, newResearch, researchSnapshot, restoreResearch } from '../../.unit-build/research.js'

/** Events numbered from 1 in order, with the envelope the server adds. */
function numbered(runId, list, research = false) {
  return list.map(([type, data], index) => ({
    seq: index + 1,
    type,
    data: { run_id: runId, seq: index + 1, timestamp: '2025-01-01T00:00:00Z', type, ...(research ? { research_id: runId } : {}), ...data },
  }))
}

const RESUMED_CHAT = numbered('run-1', [
  ['session_start', { kind: 'chat', model: 'm1', thread_id: 't1', user_message_id: 'u1' }],
  ['memory_recalled', { query: 'cat', memories: [{ id: 'mem-1', kind: 'fact', content: 'The cat is Miso.' }] }],
  ['message_delta', { content: 'Your cat ' }],
  ['message_delta', { content: 'is called ' }],
  ['message_delta', { content: 'Mis' }],
  [
    'run_resumed',
    {
      attempt: 2,
      superseded_after: 0,
      resumed_from: null,
      content: 'The server executing this run stopped; attempt 2 starts it over.',
    },
  ],
  ['session_start', { kind: 'chat', model: 'm1', thread_id: 't1', user_message_id: 'u1' }],
  ['memory_recalled', { query: 'cat', memories: [{ id: 'mem-1', kind: 'fact', content: 'The cat is Miso.' }] }],
  ['message_delta', { content: 'It is ' }],
  ['message_delta', { content: 'Miso.' }],
  ['message_complete', { message_id: 'a1', usage: { prompt_tokens: 10, completion_tokens: 3, total_tokens: 13 } }],
  ['done', { status: 'completed' }],
])

test('chat: run_resumed with superseded_after 0 keeps only the second attempt', () => {
  const turn = newTurn('t1', 'local-1')
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  assert.equal(turn.text, 'It is Miso.')
  assert.equal(turn.status, 'completed')
  assert.equal(turn.messageId, 'a1')
  assert.equal(turn.userMessageId, 'u1')
  assert.equal(turn.runId, 'run-1')
  assert.deepEqual(
    turn.items.map((item) => [item.kind, item.seq]),
    [
      ['notice', 6],
      ['recalled', 8],
    ],
  )
  assert.equal(turn.items[0].attempt, 2)
  assert.match(turn.items[0].content, /attempt 2/)
  assert.deepEqual(
    turn.events.map((event) => event.seq),
    [6, 7, 8, 9, 10, 11, 12],
  )
  assert.equal(turn.lastSeq, 12)
})

test('chat: an event at or below the last applied one is ignored', () => {
  const turn = newTurn('t1', 'local-1')
  for (const event of RESUMED_CHAT.slice(0, 5)) applyChatEvent(turn, event)
  assert.equal(turn.text, 'Your cat is called Mis')
  // A replay overlapping what is shown (after a reconnect) changes nothing.
  for (const event of RESUMED_CHAT.slice(2, 5)) applyChatEvent(turn, event)
  assert.equal(turn.text, 'Your cat is called Mis')
  assert.equal(turn.items.length, 1)
  // Nor does the superseded part of the log read again after the resume.
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  assert.equal(turn.text, 'It is Miso.')
  assert.equal(turn.items.length, 2)
})

test('chat: events up to superseded_after stand, later ones of the cut attempt go', () => {
  const events = numbered('run-2', [
    ['session_start', { kind: 'chat', model: 'm1', user_message_id: 'u2' }],
    ['tool_call', { id: 'c1', name: 'search', arguments: { q: 'a' } }],
    ['tool_result', { id: 'c1', result: 'found', ok: true }],
    ['tool_call', { id: 'c2', name: 'search', arguments: { q: 'b' } }],
    ['message_delta', { content: 'partial' }],
    ['run_resumed', { attempt: 2, superseded_after: 3, resumed_from: 'tools', content: 'attempt 2' }],
    ['tool_call', { id: 'c3', name: 'search', arguments: { q: 'b' } }],
    ['tool_result', { id: 'c3', result: 'found too', ok: true }],
    ['message_delta', { content: 'whole' }],
    ['done', { status: 'completed' }],
  ])
  const turn = newTurn('t1', null)
  for (const event of events) applyChatEvent(turn, event)
  assert.equal(turn.text, 'whole')
  assert.deepEqual(
    turn.items.map((item) => [item.kind, item.seq, item.kind === 'tool' ? item.result : undefined]),
    [
      ['tool', 2, 'found'],
      ['notice', 6, undefined],
      ['tool', 7, 'found too'],
    ],
  )
  assert.equal(turn.model, 'm1', 'the session_start that stands still names the model')
})

test('chat: a reload rebuilds the turn from its saved events, and a later resume still drops the cut attempt', () => {
  const live = newTurn('t1', 'local-1')
  for (const event of RESUMED_CHAT.slice(0, 5)) applyChatEvent(live, event)
  const saved = JSON.parse(JSON.stringify(snapshotOf(live)))

  const turn = newTurn('t1', 'u1', 'run-1')
  assert.equal(restoreSnapshot(turn, saved), true)
  assert.equal(turn.text, 'Your cat is called Mis')
  assert.equal(turn.lastSeq, 5)
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  assert.equal(turn.text, 'It is Miso.')
  assert.equal(turn.items.filter((item) => item.kind === 'notice').length, 1)

  // An older page's snapshot (what was shown, not the events) is not used: the run is replayed.
  const old = newTurn('t1', 'u1', 'run-1')
  assert.equal(restoreSnapshot(old, { text: 'Your cat', items: [], errors: [] }), false)
  assert.equal(old.text, '')
  assert.equal(old.lastSeq, 0)
})

const RESUMED_RESEARCH = numbered(
  'res-1',
  [
    ['session_start', { kind: 'research', query: 'How do cats purr?', model: 'm1' }],
    ['stage_update', { stage: 'research_brief', content: 'Writing the brief' }],
    ['thinking', { stage: 'research_brief', content: 'Purring: the mechanism in the larynx.' }],
    [
      'sources_found',
      {
        content: '1 result',
        sources: [{ url: 'https://example.org/purr', title: 'Purring' }],
        metadata: { researcher: 1, topic: 'larynx' },
      },
    ],
    ['stage_update', { stage: 'final_report_generation', content: 'Writing the report' }],
    ['report_delta', { content: '# Draft\n' }],
    ['report_delta', { content: 'cut short' }],
    [
      'run_resumed',
      {
        attempt: 2,
        superseded_after: 4,
        resumed_from: 'researcher.1',
        content: 'The server executing this run stopped; attempt 2 goes on after researcher.1.',
      },
    ],
    ['stage_update', { stage: 'final_report_generation', content: 'Writing the report again' }],
    ['report_delta', { content: '# Purring\nThe larynx [1].' }],
    // The event carries the report as stored (what streamed, with its checks applied).
    ['research_complete', { content: '# Purring\nThe larynx [1].', metadata: { word_count: 3, sources: [{ n: 1, url: 'https://example.org/purr', title: 'Purring' }] } }],
    ['done', { status: 'completed' }],
  ],
  true,
)

test('research: the stored report of research_complete replaces the streamed one (unsupported citations marked)', () => {
  const state = newResearch('q')
  const events = numbered(
    'res-2',
    [
      ['session_start', { kind: 'research', query: 'q' }],
      ['report_delta', { content: 'Cats purr [1]. Dogs bark [2].' }],
      [
        'research_complete',
        {
          content: 'Cats purr [1]. Dogs bark [2: not found in the source].',
          metadata: { citations: { checked: 2, supported: 1, unsupported: [{ n: 2, claim: 'Dogs bark.' }] } },
        },
      ],
      ['done', { status: 'completed' }],
    ],
    true,
  )
  for (const event of events) applyResearchEvent(state, event)
  assert.equal(state.report, 'Cats purr [1]. Dogs bark [2: not found in the source].')
  assert.equal(state.complete.citations.checked, 2)
})

test('research: run_resumed drops the superseded report deltas and keeps the events up to superseded_after', () => {
  const state = newResearch('How do cats purr?')
  for (const event of RESUMED_RESEARCH) applyResearchEvent(state, event)
  assert.equal(state.report, '# Purring\nThe larynx [1].')
  assert.equal(state.status, 'completed')
  assert.equal(state.runId, 'res-1')
  // Kept: the brief, the researcher and its sources (counted once).
  assert.equal(state.brief, 'Purring: the mechanism in the larynx.')
  assert.deepEqual(state.found.map((source) => source.url), ['https://example.org/purr'])
  assert.equal(state.researchers.length, 1)
  assert.equal(state.researchers[0].sources, 1)
  assert.equal(state.stage, 'final_report_generation')
  assert.equal(state.stageNotes.final_report_generation, 'Writing the report again')
  assert.deepEqual(state.numbered.map((source) => source.n), [1])
  assert.equal(state.notices.length, 1)
  assert.equal(state.notices[0].attempt, 2)
  assert.equal(state.notices[0].resumedFrom, 'researcher.1')
  assert.deepEqual(
    state.log.map((line) => line.seq),
    [2, 3, 4, 8, 9],
  )
  assert.deepEqual(
    state.events.map((event) => event.seq),
    [1, 2, 3, 4, 8, 9, 10, 11, 12],
  )
})

test('research: a second resume keeps the first one when it stands', () => {
  const more = [
    ...RESUMED_RESEARCH.slice(0, 10),
    {
      seq: 11,
      type: 'report_delta',
      data: { content: ' More that is cut.' },
    },
    { seq: 12, type: 'run_resumed', data: { attempt: 3, superseded_after: 10, resumed_from: 'report.part', content: 'attempt 3' } },
    { seq: 13, type: 'report_delta', data: { content: ' More.' } },
    { seq: 14, type: 'done', data: { status: 'completed' } },
  ]
  const state = newResearch('How do cats purr?')
  for (const event of more) applyResearchEvent(state, event)
  assert.equal(state.report, '# Purring\nThe larynx [1]. More.')
  assert.deepEqual(
    state.notices.map((notice) => notice.attempt),
    [2, 3],
  )
})

test('research: a reload rebuilds from the saved events; a plan answered before is not asked again', () => {
  const events = numbered(
    'res-2',
    [
      ['session_start', { kind: 'research', query: 'Q' }],
      ['plan_review', { stage: 'research_execution', content: '1. a', metadata: { topics: ['a'], awaiting_input: true } }],
      ['thinking', { stage: 'research_execution', content: 'Researcher 1 started: a', metadata: { researcher: 1, topic: 'a' } }],
      ['report_delta', { content: 'cut' }],
      ['run_resumed', { attempt: 2, superseded_after: 3, resumed_from: 'researcher.1', content: 'attempt 2' }],
    ],
    true,
  )
  const live = newResearch('Q')
  for (const event of events.slice(0, 4)) applyResearchEvent(live, event)
  assert.equal(live.planReview, null)
  const saved = JSON.parse(JSON.stringify(researchSnapshot(live)))
  const state = newResearch('', 'res-2')
  assert.equal(restoreResearch(state, saved), true)
  assert.equal(state.query, 'Q')
  assert.equal(state.report, 'cut')
  assert.equal(state.lastSeq, 4)
  applyResearchEvent(state, events[4])
  assert.equal(state.report, '')
  assert.equal(state.planReview, null)
  assert.equal(state.researchers.length, 1)
  assert.equal(restoreResearch(newResearch('', 'res-2'), { report: 'old', stage: 'x' }), false)
})
