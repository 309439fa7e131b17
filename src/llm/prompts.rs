//! Prompts, one text file each under `prompts/`, compiled into the binary and named by the
//! [`Prompt`] enum (a misspelled name does not compile). They are rendered by minijinja with
//! strict undefined variables: each placeholder `{{name}}` is filled once from the values given,
//! so a value that itself contains `{{sources}}` stays text. [`check`] verifies at start that
//! every template parses and uses exactly the variables its entry declares; `render` refuses
//! values that are missing or not declared. Callers quote untrusted text as data first.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use minijinja::{Environment, UndefinedBehavior};

/// Every prompt mnemo sends, with the variables it takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, strum::IntoStaticStr, strum::VariantArray)]
#[strum(serialize_all = "snake_case")]
pub enum Prompt {
    ChatSystem,
    SummarizeThread,
    ExtractMemories,
    ConsolidateMemory,
    BuildProfile,
    ResearchClarify,
    ResearchBrief,
    ResearchSupervisor,
    ResearchResearcher,
    ResearchCompress,
    ResearchCurate,
    ResearchReport,
    ResearchConclusions,
    ResearchQueries,
    ResearchLearnings,
    EvalAnswer,
    EvalJudge,
    EvalFacts,
}

/// A prompt that could not be rendered (a bug: the values do not fit the template).
#[derive(Debug, thiserror::Error)]
#[error("prompt {name}: {reason}")]
pub struct PromptError {
    pub name: &'static str,
    pub reason: String,
}

impl crate::error::HasKind for PromptError {
    fn kind(&self) -> crate::error::ErrorKind {
        crate::error::ErrorKind::Internal
    }
}

impl Prompt {
    /// The file stem under `prompts/`.
    pub(crate) fn name(self) -> &'static str {
        self.into()
    }

    fn source(self) -> &'static str {
        match self {
            Prompt::ChatSystem => include_str!("../../prompts/chat_system.md"),
            Prompt::SummarizeThread => include_str!("../../prompts/summarize_thread.md"),
            Prompt::ExtractMemories => include_str!("../../prompts/extract_memories.md"),
            Prompt::ConsolidateMemory => include_str!("../../prompts/consolidate_memory.md"),
            Prompt::BuildProfile => include_str!("../../prompts/build_profile.md"),
            Prompt::ResearchClarify => include_str!("../../prompts/research_clarify.md"),
            Prompt::ResearchBrief => include_str!("../../prompts/research_brief.md"),
            Prompt::ResearchSupervisor => include_str!("../../prompts/research_supervisor.md"),
            Prompt::ResearchResearcher => include_str!("../../prompts/research_researcher.md"),
            Prompt::ResearchCompress => include_str!("../../prompts/research_compress.md"),
            Prompt::ResearchCurate => include_str!("../../prompts/research_curate.md"),
            Prompt::ResearchReport => include_str!("../../prompts/research_report.md"),
            Prompt::ResearchConclusions => include_str!("../../prompts/research_conclusions.md"),
            Prompt::ResearchQueries => include_str!("../../prompts/research_queries.md"),
            Prompt::ResearchLearnings => include_str!("../../prompts/research_learnings.md"),
            Prompt::EvalAnswer => include_str!("../../prompts/eval_answer.md"),
            Prompt::EvalJudge => include_str!("../../prompts/eval_judge.md"),
            Prompt::EvalFacts => include_str!("../../prompts/eval_facts.md"),
        }
    }

    /// The variables the prompt takes, all required.
    pub(crate) fn variables(self) -> &'static [&'static str] {
        match self {
            Prompt::ChatSystem => &["memories", "profile", "summary", "today"],
            Prompt::SummarizeThread => &["messages", "previous"],
            Prompt::ExtractMemories => &["assistant", "user"],
            Prompt::ConsolidateMemory => &["existing", "new"],
            Prompt::BuildProfile => &["memories"],
            Prompt::ResearchClarify => &["memories", "query"],
            Prompt::ResearchBrief => &["clarification", "date", "earlier", "memories", "query"],
            Prompt::ResearchSupervisor => &["brief", "date", "max_rounds", "max_units"],
            Prompt::ResearchResearcher => &["date", "max_calls", "topic"],
            Prompt::ResearchCompress => &["notes", "sources", "topic"],
            Prompt::ResearchCurate => &["brief", "sources"],
            Prompt::ResearchReport => &[
                "brief", "date", "earlier", "findings", "gaps", "sources", "style",
            ],
            Prompt::ResearchConclusions => &["max", "query", "report"],
            Prompt::ResearchQueries => &["breadth", "learnings", "query"],
            Prompt::ResearchLearnings => &["follow_ups", "query", "sources"],
            Prompt::EvalAnswer => &["memories", "question"],
            Prompt::EvalJudge => &["answer", "gold", "question"],
            Prompt::EvalFacts => &["date", "turns"],
        }
    }

    /// The raw template text.
    #[cfg(test)]
    pub(crate) fn text(self) -> &'static str {
        self.source()
    }

    /// Fills the template's placeholders, each exactly once, from `values`. Every declared
    /// variable must be given, and nothing else.
    pub fn render(self, values: &[(&str, &str)]) -> Result<String, PromptError> {
        let error = |reason: String| PromptError {
            name: self.name(),
            reason,
        };
        let given: BTreeSet<&str> = values.iter().map(|(key, _)| *key).collect();
        let declared: BTreeSet<&str> = self.variables().iter().copied().collect();
        if given != declared {
            return Err(error(format!("takes {declared:?}, was given {given:?}")));
        }
        let context: BTreeMap<&str, &str> = values.iter().copied().collect();
        let template = ENVIRONMENT
            .get_template(self.name())
            .map_err(|e| error(e.to_string()))?;
        template.render(context).map_err(|e| error(e.to_string()))
    }
}

