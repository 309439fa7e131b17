//! Matrix products in 8-bit integers, for CPUs with AVX-512 VNNI or AVX2.
//!
//! One `vpdpbusd` (AVX-512 VNNI) multiplies 64 pairs of bytes and adds them four by four into
//! 16 integer sums, at the issue rate of one 16-wide `f32` fused multiply-add: four times the
//! products a cycle. CPUs with AVX2 only get the same sums from four instructions per 32
//! byte pairs (`vpsignb`, `vpmaddubsw`, `vpmaddwd`, `vpaddd`; see [`kernel_rows_avx2`]): a
//! quarter of the bytes to read, which bounds one text's forward pass (up to twice as fast),
//! but no more products a cycle than `f32` multiply-adds (batches run 25–30 % slower).
//!
//! - Weights are quantised once, at load, per output column: `w ≈ s_c · q` with `q` in
//!   [−127, 127], stored as the unsigned byte `q + 128` (`vpdpbusd` multiplies unsigned by
//!   signed bytes). (multilingual-e5's weights are 4-bit already: a column's 4-bit values
//!   fit 8 bits with room to spare.)
//! - Each product's input is quantised when the product runs, per row (token) and block of
//!   32 values: `x ≈ s_rb · p` with `p` in [−127, 127]. Blocks, not whole rows: BERT's hidden
//!   states have a few channels far larger than the rest, and one scale per row would leave
//!   the others a handful of steps (all-MiniLM-L6-v2's vector of "hi" moved to cosine 0.989
//!   with per-row scales).
//! - The kernel sums each block in integers, scales the block's sum by `s_rb` into an `f32`
//!   sum, and at the end takes off `128 · Σ_b s_rb · Σ_{k∈b} p` (the `+ 128` of the weights,
//!   one number per row, computed with the quantisation) and multiplies by `s_c`. Output is
//!   accumulated onto what `out` holds (the bias).
//!
//! Tiles are 6 rows × 32 columns (12 integer and 12 `f32` accumulators in 24 of the 32 vector
//! registers); rows are padded to a multiple of 6 in the quantised input; the inputs must be
//! a multiple of 32 and the columns of 32 (every BERT-small/base width is), otherwise the
//! layer stays in `f32`.

use rayon::prelude::*;

/// Rows of a tile.
const MR: usize = 6;
/// Columns of a panel (one 512-bit vector of 32-bit sums).
const PANEL: usize = 16;
/// Panels of a tile.
const NR: usize = 2;
/// Columns of a tile.
const TILE_COLS: usize = PANEL * NR;
/// Inputs sharing one scale in a quantised row.
const BLOCK: usize = 32;
/// Groups of 4 inputs (one `vpdpbusd` lane) in a block.
const QUADS_PER_BLOCK: usize = BLOCK / 4;

/// The integer kernel this CPU runs, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512 with VNNI's `vpdpbusd`.
    Vnni,
    /// AVX2 (and FMA): the same sums in four instructions instead of one.
    Avx2,
}

impl Kernel {
    /// The best kernel this CPU has.
    pub fn detect() -> Option<Self> {
        #[cfg(target_arch = "x86_64")]
        {
            if vnni() {
                return Some(Kernel::Vnni);
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Some(Kernel::Avx2);
            }
            None
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            None
        }
    }
}

impl Kernel {
    /// Whether this CPU has the kernel's instructions.
    pub fn runs_here(self) -> bool {
        match self {
            Self::Vnni => vnni(),
            #[cfg(target_arch = "x86_64")]
            Self::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(not(target_arch = "x86_64"))]
            Self::Avx2 => false,
        }
    }
}

/// True when this CPU runs an integer kernel.
pub fn supported() -> bool {
    Kernel::detect().is_some()
}

/// True when this CPU has AVX-512 VNNI (and the AVX-512 subsets the wide code uses).
fn vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512dq")
            && std::arch::is_x86_feature_detected!("avx512vnni")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// A linear layer's weights in 8 bits, laid out for the kernel.
