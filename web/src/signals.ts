// A recall result's signals in words: how it was found, how likely it is about the question,
// and what moved it up or down. Ranking scores `rrf × decay × trust × prior` (src/memory/rank.rs),
// which recall weighs by the calibrated relevance; each factor that is not 1 is named here,
// with the number behind it.

import type { Signals } from './api'

export interface Explained {
  /** "by meaning (#2) and by its words (#1)". */
  found: string
  /** "very likely" … "unlikely", from the calibrated relevance; null when not measured. */
  relevance: string | null
  /** What changed its place, e.g. "said by the assistant, not by you (×0.90)". */
  changes: string[]
}

function rankOf(rank: number | null | undefined): number | null {
  return typeof rank === 'number' ? rank : null
}

export function relevanceLabel(relevance: number | null | undefined): string | null {
  if (typeof relevance !== 'number' || Number.isNaN(relevance)) return null
  if (relevance >= 0.8) return 'very likely about your question'
  if (relevance >= 0.5) return 'likely about your question'
  if (relevance >= 0.2) return 'possibly about your question'
  return 'unlikely to be about your question'
}

function times(factor: number): string {
  return `×${factor.toFixed(2)}`
}

export function explain(signals: Partial<Signals>): Explained {
  const ways: string[] = []
  const meaning = [rankOf(signals.vector_rank), rankOf(signals.context_vector_rank)].filter((r) => r !== null)
  const words = [rankOf(signals.bm25_rank), rankOf(signals.context_bm25_rank)].filter((r) => r !== null)
  if (meaning.length) ways.push(`by meaning (#${Math.min(...meaning)})`)
  if (words.length) ways.push(`by its words (#${Math.min(...words)})`)
  const changes: string[] = []
  const trust = signals.trust ?? 1
  if (trust !== 1) changes.push(`${trust < 1 ? 'lowered' : 'raised'}: not said by you (${times(trust)})`)
  const decay = signals.decay ?? 1
  if (decay !== 1) changes.push(`lowered: old and rarely used (${times(decay)})`)
  const prior = signals.prior ?? 1
  if (prior !== 1) {
    changes.push(
      `${prior > 1 ? 'raised' : 'lowered'}: ${prior > 1 ? 'matches the time or person you named' : 'a question or a short remark'} (${times(prior)})`,
    )
  }
  if (signals.later) changes.push('a later turn on the same topic may say something newer')
  return {
    found: ways.length ? `Found ${ways.join(' and ')}` : 'Found',
    relevance: relevanceLabel(signals.relevance),
    changes,
  }
}
