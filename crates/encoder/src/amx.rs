//! Matrix products in bfloat16 on AMX tiles (Intel Sapphire Rapids and later).
//!
//! One `tdpbf16ps` multiplies a 16 × 32 tile of bfloat16 inputs by a 32 × 16 tile of weights
//! and adds the products into a 16 × 16 tile of `f32` sums: 8,192 multiply-adds in one
//! instruction, several times what AVX-512 VNNI's 8-bit products do a cycle. bfloat16 keeps
//! `f32`'s exponent, so neither the weights nor the inputs need scales: each value is rounded
//! to 8 significant bits and the sums are kept in `f32`. That is closer to `f32` than the 8-bit
//! kernel's blocks of 32 (and, like them, a text's vector does not depend on the batch it came
//! in: every sum runs over the same tiles in the same order).
//!
//! - Weights are converted once, at load, into blocks of 32 inputs × 16 columns laid out as
//!   the instruction reads them (pairs of consecutive inputs side by side per column), the
//!   blocks of a column tile in input order.
//! - Each product's input is converted when the product runs, row-major, its rows padded to a
//!   multiple of 32.
//! - The kernel computes 32 rows × 32 columns at a time in four sum tiles, loaded from and
//!   stored to the output (which holds the bias), with two input and two weight tiles.
//!
//! The instructions are written as inline assembly: Rust's AMX intrinsics are not stable.
//! Linux hands the tiles' register state to a process only on request
//! (`arch_prctl(ARCH_REQ_XCOMP_PERM)`), made once, when [`supported`] is first asked.

use rayon::prelude::*;

/// Rows (and columns) of a sum tile.
const TILE: usize = 16;
/// Inputs of one weight block: 32 bfloat16 values are a tile row of 64 bytes.
const K_STEP: usize = 32;
/// Rows a kernel call covers: two sum tiles high.
const ROWS: usize = 2 * TILE;
/// Columns a kernel call covers: two sum tiles wide.
const COLS: usize = 2 * TILE;
/// Row blocks of one task at most: its converted inputs (up to 768 KB for 1,536 inputs) and a
/// column pair's weights stay in a core's cache together.
const CHUNK_BLOCKS: usize = 8;
/// Tasks a parallel product is cut into at least (more than the threads, so one that ends
/// early finds another).
const TASKS_MIN: usize = 8;

/// True when this CPU has AMX with bfloat16 and the kernel lets this process use the tiles.
pub fn supported() -> bool {
    static READY: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *READY.get_or_init(|| has_amx_bf16() && request_tiles())
}

#[cfg(target_arch = "x86_64")]
fn has_amx_bf16() -> bool {
    use std::arch::x86_64::__cpuid_count;
    // Leaf 7 exists when the highest leaf is at least 7.
    #[allow(unused_unsafe)]
    // SAFETY: `cpuid` exists on every x86_64 CPU and only reads identification registers.
    #[allow(unsafe_code)]
    let (highest, leaf7) = unsafe { (__cpuid_count(0, 0).eax, __cpuid_count(7, 0)) };
    // EDX bit 22: AMX-BF16, bit 24: AMX-TILE.
    highest >= 7 && leaf7.edx & (1 << 22) != 0 && leaf7.edx & (1 << 24) != 0
}

#[cfg(not(target_arch = "x86_64"))]
fn has_amx_bf16() -> bool {
    false
}

/// Asks Linux for the tile registers' state (`XFEATURE_XTILEDATA`) for this process.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn request_tiles() -> bool {
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: `arch_prctl` with these arguments only changes which register states the
    // process may use; it reads and writes no memory of ours.
    #[allow(unsafe_code)]
    let answer = unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    };
    answer == 0
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn request_tiles() -> bool {
    false
}

