//! Readable text from fetched or ingested documents: HTML (boilerplate dropped, block
//! structure kept as paragraphs), PDF, and plain text. Pure functions, no I/O.
//!
//! The server runs these functions only in a worker process under hard memory and CPU
//! ceilings ([`extract_isolated`]): that is the guarantee. Inside it the usual hostile shapes
//! are refused early, so they cost less: HTML is walked without recursion, a page nested
//! deeper than [`MAX_NESTING`] is read as tag-stripped text instead of being parsed (the HTML
//! parser's scope checks cost its depth per tag), a PDF is refused past [`MAX_PDF_PAGES`]
//! pages or [`MAX_PDF_EXPANDED_BYTES`] of decompressed streams, and every extraction stops at
//! its [`Budget`].

use std::io::Read;
use std::time::{Duration, Instant};

mod worker;
pub(crate) use worker::extract_isolated;
pub use worker::{WORKER_COMMAND, configure, extract_with_cost, worker_main};

use ego_tree::iter::Edge;
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
    /// Past a size, page, time or memory limit: the document is refused, not half read.
    #[error("{0}")]
    TooLarge(String),
    /// The reader failed on the document (it crashed on it, or the document is malformed).
    #[error("{0}")]
    Unreadable(String),
    /// The extraction worker could not be run: the server's fault, not the document's.
    #[error("{0}")]
    Worker(String),
}

/// Deeper element nesting than this is not parsed as HTML.
pub(crate) const MAX_NESTING: usize = 512;
/// PDFs with more pages are refused.
pub(crate) const MAX_PDF_PAGES: usize = 2_000;
/// PDFs whose text-bearing streams inflate to more bytes than this are refused.
pub(crate) const MAX_PDF_EXPANDED_BYTES: u64 = 32 * 1024 * 1024;
/// One extraction may take this long.
pub(crate) const EXTRACT_TIME_LIMIT: Duration = Duration::from_secs(20);

/// When an extraction must stop (checked between pages and tree walks; the worker's CPU
/// ceiling bounds the time between checks).
#[derive(Debug, Clone)]
pub(crate) struct Budget {
    deadline: Instant,
}

impl Budget {
    pub(crate) fn new(limit: Duration) -> Self {
        Self {
            deadline: Instant::now() + limit,
        }
    }

    fn check(&self) -> Result<(), ExtractError> {
        if Instant::now() >= self.deadline {
            return Err(ExtractError::TooLarge(
                "reading the document took too long".into(),
            ));
        }
        Ok(())
    }
}