pub(crate) struct QuantDense {
    /// Tile after tile (32 columns), input quad after quad (4 inputs), panel after panel:
    /// 16 columns × their 4 weights of that quad, each `q + 128`.
    packed: Vec<u8>,
    /// `s_c` of every column.
    scale: Vec<f32>,
    inputs: usize,
    outputs: usize,
    kernel: Kernel,
}

impl QuantDense {
    /// Quantises `w` (`inputs × outputs`, row-major) for this CPU's kernel; `None` when it has
    /// none or the shape does not fit the kernel.
    pub(crate) fn new(w: &[f32], inputs: usize, outputs: usize) -> Option<Self> {
        Self::for_kernel(w, inputs, outputs, Kernel::detect()?)
    }

    /// [`Self::new`] for a given kernel (which the CPU must have).
    pub(crate) fn for_kernel(
        w: &[f32],
        inputs: usize,
        outputs: usize,
        kernel: Kernel,
    ) -> Option<Self> {
        if inputs == 0 || !inputs.is_multiple_of(BLOCK) || !outputs.is_multiple_of(TILE_COLS) {
            return None;
        }
        let mut scale = vec![0.0f32; outputs];
        for row in w.chunks_exact(outputs) {
            for (s, &v) in scale.iter_mut().zip(row) {
                *s = s.max(v.abs());
            }
        }
        for s in &mut scale {
            *s = if *s > 0.0 { *s / 127.0 } else { 1.0 };
        }
        let quads = inputs / 4;
        let mut packed = vec![0u8; inputs * outputs];
        for k in 0..inputs {
            for c in 0..outputs {
                let q = (w[k * outputs + c] / scale[c]).round().clamp(-127.0, 127.0) as i32;
                let (tile, within) = (c / TILE_COLS, c % TILE_COLS);
                let at = ((tile * quads + k / 4) * TILE_COLS + within) * 4 + k % 4;
                packed[at] = (q + 128) as u8;
            }
        }
        Some(Self {
            packed,
            scale,
            inputs,
            outputs,
            kernel,
        })
    }

    /// `out += x · w` for `rows` rows of `x` (`rows × inputs`); `scratch` holds the quantised
    /// input between calls. Row blocks run on the caller's rayon pool when `parallel`.
    pub(crate) fn accumulate(
        &self,
        x: &[f32],
        out: &mut [f32],
        rows: usize,
        scratch: &mut Quantised,
        parallel: bool,
    ) {
        assert_eq!(
            x.len(),
            rows * self.inputs,
            "input is not {rows}×{}",
            self.inputs
        );
        assert_eq!(
            out.len(),
            rows * self.outputs,
            "output is not {rows}×{}",
            self.outputs
        );
        scratch.fill(x, rows, self.inputs);
        let blocks = self.inputs / BLOCK;
        let run = |(tile, out): (usize, &mut [f32])| {
            let first = tile * MR;
            let input = Rows {
                values: &scratch.values[first * self.inputs..(first + MR) * self.inputs],
                scales: &scratch.scales[first * blocks..(first + MR) * blocks],
                offsets: &scratch.offsets[first..first + MR],
            };
            kernel_rows(self, &input, out);
        };
        let chunks = out.chunks_mut(MR * self.outputs).enumerate();
        if parallel && rows > MR {
            chunks.collect::<Vec<_>>().into_par_iter().for_each(run);
        } else {
            chunks.for_each(run);
        }
    }
}

/// A product's input quantised per row and block, padded to whole tiles of rows.
#[derive(Default)]
pub(crate) struct Quantised {
    /// `p`, row-major.
    values: Vec<i8>,
    /// `s_rb`, row after row.
    scales: Vec<f32>,
    /// `128 · Σ_b s_rb · Σ_{k∈b} p` of every row.
    offsets: Vec<f32>,
}

