// Unit tests of the chat turn and research reducers (src/turn.ts, src/research.ts): repeats
// ignored, `run_resumed` dropping what the attempt cut short showed, rebuilding from a saved
// snapshot.
import { assert, expect, test } from 'vitest'
import { applyResearchEvent, newResearch, researchSnapshot, restoreResearch } from '../../src/research'
import type { RunEvent } from '../../src/runstream'
import { applyChatEvent, newTurn, restoreSnapshot, snapshotOf } from '../../src/turn'

/** Events numbered from 1 in order, with the envelope the server adds. */
function numbered(runId: string, list: [type: string, data: Record<string, unknown>][], research = false): RunEvent[] {
  // Fixtures written as the server sends them; the reducers trust that shape as the page does.
  return list.map(([type, data], index) => ({
    seq: index + 1,
    type,
    data: { run_id: runId, seq: index + 1, timestamp: '2025-01-01T00:00:00Z', type, ...(research ? { research_id: runId } : {}), ...data },
  })) as RunEvent[]
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
  expect(turn.text).toBe('It is Miso.')
  expect(turn.status).toBe('completed')
  expect(turn.messageId).toBe('a1')
  expect(turn.userMessageId).toBe('u1')
  expect(turn.runId).toBe('run-1')
  expect(turn.items.map((item) => [item.kind, item.seq])).toStrictEqual([
    ['notice', 6],
    ['recalled', 8],
  ])
  const notice = turn.items[0]
  assert(notice.kind === 'notice')
  expect(notice.attempt).toBe(2)
  expect(notice.content).toMatch(/attempt 2/)
  expect(turn.events.map((event) => event.seq)).toStrictEqual([6, 7, 8, 9, 10, 11, 12])
  expect(turn.lastSeq).toBe(12)
})

test('chat: an event at or below the last applied one is ignored', () => {
  const turn = newTurn('t1', 'local-1')
  for (const event of RESUMED_CHAT.slice(0, 5)) applyChatEvent(turn, event)
  expect(turn.text).toBe('Your cat is called Mis')
  // A replay overlapping what is shown (after a reconnect) changes nothing.
  for (const event of RESUMED_CHAT.slice(2, 5)) applyChatEvent(turn, event)
  expect(turn.text).toBe('Your cat is called Mis')
  expect(turn.items.length).toBe(1)
  // Nor does the superseded part of the log read again after the resume.
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  expect(turn.text).toBe('It is Miso.')
  expect(turn.items.length).toBe(2)
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
  expect(turn.text).toBe('whole')
  expect(turn.items.map((item) => [item.kind, item.seq, item.kind === 'tool' ? item.result : undefined])).toStrictEqual([
    ['tool', 2, 'found'],
    ['notice', 6, undefined],
    ['tool', 7, 'found too'],
  ])
  expect(turn.model, 'the session_start that stands still names the model').toBe('m1')
})

test('chat: a reload rebuilds the turn from its saved events, and a later resume still drops the cut attempt', () => {
  const live = newTurn('t1', 'local-1')
  for (const event of RESUMED_CHAT.slice(0, 5)) applyChatEvent(live, event)
  const saved = JSON.parse(JSON.stringify(snapshotOf(live)))

  const turn = newTurn('t1', 'u1', 'run-1')
  expect(restoreSnapshot(turn, saved)).toBe(true)
  expect(turn.text).toBe('Your cat is called Mis')
  expect(turn.lastSeq).toBe(5)
  for (const event of RESUMED_CHAT) applyChatEvent(turn, event)
  expect(turn.text).toBe('It is Miso.')
  expect(turn.items.filter((item) => item.kind === 'notice').length).toBe(1)

  // An older page's snapshot (what was shown, not the events) is not used: the run is replayed.
  const old = newTurn('t1', 'u1', 'run-1')
  expect(restoreSnapshot(old, { text: 'Your cat', items: [], errors: [] })).toBe(false)
  expect(old.text).toBe('')
  expect(old.lastSeq).toBe(0)
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
    [
      'research_complete',
      {
        content: '# Purring\nThe larynx [1].',
        metadata: { word_count: 3, sources: [{ n: 1, url: 'https://example.org/purr', title: 'Purring' }] },
      },
    ],
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
  expect(state.report).toBe('Cats purr [1]. Dogs bark [2: not found in the source].')
  expect(state.complete?.citations.checked).toBe(2)
})

test('research: run_resumed drops the superseded report deltas and keeps the events up to superseded_after', () => {
  const state = newResearch('How do cats purr?')
  for (const event of RESUMED_RESEARCH) applyResearchEvent(state, event)
  expect(state.report).toBe('# Purring\nThe larynx [1].')
  expect(state.status).toBe('completed')
  expect(state.runId).toBe('res-1')
  // Kept: the brief, the researcher and its sources (counted once).
  expect(state.brief).toBe('Purring: the mechanism in the larynx.')
  expect(state.found.map((source) => source.url)).toStrictEqual(['https://example.org/purr'])
  expect(state.researchers.length).toBe(1)
  expect(state.researchers[0].sources).toBe(1)
  expect(state.stage).toBe('final_report_generation')
  expect(state.stageNotes.final_report_generation).toBe('Writing the report again')
  expect(state.numbered.map((source) => source.n)).toStrictEqual([1])
  expect(state.notices.length).toBe(1)
  expect(state.notices[0].attempt).toBe(2)
  expect(state.notices[0].resumedFrom).toBe('researcher.1')
  expect(state.log.map((line) => line.seq)).toStrictEqual([2, 3, 4, 8, 9])
  expect(state.events.map((event) => event.seq)).toStrictEqual([1, 2, 3, 4, 8, 9, 10, 11, 12])
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
  ] as RunEvent[]
  const state = newResearch('How do cats purr?')
  for (const event of more) applyResearchEvent(state, event)
  expect(state.report).toBe('# Purring\nThe larynx [1]. More.')
  expect(state.notices.map((notice) => notice.attempt)).toStrictEqual([2, 3])
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
  expect(live.planReview).toBe(null)
  const saved = JSON.parse(JSON.stringify(researchSnapshot(live)))
  const state = newResearch('', 'res-2')
  expect(restoreResearch(state, saved)).toBe(true)
  expect(state.query).toBe('Q')
  expect(state.report).toBe('cut')
  expect(state.lastSeq).toBe(4)
  applyResearchEvent(state, events[4])
  expect(state.report).toBe('')
  expect(state.planReview).toBe(null)
  expect(state.researchers.length).toBe(1)
  expect(restoreResearch(newResearch('', 'res-2'), { report: 'old', stage: 'x' })).toBe(false)
})
