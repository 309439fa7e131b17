//! A research as a file to keep or share: Markdown, DOCX or PDF. Each carries the question,
//! the date and outcome, the report with its citations as numbered references linked to their
//! sources, and the numbered list of sources. The report is read once into a small document
//! model (headings, paragraphs, list items; text and citations) that each format writes.

mod docx;
mod pdf;

use serde::Deserialize;

use crate::store::ResearchRecord;

pub(crate) use pdf::{FontError, Fonts};

/// What `GET /research/{id}/export?format=` can make.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    #[serde(alias = "md")]
    Markdown,
    Docx,
    Pdf,
}

impl Format {
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Markdown => "text/markdown; charset=utf-8",
            Format::Docx => {
                "application/vnd.openxmlformats-officedocument.wordprocessingml.document"
            }
            Format::Pdf => "application/pdf",
        }
    }

    pub fn extension(self) -> &'static str {
        match self {
            Format::Markdown => "md",
            Format::Docx => "docx",
            Format::Pdf => "pdf",
        }
    }
}

/// Why a research could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// It has no report (it failed, or is still running).
    #[error("this research has no report to export ({0})")]
    NoReport(String),
    #[error(transparent)]
    Font(#[from] FontError),
    #[error("writing the {0} file failed: {1}")]
    Write(&'static str, String),
}

/// A piece of text in a block.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Span {
    Text(String),
    /// A citation of the numbered source.
    Cite(usize),
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Block {
    Heading(u8, Vec<Span>),
    Paragraph(Vec<Span>),
    Item(Vec<Span>),
}

/// One numbered source.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Reference {
    pub n: usize,
    pub title: String,
    pub url: String,
}

/// A research read for export.
#[derive(Debug, Clone)]
pub(crate) struct Doc {
    pub title: String,
    pub query: String,
    /// "Researched 2026-12-05 · completed · 7 sources".
    pub byline: String,
    pub blocks: Vec<Block>,
    pub references: Vec<Reference>,
}

impl Doc {
    pub(crate) fn of(record: &ResearchRecord) -> Result<Self, ExportError> {
        let Some(report) = record.report.as_deref().filter(|r| !r.trim().is_empty()) else {
            return Err(ExportError::NoReport(record.status.to_string()));
        };
        #[derive(Deserialize)]
        struct Cited {
            n: usize,
            url: String,
            #[serde(default)]
            title: String,
        }
        let cited: Vec<Cited> = serde_json::from_value(record.sources.clone()).unwrap_or_default();
        let references: Vec<Reference> = cited
            .into_iter()
            .map(|source| Reference {
                n: source.n,
                title: if source.title.trim().is_empty() {
                    source.url.clone()
                } else {
                    source.title
                },
                url: source.url,
            })
            .collect();
        // The stored report ends with its list of sources: the file lists them itself.
        let body = report.split("\n## Sources").next().unwrap_or(report);
        let mut blocks = parse(body, references.len());
        let title = match blocks.first() {
            Some(Block::Heading(1, spans)) => {
                let title = plain(spans);
                blocks.remove(0);
                title
            }
            _ => record.query.clone(),
        };
        let date = record
            .finished_at
            .unwrap_or(record.created_at)
            .format("%Y-%m-%d");
        let byline = format!(
            "Researched {date} · {} · {} source{}",
            record.status,
            references.len(),
            if references.len() == 1 { "" } else { "s" }
        );
        Ok(Self {
            title,
            query: record.query.clone(),
            byline,
            blocks,
            references,
        })
    }

    pub(crate) fn url_of(&self, n: usize) -> Option<&str> {
        self.references
            .iter()
            .find(|reference| reference.n == n)
            .map(|reference| reference.url.as_str())
    }
}

/// Writes `record` in `format`.
pub fn export(
    record: &ResearchRecord,
    format: Format,
    fonts: &Fonts,
) -> Result<Vec<u8>, ExportError> {
    let doc = Doc::of(record)?;
    match format {
        Format::Markdown => Ok(markdown(&doc).into_bytes()),
        Format::Docx => docx::write(&doc),
        Format::Pdf => pdf::write(&doc, fonts),
    }
}

