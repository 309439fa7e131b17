//! `--answer`: question answering from recalled memories, scored the way the LoCoMo and Mem0
//! papers score it — an LLM judge's CORRECT/WRONG against the gold answer (J) and token F1 —
//! per category. The adversarial category (questions about things never said) is left out, as
//! in those papers.

use std::collections::BTreeMap;

use serde::Serialize;

use mnemo::llm::chat::{ChatMessage, ChatRequest, LlmError, RoleModel, complete_json};
use mnemo::llm::prompts::{Prompt, quote};
use mnemo::memory::rank::Recalled;

/// Categories not scored for answers.
pub const UNSCORED_CATEGORIES: [&str; 1] = ["adversarial"];

/// The models answering and judging.
#[derive(Clone)]
pub struct AnswerModels {
    pub answer: RoleModel,
    pub judge: RoleModel,
    pub structured_retries: u32,
}

/// Scores of one category (or all).
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AnswerScores {
    pub questions: usize,
    pub correct: usize,
    /// Share of answers the judge labelled CORRECT, in percent.
    pub judge_accuracy: f64,
    /// Mean token F1 against the gold answer, in percent.
    pub f1: f64,
}

/// What `--answer` measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct AnswerReport {
    /// The memory unit and retrieval whose recalls were answered from, e.g. `dated/hybrid`.
    pub run: String,
    /// Memories given to the answer model per question.
    pub k: usize,
    pub answer_model: String,
    pub judge_model: String,
    pub overall: AnswerScores,
    pub categories: BTreeMap<String, AnswerScores>,
    /// Questions whose answer or judgement failed (not counted above).
    pub failures: usize,
}

/// Sums answers as they come.
#[derive(Debug, Default)]
pub struct AnswerTally {
    sums: BTreeMap<String, (usize, usize, f64)>,
    pub failures: usize,
}

impl AnswerTally {
    pub fn add(&mut self, category: &str, correct: bool, f1: f64) {
        let entry = self.sums.entry(category.to_string()).or_default();
        entry.0 += 1;
        entry.1 += usize::from(correct);
        entry.2 += f1;
    }

    pub fn report(&self, run: String, k: usize, models: &AnswerModels) -> AnswerReport {
        let scores = |(n, correct, f1): (usize, usize, f64)| AnswerScores {
            questions: n,
            correct,
            judge_accuracy: percent(correct as f64, n),
            f1: percent(f1, n),
        };
        let total = self.sums.values().fold((0, 0, 0.0), |acc, s| {
            (acc.0 + s.0, acc.1 + s.1, acc.2 + s.2)
        });
        AnswerReport {
            run,
            k,
            answer_model: models.answer.model.model().to_string(),
            judge_model: models.judge.model.model().to_string(),
            overall: scores(total),
            categories: self
                .sums
                .iter()
                .map(|(category, sums)| (category.clone(), scores(*sums)))
                .collect(),
            failures: self.failures,
        }
    }
}

fn percent(sum: f64, n: usize) -> f64 {
    if n == 0 {
        0.0
    } else {
        (sum / n as f64 * 1000.0).round() / 10.0
    }
}

/// One question: the answer from the recalled memories, the judge's verdict and token F1.
pub async fn answer_and_judge(
    models: &AnswerModels,
    question: &str,
    gold: &str,
    recalled: &[Recalled],
) -> Result<(String, bool, f64), LlmError> {
    let memories: Vec<String> = recalled
        .iter()
        .map(|found| quote(&found.memory.content))
        .collect();
    let text =
        Prompt::EvalAnswer.render(&[("memories", &memories.join("\n")), ("question", question)])?;
    let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
    request.max_tokens = Some(models.answer.max_tokens.min(200));
    request.temperature = Some(0.0);
    let answer = models.answer.model.complete(&request).await?.content;
    let answer = answer.trim().to_string();
    let text =
        Prompt::EvalJudge.render(&[("question", question), ("gold", gold), ("answer", &answer)])?;
    let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
    request.max_tokens = Some(models.judge.max_tokens.min(100));
    request.temperature = Some(0.0);
    let (correct, _) = complete_json(
        models.judge.model.as_ref(),
        request,
        models.structured_retries,
        |value| match value["label"]
            .as_str()
            .map(str::to_ascii_uppercase)
            .as_deref()
        {
            Some("CORRECT") => Ok(true),
            Some("WRONG") => Ok(false),
            _ => Err("label must be CORRECT or WRONG".to_string()),
        },
    )
    .await?;
    let f1 = token_f1(&answer, gold);
    Ok((answer, correct, f1))
}

/// The facts of one session, each with the ids of the turns it comes from (ids not in the
/// session are dropped, and a fact left without any is dropped).
pub async fn extract_facts(
    model: &RoleModel,
    retries: u32,
    date: &str,
    turns: &[(String, String, String)],
) -> Result<Vec<(String, Vec<String>)>, LlmError> {
    let listed: Vec<String> = turns
        .iter()
        .map(|(id, speaker, text)| format!("[{id}] {speaker}: {}", text.replace('\n', " ")))
        .collect();
    let text = Prompt::EvalFacts.render(&[("date", date), ("turns", &listed.join("\n"))])?;
    let mut request = ChatRequest::new(vec![ChatMessage::user(text)]);
    request.max_tokens = Some(model.max_tokens);
    request.temperature = Some(0.0);
    let known: std::collections::BTreeSet<&str> =
        turns.iter().map(|(id, _, _)| id.as_str()).collect();
    let (facts, _) = complete_json(model.model.as_ref(), request, retries, |value| {
        let items = value["facts"].as_array().ok_or("facts must be a list")?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let content = item["content"].as_str()?.trim().to_string();
                let refs: Vec<String> = item["turns"]
                    .as_array()?
                    .iter()
                    .filter_map(|id| id.as_str())
                    .filter(|id| known.contains(id))
                    .map(str::to_string)
                    .collect();
                (!content.is_empty() && !refs.is_empty()).then_some((content, refs))
            })
            .collect::<Vec<_>>())
    })
    .await?;
    Ok(facts)
}

