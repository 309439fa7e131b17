//! Readable text from fetched or ingested documents: HTML (boilerplate dropped, block
//! structure kept as paragraphs), PDF, and plain text. Pure functions, no I/O.

use scraper::{ElementRef, Html, Node, Selector};

/// The text of a document, with its title when it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extracted {
    pub title: Option<String>,
    /// Paragraphs separated by blank lines.
    pub text: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ExtractError {
    #[error("the PDF could not be read: {0}")]
    Pdf(String),
    #[error("unsupported content type {0:?}")]
    Unsupported(String),
}

/// Elements whose content is never readable text.
const SKIPPED: &[&str] = &[
    "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object", "head", "nav",
    "footer", "aside", "form", "button", "select", "textarea",
];

/// Elements that end a paragraph.
const BLOCKS: &[&str] = &[
    "p",
    "div",
    "section",
    "article",
    "main",
    "header",
    "li",
    "ul",
    "ol",
    "dl",
    "dt",
    "dd",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "blockquote",
    "pre",
    "table",
    "tr",
    "br",
    "hr",
    "figure",
    "figcaption",
    "details",
    "summary",
    "address",
];

/// A main region is preferred over the whole body when it holds at least this share of the
/// body's text.
const MAIN_SHARE: f64 = 0.3;

/// Extracts the title and the readable text of an HTML page.
pub fn html_to_text(html: &str) -> Extracted {
    let document = Html::parse_document(html);
    let title = selector("title")
        .and_then(|s| document.select(&s).next())
        .map(|t| collapse(&t.text().collect::<String>()))
        .filter(|t| !t.is_empty());
    let root = document.root_element();
    let body = selector("body")
        .and_then(|s| document.select(&s).next())
        .unwrap_or(root);
    let whole = render(body);
    let main = selector("article, main, [role=main]")
        .and_then(|s| document.select(&s).next())
        .map(render)
        .filter(|text| text.len() as f64 >= whole.len() as f64 * MAIN_SHARE);
    Extracted {
        title,
        text: main.unwrap_or(whole),
    }
}

/// Extracts the text of a PDF document.
pub fn pdf_to_text(bytes: &[u8]) -> Result<String, ExtractError> {
    // pdf-extract panics on some malformed files; a bad upload must not take a worker down.
    let result = std::panic::catch_unwind(|| pdf_extract::extract_text_from_mem(bytes));
    match result {
        Ok(Ok(text)) => Ok(paragraphs(&text)),
        Ok(Err(error)) => Err(ExtractError::Pdf(error.to_string())),
        Err(_) => Err(ExtractError::Pdf("malformed document".into())),
    }
}

/// Extracts text by content type (`text/html`, `application/pdf`, `text/*`, markdown).
pub fn by_content_type(content_type: &str, bytes: &[u8]) -> Result<Extracted, ExtractError> {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "text/html" | "application/xhtml+xml" => Ok(html_to_text(&String::from_utf8_lossy(bytes))),
        "application/pdf" => Ok(Extracted {
            title: None,
            text: pdf_to_text(bytes)?,
        }),
        "" | "application/json" | "application/xml" | "text/xml" | "application/markdown" => {
            Ok(plain(bytes))
        }
        other if other.starts_with("text/") => Ok(plain(bytes)),
        other => Err(ExtractError::Unsupported(other.to_string())),
    }
}

fn plain(bytes: &[u8]) -> Extracted {
    Extracted {
        title: None,
        text: paragraphs(&String::from_utf8_lossy(bytes)),
    }
}

fn selector(css: &str) -> Option<Selector> {
    Selector::parse(css).ok()
}

/// The text below `element`, one paragraph per block element.
fn render(element: ElementRef<'_>) -> String {
    let mut out = String::new();
    walk(element, &mut out);
    paragraphs(&out)
}

fn walk(element: ElementRef<'_>, out: &mut String) {
    let name = element.value().name();
    if SKIPPED.contains(&name) || element.value().attr("hidden").is_some() {
        return;
    }
    let block = BLOCKS.contains(&name);
    if block {
        out.push_str("\n\n");
    }
    for child in element.children() {
        match child.value() {
            Node::Text(text) => {
                out.push_str(text);
            }
            Node::Element(_) => {
                if let Some(child) = ElementRef::wrap(child) {
                    walk(child, out);
                }
            }
            _ => {}
        }
    }
    if block {
        out.push_str("\n\n");
    } else {
        // Inline elements still separate words (`<td>a</td><td>b</td>`).
        out.push(' ');
    }
}

/// Whitespace collapsed inside paragraphs; paragraphs separated by one blank line.
pub fn paragraphs(text: &str) -> String {
    text.replace("\r\n", "\n")
        .split("\n\n")
        .map(collapse)
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_keeps_the_article_and_drops_boilerplate() {
        let html = r#"<!doctype html><html><head><title> Rust  1.95 notes </title>
            <style>body { color: red }</style><script>track("x")</script></head>
            <body><nav>Home | About</nav>
            <article><h1>What changed</h1><p>The   compiler got
            faster.</p><p>Two <b>new</b> lints.</p></article>
            <footer>© someone</footer></body></html>"#;
        let page = html_to_text(html);
        assert_eq!(page.title.as_deref(), Some("Rust 1.95 notes"));
        assert_eq!(
            page.text,
            "What changed\n\nThe compiler got faster.\n\nTwo new lints."
        );
    }

    #[test]
    fn html_without_a_main_region_uses_the_body() {
        let page = html_to_text(
            "<p>alpha</p><div>beta <span>gamma</span></div><table><tr><td>a</td><td>b</td></tr></table>",
        );
        assert_eq!(page.title, None);
        assert_eq!(page.text, "alpha\n\nbeta gamma\n\na b");
    }

    #[test]
    fn content_types_pick_the_extractor() {
        let text = by_content_type("text/plain; charset=utf-8", b"one\n\n\ntwo  words").unwrap();
        assert_eq!(text.text, "one\n\ntwo words");
        let html = by_content_type("text/html", b"<title>T</title><p>x</p>").unwrap();
        assert_eq!(html.title.as_deref(), Some("T"));
        assert!(matches!(
            by_content_type("image/png", b"\x89PNG"),
            Err(ExtractError::Unsupported(_))
        ));
        assert!(matches!(
            by_content_type("application/pdf", b"not a pdf"),
            Err(ExtractError::Pdf(_))
        ));
    }
}