/// The file name offered for a research's export: its question, shortened, in ASCII.
pub fn file_name(record: &ResearchRecord, format: Format) -> String {
    let mut stem: String = record
        .query
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    while stem.contains("--") {
        stem = stem.replace("--", "-");
    }
    let stem = stem.trim_matches('-');
    let stem = crate::text::prefix(stem, 60).trim_end_matches('-');
    let stem = if stem.is_empty() { "research" } else { stem };
    format!("{stem}.{}", format.extension())
}

/// The text of spans, citations as `[n]`.
pub(crate) fn plain(spans: &[Span]) -> String {
    spans
        .iter()
        .map(|span| match span {
            Span::Text(text) => text.clone(),
            Span::Cite(n) => format!("[{n}]"),
        })
        .collect()
}

/// The report's markdown as blocks: `#` headings, `-`/`*`/`1.` list items, paragraphs (lines
/// joined); `**`/`__`/backticks dropped; citations of listed sources as `Cite`.
pub(crate) fn parse(report: &str, sources: usize) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut paragraph: Vec<String> = Vec::new();
    let flush = |paragraph: &mut Vec<String>, blocks: &mut Vec<Block>| {
        if !paragraph.is_empty() {
            blocks.push(Block::Paragraph(spans(&paragraph.join(" "), sources)));
            paragraph.clear();
        }
    };
    for line in report.lines() {
        let line = line.trim();
        if line.is_empty() {
            flush(&mut paragraph, &mut blocks);
            continue;
        }
        let hashes = line.chars().take_while(|c| *c == '#').count();
        if (1..=6).contains(&hashes) && line[hashes..].starts_with(' ') {
            flush(&mut paragraph, &mut blocks);
            blocks.push(Block::Heading(
                hashes as u8,
                spans(line[hashes..].trim(), sources),
            ));
            continue;
        }
        let item = line
            .strip_prefix("- ")
            .or_else(|| line.strip_prefix("* "))
            .or_else(|| {
                let digits = line.chars().take_while(char::is_ascii_digit).count();
                (digits > 0 && line[digits..].starts_with(". ")).then(|| &line[digits + 2..])
            });
        match item {
            Some(item) => {
                flush(&mut paragraph, &mut blocks);
                blocks.push(Block::Item(spans(item.trim(), sources)));
            }
            None => paragraph.push(line.to_string()),
        }
    }
    flush(&mut paragraph, &mut blocks);
    blocks
}

/// A line's text and citations (`[1]`, `[1, 2]`: one `Cite` each; other brackets are text).
fn spans(line: &str, sources: usize) -> Vec<Span> {
    let line = line.replace("**", "").replace("__", "").replace('`', "");
    let mut out = Vec::new();
    let mut text = String::new();
    let mut rest = line.as_str();
    while let Some(open) = rest.find('[') {
        text.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let numbers: Option<Vec<usize>> = after.find(']').and_then(|close| {
            if after[close + 1..].starts_with('(') {
                return None;
            }
            after[..close]
                .split(',')
                .map(|part| part.trim().parse::<usize>().ok())
                .collect::<Option<Vec<usize>>>()
                .filter(|numbers| numbers.iter().all(|n| (1..=sources).contains(n)))
        });
        match numbers {
            Some(numbers) => {
                if !text.is_empty() {
                    out.push(Span::Text(std::mem::take(&mut text)));
                }
                out.extend(numbers.into_iter().map(Span::Cite));
                let close = after.find(']').unwrap_or(0);
                rest = &after[close + 1..];
            }
            None => {
                text.push('[');
                rest = after;
            }
        }
    }
    text.push_str(rest);
    if !text.is_empty() {
        out.push(Span::Text(text));
    }
    out
}

