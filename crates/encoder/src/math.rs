//! The elementwise functions of the forward pass — GELU's error function and softmax's
//! exponential — as straight-line arithmetic the compiler turns into vector instructions.
//!
//! The scalar library functions (`libm::erff`, `f32::exp`) branch and call per element; a
//! text of 40 tokens through e5's 12 layers takes 740k error functions and 230k exponentials,
//! which cost as much as a third of the matrix products. Here each is a polynomial on a
//! reduced argument, within a few units in the last place of `f32` (1e-6 for the error function) over the range a BERT
//! layer produces, and the loops over a slice are compiled three times: for AVX-512, for AVX2
//! (chosen at run time when the CPU has them) and for the baseline.

/// `e^x` for `x` in about [-87, 88]; below that the result is 0 (it would be subnormal).
///
/// `x = n·ln 2 + r` with `|r| ≤ ln 2 / 2`, so `e^x = 2^n · e^r`; `e^r` is its Taylor series to
/// the 7th power (the next term is below 3e-9 of the result), `2^n` is written into the
/// exponent bits.
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    const LOG2_E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in a part exact in f32 and the rest, so `x - n·ln 2` loses nothing.
    const LN2_HIGH: f32 = 0.693_145_75;
    const LN2_LOW: f32 = 1.428_606_8e-6;
    // Adding then subtracting 1.5·2^23 rounds to the nearest integer without a call.
    const ROUND: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let shifted = x * LOG2_E + ROUND;
    let n = shifted - ROUND;
    let r = (x - n * LN2_HIGH) - n * LN2_LOW;
    let p = 1.0 / 5040.0;
    let p = p * r + 1.0 / 720.0;
    let p = p * r + 1.0 / 120.0;
    let p = p * r + 1.0 / 24.0;
    let p = p * r + 1.0 / 6.0;
    let p = p * r + 0.5;
    let p = p * r + 1.0;
    let p = p * r + 1.0;
    // `n` as an integer, without a float-to-integer conversion (Rust's saturating `as` does
    // not vectorise): `shifted` lies in [2^23, 2^24), where consecutive integers are
    // consecutive bit patterns, so its bits less ROUND's are `n`.
    let n_bits = shifted.to_bits().wrapping_sub(ROUND.to_bits());
    let scale = f32::from_bits(n_bits.wrapping_add(127) << 23);
    p * scale
}

/// The error function, within 1e-6 of the exact value: Abramowitz and Stegun's 7.1.26,
/// `erf(x) = 1 − t·(a1 + t·(a2 + …))·e^(−x²)` with `t = 1/(1 + p·|x|)`, sign restored.
#[inline(always)]
pub(crate) fn erf(x: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A: [f32; 5] = [
        0.254_829_6,
        -0.284_496_74,
        1.421_413_8,
        -1.453_152,
        1.061_405_4,
    ];
    let a = x.abs();
    let t = 1.0 / (1.0 + P * a);
    let poly = t * (A[0] + t * (A[1] + t * (A[2] + t * (A[3] + t * A[4]))));
    let y = 1.0 - poly * exp(-a * a);
    y.copysign(x)
}

/// BERT's GELU, `x·Φ(x) = x/2 · (1 + erf(x/√2))`.
#[inline(always)]
fn gelu(x: f32) -> f32 {
    0.5 * x * (1.0 + erf(x * std::f32::consts::FRAC_1_SQRT_2))
}

/// GELU's tanh approximation, `tanh(u) = 1 − 2/(e^(2u) + 1)`.
#[inline(always)]
fn gelu_tanh(x: f32) -> f32 {
    let u = 0.797_884_6 * (x + 0.044_715 * x * x * x);
    let tanh = 1.0 - 2.0 / (exp(2.0 * u) + 1.0);
    0.5 * x * (1.0 + tanh)
}

#[inline(always)]
fn gelu_body(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu(*v));
}

#[inline(always)]
fn gelu_tanh_body(x: &mut [f32]) {
    x.iter_mut().for_each(|v| *v = gelu_tanh(*v));
}

/// The sum of `f` over `values` in 16 running sums, added up at the end: the loop vectorises
/// (one running sum, the order Rust's `sum` keeps, is a chain of dependent scalar adds).
#[inline(always)]
pub(crate) fn lane_sum(values: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut lanes = [0.0f32; 16];
    let mut chunks = values.chunks_exact(16);
    for chunk in &mut chunks {
        lanes.iter_mut().zip(chunk).for_each(|(l, &v)| *l += f(v));
    }
    lanes.iter().sum::<f32>() + chunks.remainder().iter().map(|&v| f(v)).sum::<f32>()
}