/// Lowercased words without punctuation and the articles a, an, the (the SQuAD / LoCoMo
/// normalisation).
fn normalise(text: &str) -> Vec<String> {
    text.to_lowercase()
        .chars()
        .map(|c| {
            if c.is_alphanumeric() || c.is_whitespace() {
                c
            } else {
                ' '
            }
        })
        .collect::<String>()
        .split_whitespace()
        .filter(|word| !matches!(*word, "a" | "an" | "the"))
        .map(str::to_string)
        .collect()
}

/// Token F1 between a prediction and the gold answer, over word multisets.
pub fn token_f1(prediction: &str, gold: &str) -> f64 {
    let predicted = normalise(prediction);
    let expected = normalise(gold);
    if predicted.is_empty() || expected.is_empty() {
        return f64::from(u8::from(predicted == expected));
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for word in &expected {
        *counts.entry(word).or_default() += 1;
    }
    let mut common = 0usize;
    for word in &predicted {
        if let Some(count) = counts.get_mut(word.as_str())
            && *count > 0
        {
            *count -= 1;
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let precision = common as f64 / predicted.len() as f64;
    let recall = common as f64 / expected.len() as f64;
    2.0 * precision * recall / (precision + recall)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use async_trait::async_trait;

    use super::*;
    use mnemo::llm::chat::{ChatModel, ChatResponse, DeltaSink};

    #[test]
    fn token_f1_follows_the_squad_normalisation() {
        assert_eq!(token_f1("The Eiffel Tower!", "eiffel tower"), 1.0);
        assert_eq!(token_f1("", ""), 1.0);
        assert_eq!(token_f1("something", ""), 0.0);
        assert_eq!(token_f1("red car", "blue bike"), 0.0);
        // 1 common word: precision 1/2, recall 1/3 → F1 0.4.
        assert!((token_f1("red car", "a red big bike") - 0.4).abs() < 1e-9);
        // Repeated words count once per occurrence in the gold answer.
        assert!((token_f1("dog dog", "dog") - 2.0 / 3.0).abs() < 1e-9);
    }

    /// Answers from a list, in order, and records the prompts.
    struct Scripted {
        replies: Mutex<Vec<String>>,
        prompts: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl ChatModel for Scripted {
        fn model(&self) -> &str {
            "scripted"
        }

        async fn stream(
            &self,
            request: &ChatRequest,
            _on_delta: DeltaSink<'_>,
        ) -> Result<ChatResponse, LlmError> {
            self.complete(request).await
        }

        async fn complete(&self, request: &ChatRequest) -> Result<ChatResponse, LlmError> {
            self.prompts
                .lock()
                .unwrap()
                .push(request.messages[0].content.clone());
            let content = self.replies.lock().unwrap().remove(0);
            Ok(ChatResponse {
                content,
                ..ChatResponse::default()
            })
        }
    }

    #[tokio::test]
    async fn answers_are_judged_and_tallied_per_category() {
        let model = Arc::new(Scripted {
            replies: Mutex::new(vec![
                "7 May 2023".into(),
                "{\"label\": \"CORRECT\"}".into(),
                "Paris".into(),
                "not json".into(),
                "{\"label\": \"WRONG\"}".into(),
            ]),
            prompts: Mutex::new(Vec::new()),
        });
        let role = RoleModel::new(mnemo::config::ModelRole::Chat, model.clone(), 1000);
        let models = AnswerModels {
            answer: role.clone(),
            judge: role,
            structured_retries: 1,
        };
        let (answer, correct, f1) = answer_and_judge(&models, "When?", "7 May 2023", &[])
            .await
            .unwrap();
        assert_eq!((answer.as_str(), correct, f1), ("7 May 2023", true, 1.0));
        // A malformed verdict is asked again.
        let (_, correct, f1) = answer_and_judge(&models, "Where?", "Lyon", &[])
            .await
            .unwrap();
        assert!(!correct);
        assert_eq!(f1, 0.0);
        let prompts = model.prompts.lock().unwrap().clone();
        assert!(prompts[0].contains("Question: When?"));
        assert!(prompts[1].contains("Gold answer: 7 May 2023"));

        let mut tally = AnswerTally::default();
        tally.add("temporal", true, 1.0);
        tally.add("temporal", false, 0.5);
        tally.add("single-hop", true, 0.0);
        let report = tally.report("dated/hybrid".into(), 10, &models);
        assert_eq!(report.overall.questions, 3);
        assert_eq!(report.overall.judge_accuracy, 66.7);
        assert_eq!(report.overall.f1, 50.0);
        assert_eq!(report.categories["temporal"].judge_accuracy, 50.0);
        assert_eq!(report.categories["temporal"].f1, 75.0);
    }
}
