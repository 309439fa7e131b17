//! `mnemo import-chat FILE`: a past conversation becomes a thread of the user's history and
//! its memories, through the same path as `POST /v1/threads/{id}/import`. Reads mnemo's own
//! format (`{"title", "messages": [{"role", "content", "author"?, "created_at"?}]}`, one or a
//! list) and ChatGPT's export (`conversations.json`: the main branch of each conversation).

use std::path::Path;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde_json::{Value, json};

use super::Failure;
use super::memory::{Backend, RemoteBody, Target, parse_json};
use mnemo::config::Settings;
use mnemo::store::{NewMessage, Role};

/// One conversation read from a file.
#[derive(Debug, Clone)]
pub struct Conversation {
    pub title: String,
    pub messages: Vec<NewMessage>,
}

/// Reads the conversations of a file in either format.
pub fn parse(text: &str) -> Result<Vec<Conversation>, String> {
    let value: Value = serde_json::from_str(text).map_err(|error| format!("not JSON: {error}"))?;
    let items: Vec<&Value> = match &value {
        Value::Array(items) => items.iter().collect(),
        Value::Object(_) => vec![&value],
        _ => return Err("expected a conversation object or a list of them".into()),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(index, item)| {
            if item.get("mapping").is_some() {
                chatgpt(item)
            } else {
                own(item)
            }
            .map_err(|error| format!("conversation {}: {error}", index + 1))
        })
        .filter(|conversation| {
            conversation
                .as_ref()
                .map_or(true, |conversation| !conversation.messages.is_empty())
        })
        .collect()
}

fn own(item: &Value) -> Result<Conversation, String> {
    let messages: Vec<NewMessage> = serde_json::from_value(
        item.get("messages")
            .cloned()
            .ok_or("no \"messages\" list")?,
    )
    .map_err(|error| error.to_string())?;
    Ok(Conversation {
        title: item["title"]
            .as_str()
            .unwrap_or("Imported conversation")
            .to_string(),
        messages,
    })
}