/// `row = softmax(row)` for every row of `width` values in `scores`. The maximum and the sum
/// run in 16 lanes, so every loop vectorises (a row of a short text's attention is a few
/// dozen values: one call for all rows keeps the per-call work out of the loop).
#[inline(always)]
fn softmax_rows_body(scores: &mut [f32], width: usize) {
    for row in scores.chunks_exact_mut(width.max(1)) {
        let mut lanes = [f32::NEG_INFINITY; 16];
        let mut chunks = row.chunks_exact(16);
        for chunk in &mut chunks {
            lanes
                .iter_mut()
                .zip(chunk)
                .for_each(|(l, &s)| *l = l.max(s));
        }
        let max = chunks
            .remainder()
            .iter()
            .chain(&lanes)
            .fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        row.iter_mut().for_each(|s| *s = exp(*s - max));
        let inv = 1.0 / lane_sum(row, |s| s);
        row.iter_mut().for_each(|s| *s *= inv);
    }
}

vectorised!(pub(crate) gelu_in_place / gelu_in_place_on, gelu_body, (x: &mut [f32]));
vectorised!(pub(crate) gelu_tanh_in_place / gelu_tanh_in_place_on, gelu_tanh_body, (x: &mut [f32]));
vectorised!(pub(crate) softmax_rows / softmax_rows_on, softmax_rows_body, (scores: &mut [f32], width: usize));

#[cfg(test)]
mod tests {
    use super::*;

    fn grid(from: f32, to: f32, steps: usize) -> impl Iterator<Item = f32> {
        (0..=steps).map(move |i| from + (to - from) * i as f32 / steps as f32)
    }

    #[test]
    fn exp_is_within_a_few_ulps_of_the_library() {
        for x in grid(-87.0, 88.0, 200_000) {
            let (got, want) = (exp(x), x.exp());
            let rel = ((got - want) / want).abs();
            assert!(rel < 5e-7, "exp({x}) = {got}, library {want}");
        }
        assert_eq!(exp(0.0), 1.0);
        assert_eq!(exp(-1000.0), exp(-87.0));
    }

    #[test]
    fn erf_is_within_1e6_of_the_library() {
        for x in grid(-9.0, 9.0, 200_000) {
            let (got, want) = (erf(x), libm::erff(x));
            assert!(
                (got - want).abs() < 1e-6,
                "erf({x}) = {got}, library {want}"
            );
        }
        assert_eq!(erf(0.0), 0.0);
    }

    #[test]
    fn slices_match_the_scalar_definitions() {
        let mut x: Vec<f32> = grid(-12.0, 12.0, 4_099).collect();
        let want: Vec<f32> = x
            .iter()
            .map(|&v| 0.5 * v * (1.0 + libm::erff(v * std::f32::consts::FRAC_1_SQRT_2)))
            .collect();
        gelu_in_place(&mut x);
        for (g, w) in x.iter().zip(&want) {
            assert!((g - w).abs() < 3e-6 * w.abs().max(1.0), "{g} against {w}");
        }

        let mut t: Vec<f32> = grid(-12.0, 12.0, 4_099).collect();
        let want: Vec<f32> = t
            .iter()
            .map(|&v| 0.5 * v * (1.0 + (0.797_884_6 * (v + 0.044_715 * v * v * v)).tanh()))
            .collect();
        gelu_tanh_in_place(&mut t);
        for (g, w) in t.iter().zip(&want) {
            assert!((g - w).abs() < 3e-6 * w.abs().max(1.0), "{g} against {w}");
        }

        let scores: Vec<f32> = [3.0, -1.0, 0.5, 40.0, -200.0, 7.25, 0.0]
            .iter()
            .cycle()
            .take(37)
            .enumerate()
            .map(|(i, s)| s * 0.17 + i as f32 * 0.01)
            .collect();
        let max = scores.iter().fold(f32::NEG_INFINITY, |m, &s| m.max(s));
        let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
        let total: f32 = exps.iter().sum();
        // Two rows: the second is the first shifted by a constant (the same softmax).
        let mut rows = scores.clone();
        rows.extend(scores.iter().map(|s| s - 3.5));
        softmax_rows(&mut rows, scores.len());
        for row in rows.chunks_exact(scores.len()) {
            for (g, e) in row.iter().zip(&exps) {
                assert!((g - e / total).abs() < 1e-6, "{g} against {}", e / total);
            }
            assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        }
    }
}