/// `f32` to bfloat16, rounding to nearest even (NaN stays a NaN).
#[inline(always)]
fn to_bf16(v: f32) -> u16 {
    let bits = v.to_bits();
    if v.is_nan() {
        return ((bits >> 16) | 0x40) as u16;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

vectorised!(convert_rows / convert_rows_on, convert_body, (x: &[f32], out: &mut [u16]));

#[inline(always)]
fn convert_body(x: &[f32], out: &mut [u16]) {
    for (o, &v) in out.iter_mut().zip(x) {
        *o = to_bf16(v);
    }
}

/// A linear layer's weights in bfloat16, laid out for the kernel.
pub(crate) struct Bf16Dense {
    /// Column tile after column tile (16 columns); in each, block after block of 32 inputs:
    /// 16 rows (pairs of inputs) × 16 columns × the pair.
    packed: Vec<u16>,
    inputs: usize,
    outputs: usize,
}

impl Bf16Dense {
    /// Converts `w` (`inputs × outputs`, row-major); `None` when this CPU has no AMX or the
    /// shape does not fit the kernel (inputs a multiple of 32, outputs of 32).
    pub(crate) fn new(w: &[f32], inputs: usize, outputs: usize) -> Option<Self> {
        if !supported()
            || inputs == 0
            || outputs == 0
            || !inputs.is_multiple_of(K_STEP)
            || !outputs.is_multiple_of(COLS)
            || w.len() != inputs * outputs
        {
            return None;
        }
        let k_blocks = inputs / K_STEP;
        let mut packed = vec![0u16; inputs * outputs];
        for k in 0..inputs {
            for c in 0..outputs {
                let (tile, col) = (c / TILE, c % TILE);
                let (block, within) = (k / K_STEP, k % K_STEP);
                let at =
                    (((tile * k_blocks + block) * TILE + within / 2) * TILE + col) * 2 + within % 2;
                packed[at] = to_bf16(w[k * outputs + c]);
            }
        }
        Some(Self {
            packed,
            inputs,
            outputs,
        })
    }

    /// `out += x · w` for `rows` rows of `x` (`rows × inputs`); `scratch` holds the converted
    /// input between calls. Row blocks (and, for few rows, column groups) run on the caller's
    /// rayon pool when `parallel`.
    pub(crate) fn accumulate(
        &self,
        x: &[f32],
        out: &mut [f32],
        rows: usize,
        scratch: &mut Vec<u16>,
        parallel: bool,
    ) {
        let (k, n) = (self.inputs, self.outputs);
        assert_eq!(x.len(), rows * k, "input is not {rows}×{k}");
        assert_eq!(out.len(), rows * n, "output is not {rows}×{n}");
        let padded = rows.div_ceil(ROWS) * ROWS;
        if rows == 0 {
            return;
        }
        // The padding rows must read as zeros; the others are all written below.
        scratch.resize(padded * k, 0);
        scratch[rows * k..].fill(0);
        if parallel && rows > ROWS {
            x.par_chunks(ROWS * k)
                .zip(scratch.par_chunks_mut(ROWS * k))
                .for_each(|(x, out)| convert_rows(x, out));
        } else {
            convert_rows(x, scratch);
        }
        let input: &[u16] = scratch;
        // Tasks are rectangles of up to CHUNK_ROWS rows by a group of columns. Inside one, each
        // pair of column tiles' weights is read from memory once and then stays in the core's
        // cache while every row block of the chunk takes it; the chunk's converted rows stay
        // there too. Few rows (one text) would leave a thread idle: split the columns more.
        let row_blocks = padded / ROWS;
        let chunks = row_blocks.div_ceil(CHUNK_BLOCKS);
        // Chunks of equal size (within a block), so that tasks take equal time.
        let chunk_rows = row_blocks.div_ceil(chunks) * ROWS;
        let groups = if parallel {
            TASKS_MIN.div_ceil(chunks).min(n / COLS)
        } else {
            1
        };
        let group_cols = (n / COLS).div_ceil(groups) * COLS;
        let tasks: Vec<(usize, usize)> = (0..padded)
            .step_by(chunk_rows)
            .flat_map(|first_row| (0..n).step_by(group_cols).map(move |c| (first_row, c)))
            .collect();
        let shared = SharedOut(out.as_mut_ptr());
        let run = |&(first_row, first_col): &(usize, usize)| {
            let last_row = (first_row + chunk_rows).min(padded);
            let a = &input[first_row * k..last_row * k];
            let valid = chunk_rows.min(rows - first_row);
            let cols = group_cols.min(n - first_col);
            // SAFETY: `out` holds `rows × n` values (asserted above), so rows
            // `first_row..first_row + valid` and columns `first_col..first_col + cols` lie in
            // it; tasks cover disjoint such rectangles, and `out` stays borrowed until all
            // have run.
            #[allow(unsafe_code)]
            unsafe {
                self.rectangle(
                    a,
                    shared.at(first_row * n + first_col),
                    valid,
                    first_col,
                    cols,
                )
            };
        };
        if parallel && tasks.len() > 1 {
            tasks.par_iter().for_each(run);
        } else {
            tasks.iter().for_each(run);
        }
    }

    /// One rectangle of the output: `a` holds the converted rows of the rectangle's row
    /// blocks (32 rows each, the last padded), `out` points at its first row (of `outputs`
    /// values each), column `first_col`; `valid` rows, `cols` columns.
    ///
    /// # Safety
    /// `out` must be valid for reads and writes of that rectangle, and nothing else may access
    /// it meanwhile.
    #[allow(unsafe_code)]
    unsafe fn rectangle(
        &self,
        a: &[u16],
        out: *mut f32,
        valid: usize,
        first_col: usize,
        cols: usize,
    ) {
        let (k, n) = (self.inputs, self.outputs);
        let k_blocks = k / K_STEP;
        let tile_len = k_blocks * TILE * TILE * 2;
        let blocks = a.len() / (ROWS * k);
        assert!(
            a.len() == blocks * ROWS * k && valid <= blocks * ROWS && valid > (blocks - 1) * ROWS
        );
        assert!(first_col.is_multiple_of(COLS) && cols.is_multiple_of(COLS));
        assert!(first_col + cols <= n && self.packed.len() == k * n);
        // A partial row block's sums go through a buffer of 32 × 32.
        let mut tail = [0.0f32; ROWS * COLS];
        // SAFETY: a `Bf16Dense` exists only where `supported()` was true.
        unsafe { tiles::configure() };
        for c in (0..cols).step_by(COLS) {
            let tile = (first_col + c) / TILE;
            let weights = &self.packed[tile * tile_len..(tile + 2) * tile_len];
            for block in 0..blocks {
                let a = &a[block * ROWS * k..(block + 1) * ROWS * k];
                let rows = ROWS.min(valid - block * ROWS);
                // SAFETY (the pointers below): rows `r < valid` and columns `c' < cols` of `out`
                // (row stride `n`) are the caller's rectangle; `a` holds 32 rows of `k`
                // values; `weights` two column tiles of `k_blocks` blocks of 16 × 32 values.
                let sums = unsafe { out.add(block * ROWS * n + c) };
                if rows == ROWS {
                    unsafe { tiles::product(sums, n, a, k, weights, k_blocks) };
                    continue;
                }
                for r in 0..rows {
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            sums.add(r * n),
                            tail[r * COLS..].as_mut_ptr(),
                            COLS,
                        )
                    };
                }
                unsafe { tiles::product(tail.as_mut_ptr(), COLS, a, k, weights, k_blocks) };
                for r in 0..rows {
                    unsafe {
                        std::ptr::copy_nonoverlapping(
                            tail[r * COLS..].as_ptr(),
                            sums.add(r * n),
                            COLS,
                        )
                    };
                }
            }
        }
        // SAFETY: as above.
        unsafe { tiles::release() };
    }
}