/// ChatGPT's export: nodes linked by `parent`; the conversation is the branch that ends at
/// `current_node`. System and tool messages and empty ones are left out.
fn chatgpt(item: &Value) -> Result<Conversation, String> {
    let mapping = item["mapping"]
        .as_object()
        .ok_or("\"mapping\" is not an object")?;
    let mut node = item["current_node"]
        .as_str()
        .map(str::to_string)
        .or_else(|| {
            // No current node: the last leaf in the mapping.
            mapping
                .iter()
                .filter(|(_, node)| node["children"].as_array().is_none_or(Vec::is_empty))
                .map(|(id, _)| id.clone())
                .next_back()
        })
        .ok_or("the conversation has no messages")?;
    let mut branch = Vec::new();
    let mut seen = std::collections::HashSet::new();
    while let Some(entry) = mapping.get(&node) {
        if !seen.insert(node.clone()) {
            return Err("the message tree has a cycle".into());
        }
        branch.push(entry);
        match entry["parent"].as_str() {
            Some(parent) => node = parent.to_string(),
            None => break,
        }
    }
    branch.reverse();
    let messages = branch
        .into_iter()
        .filter_map(|entry| {
            let message = entry.get("message")?;
            let role = match message["author"]["role"].as_str()? {
                "user" => Role::User,
                "assistant" => Role::Assistant,
                _ => return None,
            };
            let content: Vec<&str> = message["content"]["parts"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let content = content.join("\n").trim().to_string();
            if content.is_empty() {
                return None;
            }
            let created_at = message["create_time"]
                .as_f64()
                .and_then(|seconds| DateTime::<Utc>::from_timestamp_micros((seconds * 1e6) as i64));
            Some(NewMessage {
                role,
                content,
                author: None,
                created_at,
            })
        })
        .collect();
    Ok(Conversation {
        title: item["title"]
            .as_str()
            .unwrap_or("ChatGPT conversation")
            .to_string(),
        messages,
    })
}

pub async fn run(settings: &Settings, target: Target, path: &Path) -> Result<(), Failure> {
    let text = std::fs::read_to_string(path)
        .map_err(|error| Failure::usage(format!("reading {}: {error}", path.display())))?;
    let conversations =
        parse(&text).map_err(|error| Failure::usage(format!("{}: {error}", path.display())))?;
    if conversations.is_empty() {
        return Err(Failure::usage(format!(
            "{}: no messages to import",
            path.display()
        )));
    }
    let backend = Backend::open(settings, target).await?;
    let outcome = import_all(settings, &backend, conversations).await;
    backend.close().await;
    outcome
}

async fn import_all(
    settings: &Settings,
    backend: &Backend,
    conversations: Vec<Conversation>,
) -> Result<(), Failure> {
    for conversation in conversations {
        let count = conversation.messages.len();
        let title = conversation.title.clone();
        let thread = match backend {
            Backend::Remote { .. } => remote(backend, conversation).await?,
            Backend::Embedded {
                engine,
                store,
                user,
                ..
            } => {
                let models = mnemo::llm::roles::Models::from_settings(&settings.llm);
                let writer =
                    mnemo::memory::writer::MemoryWriter::new(store.clone(), engine.clone(), models);
                let thread = store
                    .user(*user)
                    .create_thread(&conversation.title, false)
                    .await?;
                writer
                    .import_conversation(*user, thread.id, conversation.messages)
                    .await
                    .map_err(|error| Failure::usage(error.to_string()))?;
                while writer.work_one().await? {}
                engine
                    .wait_recallable(Duration::from_secs(600))
                    .await
                    .map_err(|error| Failure::other(error.to_string()))?;
                thread.id.to_string()
            }
        };
        println!("{thread}\t{count} messages\t{title}");
    }
    Ok(())
}

/// Creates the thread on the server, imports into it, and waits for its memory job.
async fn remote(backend: &Backend, conversation: Conversation) -> Result<String, Failure> {
    let created = parse_json(
        &backend
            .remote(
                reqwest::Method::POST,
                "/v1/threads",
                Some(RemoteBody::Json(json!({ "title": conversation.title }))),
            )
            .await?,
    )?;
    let thread = created["id"]
        .as_str()
        .ok_or_else(|| Failure::other("the server returned no thread id"))?
        .to_string();
    let imported = parse_json(
        &backend
            .remote(
                reqwest::Method::POST,
                &format!("/v1/threads/{thread}/import"),
                Some(RemoteBody::Json(
                    json!({ "messages": conversation.messages }),
                )),
            )
            .await?,
    )?;
    let job = imported["job"].as_str().unwrap_or_default().to_string();
    for _ in 0..1200 {
        let state = parse_json(
            &backend
                .remote(reqwest::Method::GET, &format!("/v1/jobs/{job}"), None)
                .await?,
        )?;
        match state["status"].as_str() {
            Some("done") => return Ok(thread),
            Some("failed") => {
                return Err(Failure::other(format!(
                    "the server could not write the memories of thread {thread}"
                )));
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
    Err(Failure::other(format!(
        "thread {thread} is imported; its memories are still being written"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_mnemo_and_chatgpt_formats() {
        let own = r#"{"title": "Trip", "messages": [
            {"role": "user", "author": "Caroline", "content": "I went to Kyoto", "created_at": "2023-05-08T13:56:00Z"},
            {"role": "assistant", "content": "How was it?"}]}"#;
        let parsed = parse(own).unwrap();
        assert_eq!(parsed.len(), 1);
        assert_eq!(parsed[0].title, "Trip");
        assert_eq!(parsed[0].messages[0].author.as_deref(), Some("Caroline"));
        assert_eq!(parsed[0].messages[1].role, Role::Assistant);

        let chatgpt = r#"[{"title": "Cats", "current_node": "c", "mapping": {
            "root": {"id": "root", "message": null, "parent": null, "children": ["s"]},
            "s": {"id": "s", "parent": "root", "children": ["a"], "message": {"author": {"role": "system"}, "content": {"parts": ["be nice"]}}},
            "a": {"id": "a", "parent": "s", "children": ["b", "x"], "message": {"author": {"role": "user"}, "create_time": 1683554160.5, "content": {"parts": ["My cat is called Miso"]}}},
            "x": {"id": "x", "parent": "a", "children": [], "message": {"author": {"role": "assistant"}, "content": {"parts": ["an abandoned branch"]}}},
            "b": {"id": "b", "parent": "a", "children": ["c"], "message": {"author": {"role": "assistant"}, "content": {"parts": ["Miso is a lovely name."]}}},
            "c": {"id": "c", "parent": "b", "children": [], "message": {"author": {"role": "user"}, "content": {"parts": ["", "thanks"]}}}
        }}]"#;
        let parsed = parse(chatgpt).unwrap();
        let messages = &parsed[0].messages;
        let said: Vec<(Role, &str)> = messages
            .iter()
            .map(|m| (m.role, m.content.as_str()))
            .collect();
        assert_eq!(
            said,
            [
                (Role::User, "My cat is called Miso"),
                (Role::Assistant, "Miso is a lovely name."),
                (Role::User, "thanks"),
            ]
        );
        assert_eq!(
            messages[0].created_at.unwrap().to_rfc3339(),
            "2023-05-08T13:56:00.500+00:00"
        );
        assert!(parse("[1, 2]").is_err());
        assert!(parse("not json").unwrap_err().contains("not JSON"));
    }
}
