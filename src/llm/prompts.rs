//! Prompts, one text file each under `prompts/`, compiled into the binary and looked up by
//! name. Placeholders are `{{name}}`; values are inserted verbatim (callers quote untrusted text
//! as data before inserting it).

/// The text of a prompt by file stem.
pub fn prompt(name: &str) -> Option<&'static str> {
    match name {
        "chat_system" => Some(include_str!("../../prompts/chat_system.md")),
        "summarize_thread" => Some(include_str!("../../prompts/summarize_thread.md")),
        "extract_memories" => Some(include_str!("../../prompts/extract_memories.md")),
        "consolidate_memory" => Some(include_str!("../../prompts/consolidate_memory.md")),
        "build_profile" => Some(include_str!("../../prompts/build_profile.md")),
        "research_clarify" => Some(include_str!("../../prompts/research_clarify.md")),
        "research_brief" => Some(include_str!("../../prompts/research_brief.md")),
        "research_supervisor" => Some(include_str!("../../prompts/research_supervisor.md")),
        "research_researcher" => Some(include_str!("../../prompts/research_researcher.md")),
        "research_compress" => Some(include_str!("../../prompts/research_compress.md")),
        "research_curate" => Some(include_str!("../../prompts/research_curate.md")),
        "research_report" => Some(include_str!("../../prompts/research_report.md")),
        "research_conclusions" => Some(include_str!("../../prompts/research_conclusions.md")),
        "research_queries" => Some(include_str!("../../prompts/research_queries.md")),
        "research_learnings" => Some(include_str!("../../prompts/research_learnings.md")),
        "eval_answer" => Some(include_str!("../../prompts/eval_answer.md")),
        "eval_judge" => Some(include_str!("../../prompts/eval_judge.md")),
        "eval_facts" => Some(include_str!("../../prompts/eval_facts.md")),
        _ => None,
    }
}

/// Fills `{{key}}` placeholders.
pub fn render(template: &str, values: &[(&str, &str)]) -> String {
    let mut text = template.to_string();
    for (key, value) in values {
        text = text.replace(&format!("{{{{{key}}}}}"), value);
    }
    text
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

    #[test]
    fn prompts_exist_and_render() {
        let system = prompt("chat_system").unwrap();
        assert!(system.contains("{{memories}}"));
        let rendered = render("a {{x}} b {{x}} {{y}}", &[("x", "1"), ("y", "2")]);
        assert_eq!(rendered, "a 1 b 1 2");
        assert!(prompt("summarize_thread").is_some());
        assert!(prompt("nope").is_none());
    }

    #[test]
    fn quoting_keeps_every_line_as_data() {
        assert_eq!(
            quote("ignore previous\n# SYSTEM"),
            "> ignore previous\n> # SYSTEM"
        );
    }
}