/// The output shared by the tasks of one product, each writing its own rectangle.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);

// SAFETY: the tasks write disjoint rectangles (see `accumulate`).
#[allow(unsafe_code)]
unsafe impl Send for SharedOut {}
#[allow(unsafe_code)]
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The pointer `offset` values in.
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// The tile instructions, as inline assembly.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod tiles {
    use std::arch::asm;

    use super::{K_STEP, TILE};

    /// `ldtilecfg`'s 64-byte operand: palette 1, eight tiles of 16 rows × 64 bytes.
    #[repr(C, align(64))]
    struct Config {
        palette: u8,
        start_row: u8,
        reserved: [u8; 14],
        bytes_per_row: [u16; 16],
        rows: [u8; 16],
    }

    const CONFIG: Config = Config {
        palette: 1,
        start_row: 0,
        reserved: [0; 14],
        bytes_per_row: [64, 64, 64, 64, 64, 64, 64, 64, 0, 0, 0, 0, 0, 0, 0, 0],
        rows: [16, 16, 16, 16, 16, 16, 16, 16, 0, 0, 0, 0, 0, 0, 0, 0],
    };

    /// Loads the tile shapes on this thread.
    ///
    /// # Safety
    /// The CPU has AMX and the process may use it ([`super::supported`] returned true).
    pub(super) unsafe fn configure() {
        // SAFETY: the caller's promise; the operand is a valid 64-byte configuration.
        unsafe { asm!("ldtilecfg [{}]", in(reg) &CONFIG, options(nostack, readonly)) };
    }

    /// Returns this thread's tiles to their initial state.
    ///
    /// # Safety
    /// As for [`configure`].
    pub(super) unsafe fn release() {
        // SAFETY: the caller's promise.
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }

    /// `sums[0..32][0..32] += a · w` with `sums` row stride `stride` values, `a` 32 rows of
    /// `k` bfloat16 values, `w` two column tiles of `k_blocks ≥ 1` weight blocks. One `asm!`
    /// block from the first tile load to the last store: the tiles' contents never have to
    /// outlive a block.
    ///
    /// # Safety
    /// The tiles are configured on this thread ([`configure`]); `sums` is valid for reads and
    /// writes of 32 rows × 32 values at `stride`; `a` and `w` hold what is said above.
    pub(super) unsafe fn product(
        sums: *mut f32,
        stride: usize,
        a: &[u16],
        k: usize,
        w: &[u16],
        k_blocks: usize,
    ) {
        const BLOCK: usize = K_STEP * TILE;
        assert!(k_blocks >= 1 && k >= k_blocks * K_STEP);
        assert!(a.len() >= 2 * TILE * k && w.len() >= 2 * k_blocks * BLOCK);
        // SAFETY: the caller's promises and the asserts above: every tile row read or written
        // is one of the 32 rows (16 per tile) of 64 bytes described there; the loop runs
        // `k_blocks` times, stepping 32 values along `a`'s rows and one block along each
        // column tile of `w`.
        unsafe {
            asm!(
                "tileloadd tmm0, [{low} + {sum_stride}*1]",
                "tileloadd tmm1, [{low} + {sum_stride}*1 + 64]",
                "tileloadd tmm2, [{high} + {sum_stride}*1]",
                "tileloadd tmm3, [{high} + {sum_stride}*1 + 64]",
                "2:",
                "tileloadd tmm4, [{a_low} + {a_stride}*1]",
                "tileloadd tmm5, [{a_high} + {a_stride}*1]",
                "tileloadd tmm6, [{w0} + {w_stride}*1]",
                "tileloadd tmm7, [{w1} + {w_stride}*1]",
                "tdpbf16ps tmm0, tmm4, tmm6",
                "tdpbf16ps tmm1, tmm4, tmm7",
                "tdpbf16ps tmm2, tmm5, tmm6",
                "tdpbf16ps tmm3, tmm5, tmm7",
                "add {a_low}, 64",
                "add {a_high}, 64",
                "add {w0}, 1024",
                "add {w1}, 1024",
                "dec {blocks}",
                "jnz 2b",
                "tilestored [{low} + {sum_stride}*1], tmm0",
                "tilestored [{low} + {sum_stride}*1 + 64], tmm1",
                "tilestored [{high} + {sum_stride}*1], tmm2",
                "tilestored [{high} + {sum_stride}*1 + 64], tmm3",
                low = in(reg) sums,
                high = in(reg) sums.wrapping_add(TILE * stride),
                sum_stride = in(reg) stride * 4,
                a_low = inout(reg) a.as_ptr() => _,
                a_high = inout(reg) a.as_ptr().wrapping_add(TILE * k) => _,
                a_stride = in(reg) k * 2,
                w0 = inout(reg) w.as_ptr() => _,
                w1 = inout(reg) w.as_ptr().wrapping_add(k_blocks * BLOCK) => _,
                w_stride = in(reg) 64usize,
                blocks = inout(reg) k_blocks => _,
                options(nostack),
            );
        }
    }
}

