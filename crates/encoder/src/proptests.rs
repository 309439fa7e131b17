//! Property tests: every kernel of the crate against a plain scalar reference written here
//! (loops in `f64`), over random shapes — one row, a few, row counts that are not multiples of
//! the kernels' tiles, tall and skinny, wide — and random values, some with a few channels fifty
//! times larger than the rest (as BERT's hidden states have).
//!
//! Each tolerance is a bound derived from the arithmetic, not a number that happened to pass:
//! an `f32` sum of `k` terms is within `k·ε/2` of the exact sum relative to the sum of the
//! terms' magnitudes (ε = `f32::EPSILON`); an 8-bit value is within half its quantisation step;
//! a bfloat16 value (8 significant bits) within a relative `2⁻⁸`.
//!
//! A kernel this CPU cannot run is marked ignored (with the instructions it needs) by the
//! `cpu_*` flags `build.rs` sets from the CPU, so the test list shows it as not run, never as
//! passed; each test asserts the CPU runs it before it starts, so a target directory carried
//! to another CPU fails instead of executing instructions the CPU lacks.

use proptest::prelude::*;

use crate::amx::Bf16Dense;
use crate::int8::{Kernel, QuantDense, Quantised};
use crate::math::{gelu_in_place_on, gelu_tanh_in_place_on, softmax_rows_on};
use crate::packed::Q4Matrix;
use crate::{Isa, Norm, layer_norm_rows_on, matmul_accumulate};

const EPS: f64 = f32::EPSILON as f64;

/// A xorshift64* stream of pseudo-random numbers from `seed`.
fn stream(seed: u64) -> impl FnMut() -> u64 {
    let mut state = seed | 1;
    move || {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Random values from a seed: uniform in [-scale, scale), and, when `spike > 0`, every
/// `spike`-th value 50 times larger. (Drawn from a seed, not by proptest one by one: shrinking
/// then works on the shape, and a case of 100,000 values costs nothing to make.)
fn values(len: usize, seed: u64, scale: f32, spike: usize) -> Vec<f32> {
    let mut next = stream(seed);
    (0..len)
        .map(|i| {
            let unit = (next() >> 40) as f32 / (1 << 24) as f32;
            let v = (2.0 * unit - 1.0) * scale;
            if spike > 0 && i % spike == 0 {
                v * 50.0
            } else {
                v
            }
        })
        .collect()
}

/// A product's case: `x` (`m × k`), `w` (`k × n`), `bias` (`n`).
struct Product {
    m: usize,
    k: usize,
    n: usize,
    x: Vec<f32>,
    w: Vec<f32>,
    bias: Vec<f32>,
}

impl Product {
    fn new(m: usize, k: usize, n: usize, seed: u64, scale: f32, spike: usize) -> Self {
        Self {
            m,
            k,
            n,
            x: values(m * k, seed, scale, spike),
            w: values(k * n, seed ^ 0x9e37_79b9, 1.0, 0),
            bias: values(n, seed ^ 0x7f4a_7c15, 1.0, 0),
        }
    }

    /// `bias + x · w` in plain loops in `f64`, and for every output the sum of its terms'
    /// magnitudes (`|bias| + Σ|x·w|`), which rounding errors are bounded against.
    fn reference(&self) -> (Vec<f64>, Vec<f64>) {
        let (m, k, n) = (self.m, self.k, self.n);
        let mut want = vec![0.0f64; m * n];
        let mut size = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                let mut sum = f64::from(self.bias[j]);
                let mut magnitude = f64::from(self.bias[j]).abs();
                for p in 0..k {
                    let term = f64::from(self.x[i * k + p]) * f64::from(self.w[p * n + j]);
                    sum += term;
                    magnitude += term.abs();
                }
                want[i * n + j] = sum;
                size[i * n + j] = magnitude;
            }
        }
        (want, size)
    }

    /// The bias in every row, which the kernels accumulate onto.
    fn start(&self) -> Vec<f32> {
        (0..self.m)
            .flat_map(|_| self.bias.iter().copied())
            .collect()
    }

    /// Runs `accumulate(x, out)` on a pool of two threads, onto the bias.
    fn run(&self, accumulate: impl FnOnce(&[f32], &mut [f32]) + Send) -> Vec<f32> {
        let mut out = self.start();
        pool().install(|| accumulate(&self.x, &mut out));
        out
    }
}