/// Markdown: citations as `[[n]](url)`, the sources as a numbered list of links.
pub(crate) fn markdown(doc: &Doc) -> String {
    let line = |spans: &[Span]| -> String {
        spans
            .iter()
            .map(|span| match span {
                Span::Text(text) => text.clone(),
                Span::Cite(n) => match doc.url_of(*n) {
                    Some(url) => format!("[[{n}]]({})", markdown_url(url)),
                    None => format!("[{n}]"),
                },
            })
            .collect()
    };
    let mut out = format!(
        "# {}\n\n> {}\n>\n> {}\n",
        doc.title,
        doc.query.replace('\n', " "),
        doc.byline
    );
    for block in &doc.blocks {
        match block {
            Block::Heading(level, spans) => out.push_str(&format!(
                "\n{} {}\n",
                "#".repeat(usize::from(*level).max(2)),
                line(spans)
            )),
            Block::Paragraph(spans) => out.push_str(&format!("\n{}\n", line(spans))),
            Block::Item(spans) => out.push_str(&format!("- {}\n", line(spans))),
        }
    }
    if !doc.references.is_empty() {
        out.push_str("\n## Sources\n\n");
        for reference in &doc.references {
            out.push_str(&format!(
                "{}. [{}]({})\n",
                reference.n,
                reference.title.replace(['[', ']'], ""),
                markdown_url(&reference.url)
            ));
        }
    }
    out
}

/// A URL as a markdown link target: spaces and parentheses escaped.
fn markdown_url(url: &str) -> String {
    url.replace(' ', "%20")
        .replace('(', "%28")
        .replace(')', "%29")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(query: &str, report: &str) -> ResearchRecord {
        ResearchRecord {
            id: crate::store::RunId::new(),
            run_id: crate::store::RunId::new(),
            thread_id: None,
            query: query.into(),
            model: None,
            status: crate::store::RunStatus::Completed,
            config: serde_json::json!({}),
            report: Some(report.into()),
            sources: serde_json::json!([{ "n": 1, "url": "https://example.org/a", "title": "A" }]),
            usage: serde_json::json!({}),
            stage_timings: serde_json::json!({}),
            word_count: 3,
            source_count: 1,
            duration_ms: None,
            error: None,
            created_at: chrono::Utc::now(),
            finished_at: None,
        }
    }

    /// A server without a usable font answers with what to install, for Latin text and for
    /// Chinese text a Latin font cannot draw; Markdown and DOCX need no font.
    #[test]
    fn a_pdf_without_a_usable_font_says_which_package_to_install() {
        let none = Fonts::default();
        let english = record("tides", "# Tides\n\nThe moon pulls [1].");
        let error = export(&english, Format::Pdf, &none).unwrap_err();
        assert!(
            matches!(error, ExportError::Font(FontError::NoFont)),
            "{error}"
        );
        assert!(error.to_string().contains("fonts-dejavu-core"));
        let chinese = record("潮汐", "# 潮汐\n\n月亮的引力 [1]。");
        let error = export(&chinese, Format::Pdf, &none).unwrap_err();
        assert!(
            matches!(error, ExportError::Font(FontError::NoCjkFont)),
            "{error}"
        );
        assert!(error.to_string().contains("fonts-noto-cjk"));
        assert!(export(&english, Format::Markdown, &none).is_ok());
        assert!(
            export(&english, Format::Docx, &none)
                .unwrap()
                .starts_with(b"PK")
        );
        let failed = ResearchRecord {
            report: None,
            status: crate::store::RunStatus::Failed,
            ..english
        };
        assert!(matches!(
            export(&failed, Format::Markdown, &none),
            Err(ExportError::NoReport(_))
        ));
    }

    #[test]
    fn a_report_reads_into_blocks_with_citations_of_listed_sources_only() {
        let report = "# Tides\n\nThe moon pulls [1]. Springs\nare higher [1, 2] than [docs](http://x) and [7].\n\n## Why\n\n- Gravity [2]\n1. Order\n\n## Sources\n\n[1] A — http://a\n";
        let blocks = parse(report.split("\n## Sources").next().unwrap(), 2);
        assert_eq!(
            blocks,
            vec![
                Block::Heading(1, vec![Span::Text("Tides".into())]),
                Block::Paragraph(vec![
                    Span::Text("The moon pulls ".into()),
                    Span::Cite(1),
                    Span::Text(". Springs are higher ".into()),
                    Span::Cite(1),
                    Span::Cite(2),
                    Span::Text(" than [docs](http://x) and [7].".into()),
                ]),
                Block::Heading(2, vec![Span::Text("Why".into())]),
                Block::Item(vec![Span::Text("Gravity ".into()), Span::Cite(2)]),
                Block::Item(vec![Span::Text("Order".into())]),
            ]
        );
    }
}
