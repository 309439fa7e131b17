//! The JSON schemas of the structured answers mnemo asks models for, sent as
//! `response_format: json_schema` where the server accepts it (OpenAI, vLLM, Ollama, LM Studio)
//! so that constrained decoding produces the shape; servers that refuse it get
//! `json_object`, then plain prompting, and every answer is still parsed, repaired and checked
//! by its caller (`llm::chat::complete_json`). The schemas say what the prompts in `prompts/`
//! ask for.

use serde_json::{Value, json};

/// A named schema for `response_format: {"type": "json_schema", …}`.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSchema {
    pub name: &'static str,
    pub schema: Value,
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({ "type": "object", "properties": properties, "required": required })
}

fn strings() -> Value {
    json!({ "type": "array", "items": { "type": "string" } })
}

/// The memory writer's extraction (`prompts/extract_memories.md`).
pub fn memories() -> JsonSchema {
    let item = object(
        json!({
            "should_remember": { "type": "boolean" },
            "kind": { "type": "string", "enum": ["fact", "preference", "event"] },
            "content": { "type": "string" },
            "importance": { "type": "integer", "minimum": 1, "maximum": 5 },
        }),
        &["kind", "content", "importance"],
    );
    JsonSchema {
        name: "memories",
        schema: object(
            json!({ "memories": { "type": "array", "items": item } }),
            &["memories"],
        ),
    }
}

/// The writer's decision about a new memory beside similar ones
/// (`prompts/consolidate_memory.md`).
pub(crate) fn decision() -> JsonSchema {
    JsonSchema {
        name: "memory_decision",
        schema: object(
            json!({
                "action": { "type": "string", "enum": ["add", "noop", "supersede"] },
                "target_id": { "type": "string" },
            }),
            &["action"],
        ),
    }
}

/// The schema of a research step's structured answer, by the step's name.
pub(crate) fn research_step(step: &str) -> Option<JsonSchema> {
    let (name, schema) = match step {
        "clarification" => (
            "clarification",
            object(
                json!({
                    "need_clarification": { "type": "boolean" },
                    "question": { "type": "string" },
                }),
                &["need_clarification"],
            ),
        ),
        "research_brief" => (
            "research_brief",
            object(json!({ "brief": { "type": "string" } }), &["brief"]),
        ),
        "plan_queries" => (
            "plan_queries",
            object(
                json!({ "queries": { "type": "array", "items": object(
                    json!({ "query": { "type": "string" }, "goal": { "type": "string" } }),
                    &["query"],
                ) } }),
                &["queries"],
            ),
        ),
        "learnings" => (
            "learnings",
            object(
                json!({ "learnings": strings(), "follow_up_questions": strings() }),
                &["learnings"],
            ),
        ),
        "curate_sources" => (
            "curate_sources",
            object(
                json!({ "sources": { "type": "array", "items": object(
                    json!({
                        "id": { "type": "integer" },
                        "relevance": { "type": "number" },
                        "credibility": { "type": "number" },
                    }),
                    &["id", "relevance", "credibility"],
                ) } }),
                &["sources"],
            ),
        ),
        "conclusions" => (
            "conclusions",
            object(json!({ "conclusions": strings() }), &["conclusions"]),
        ),
        _ => return None,
    };
    Some(JsonSchema { name, schema })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every research step that asks for JSON has its schema.
    #[test]
    fn each_structured_research_step_has_a_schema() {
        for step in [
            "clarification",
            "research_brief",
            "plan_queries",
            "learnings",
            "curate_sources",
            "conclusions",
        ] {
            let schema = research_step(step).expect(step);
            assert_eq!(schema.schema["type"], "object", "{step}");
        }
        assert!(research_step("final_report").is_none());
    }
}
