//! The one percentile every measurement prints (`mnemo bench …`, `mnemo eval`'s latencies,
//! `cargo bench --bench load`, which includes this file by path).

/// The nearest-rank percentile at fraction `p` (0–1) of ascending `sorted`: the smallest
/// element with at least `p` of the elements at or below it; 0 when empty.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = (p.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    #[test]
    fn percentiles_pick_an_element() {
        use super::percentile;
        assert_eq!(percentile(&[], 0.5), 0.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.5), 2.0);
        assert_eq!(percentile(&[1.0, 2.0, 3.0, 4.0], 0.99), 4.0);
        assert_eq!(percentile(&[7.0], 0.95), 7.0);
    }
}