impl Quantised {
    fn fill(&mut self, x: &[f32], rows: usize, width: usize) {
        let padded = rows.div_ceil(MR) * MR;
        let blocks = width / BLOCK;
        self.values.clear();
        self.values.resize(padded * width, 0);
        self.scales.clear();
        self.scales.resize(padded * blocks, 0.0);
        self.offsets.clear();
        self.offsets.resize(padded, 0.0);
        quantise_rows(
            x,
            width,
            &mut self.values,
            &mut self.scales,
            &mut self.offsets,
        );
    }
}

/// Quantises every row of `x` (`width` values each) block by block into `values`, `scales`
/// and `offsets` (see [`Quantised`]).
fn quantise_rows(
    x: &[f32],
    width: usize,
    values: &mut [i8],
    scales: &mut [f32],
    offsets: &mut [f32],
) {
    let blocks = width / BLOCK;
    // Once per product, not per block: the feature lookups are cheap but not free.
    let wide = vnni();
    assert!(x.len() <= values.len() && x.len() / BLOCK <= scales.len());
    assert!(x.len() / width.max(1) <= offsets.len());
    for (((row, values), scales), offset) in x
        .chunks_exact(width)
        .zip(values.chunks_exact_mut(width))
        .zip(scales.chunks_exact_mut(blocks))
        .zip(offsets.iter_mut())
    {
        let mut total = 0.0;
        for ((block, values), scale) in row
            .chunks_exact(BLOCK)
            .zip(values.chunks_exact_mut(BLOCK))
            .zip(scales.iter_mut())
        {
            let (s, sum) = quantise_block(block, values, wide);
            *scale = s;
            total += s * sum as f32;
        }
        *offset = 128.0 * total;
    }
}

/// Quantises a block of 32 values to signed bytes; returns its scale and the bytes' sum.
/// `wide` (the CPU has AVX-512 VNNI) takes the AVX-512 path.
fn quantise_block(block: &[f32], out: &mut [i8], wide: bool) -> (f32, i32) {
    assert!(block.len() == BLOCK && out.len() == BLOCK);
    #[cfg(not(target_arch = "x86_64"))]
    let _ = wide;
    #[cfg(target_arch = "x86_64")]
    if wide {
        // SAFETY: `wide` is `vnni()`, read by the one caller: the CPU has the features
        // `quantise_block_wide` is compiled for; both slices hold 32 values (asserted above).
        #[allow(unsafe_code)]
        return unsafe { quantise_block_wide(block, out) };
    }
    let max = block.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    if max == 0.0 {
        out.fill(0);
        return (0.0, 0);
    }
    let inv = 127.0 / max;
    let mut sum = 0;
    for (o, &v) in out.iter_mut().zip(block) {
        let q = (v * inv).round_ties_even() as i32;
        sum += q;
        *o = q as i8;
    }
    (max / 127.0, sum)
}

/// [`quantise_block`] in two 16-wide halves: the largest magnitude, then scale, round to
/// nearest even (the default rounding mode), sum and narrow to bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
#[allow(unsafe_code)]
unsafe fn quantise_block_wide(block: &[f32], out: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    let sign = _mm512_set1_ps(-0.0);
    // SAFETY: both slices hold 32 values (the caller asserts it).
    let (low, high) = unsafe {
        (
            _mm512_loadu_ps(block.as_ptr()),
            _mm512_loadu_ps(block.as_ptr().add(16)),
        )
    };
    let max = _mm512_reduce_max_ps(_mm512_max_ps(
        _mm512_andnot_ps(sign, low),
        _mm512_andnot_ps(sign, high),
    ));
    if max == 0.0 {
        out.fill(0);
        return (0.0, 0);
    }
    let factor = _mm512_set1_ps(127.0 / max);
    let q_low = _mm512_cvtps_epi32(_mm512_mul_ps(low, factor));
    let q_high = _mm512_cvtps_epi32(_mm512_mul_ps(high, factor));
    let sum = _mm512_reduce_add_epi32(_mm512_add_epi32(q_low, q_high));
    // SAFETY: as above.
    unsafe {
        _mm_storeu_si128(out.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(q_low));
        _mm_storeu_si128(
            out.as_mut_ptr().add(16).cast(),
            _mm512_cvtepi32_epi8(q_high),
        );
    }
    (max / 127.0, sum)
}