impl Default for Budget {
    fn default() -> Self {
        Self::new(EXTRACT_TIME_LIMIT)
    }
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
#[cfg(test)]
pub(crate) fn html_to_text(html: &str) -> Extracted {
    html_within(html, &Budget::default()).unwrap_or_else(|_| Extracted {
        title: None,
        text: strip_tags(html),
    })
}

fn html_within(html: &str, budget: &Budget) -> Result<Extracted, ExtractError> {
    if nested_deeper_than(html, MAX_NESTING) {
        return Ok(Extracted {
            title: None,
            text: strip_tags(html),
        });
    }
    let document = Html::parse_document(html);
    budget.check()?;
    let title = selector("title")
        .and_then(|s| document.select(&s).next())
        .map(|t| collapse(&t.text().collect::<String>()))
        .filter(|t| !t.is_empty());
    let root = document.root_element();
    let body = selector("body")
        .and_then(|s| document.select(&s).next())
        .unwrap_or(root);
    let whole = render(body, budget)?;
    let main = match selector("article, main, [role=main]").and_then(|s| document.select(&s).next())
    {
        Some(region) => Some(render(region, budget)?)
            .filter(|text| text.len() as f64 >= whole.len() as f64 * MAIN_SHARE),
        None => None,
    };
    Ok(Extracted {
        title,
        text: main.unwrap_or(whole),
    })
}

fn pdf_within(bytes: &[u8], budget: &Budget) -> Result<String, ExtractError> {
    // pdf-extract panics on some malformed files; a bad upload must not take a worker down.
    let result = std::panic::catch_unwind(|| -> Result<String, ExtractError> {
        let document = pdf_extract::Document::load_mem(bytes)
            .map_err(|error| ExtractError::Pdf(error.to_string()))?;
        let pages = document.get_pages();
        if pages.len() > MAX_PDF_PAGES {
            return Err(ExtractError::TooLarge(format!(
                "the PDF has {} pages; at most {MAX_PDF_PAGES} are read",
                pages.len()
            )));
        }
        check_expansion(&document, budget)?;
        let mut text = String::new();
        {
            let mut output = pdf_extract::PlainTextOutput::new(&mut text);
            for &page in pages.keys() {
                budget.check()?;
                pdf_extract::output_doc_page(&document, &mut output, page)
                    .map_err(|error| ExtractError::Pdf(error.to_string()))?;
            }
        }
        Ok(text)
    });
    match result {
        Ok(Ok(text)) => Ok(paragraphs(&text)),
        Ok(Err(error)) => Err(error),
        Err(_) => Err(ExtractError::Pdf("malformed document".into())),
    }
}

/// Refuses a PDF whose streams that text is read from (all but images) inflate past
/// [`MAX_PDF_EXPANDED_BYTES`], counting as they inflate and stopping at the cap.
fn check_expansion(document: &pdf_extract::Document, budget: &Budget) -> Result<(), ExtractError> {
    let too_large = || {
        ExtractError::TooLarge(format!(
            "the PDF expands to more than {} MiB of content; it is refused",
            MAX_PDF_EXPANDED_BYTES / (1024 * 1024)
        ))
    };
    let mut total: u64 = 0;
    for object in document.objects.values() {
        let pdf_extract::Object::Stream(stream) = object else {
            continue;
        };
        let dict = &stream.dict;
        let is_image = dict
            .get(b"Subtype")
            .and_then(pdf_extract::Object::as_name)
            .is_ok_and(|name| name == b"Image");
        if is_image {
            continue;
        }
        let filters = stream.filters().unwrap_or_default();
        let size = if filters.iter().any(|f| *f == b"FlateDecode") {
            budget.check()?;
            let remaining = MAX_PDF_EXPANDED_BYTES.saturating_sub(total) + 1;
            let mut inflated =
                flate2::read::ZlibDecoder::new(stream.content.as_slice()).take(remaining);
            // A truncated or corrupt stream counts what inflated before the error.
            let mut counted: u64 = 0;
            let mut buffer = [0u8; 64 * 1024];
            loop {
                match inflated.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(read) => counted += read as u64,
                }
            }
            counted
        } else {
            stream.content.len() as u64
        };
        total = total.saturating_add(size);
        if total > MAX_PDF_EXPANDED_BYTES {
            return Err(too_large());
        }
    }
    Ok(())
}

/// Extracts text by content type (`text/html`, `application/pdf`, `text/*`, markdown).
pub(crate) fn by_content_type(content_type: &str, bytes: &[u8]) -> Result<Extracted, ExtractError> {
    by_content_type_within(content_type, bytes, &Budget::default())
}