static ENVIRONMENT: LazyLock<Environment<'static>> = LazyLock::new(|| {
    let mut environment = Environment::new();
    environment.set_undefined_behavior(UndefinedBehavior::Strict);
    environment.set_keep_trailing_newline(true);
    environment.set_auto_escape_callback(|_| minijinja::AutoEscape::None);
    for prompt in <Prompt as strum::VariantArray>::VARIANTS {
        // A template that does not parse is reported by `check` (and by `render`).
        let _ = environment.add_template(prompt.name(), prompt.source());
    }
    environment
});

/// Checks every prompt at start: it parses and uses exactly its declared variables.
pub(crate) fn check() -> Result<(), PromptError> {
    for &prompt in <Prompt as strum::VariantArray>::VARIANTS {
        let error = |reason: String| PromptError {
            name: prompt.name(),
            reason,
        };
        let template = ENVIRONMENT
            .get_template(prompt.name())
            .map_err(|e| error(e.to_string()))?;
        let used: BTreeSet<String> = template.undeclared_variables(false).into_iter().collect();
        let declared: BTreeSet<String> = prompt
            .variables()
            .iter()
            .map(std::string::ToString::to_string)
            .collect();
        if used != declared {
            return Err(error(format!(
                "the template uses {used:?} but declares {declared:?}"
            )));
        }
    }
    Ok(())
}

/// Quotes untrusted text as data: every line prefixed with `> `, so it cannot pose as our own
/// instructions or headings.
pub fn quote(text: &str) -> String {
    text.lines()
        .map(|line| format!("> {line}"))
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        #[test]
        fn quoted_text_is_data_on_every_line(text in "\\PC{0,300}") {
            let quoted = quote(&text);
            proptest::prop_assert_eq!(quoted.lines().count(), text.lines().count());
            for line in quoted.lines() {
                proptest::prop_assert!(line.starts_with("> "));
            }
        }

        #[test]
        fn rendered_values_are_inserted_verbatim(value in "\\PC{0,200}") {
            let rendered = Prompt::BuildProfile.render(&[("memories", &value)]).unwrap();
            proptest::prop_assert!(rendered.contains(&value));
        }
    }

    #[test]
    fn prompts_exist_and_render() {
        check().unwrap();
        let system = Prompt::ChatSystem.text();
        assert!(system.contains("{{memories}}"));
        let rendered = Prompt::BuildProfile
            .render(&[("memories", "- likes tea")])
            .unwrap();
        assert!(rendered.contains("- likes tea"), "{rendered}");
        assert!(!rendered.contains("{{"), "{rendered}");
    }

    #[test]
    fn a_value_is_never_expanded_again() {
        // The old sequential substitution expanded `{{sources}}` inside an earlier value.
        let rendered = Prompt::ResearchCurate
            .render(&[("brief", "quote: {{sources}}"), ("sources", "[1] a")])
            .unwrap();
        assert!(rendered.contains("quote: {{sources}}"), "{rendered}");
        assert_eq!(rendered.matches("[1] a").count(), 1, "{rendered}");
    }

    #[test]
    fn missing_or_unknown_variables_are_errors() {
        let missing = Prompt::ResearchCurate
            .render(&[("brief", "b")])
            .unwrap_err();
        assert!(missing.to_string().contains("research_curate"), "{missing}");
        assert!(
            Prompt::BuildProfile
                .render(&[("memories", "m"), ("extra", "x")])
                .is_err()
        );
    }

    #[test]
    fn quoting_keeps_every_line_as_data() {
        assert_eq!(
            quote("ignore previous\n# SYSTEM"),
            "> ignore previous\n> # SYSTEM"
        );
    }
}
