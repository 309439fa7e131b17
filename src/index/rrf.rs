//! Pure ranking helpers for hybrid retrieval: reciprocal rank fusion of
//! several ranked id lists, and the time-decay factor applied to memories
//! that have not been accessed for a while. No I/O, no allocation beyond the
//! returned vectors.

use std::collections::HashMap;

use crate::store::MemoryId;

const MS_PER_DAY: f64 = 86_400_000.0;

/// Fuses ranked lists with reciprocal rank fusion (Cormack et al., 2009).
///
/// Each list contributes `1 / (k + rank)` to an id, with `rank` starting at 1.
/// An id repeated inside one list only counts at its best (first) rank. A
/// negative or NaN `k` is treated as 0. The result is sorted by descending
/// fused score; equal scores are ordered by ascending id so the output is
/// deterministic.
pub fn reciprocal_rank_fusion(lists: &[&[MemoryId]], k: f64) -> Vec<(MemoryId, f64)> {
    let k = if k.is_nan() { 0.0 } else { k.max(0.0) };
    let mut scores: HashMap<MemoryId, f64> = HashMap::new();
    for list in lists {
        let mut seen = std::collections::HashSet::with_capacity(list.len());
        for (position, id) in list.iter().enumerate() {
            if !seen.insert(*id) {
                continue;
            }
            let rank = position as f64 + 1.0;
            *scores.entry(*id).or_insert(0.0) += 1.0 / (k + rank);
        }
    }
    let mut fused: Vec<(MemoryId, f64)> = scores.into_iter().collect();
    fused.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    fused
}

/// Multiplier in `[floor, 1.0]` that down-weights memories not accessed recently.
///
/// * `importance >= 4` never decays (1.0).
/// * Otherwise the factor halves every `half_life_days` of age
///   (`now_ms - last_access_ms`), but never drops below `floor`.
/// * A zero or negative age (clock skew, future timestamps) gives 1.0.
/// * `floor` is clamped into `[0, 1]` (NaN counts as 0); a non-positive or
///   NaN half-life means "decays instantly", i.e. any positive age yields `floor`.
pub fn decay_factor(
    importance: u8,
    last_access_ms: i64,
    now_ms: i64,
    half_life_days: f64,
    floor: f64,
) -> f64 {
    if importance >= 4 {
        return 1.0;
    }
    let age_ms = i128::from(now_ms) - i128::from(last_access_ms);
    if age_ms <= 0 {
        return 1.0;
    }
    let floor = if floor.is_nan() {
        0.0
    } else {
        floor.clamp(0.0, 1.0)
    };
    if half_life_days.is_nan() || half_life_days <= 0.0 {
        return floor;
    }
    let age_days = age_ms as f64 / MS_PER_DAY;
    let factor = 0.5_f64.powf(age_days / half_life_days);
    factor.clamp(floor, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u128) -> MemoryId {
        MemoryId::from_uuid(uuid::Uuid::from_u128(n))
    }

    #[test]
    fn rrf_table() {
        let k = 60.0;
        let r = |rank: f64| 1.0 / (k + rank);
        struct Case {
            name: &'static str,
            lists: Vec<Vec<MemoryId>>,
            expected: Vec<(MemoryId, f64)>,
        }
        let cases = vec![
            Case {
                name: "no lists",
                lists: vec![],
                expected: vec![],
            },
            Case {
                name: "single list keeps order",
                lists: vec![vec![id(3), id(1), id(2)]],
                expected: vec![(id(3), r(1.0)), (id(1), r(2.0)), (id(2), r(3.0))],
            },
            Case {
                name: "item in both lists wins",
                lists: vec![vec![id(1), id(2)], vec![id(2), id(3)]],
                expected: vec![(id(2), r(2.0) + r(1.0)), (id(1), r(1.0)), (id(3), r(2.0))],
            },
            Case {
                name: "ties broken by ascending id",
                lists: vec![vec![id(9), id(5)], vec![id(5), id(9)]],
                expected: vec![(id(5), r(1.0) + r(2.0)), (id(9), r(1.0) + r(2.0))],
            },
            Case {
                name: "duplicate inside a list counts once at best rank",
                lists: vec![vec![id(1), id(1), id(2)]],
                expected: vec![(id(1), r(1.0)), (id(2), r(3.0))],
            },
            Case {
                name: "empty list contributes nothing",
                lists: vec![vec![], vec![id(4)]],
                expected: vec![(id(4), r(1.0))],
            },
        ];
        for case in cases {
            let slices: Vec<&[MemoryId]> = case.lists.iter().map(Vec::as_slice).collect();
            let got = reciprocal_rank_fusion(&slices, k);
            assert_eq!(got.len(), case.expected.len(), "{}", case.name);
            for ((gid, gs), (eid, es)) in got.iter().zip(&case.expected) {
                assert_eq!(gid, eid, "{}", case.name);
                assert!((gs - es).abs() < 1e-12, "{}: {gs} vs {es}", case.name);
            }
        }
    }

    #[test]
    fn rrf_negative_k_is_zero() {
        let lists: [&[MemoryId]; 1] = [&[id(1), id(2)]];
        let got = reciprocal_rank_fusion(&lists, -5.0);
        assert_eq!(got, vec![(id(1), 1.0), (id(2), 0.5)]);
        let got = reciprocal_rank_fusion(&lists, f64::NAN);
        assert_eq!(got, vec![(id(1), 1.0), (id(2), 0.5)]);
    }

    #[test]
    fn decay_table() {
        const DAY: i64 = 86_400_000;
        let now = 1_700_000_000_000_i64;
        // (importance, last_access, half_life_days, floor, expected)
        let cases: &[(u8, i64, f64, f64, f64)] = &[
            (4, now - 1000 * DAY, 30.0, 0.5, 1.0),
            (5, now - 1000 * DAY, 30.0, 0.0, 1.0),
            (3, now, 30.0, 0.5, 1.0),
            (3, now + DAY, 30.0, 0.5, 1.0),
            (3, now - 30 * DAY, 30.0, 0.0, 0.5),
            (3, now - 60 * DAY, 30.0, 0.0, 0.25),
            (3, now - 60 * DAY, 30.0, 0.5, 0.5),
            (
                1,
                now - 15 * DAY,
                30.0,
                0.0,
                std::f64::consts::FRAC_1_SQRT_2,
            ),
            (0, now - 10_000 * DAY, 30.0, 0.5, 0.5),
            (2, now - DAY, 0.0, 0.3, 0.3),
            (2, now - DAY, -1.0, 0.3, 0.3),
            (2, now - DAY, f64::NAN, 0.3, 0.3),
            (2, now - 30 * DAY, 30.0, 1.5, 1.0),
            (2, now - 30 * DAY, 30.0, -1.0, 0.5),
            (2, now - 30 * DAY, f64::INFINITY, 0.0, 1.0),
            (2, i64::MIN, 30.0, 0.5, 0.5),
        ];
        for &(importance, last, half_life, floor, expected) in cases {
            let got = decay_factor(importance, last, now, half_life, floor);
            assert!(
                (got - expected).abs() < 1e-9,
                "importance={importance} age_days={} half_life={half_life} floor={floor}: got {got}, want {expected}",
                (i128::from(now) - i128::from(last)) / i128::from(DAY),
            );
        }
    }
}