fn by_content_type_within(
    content_type: &str,
    bytes: &[u8],
    budget: &Budget,
) -> Result<Extracted, ExtractError> {
    let essence = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    match essence.as_str() {
        "text/html" | "application/xhtml+xml" => {
            html_within(&String::from_utf8_lossy(bytes), budget)
        }
        "application/pdf" => Ok(Extracted {
            title: None,
            text: pdf_within(bytes, budget)?,
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
fn render(element: ElementRef<'_>, budget: &Budget) -> Result<String, ExtractError> {
    let mut out = String::new();
    walk(element, &mut out, budget)?;
    Ok(paragraphs(&out))
}

/// Nodes walked between two budget checks.
const NODES_PER_CHECK: usize = 4096;

/// Appends the text below `element`, without recursion: the tree's open and close edges in
/// document order, skipping the subtrees of [`SKIPPED`] and hidden elements.
fn walk(element: ElementRef<'_>, out: &mut String, budget: &Budget) -> Result<(), ExtractError> {
    let mut skipping = None;
    for (index, edge) in element.traverse().enumerate() {
        if index % NODES_PER_CHECK == 0 {
            budget.check()?;
        }
        match edge {
            Edge::Open(node) => {
                if skipping.is_some() {
                    continue;
                }
                match node.value() {
                    Node::Text(text) => out.push_str(text),
                    Node::Element(element) => {
                        if SKIPPED.contains(&element.name()) || element.attr("hidden").is_some() {
                            skipping = Some(node.id());
                        } else if BLOCKS.contains(&element.name()) {
                            out.push_str("\n\n");
                        }
                    }
                    _ => {}
                }
            }
            Edge::Close(node) => {
                if let Some(skipped) = skipping {
                    if skipped == node.id() {
                        skipping = None;
                    }
                    continue;
                }
                if let Node::Element(element) = node.value() {
                    if BLOCKS.contains(&element.name()) {
                        out.push_str("\n\n");
                    } else {
                        // Inline elements still separate words (`<td>a</td><td>b</td>`).
                        out.push(' ');
                    }
                }
            }
        }
    }
    Ok(())
}

/// Elements that never hold children.
const VOID: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr",
];
/// Elements whose content is raw text, not markup.
const RAW_TEXT: &[&str] = &["script", "style", "textarea", "title", "xmp", "noscript"];

/// A tag of a scanned page: its lower-cased name, whether it closes, where it ends.
struct Tag {
    name: String,
    closing: bool,
    end: usize,
}

/// The tag starting at `bytes[at] == b'<'`, if it is one (comments, doctypes and stray `<`
/// are not).
fn tag_at(bytes: &[u8], at: usize) -> Option<Tag> {
    let mut i = at + 1;
    let closing = bytes.get(i) == Some(&b'/');
    if closing {
        i += 1;
    }
    let start = i;
    while bytes.get(i).is_some_and(u8::is_ascii_alphanumeric) {
        i += 1;
    }
    if i == start || !bytes[start].is_ascii_alphabetic() {
        return None;
    }
    let name = String::from_utf8_lossy(&bytes[start..i]).to_ascii_lowercase();
    let end = bytes[i..]
        .iter()
        .position(|&b| b == b'>')
        .map_or(bytes.len(), |p| i + p + 1);
    Some(Tag { name, closing, end })
}

/// Whether elements nest deeper than `limit` in `html`, by a linear scan that keeps the names
/// of the open elements (an end tag closes up to its name when open, and is ignored when not,
/// as an HTML parser does; elements closed implicitly are counted as open, so it
/// over-estimates, never under).
pub(crate) fn nested_deeper_than(html: &str, limit: usize) -> bool {
    let bytes = html.as_bytes();
    let mut open: Vec<String> = Vec::new();
    let mut i = 0;
    while let Some(offset) = bytes[i..].iter().position(|&b| b == b'<') {
        let at = i + offset;
        if bytes[at..].starts_with(b"<!--") {
            i = find(bytes, at + 4, b"-->").map_or(bytes.len(), |end| end + 3);
            continue;
        }
        let Some(tag) = tag_at(bytes, at) else {
            i = at + 1;
            continue;
        };
        i = tag.end;
        if tag.closing {
            if let Some(position) = open.iter().rposition(|name| *name == tag.name) {
                open.truncate(position);
            }
            continue;
        }
        if VOID.contains(&tag.name.as_str()) {
            continue;
        }
        if RAW_TEXT.contains(&tag.name.as_str()) {
            let closer = format!("</{}", tag.name);
            i = find_ignoring_case(bytes, i, closer.as_bytes()).unwrap_or(bytes.len());
            continue;
        }
        open.push(tag.name);
        if open.len() > limit {
            return true;
        }
    }
    false
}

fn find(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(needle.len())
        .position(|window| window == needle)
        .map(|p| from + p)
}

fn find_ignoring_case(bytes: &[u8], from: usize, needle: &[u8]) -> Option<usize> {
    bytes
        .get(from..)?
        .windows(needle.len())
        .position(|window| window.eq_ignore_ascii_case(needle))
        .map(|p| from + p)
}

/// The text of a page without parsing it: tags, comments and raw-text elements' content
/// dropped, block tags ending paragraphs, the common entities decoded.
pub(crate) fn strip_tags(html: &str) -> String {
    let bytes = html.as_bytes();
    let mut out = String::with_capacity(html.len() / 2);
    let mut text_from = 0;
    let mut i = 0;
    while let Some(offset) = bytes[i..].iter().position(|&b| b == b'<') {
        let at = i + offset;
        let skip_to = if bytes[at..].starts_with(b"<!--") {
            find(bytes, at + 4, b"-->").map_or(bytes.len(), |end| end + 3)
        } else if let Some(tag) = tag_at(bytes, at) {
            if tag.closing {
                tag.end
            } else if RAW_TEXT.contains(&tag.name.as_str()) {
                let closer = format!("</{}", tag.name);
                find_ignoring_case(bytes, tag.end, closer.as_bytes()).unwrap_or(bytes.len())
            } else {
                tag.end
            }
        } else if bytes.get(at + 1).is_some_and(|b| *b == b'!' || *b == b'?') {
            find(bytes, at, b">").map_or(bytes.len(), |end| end + 1)
        } else {
            i = at + 1;
            continue;
        };
        out.push_str(&html[text_from..at]);
        let block = tag_at(bytes, at).is_some_and(|tag| BLOCKS.contains(&tag.name.as_str()));
        out.push_str(if block { "\n\n" } else { " " });
        text_from = skip_to.min(bytes.len());
        i = text_from;
    }
    out.push_str(&html[text_from..]);
    let decoded = out
        .replace("&nbsp;", " ")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&amp;", "&");
    paragraphs(&decoded)
}

/// Whitespace collapsed inside paragraphs; paragraphs separated by one blank line.
pub(crate) fn paragraphs(text: &str) -> String {
    // NUL is never text (and PostgreSQL cannot store it).
    text.replace("\r\n", "\n")
        .replace('\0', "")
        .split("\n\n")
        .map(collapse)
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn collapse(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('\0', "")
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

    /// The recursive walk overflowed the stack (and aborted the process) past ~17,000 levels.
    #[test]
    fn deep_trees_are_walked_without_recursion() {
        let depth = 20_000;
        let html = format!(
            "{}<p>deep <b>inside</b></p>{}",
            "<div>".repeat(depth),
            "</div>".repeat(depth)
        );
        let document = Html::parse_document(&html);
        let text = render(document.root_element(), &Budget::default()).unwrap();
        assert_eq!(text, "deep inside");
        // Through the public path the page is too deep to parse and is read as text.
        assert!(nested_deeper_than(&html, MAX_NESTING));
        assert_eq!(html_to_text(&html).text, "deep inside");
    }

    #[test]
    fn a_spent_budget_stops_the_walk() {
        let html = "<p>x</p>".repeat(10);
        let spent = Budget::new(Duration::ZERO);
        assert!(matches!(
            by_content_type_within("text/html", html.as_bytes(), &spent),
            Err(ExtractError::TooLarge(_))
        ));
    }

    #[test]
    fn nesting_is_estimated_like_a_parser_would_build_it() {
        let balanced = "<div><span>x</span></div>".repeat(2_000);
        assert!(!nested_deeper_than(&balanced, 8));
        assert!(!nested_deeper_than(&"<br><img src=x>".repeat(1_000), 8));
        // An end tag of an element that is not open closes nothing.
        assert!(nested_deeper_than(&"<div></x>".repeat(9), 8));
        // Markup inside comments and scripts is text.
        let quoted = format!(
            "<!-- {} --><script>{}</script><p>ok</p>",
            "<div>".repeat(100),
            "'<div>'.repeat(100)".repeat(20)
        );
        assert!(!nested_deeper_than(&quoted, 8));
        assert!(nested_deeper_than(&"<DIV>".repeat(9), 8));
    }

    #[test]
    fn stripped_tags_keep_the_text_and_its_paragraphs() {
        let html = "<html><head><title>T</title><style>p{}</style></head><body>\
            <p>one &amp; <b>two</b></p><script>alert('<p>')</script><!-- <p>hidden</p> -->\
            <div>three&nbsp;four</div> 1 < 2</body></html>";
        assert_eq!(strip_tags(html), "one & two\n\nthree four\n\n1 < 2");
        assert_eq!(strip_tags("a<"), "a<");
        assert_eq!(strip_tags("é<i>ü</i>ß"), "é ü ß");
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
