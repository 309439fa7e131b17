//! The XLM-RoBERTa tokenizer of a packed multilingual model ([`mnemo_encoder::packed`]), built
//! with the `tokenizers` crate from the vocabulary the model file carries: a SentencePiece
//! unigram model, the metaspace (`▁`) pre-tokenizer and `<s> … </s>` around every text.
//!
//! SentencePiece normalises before it segments. The model file carries the per-character part
//! of that normaliser (full-width forms to their ASCII ones, compatibility characters, control
//! characters dropped, every kind of space to U+0020); [`SentencePieceTokenizer`] applies it and
//! then collapses runs of spaces, as the engine the file was made for does, so that both
//! segment a text alike.

use std::collections::HashMap;

use mnemo_encoder::packed::Vocabulary;
use tokenizers::models::unigram::Unigram;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::processors::template::TemplateProcessing;
use tokenizers::{Encoding, Tokenizer, TruncationDirection, TruncationParams, TruncationStrategy};

/// A SentencePiece unigram tokenizer with its character normaliser.
pub(crate) struct SentencePieceTokenizer {
    tokenizer: Tokenizer,
    normalization: HashMap<char, String>,
}

impl std::fmt::Debug for SentencePieceTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentencePieceTokenizer")
            .field("pieces", &self.tokenizer.get_vocab_size(false))
            .field("normalised_characters", &self.normalization.len())
            .finish()
    }
}

impl SentencePieceTokenizer {
    /// The tokenizer of `vocabulary`, cutting texts to `max_length` tokens (`<s>`, `</s>`
    /// included).
    pub(crate) fn new(vocabulary: &Vocabulary, max_length: usize) -> Result<Self, String> {
        let piece = |id: u32| {
            vocabulary
                .pieces
                .get(id as usize)
                .map(|(text, _)| text.clone())
                .ok_or_else(|| format!("special token id {id} is not in the vocabulary"))
        };
        let (bos, eos) = (piece(vocabulary.bos)?, piece(vocabulary.eos)?);
        let model = Unigram::from(
            vocabulary.pieces.clone(),
            Some(vocabulary.unk as usize),
            false,
        )
        .map_err(|e| format!("unigram model: {e}"))?;
        let template = TemplateProcessing::builder()
            .try_single(format!("{bos} $A {eos}"))
            .map_err(|e| format!("template: {e}"))?
            .special_tokens(vec![(bos, vocabulary.bos), (eos, vocabulary.eos)])
            .build()
            .map_err(|e| format!("template: {e}"))?;
        let mut tokenizer = Tokenizer::new(model);
        // Not split at spaces: the unigram search runs over the whole text, as SentencePiece's.
        tokenizer.with_pre_tokenizer(Some(Metaspace::new('▁', PrependScheme::Always, false)));
        tokenizer.with_post_processor(Some(template));
        tokenizer.with_decoder(Some(Metaspace::new('▁', PrependScheme::Always, false)));
        tokenizer
            .with_truncation(Some(TruncationParams {
                direction: TruncationDirection::Right,
                max_length,
                strategy: TruncationStrategy::LongestFirst,
                stride: 0,
            }))
            .map_err(|e| format!("truncation: {e}"))?;
        tokenizer.with_padding(None);
        Ok(Self {
            tokenizer,
            normalization: vocabulary.normalization.clone(),
        })
    }

    /// `text` as the model's normaliser leaves it: characters replaced by the map, runs of
    /// spaces collapsed to one.
    pub(crate) fn normalize(&self, text: &str) -> String {
        let mut out = String::with_capacity(text.len());
        for c in text.chars() {
            match self.normalization.get(&c) {
                Some(replacement) => {
                    for r in replacement.chars() {
                        push_collapsing(&mut out, r);
                    }
                }
                None => push_collapsing(&mut out, c),
            }
        }
        out
    }

    /// Token ids of every text, with `<s>` and `</s>`.
    pub(crate) fn encode_batch(&self, texts: &[&str]) -> Result<Vec<Encoding>, String> {
        let normalized: Vec<String> = texts.iter().map(|t| self.normalize(t)).collect();
        self.tokenizer
            .encode_batch(normalized, true)
            .map_err(|e| e.to_string())
    }
}

fn push_collapsing(out: &mut String, c: char) {
    if c == ' ' && out.ends_with(' ') {
        return;
    }
    out.push(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vocabulary() -> Vocabulary {
        let pieces = [
            ("<s>", 0.0),
            ("<pad>", 0.0),
            ("</s>", 0.0),
            ("<unk>", 0.0),
            ("▁", -3.0),
            ("▁my", -4.0),
            ("▁cat", -5.0),
            ("▁ca", -6.0),
            ("t", -6.0),
            ("▁我", -5.0),
            ("的", -4.0),
            ("猫", -6.0),
            ("我的", -7.0),
            ("!", -4.0),
        ];
        Vocabulary {
            pieces: pieces.iter().map(|(p, s)| (p.to_string(), *s)).collect(),
            bos: 0,
            eos: 2,
            pad: 1,
            unk: 3,
            normalization: [('！', "!"), ('\t', " "), ('\u{200b}', "")]
                .iter()
                .map(|(c, s)| (*c, s.to_string()))
                .collect(),
        }
    }

    fn tokens(tokenizer: &SentencePieceTokenizer, text: &str) -> Vec<String> {
        tokenizer.encode_batch(&[text]).unwrap()[0]
            .get_tokens()
            .to_vec()
    }

    #[test]
    fn segments_by_the_best_unigram_path_between_bos_and_eos() {
        let tokenizer = SentencePieceTokenizer::new(&vocabulary(), 16).unwrap();
        assert_eq!(tokens(&tokenizer, "my cat"), ["<s>", "▁my", "▁cat", "</s>"]);
        assert_eq!(
            tokens(&tokenizer, "我的猫"),
            ["<s>", "▁我", "的", "猫", "</s>"]
        );
        let ids = tokenizer.encode_batch(&["my cat"]).unwrap()[0]
            .get_ids()
            .to_vec();
        assert_eq!(ids, [0, 5, 6, 2]);
    }

    #[test]
    fn normalises_characters_and_collapses_spaces_first() {
        let tokenizer = SentencePieceTokenizer::new(&vocabulary(), 16).unwrap();
        assert_eq!(tokenizer.normalize("my\t\t cat！\u{200b}"), "my cat!");
        assert_eq!(
            tokens(&tokenizer, "my \t cat！"),
            ["<s>", "▁my", "▁cat", "!", "</s>"]
        );
        // An unknown character is <unk> (whose token text is the character itself).
        let ids = tokenizer.encode_batch(&["my 狗"]).unwrap()[0]
            .get_ids()
            .to_vec();
        assert_eq!(ids, [0, 5, 4, 3, 2]);
    }

    #[test]
    fn truncates_to_the_limit_with_the_end_marker_kept() {
        let tokenizer = SentencePieceTokenizer::new(&vocabulary(), 4).unwrap();
        assert_eq!(
            tokens(&tokenizer, "my cat my cat"),
            ["<s>", "▁my", "▁cat", "</s>"]
        );
    }
}