/// One row's tile of quantised input, as the kernel reads it.
struct Rows<'a> {
    values: &'a [i8],
    scales: &'a [f32],
    offsets: &'a [f32],
}

/// One tile of (up to) `MR` rows against every tile of columns.
fn kernel_rows(layer: &QuantDense, input: &Rows<'_>, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: a `QuantDense` is only built for a kernel the CPU has (`new` detects it,
        // `for_kernel`'s callers check); the kernels' reads are bounded by the asserts in them.
        #[allow(unsafe_code)]
        unsafe {
            match layer.kernel {
                Kernel::Vnni => kernel_rows_vnni(layer, input, out),
                Kernel::Avx2 => kernel_rows_avx2(layer, input, out),
            }
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (layer, input, out);
        unreachable!("the integer kernel exists on x86_64 only");
    }
}

/// The sizes a kernel works with, after checking that the slices it reads and writes hold
/// them (the kernels' unchecked reads rely on these asserts).
struct Shape {
    k: usize,
    n: usize,
    quads: usize,
    blocks: usize,
    rows: usize,
}

impl Shape {
    fn checked(layer: &QuantDense, input: &Rows<'_>, out: &[f32]) -> Self {
        let (k, n) = (layer.inputs, layer.outputs);
        let (quads, blocks) = (k / 4, k / BLOCK);
        let rows = out.len() / n;
        assert!(rows <= MR && out.len() == rows * n);
        assert_eq!(input.values.len(), MR * k);
        assert_eq!(input.scales.len(), MR * blocks);
        assert_eq!(input.offsets.len(), MR);
        assert_eq!(layer.packed.len(), k * n);
        Self {
            k,
            n,
            quads,
            blocks,
            rows,
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vnni")]
#[allow(unsafe_code)]
unsafe fn kernel_rows_vnni(layer: &QuantDense, input: &Rows<'_>, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let Shape {
        k,
        n,
        quads,
        blocks,
        rows,
    } = Shape::checked(layer, input, out);
    let tile_bytes = quads * TILE_COLS * 4;
    for tile in 0..n / TILE_COLS {
        let weights = &layer.packed[tile * tile_bytes..(tile + 1) * tile_bytes];
        let mut sums = [[_mm512_setzero_ps(); NR]; MR];
        for block in 0..blocks {
            let mut acc = [[_mm512_setzero_si512(); NR]; MR];
            for q in block * QUADS_PER_BLOCK..(block + 1) * QUADS_PER_BLOCK {
                let w = &weights[q * TILE_COLS * 4..(q + 1) * TILE_COLS * 4];
                // SAFETY: `w` holds NR × 64 bytes.
                let panel: [__m512i; NR] = std::array::from_fn(|j| unsafe {
                    _mm512_loadu_si512(w[j * 64..].as_ptr().cast())
                });
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: `i < MR` and `q < k / 4`: the 4 bytes lie inside `values`
                    // (MR × k).
                    let four = unsafe {
                        input
                            .values
                            .as_ptr()
                            .add(i * k + q * 4)
                            .cast::<i32>()
                            .read_unaligned()
                    };
                    let a = _mm512_set1_epi32(four);
                    for (acc, &p) in acc.iter_mut().zip(&panel) {
                        *acc = _mm512_dpbusd_epi32(*acc, p, a);
                    }
                }
            }
            for (i, (sums, acc)) in sums.iter_mut().zip(&acc).enumerate() {
                let s = _mm512_set1_ps(input.scales[i * blocks + block]);
                for (sum, &acc) in sums.iter_mut().zip(acc) {
                    *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc), s, *sum);
                }
            }
        }
        for (i, sums) in sums.iter().enumerate().take(rows) {
            let offset = _mm512_set1_ps(input.offsets[i]);
            for (j, &sum) in sums.iter().enumerate() {
                let col = tile * TILE_COLS + j * PANEL;
                // SAFETY: `col + 16 ≤ n`; the slices below are that long.
                unsafe {
                    let scale = _mm512_loadu_ps(layer.scale[col..col + PANEL].as_ptr());
                    let dst = out[i * n + col..i * n + col + PANEL].as_mut_ptr();
                    let value = _mm512_sub_ps(sum, offset);
                    _mm512_storeu_ps(dst, _mm512_fmadd_ps(value, scale, _mm512_loadu_ps(dst)));
                }
            }
        }
    }
}

