//! DOCX through `docx-rs`: the title and byline, the report's headings, paragraphs and list
//! items, each citation a hyperlink to its source, then the numbered sources.

use docx_rs::{Docx, Hyperlink, HyperlinkType, Paragraph, Run};

use super::{Block, Doc, ExportError, Span};

/// Sizes in half-points, as DOCX counts them.
const TITLE: usize = 36;
const HEADINGS: [usize; 3] = [30, 26, 24];
const LINK_COLOR: &str = "1F4E79";

pub(super) fn write(doc: &Doc) -> Result<Vec<u8>, ExportError> {
    let mut file = Docx::new()
        .add_paragraph(Paragraph::new().add_run(Run::new().add_text(&doc.title).bold().size(TITLE)))
        .add_paragraph(Paragraph::new().add_run(Run::new().add_text(&doc.query).italic()))
        .add_paragraph(Paragraph::new().add_run(Run::new().add_text(&doc.byline).size(18)));
    for block in &doc.blocks {
        let paragraph = match block {
            Block::Heading(level, spans) => {
                let size = HEADINGS[usize::from(level.saturating_sub(1)).min(2)];
                spans_into(doc, Paragraph::new(), spans, Some(size))
            }
            Block::Paragraph(spans) => spans_into(doc, Paragraph::new(), spans, None),
            Block::Item(spans) => spans_into(
                doc,
                Paragraph::new().add_run(Run::new().add_text("•  ")),
                spans,
                None,
            ),
        };
        file = file.add_paragraph(paragraph);
    }
    if !doc.references.is_empty() {
        file = file.add_paragraph(
            Paragraph::new().add_run(Run::new().add_text("Sources").bold().size(HEADINGS[0])),
        );
        for reference in &doc.references {
            file = file.add_paragraph(
                Paragraph::new()
                    .add_run(
                        Run::new().add_text(format!("{}. {} — ", reference.n, reference.title)),
                    )
                    .add_hyperlink(link(&reference.url, &reference.url)),
            );
        }
    }
    let mut bytes = Vec::new();
    file.build()
        .pack(&mut std::io::Cursor::new(&mut bytes))
        .map_err(|error| ExportError::Write("DOCX", error.to_string()))?;
    Ok(bytes)
}

fn spans_into(
    doc: &Doc,
    mut paragraph: Paragraph,
    spans: &[Span],
    size: Option<usize>,
) -> Paragraph {
    for span in spans {
        paragraph = match span {
            Span::Text(text) => {
                let run = Run::new().add_text(text);
                paragraph.add_run(match size {
                    Some(size) => run.bold().size(size),
                    None => run,
                })
            }
            Span::Cite(n) => match doc.url_of(*n) {
                Some(url) => paragraph.add_hyperlink(link(url, &format!("[{n}]"))),
                None => paragraph.add_run(Run::new().add_text(format!("[{n}]"))),
            },
        };
    }
    paragraph
}

fn link(url: &str, text: &str) -> Hyperlink {
    Hyperlink::new(url, HyperlinkType::External).add_run(
        Run::new()
            .add_text(text)
            .color(LINK_COLOR)
            .underline("single"),
    )
}