/// Elsewhere there are no tiles: [`supported`] is false, so no [`Bf16Dense`] exists.
#[cfg(not(target_arch = "x86_64"))]
mod tiles {
    pub(super) unsafe fn configure() {
        unreachable!("AMX exists on x86_64 only")
    }
    pub(super) unsafe fn release() {}
    pub(super) unsafe fn product(_: *mut f32, _: usize, _: &[u16], _: usize, _: &[u16], _: usize) {
        unreachable!("AMX exists on x86_64 only")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::{Case, matrix};

    #[test]
    fn conversion_rounds_to_nearest_even() {
        assert_eq!(to_bf16(1.0), 0x3f80);
        assert_eq!(to_bf16(-2.0), 0xc000);
        // 1 + 2^-8 lies halfway between 1 and 1 + 2^-7: even (1) wins; just above it rounds up.
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8000)), 0x3f80);
        assert_eq!(to_bf16(f32::from_bits(0x3f80_8001)), 0x3f81);
        // Halfway above an odd last bit rounds up to even.
        assert_eq!(to_bf16(f32::from_bits(0x3f81_8000)), 0x3f82);
        assert!(f32::from_bits(u32::from(to_bf16(f32::NAN)) << 16).is_nan());
        let x: Vec<f32> = matrix(3, 37, 7);
        let mut wide = vec![0u16; x.len()];
        convert_rows(&x, &mut wide);
        assert!(wide.iter().zip(&x).all(|(&w, &v)| w == to_bf16(v)));
    }

    #[test]
    #[cfg_attr(not(cpu_amx), ignore = "needs AMX tiles (x86 amx-tile, amx-bf16)")]
    fn tile_products_track_the_f32_ones() {
        assert!(
            supported(),
            "this CPU has AMX but Linux did not grant the tile state"
        );
        // Row counts below, at and above the 32-row block, one text and a batch; column
        // counts of one and several column groups.
        for (m, k, n) in [
            (1, 32, 32),
            (12, 384, 1152),
            (33, 1536, 384),
            (100, 384, 96),
        ] {
            let case = Case::new(m, k, n);
            let layer = Bf16Dense::new(&case.w, k, n).expect("fits the kernel");
            for parallel in [false, true] {
                let got = case.run(|x, out| layer.accumulate(x, out, m, &mut Vec::new(), parallel));
                // Each output sums k products of values in [-1, 1]: its spread is √k/3. Both
                // factors are rounded to 8 significant bits (a relative 2^-8 at most), so the
                // error is a fraction of a percent of that.
                let spread = (k as f32).sqrt() / 3.0;
                let worst = case.worst(&got);
                assert!(
                    worst < 0.01 * spread,
                    "{m}×{k}×{n}, parallel {parallel}: off by {worst} (spread {spread})"
                );
            }
        }
    }

    #[test]
    #[cfg_attr(not(cpu_amx), ignore = "needs AMX tiles (x86 amx-tile, amx-bf16)")]
    fn a_row_does_not_depend_on_its_batch() {
        assert!(
            supported(),
            "this CPU has AMX but Linux did not grant the tile state"
        );
        let (k, n) = (384, 128);
        let (x, w) = (matrix(70, k, 11), matrix(k, n, 12));
        let layer = Bf16Dense::new(&w, k, n).expect("fits the kernel");
        let mut scratch = Vec::new();
        let mut all = vec![0.0f32; 70 * n];
        layer.accumulate(&x, &mut all, 70, &mut scratch, false);
        for (first, count) in [(0, 1), (5, 12), (40, 30)] {
            let mut part = vec![0.0f32; count * n];
            layer.accumulate(
                &x[first * k..(first + count) * k],
                &mut part,
                count,
                &mut scratch,
                true,
            );
            assert_eq!(
                part,
                all[first * n..(first + count) * n],
                "rows {first}..+{count}"
            );
        }
    }

    #[test]
    fn shapes_the_kernel_cannot_take_are_refused() {
        assert!(Bf16Dense::new(&matrix(33, 32, 1), 33, 32).is_none());
        assert!(Bf16Dense::new(&matrix(32, 48, 1), 32, 48).is_none());
    }
}
