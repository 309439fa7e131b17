//! Pure ranking helper for hybrid retrieval: the time-decay factor applied to memories that
//! have not been accessed for a while. No I/O, no allocation.

const MS_PER_DAY: f64 = 86_400_000.0;

/// Multiplier in `[floor, 1.0]` that down-weights memories not accessed recently.
///
/// * `importance >= 4` never decays (1.0).
/// * Otherwise the factor halves every `half_life_days` of age
///   (`now_ms - last_access_ms`), but never drops below `floor`.
/// * A zero or negative age (clock skew, future timestamps) gives 1.0.
/// * `floor` is clamped into `[0, 1]` (NaN counts as 0); a non-positive or
///   NaN half-life means "decays instantly", i.e. any positive age yields `floor`.
pub(crate) fn decay_factor(
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