/// Rows of a tile the AVX2 kernel takes at once (two groups per tile): 3 rows × 2 panels of
/// 8 sums, the two panels' weights and the row's broadcast bytes fit the 16 vector registers.
const AVX2_ROWS: usize = 3;

/// [`kernel_rows_vnni`] for AVX2. `vpmaddubsw` multiplies unsigned by signed bytes and adds
/// pairs into 16-bit sums, which `255 · 127 · 2` would overflow; so the weights are taken back
/// to signed (`q + 128` xor 128 is `q`), the input's sign is moved onto them (`vpsignb`) and
/// its magnitude is the unsigned operand: a pair is at most `2 · 127 · 127`, which fits, and
/// the sums are exactly the VNNI kernel's less the `+ 128` of the weights (so no offset is
/// taken off). `vpmaddwd` by ones widens the pairs to 32-bit sums of four.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(unsafe_code)]
unsafe fn kernel_rows_avx2(layer: &QuantDense, input: &Rows<'_>, out: &mut [f32]) {
    use std::arch::x86_64::*;
    const WIDTH: usize = 8;
    let Shape {
        k,
        n,
        quads,
        blocks,
        rows,
    } = Shape::checked(layer, input, out);
    let tile_bytes = quads * TILE_COLS * 4;
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    for tile in 0..n / TILE_COLS {
        let weights = &layer.packed[tile * tile_bytes..(tile + 1) * tile_bytes];
        // A tile's 32 columns in two halves of 16: two 8-wide panels each.
        for half in 0..2 {
            for first in (0..rows).step_by(AVX2_ROWS) {
                let mut sums = [[_mm256_setzero_ps(); 2]; AVX2_ROWS];
                for block in 0..blocks {
                    let mut acc = [[_mm256_setzero_si256(); 2]; AVX2_ROWS];
                    for q in block * QUADS_PER_BLOCK..(block + 1) * QUADS_PER_BLOCK {
                        let w = &weights[q * TILE_COLS * 4 + half * 64..][..64];
                        // SAFETY: `w` holds 2 × 32 bytes.
                        let panel: [__m256i; 2] = std::array::from_fn(|j| unsafe {
                            _mm256_xor_si256(_mm256_loadu_si256(w[j * 32..].as_ptr().cast()), flip)
                        });
                        for (i, acc) in acc.iter_mut().enumerate() {
                            // SAFETY: `first + i < MR` (rows are padded to MR in `values`)
                            // and `q < k / 4`: the 4 bytes lie inside `values` (MR × k).
                            let four = unsafe {
                                input
                                    .values
                                    .as_ptr()
                                    .add((first + i) * k + q * 4)
                                    .cast::<i32>()
                                    .read_unaligned()
                            };
                            let a = _mm256_set1_epi32(four);
                            let magnitude = _mm256_sign_epi8(a, a);
                            for (acc, &p) in acc.iter_mut().zip(&panel) {
                                let pairs = _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(p, a));
                                *acc = _mm256_add_epi32(*acc, _mm256_madd_epi16(pairs, ones));
                            }
                        }
                    }
                    for (i, (sums, acc)) in sums.iter_mut().zip(&acc).enumerate() {
                        let s = _mm256_set1_ps(input.scales[(first + i) * blocks + block]);
                        for (sum, &acc) in sums.iter_mut().zip(acc) {
                            *sum = _mm256_fmadd_ps(_mm256_cvtepi32_ps(acc), s, *sum);
                        }
                    }
                }
                for (i, sums) in sums.iter().enumerate().take(rows - first) {
                    let row = first + i;
                    for (j, &sum) in sums.iter().enumerate() {
                        let col = tile * TILE_COLS + half * 2 * WIDTH + j * WIDTH;
                        // SAFETY: `col + 8 ≤ n`; the slices below are that long.
                        unsafe {
                            let scale = _mm256_loadu_ps(layer.scale[col..col + WIDTH].as_ptr());
                            let dst = out[row * n + col..row * n + col + WIDTH].as_mut_ptr();
                            _mm256_storeu_ps(
                                dst,
                                _mm256_fmadd_ps(sum, scale, _mm256_loadu_ps(dst)),
                            );
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{Case, matrix};

    #[test]
    fn shapes_the_kernel_cannot_take_stay_in_f32() {
        assert!(QuantDense::new(&matrix(16, 64, 1), 16, 64).is_none());
        assert!(QuantDense::new(&matrix(32, 48, 1), 32, 48).is_none());
        assert!(QuantDense::new(&matrix(32, 96, 1), 32, 96).is_some());
    }

    #[test]
    #[cfg_attr(
        not(cpu_vnni),
        ignore = "needs AVX-512 VNNI (x86 avx512f, bw, dq, vnni)"
    )]
    fn the_wide_and_the_plain_quantiser_agree() {
        assert!(vnni());
        let values = matrix(64, BLOCK, 7);
        let mut blocks: Vec<&[f32]> = values.chunks_exact(BLOCK).collect();
        let zeros = [0.0f32; BLOCK];
        // Exact ties (0.5 steps after scaling) round to even on both paths.
        let ties: Vec<f32> = (0..BLOCK)
            .map(|i| (i as f32 - 16.0) * 0.5 * 8.0 / 127.0)
            .collect();
        blocks.push(&zeros);
        blocks.push(&ties);
        for block in blocks {
            let (mut plain, mut wide) = ([0i8; BLOCK], [0i8; BLOCK]);
            let a = quantise_block(block, &mut plain, false);
            let b = quantise_block(block, &mut wide, true);
            assert_eq!((a, plain), (b, wide));
        }
    }

    /// The integer kernels this CPU has (AVX-512 machines have AVX2 too: both are checked).
    fn kernels() -> Vec<Kernel> {
        let mut found = Vec::new();
        if vnni() {
            found.push(Kernel::Vnni);
        }
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            found.push(Kernel::Avx2);
        }
        assert!(!found.is_empty(), "the build saw an integer kernel");
        found
    }

    #[test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    fn integer_products_track_the_f32_ones() {
        for kernel in kernels() {
            for (m, k, n) in [(1, 32, 32), (7, 384, 128), (13, 1536, 384)] {
                let case = Case::new(m, k, n);
                let layer = QuantDense::for_kernel(&case.w, k, n, kernel).expect("fits the kernel");
                for parallel in [false, true] {
                    let mut scratch = Quantised::default();
                    let got =
                        case.run(|x, out| layer.accumulate(x, out, m, &mut scratch, parallel));
                    // Each output sums k products of values in [-1, 1]: its spread is √k/3.
                    // The two roundings (half a step of 1/127 each) leave about 0.6 % of that
                    // on average, a few times that at worst over thousands of outputs.
                    let spread = (k as f32).sqrt() / 3.0;
                    let worst = case.worst(&got);
                    let rms = (got
                        .iter()
                        .zip(&case.want)
                        .map(|(g, w)| (g - w).powi(2))
                        .sum::<f32>()
                        / got.len() as f32)
                        .sqrt();
                    assert!(
                        rms < 0.01 * spread,
                        "{kernel:?} {m}×{k}×{n}: rms error {rms} (spread {spread})"
                    );
                    assert!(
                        worst < 0.04 * spread,
                        "{kernel:?} {m}×{k}×{n}: off by {worst} (spread {spread})"
                    );
                }
            }
        }
    }

    /// Both kernels sum the same integers: where a CPU has both, their outputs differ only by
    /// the rounding of the `f32` steps around the sums (the VNNI kernel takes the weights'
    /// offset off; the AVX2 one never adds it). Large inputs with a few large values reach
    /// the pair sums' limit `2 · 127 · 127`, where a saturating 16-bit sum would show.
    #[test]
    #[cfg_attr(
        not(all(cpu_vnni, cpu_avx2)),
        ignore = "needs both integer kernels (x86 avx512 vnni, and avx2 with fma)"
    )]
    fn the_two_kernels_agree() {
        let found = kernels();
        assert_eq!(found.len(), 2);
        let (m, k, n) = (11, 768, 96);
        let w = matrix(k, n, 12);
        let mut x = matrix(m, k, 13);
        for (i, v) in x.iter_mut().enumerate() {
            if i % 7 == 0 {
                *v = v.signum() * 1.0;
            }
        }
        let outputs: Vec<Vec<f32>> = found
            .iter()
            .map(|&kernel| {
                let layer = QuantDense::for_kernel(&w, k, n, kernel).unwrap();
                let mut out = vec![0.0f32; m * n];
                layer.accumulate(&x, &mut out, m, &mut Quantised::default(), false);
                out
            })
            .collect();
        for (a, b) in outputs[0].iter().zip(&outputs[1]) {
            assert!((a - b).abs() <= 1e-4 * a.abs().max(1.0), "{a} against {b}");
        }
    }

    /// A row with one channel two hundred times larger than the rest: the other blocks keep
    /// their precision (with one scale per row, a step of 10/127 would round most of them
    /// to zero).
    #[test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    fn an_outlier_channel_costs_only_its_own_block() {
        let (k, n) = (384, 64);
        let w = matrix(k, n, 7);
        let mut x: Vec<f32> = matrix(1, k, 8).iter().map(|v| v * 0.05).collect();
        x[5] = 10.0;
        for kernel in kernels() {
            outlier_case(&QuantDense::for_kernel(&w, k, n, kernel).unwrap(), &w, &x);
        }
    }

    fn outlier_case(layer: &QuantDense, w: &[f32], x: &[f32]) {
        let (k, n) = (layer.inputs, layer.outputs);
        let mut got = vec![0.0f32; n];
        layer.accumulate(x, &mut got, 1, &mut Quantised::default(), false);
        for (j, got) in got.iter().enumerate() {
            // The outlier's own error is its weight's rounding (half a step of 1/127, times
            // 10); the other blocks must stay within 1 % of the sum of their terms' sizes.
            let want: f32 = (0..k).map(|p| x[p] * w[p * n + j]).sum();
            let rest: f32 = (BLOCK..k).map(|p| (x[p] * w[p * n + j]).abs()).sum();
            // The outlier's neighbours share its coarse scale: most of them round to zero.
            let neighbours: f32 = (0..BLOCK)
                .filter(|&p| p != 5)
                .map(|p| (x[p] * w[p * n + j]).abs())
                .sum();
            assert!(
                (got - want).abs() < 0.01 * rest + neighbours + 0.05,
                "column {j}: {got} against {want}"
            );
        }
    }

    #[test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    fn a_zero_row_gives_the_bias() {
        for kernel in kernels() {
            let layer = QuantDense::for_kernel(&matrix(32, 64, 9), 32, 64, kernel).unwrap();
            let mut out = vec![0.5f32; 64];
            layer.accumulate(&[0.0; 32], &mut out, 1, &mut Quantised::default(), false);
            assert!(out.iter().all(|&v| v == 0.5), "{kernel:?}");
        }
    }
}