fn pool() -> &'static rayon::ThreadPool {
    static POOL: std::sync::OnceLock<rayon::ThreadPool> = std::sync::OnceLock::new();
    POOL.get_or_init(|| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .expect("a pool of two threads")
    })
}

/// (rows, inputs, outputs) of the shapes the integer and tile kernels take — inputs and
/// outputs multiples of 32 —: one row; a few (mostly not a multiple of the integer kernel's
/// 6-row tiles or the tiles' 32-row blocks); tall and skinny; short and wide.
fn kernel_shapes() -> impl Strategy<Value = (usize, usize, usize)> {
    prop_oneof![
        (Just(1usize), 1usize..=48, 1usize..=24),
        (2usize..=70, 1usize..=24, 1usize..=12),
        (100usize..=260, 1usize..=2, 1usize..=2),
        (1usize..=4, 1usize..=4, 20usize..=48),
    ]
    .prop_map(|(m, k_blocks, n_blocks)| (m, 32 * k_blocks, 32 * n_blocks))
}

/// Input scales: small, unit, large; and how often a large channel comes (0: never).
fn inputs() -> impl Strategy<Value = (u64, f32, usize)> {
    (
        any::<u64>(),
        prop_oneof![Just(0.01f32), Just(1.0), Just(30.0)],
        prop_oneof![Just(0usize), 3usize..40],
    )
}

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // A failure prints its case; nothing is written into the source tree.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// The integer kernel `kernel` against the reference. The bound per output, from the
/// quantisation: a weight is off by at most half its column's step (`s_c / 2`, `s_c` = the
/// column's largest magnitude / 127), an input by at most half its block's step (`s_b / 2`,
/// the block of 32 values of its row), so a term `x·w` is off by at most
/// `s_b/2 · |w| + (|x| + s_b/2) · s_c/2`, summed over the inputs. The `f32` steps around the
/// exact integer sums add a rounding of each block's sum (the VNNI kernel's sums carry the
/// weights' `+128`, up to `256 · s_c · Σ|x|` before the offset is taken off) and of the
/// result.
fn check_int8(kernel: Kernel, case: &Product, parallel: bool) -> Result<(), TestCaseError> {
    prop_assert!(kernel.runs_here(), "this CPU lacks the {kernel:?} kernel");
    let (m, k, n) = (case.m, case.k, case.n);
    let layer = QuantDense::for_kernel(&case.w, k, n, kernel);
    let Some(layer) = layer else {
        return Err(TestCaseError::fail(format!("{k}×{n} refused")));
    };
    let mut scratch = Quantised::default();
    let got = case.run(|x, out| layer.accumulate(x, out, m, &mut scratch, parallel));
    let (want, size) = case.reference();
    let column_step: Vec<f64> = (0..n)
        .map(|j| {
            (0..k)
                .map(|p| f64::from(case.w[p * n + j]).abs())
                .fold(0.0, f64::max)
                / 127.0
        })
        .collect();
    let blocks = k / 32;
    for i in 0..m {
        let row = &case.x[i * k..(i + 1) * k];
        let block_step: Vec<f64> = row
            .chunks(32)
            .map(|b| b.iter().map(|v| f64::from(*v).abs()).fold(0.0, f64::max) / 127.0)
            .collect();
        let row_size: f64 = row.iter().map(|v| f64::from(*v).abs()).sum();
        for (j, &s_c) in column_step.iter().enumerate() {
            let mut bound = 0.0;
            for p in 0..k {
                let (x, w, s_b) = (
                    f64::from(row[p]).abs(),
                    f64::from(case.w[p * n + j]).abs(),
                    block_step[p / 32],
                );
                bound += s_b / 2.0 * w + (x + s_b / 2.0) * s_c / 2.0;
            }
            let at = i * n + j;
            let rounding = (blocks as f64 + 4.0) * EPS * 256.0 * s_c * row_size
                + 4.0 * EPS * (size[at] + bound);
            let error = (f64::from(got[at]) - want[at]).abs();
            prop_assert!(
                error <= bound * (1.0 + 1e-5) + rounding,
                "{kernel:?} {m}×{k}×{n} (parallel {parallel}) row {i} column {j}: {} against \
                 {}, off by {error}, bound {bound} + {rounding}",
                got[at],
                want[at]
            );
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    #[cfg_attr(not(cpu_vnni), ignore = "needs AVX-512 VNNI (x86 avx512f, bw, dq, vnni)")]
    fn int8_vnni_products_match_the_scalar_reference(
        (m, k, n) in kernel_shapes(),
        (seed, scale, spike) in inputs(),
        parallel in any::<bool>(),
    ) {
        check_int8(Kernel::Vnni, &Product::new(m, k, n, seed, scale, spike), parallel)?;
    }

    #[test]
    #[cfg_attr(not(cpu_avx2), ignore = "needs AVX2 with FMA (x86 avx2, fma)")]
    fn int8_avx2_products_match_the_scalar_reference(
        (m, k, n) in kernel_shapes(),
        (seed, scale, spike) in inputs(),
        parallel in any::<bool>(),
    ) {
        check_int8(Kernel::Avx2, &Product::new(m, k, n, seed, scale, spike), parallel)?;
    }

    /// Bfloat16 on AMX tiles. Each factor is rounded to nearest with 8 significant bits (the
    /// leading one and seven stored), a relative `2⁻⁸` at most, so a term `x·w` is off by at
    /// most `(2⁻⁷ + 2⁻¹⁶)·|x·w|`; the products of two bfloat16 values are exact in `f32`, and
    /// their sums round as any `f32` sum of `k` terms. (The bound once said `2⁻⁹` per factor,
    /// which passed on CPUs without AMX only because the test did not run there; on a Xeon with
    /// AMX the tiles matched an exact emulation of bfloat16 products to the last bit and still
    /// exceeded that bound.)
    #[test]
    #[cfg_attr(not(cpu_amx), ignore = "needs AMX tiles (x86 amx-tile, amx-bf16)")]
    fn bf16_tile_products_match_the_scalar_reference(
        (m, k, n) in kernel_shapes(),
        (seed, scale, spike) in inputs(),
        parallel in any::<bool>(),
    ) {
        prop_assert!(crate::amx::supported(), "this CPU has AMX but Linux did not grant the tile state");
        let case = Product::new(m, k, n, seed, scale, spike);
        let layer = Bf16Dense::new(&case.w, k, n);
        let Some(layer) = layer else {
            return Err(TestCaseError::fail(format!("{k}×{n} refused")));
        };
        let got = case.run(|x, out| layer.accumulate(x, out, m, &mut Vec::new(), parallel));
        let (want, size) = case.reference();
        let relative = 2f64.powi(-7) + 2f64.powi(-16) + (k as f64 + 4.0) * EPS;
        for (at, (got, (want, size))) in got.iter().zip(want.iter().zip(&size)).enumerate() {
            let error = (f64::from(*got) - want).abs();
            prop_assert!(
                error <= relative * size,
                "{m}×{k}×{n} (parallel {parallel}) output {at}: {got} against {want}, off by {error}"
            );
        }
    }

    /// The `f32` products on `gemm`, any shape, on one thread or two: within the bound of an
    /// `f32` sum of `k + 1` terms (`(k + 2)·ε/2` relative to the terms' magnitudes, doubled
    /// for the fused multiply-adds' and the blocked sums' order).
    #[test]
    fn f32_products_match_the_scalar_reference(
        m in 1usize..=90,
        k in 1usize..=300,
        n in 1usize..=130,
        (seed, scale, spike) in inputs(),
        threads in 1usize..=2,
    ) {
        let case = Product::new(m, k, n, seed, scale, spike);
        let (x, w) = (&case.x, &case.w);
        let got = case.run(|_, out| matmul_accumulate(out, x, w, m, k, n, threads));
        let (want, size) = case.reference();
        for (at, (got, (want, size))) in got.iter().zip(want.iter().zip(&size)).enumerate() {
            let error = (f64::from(*got) - want).abs();
            prop_assert!(
                error <= (k as f64 + 2.0) * EPS * size,
                "{m}×{k}×{n} on {threads}: output {at} {got} against {want}, off by {error}"
            );
        }
    }

    /// Shapes the integer kernel cannot take are refused (the layer then stays in `f32`),
    /// and only those. Packing runs no kernel instruction, so this runs on every CPU.
    #[test]
    fn int8_takes_exactly_the_shapes_its_tiles_fit(k in 1usize..=200, n in 1usize..=200) {
        let w = values(k * n, 1, 1.0, 0);
        for kernel in [Kernel::Vnni, Kernel::Avx2] {
            let fits = k % 32 == 0 && n % 32 == 0;
            prop_assert_eq!(QuantDense::for_kernel(&w, k, n, kernel).is_some(), fits);
        }
    }

    /// A packed 4-bit row expands to `(nibble − 8) · d`, the low nibbles being the block's
    /// first 16 weights: exactly (a 4-bit integer times a half-precision scale is exact in
    /// `f32`), with the scale decoded by the `half` crate as the reference.
    #[test]
    fn packed_rows_expand_as_the_format_says(
        rows in 1usize..=6,
        blocks in 1usize..=12,
        seed in any::<u64>(),
        scales in proptest::collection::vec(any::<u16>(), 72),
    ) {
        let cols = 32 * blocks;
        let mut next = stream(seed);
        let nibbles: Vec<u8> = (0..rows * blocks * 16).map(|_| (next() >> 56) as u8).collect();
        let mut bytes = Vec::new();
        let mut want = Vec::new();
        for (b, block) in nibbles.chunks(16).enumerate() {
            // Any finite half-precision scale: subnormals, zero, the largest.
            let mut d = scales[b % scales.len()];
            if !half::f16::from_bits(d).is_finite() {
                d &= 0x83ff;
            }
            bytes.extend(d.to_le_bytes());
            bytes.extend(block);
            let scale = half::f16::from_bits(d).to_f32();
            let mut weights = [0.0f32; 32];
            for (j, byte) in block.iter().enumerate() {
                weights[j] = (f32::from(byte & 0x0f) - 8.0) * scale;
                weights[j + 16] = (f32::from(byte >> 4) - 8.0) * scale;
            }
            want.extend(weights);
        }
        let matrix = Q4Matrix::from_bytes(bytes, cols);
        prop_assert_eq!(&matrix.expand(), &want);
        let mut row = vec![0.0f32; cols];
        for r in 0..rows {
            matrix.row_into(r, &mut row);
            prop_assert_eq!(&row[..], &want[r * cols..(r + 1) * cols]);
        }
    }
}

/// The elementwise work compiled for `isa` against the scalar definitions in `f64`:
///
/// - GELU (`x/2 · (1 + erf(x/√2))`): the polynomial error function is within 1e-6 of the
///   exact one (`math.rs`' test over a fine grid), which moves GELU by `|x|/2 · 1e-6`, plus a
///   few roundings of the result; its tanh form as well: `tanh u = 1 − 2/(e^(2u) + 1)` is off
///   by half the exponential's relative 5e-7 at most, plus `u`'s rounding through
///   `tanh' · u ≤ 0.45` and a few ε — below 1e-6;
/// - softmax: the polynomial exponential is within a relative 5e-7, so each probability is
///   within a relative 1e-6 after the normalisation's roundings, plus the `f32` sum of the row
///   (`width · ε` relative);
/// - layer norm: the mean and the variance are `f32` sums of `width` terms, off by
///   `width · ε` relative to the row's magnitudes; divided by the standard deviation that is
///   `(width + 4) · ε · (M / σ)²` of a normalised value (`M` the row's largest magnitude, `σ`
///   its standard deviation), times the weight, plus the roundings of the result.
fn check_elementwise(
    isa: Isa,
    width: usize,
    rows: usize,
    seed: u64,
    scale: f32,
) -> Result<(), TestCaseError> {
    prop_assert!(isa.runs_here(), "this CPU lacks {isa:?}");
    let x = values(width * rows, seed, scale, 0);

    let mut gelu = x.clone();
    gelu_in_place_on(isa, &mut gelu);
    let mut tanh = x.clone();
    gelu_tanh_in_place_on(isa, &mut tanh);
    for ((&v, &g), &t) in x.iter().zip(&gelu).zip(&tanh) {
        let v64 = f64::from(v);
        let want = 0.5 * v64 * (1.0 + libm::erf(v64 * std::f64::consts::FRAC_1_SQRT_2));
        let bound = v64.abs() / 2.0 * 1e-6 + 4.0 * EPS * (want.abs() + v64.abs());
        prop_assert!(
            (f64::from(g) - want).abs() <= bound,
            "{isa:?} gelu({v}) = {g}, exact {want}"
        );
        let u = 0.797_884_6 * (v64 + 0.044_715 * v64 * v64 * v64);
        let want = 0.5 * v64 * (1.0 + u.tanh());
        let bound = v64.abs() / 2.0 * 1e-6 + 4.0 * EPS * (want.abs() + v64.abs());
        prop_assert!(
            (f64::from(t) - want).abs() <= bound,
            "{isa:?} gelu_tanh({v}) = {t}, exact {want}"
        );
    }

    let mut scores = x.clone();
    softmax_rows_on(isa, &mut scores, width);
    for (row, got) in x.chunks(width).zip(scores.chunks(width)) {
        let max = row
            .iter()
            .fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let exps: Vec<f64> = row.iter().map(|&v| (f64::from(v) - max).exp()).collect();
        let total: f64 = exps.iter().sum();
        for (e, &g) in exps.iter().zip(got) {
            let want = e / total;
            // Scores 87 below the row's largest come out as e^-87 (≈ 1.6e-38), not smaller.
            let bound = want * (1e-6 + (width as f64 + 4.0) * EPS) + 1e-37;
            prop_assert!(
                (f64::from(g) - want).abs() <= bound,
                "{isa:?} softmax of width {width}: {g} against {want}"
            );
        }
    }

    let residual = values(width * rows, seed ^ 0x5555, scale, 0);
    let norm = Norm {
        weight: values(width, seed ^ 0x1234, 2.0, 0),
        bias: values(width, seed ^ 0x4321, 1.0, 0),
    };
    let eps = 1e-12f32;
    let mut normed = x.clone();
    layer_norm_rows_on(isa, &mut normed, Some(&residual[..]), &norm, width, eps);
    for ((row, add), got) in x
        .chunks(width)
        .zip(residual.chunks(width))
        .zip(normed.chunks(width))
    {
        let summed: Vec<f64> = row
            .iter()
            .zip(add)
            // The residual is added in f32, as the pass does, before normalising.
            .map(|(&a, &b)| f64::from(a + b))
            .collect();
        let mean = summed.iter().sum::<f64>() / width as f64;
        let variance = summed.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / width as f64;
        let sd = (variance + f64::from(eps)).sqrt();
        let largest = summed.iter().fold(0.0f64, |m, v| m.max(v.abs()));
        let conditioning = (largest / sd).powi(2).max(1.0);
        for (c, (&v, &g)) in summed.iter().zip(got).enumerate() {
            let (w, b) = (f64::from(norm.weight[c]), f64::from(norm.bias[c]));
            let z = (v - mean) / sd;
            let want = z * w + b;
            let bound =
                w.abs() * (width as f64 + 4.0) * 4.0 * EPS * conditioning * z.abs().max(1.0)
                    + 4.0 * EPS * (want.abs() + b.abs());
            prop_assert!(
                (f64::from(g) - want).abs() <= bound,
                "{isa:?} layer norm of width {width}, column {c}: {g} against {want}"
            );
        }
    }
    Ok(())
}

/// Row widths of every size up to a few vector lengths past 16 lanes, and BERT's.
fn widths() -> impl Strategy<Value = usize> {
    prop_oneof![1usize..=70, Just(384usize), Just(768usize)]
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    #[cfg_attr(not(cpu_avx512), ignore = "needs AVX-512 (x86 avx512f, bw, dq, vl, fma)")]
    fn elementwise_avx512_matches_the_scalar_reference(
        width in widths(),
        rows in 1usize..=5,
        seed in any::<u64>(),
        scale in prop_oneof![Just(0.1f32), Just(3.0), Just(12.0)],
    ) {
        check_elementwise(Isa::Avx512, width, rows, seed, scale)?;
    }

    #[test]
    #[cfg_attr(not(cpu_avx2), ignore = "needs AVX2 with FMA (x86 avx2, fma)")]
    fn elementwise_avx2_matches_the_scalar_reference(
        width in widths(),
        rows in 1usize..=5,
        seed in any::<u64>(),
        scale in prop_oneof![Just(0.1f32), Just(3.0), Just(12.0)],
    ) {
        check_elementwise(Isa::Avx2, width, rows, seed, scale)?;
    }

    #[test]
    fn elementwise_baseline_matches_the_scalar_reference(
        width in widths(),
        rows in 1usize..=5,
        seed in any::<u64>(),
        scale in prop_oneof![Just(0.1f32), Just(3.0), Just(12.0)],
    ) {
        check_elementwise(Isa::Baseline, width, rows, seed, scale)?;
    }
}
