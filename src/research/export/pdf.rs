//! PDF through `krilla`, with fonts found on the system at run time (never shipped): a font
//! with Chinese, Japanese and Korean glyphs (Noto Sans CJK, Droid Sans Fallback, WenQuanYi)
//! when the report has such text — it covers Latin too — else a Latin one (DejaVu Sans, Noto
//! Sans, Liberation Sans). Lines are broken between words (and between CJK characters) by
//! widths measured with rustybuzz, as krilla shapes them; each citation is a link to its
//! source.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use krilla::Document;
use krilla::action::{Action, LinkAction};
use krilla::annotation::{Annotation, LinkAnnotation, Target};
use krilla::color::rgb;
use krilla::geom::{Point, Rect};
use krilla::page::PageSettings;
use krilla::paint::Fill;
use krilla::text::{Font, TextDirection};

use super::{Block, Doc, ExportError, Span};
use crate::text::script::is_cjk;

/// A4, in points.
const PAGE_WIDTH: f32 = 595.0;
const PAGE_HEIGHT: f32 = 842.0;
const MARGIN: f32 = 56.0;
const BODY: f32 = 10.5;
const SMALL: f32 = 9.0;
const TITLE: f32 = 19.0;
const HEADINGS: [f32; 3] = [15.0, 13.0, 11.5];
const LEADING: f32 = 1.45;
const INDENT: f32 = 14.0;

/// Font files looked for, best first, by file name.
const CJK_FONTS: &[&str] = &[
    "NotoSansCJK-Regular.ttc",
    "NotoSansCJKsc-Regular.otf",
    "NotoSansSC-Regular.otf",
    "NotoSerifCJK-Regular.ttc",
    "DroidSansFallbackFull.ttf",
    "DroidSansFallback.ttf",
    "wqy-microhei.ttc",
    "wqy-zenhei.ttc",
];
const LATIN_FONTS: &[&str] = &[
    "DejaVuSans.ttf",
    "NotoSans-Regular.ttf",
    "LiberationSans-Regular.ttf",
    "FreeSans.ttf",
];
/// Where fonts are looked for (and `MNEMO_FONT_DIRS`, `:`-separated, first).
const FONT_DIRS: &[&str] = &["/usr/share/fonts", "/usr/local/share/fonts"];

/// Why a PDF could not be made.
#[derive(Debug, thiserror::Error)]
pub enum FontError {
    #[error(
        "the report has Chinese, Japanese or Korean text and no font for it is installed (install Debian's fonts-noto-cjk, or put such a font in a directory named by MNEMO_FONT_DIRS)"
    )]
    NoCjkFont,
    #[error(
        "no font is installed to write a PDF with (install Debian's fonts-dejavu-core, or name a font directory with MNEMO_FONT_DIRS)"
    )]
    NoFont,
    #[error("the font {0} cannot be read: {1}")]
    Unreadable(String, String),
}

/// The fonts a PDF can be written with, found once; their bytes are read on first use.
#[derive(Debug, Default)]
pub struct Fonts {
    cjk: Option<PathBuf>,
    latin: Option<PathBuf>,
    loaded: OnceLock<Vec<(PathBuf, Arc<Vec<u8>>)>>,
}

impl Fonts {
    /// Looks for fonts in `MNEMO_FONT_DIRS` and the system's font directories.
    pub(crate) fn system() -> Self {
        let mut dirs: Vec<PathBuf> = std::env::var("MNEMO_FONT_DIRS")
            .unwrap_or_default()
            .split(':')
            .filter(|dir| !dir.trim().is_empty())
            .map(PathBuf::from)
            .collect();
        dirs.extend(FONT_DIRS.iter().map(PathBuf::from));
        let mut files = Vec::new();
        for dir in &dirs {
            collect(dir, 4, &mut files);
        }
        let best = |names: &[&str]| {
            names.iter().find_map(|name| {
                files
                    .iter()
                    .find(|file| file.file_name().is_some_and(|found| found == *name))
                    .cloned()
            })
        };
        Self {
            cjk: best(CJK_FONTS),
            latin: best(LATIN_FONTS),
            loaded: OnceLock::new(),
        }
    }

    /// The font for a document: a CJK one when it needs one.
    fn pick(&self, needs_cjk: bool) -> Result<Font, FontError> {
        let path = if needs_cjk {
            self.cjk.as_ref().ok_or(FontError::NoCjkFont)?
        } else {
            self.latin
                .as_ref()
                .or(self.cjk.as_ref())
                .ok_or(FontError::NoFont)?
        };
        let bytes = self.bytes(path)?;
        Font::new(bytes.into(), 0).ok_or_else(|| {
            FontError::Unreadable(path.display().to_string(), "not a usable font".into())
        })
    }

    fn bytes(&self, path: &Path) -> Result<Arc<Vec<u8>>, FontError> {
        let loaded = self.loaded.get_or_init(|| {
            [&self.cjk, &self.latin]
                .into_iter()
                .flatten()
                .filter_map(|path| {
                    std::fs::read(path)
                        .ok()
                        .map(|bytes| (path.clone(), Arc::new(bytes)))
                })
                .collect()
        });
        loaded
            .iter()
            .find(|(known, _)| known == path)
            .map(|(_, bytes)| bytes.clone())
            .ok_or_else(|| {
                FontError::Unreadable(path.display().to_string(), "it could not be read".into())
            })
    }
}

/// Font files under `dir`, `depth` levels down at most.
fn collect(dir: &Path, depth: usize, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if depth > 0 {
                collect(&path, depth - 1, out);
            }
        } else {
            out.push(path);
        }
    }
}

/// Widths of text in a font, as krilla will shape it.
struct Measure<'a> {
    face: rustybuzz::Face<'a>,
    units: f32,
}

impl<'a> Measure<'a> {
    fn new(bytes: &'a [u8]) -> Option<Self> {
        let face = rustybuzz::Face::from_slice(bytes, 0)?;
        let units = face.units_per_em() as f32;
        Some(Self { face, units })
    }

    fn width(&self, text: &str, size: f32) -> f32 {
        let mut buffer = rustybuzz::UnicodeBuffer::new();
        buffer.push_str(text);
        buffer.guess_segment_properties();
        let shaped = rustybuzz::shape(&self.face, &[], buffer);
        let advance: i32 = shaped.glyph_positions().iter().map(|p| p.x_advance).sum();
        advance as f32 / self.units * size
    }
}

/// One piece of a line: text, or a citation linking to a URL.
struct Piece {
    text: String,
    link: Option<String>,
}

/// Lays the document out on A4 pages and writes the PDF.
pub(super) fn write(doc: &Doc, fonts: &Fonts) -> Result<Vec<u8>, ExportError> {
    let needs_cjk = doc_text(doc).chars().any(is_cjk);
    let font = fonts.pick(needs_cjk)?;
    let bytes: Arc<Vec<u8>> = fonts.bytes(if needs_cjk {
        fonts.cjk.as_deref().ok_or(FontError::NoCjkFont)?
    } else {
        fonts
            .latin
            .as_deref()
            .or(fonts.cjk.as_deref())
            .ok_or(FontError::NoFont)?
    })?;
    let measure = Measure::new(bytes.as_slice()).ok_or_else(|| {
        FontError::Unreadable("the chosen font".into(), "it cannot be shaped".into())
    })?;
    let mut writer = Writer::new(font, measure);
    writer.paragraph(&[plain_piece(&doc.title)], TITLE, 0.0);
    writer.space(4.0);
    writer.paragraph(&[plain_piece(&doc.query)], BODY, 0.0);
    writer.paragraph(&[plain_piece(&doc.byline)], SMALL, 0.0);
    writer.space(10.0);
    for block in &doc.blocks {
        match block {
            Block::Heading(level, spans) => {
                let size = HEADINGS[usize::from(level.saturating_sub(1)).min(2)];
                writer.space(size * 0.6);
                writer.paragraph(&pieces(doc, spans), size, 0.0);
                writer.space(2.0);
            }
            Block::Paragraph(spans) => {
                writer.paragraph(&pieces(doc, spans), BODY, 0.0);
                writer.space(BODY * 0.5);
            }
            Block::Item(spans) => {
                let mut all = vec![plain_piece("•  ")];
                all.extend(pieces(doc, spans));
                writer.paragraph(&all, BODY, INDENT);
            }
        }
    }
    if !doc.references.is_empty() {
        writer.space(HEADINGS[0] * 0.6);
        writer.paragraph(&[plain_piece("Sources")], HEADINGS[0], 0.0);
        writer.space(2.0);
        for reference in &doc.references {
            writer.paragraph(
                &[
                    plain_piece(&format!("{}. {} — ", reference.n, reference.title)),
                    Piece {
                        text: reference.url.clone(),
                        link: Some(reference.url.clone()),
                    },
                ],
                SMALL,
                INDENT,
            );
        }
    }
    writer.finish()
}

fn plain_piece(text: &str) -> Piece {
    Piece {
        text: text.to_string(),
        link: None,
    }
}

fn pieces(doc: &Doc, spans: &[Span]) -> Vec<Piece> {
    spans
        .iter()
        .map(|span| match span {
            Span::Text(text) => plain_piece(text),
            Span::Cite(n) => Piece {
                text: format!("[{n}]"),
                link: doc.url_of(*n).map(str::to_string),
            },
        })
        .collect()
}

fn doc_text(doc: &Doc) -> String {
    let mut text = format!("{}{}{}", doc.title, doc.query, doc.byline);
    for block in &doc.blocks {
        let (Block::Heading(_, spans) | Block::Paragraph(spans) | Block::Item(spans)) = block;
        text.push_str(&super::plain(spans));
    }
    for reference in &doc.references {
        text.push_str(&reference.title);
    }
    text
}

/// A line laid out: its text and where its links are (x offset and width).
struct Line {
    text: String,
    links: Vec<(f32, f32, String)>,
}

/// Places lines on pages, starting a new page when one is full.
struct Writer<'a> {
    font: Font,
    measure: Measure<'a>,
    /// Finished pages: their lines (x, baseline y, size, line).
    pages: Vec<Vec<(f32, f32, f32, Line)>>,
    y: f32,
}

impl<'a> Writer<'a> {
    fn new(font: Font, measure: Measure<'a>) -> Self {
        Self {
            font,
            measure,
            pages: vec![Vec::new()],
            y: MARGIN,
        }
    }

    fn space(&mut self, points: f32) {
        self.y += points;
    }

    /// Breaks `pieces` into lines no wider than the text column (less `indent`) and places
    /// them.
    fn paragraph(&mut self, pieces: &[Piece], size: f32, indent: f32) {
        let width = PAGE_WIDTH - 2.0 * MARGIN - indent;
        for line in self.lines(pieces, size, width) {
            let height = size * LEADING;
            if self.y + height > PAGE_HEIGHT - MARGIN {
                self.pages.push(Vec::new());
                self.y = MARGIN;
            }
            self.y += height;
            if let Some(page) = self.pages.last_mut() {
                page.push((MARGIN + indent, self.y - size * 0.3, size, line));
            }
        }
    }

    fn lines(&self, pieces: &[Piece], size: f32, width: f32) -> Vec<Line> {
        let mut lines = Vec::new();
        let mut current = Line {
            text: String::new(),
            links: Vec::new(),
        };
        let mut x = 0.0;
        for piece in pieces {
            for token in tokens(&piece.text) {
                let token_width = self.measure.width(&token, size);
                if x + token_width > width && !current.text.trim().is_empty() {
                    lines.push(std::mem::replace(
                        &mut current,
                        Line {
                            text: String::new(),
                            links: Vec::new(),
                        },
                    ));
                    x = 0.0;
                    if token.trim().is_empty() {
                        continue;
                    }
                }
                let token = if x == 0.0 {
                    token.trim_start().to_string()
                } else {
                    token
                };
                let token_width = self.measure.width(&token, size);
                if let Some(url) = &piece.link {
                    current.links.push((x, token_width, url.clone()));
                }
                current.text.push_str(&token);
                x += token_width;
            }
        }
        if !current.text.trim().is_empty() {
            lines.push(current);
        }
        lines
    }

    fn finish(self) -> Result<Vec<u8>, ExportError> {
        let mut document = Document::new();
        let settings = PageSettings::from_wh(PAGE_WIDTH, PAGE_HEIGHT)
            .ok_or_else(|| ExportError::Write("PDF", "bad page size".into()))?;
        for lines in self.pages {
            let mut page = document.start_page_with(settings.clone());
            let mut annotations = Vec::new();
            {
                let mut surface = page.surface();
                surface.set_fill(Some(Fill {
                    paint: rgb::Color::new(20, 20, 20).into(),
                    ..Fill::default()
                }));
                for (x, y, size, line) in &lines {
                    surface.draw_text(
                        Point::from_xy(*x, *y),
                        self.font.clone(),
                        *size,
                        line.text.trim_end(),
                        false,
                        TextDirection::Auto,
                    );
                    for (offset, width, url) in &line.links {
                        if let Some(rect) =
                            Rect::from_xywh(x + offset, y - size, width.max(1.0), size * 1.2)
                        {
                            annotations.push(Annotation::new_link(
                                LinkAnnotation::new(
                                    rect,
                                    Target::Action(Action::Link(LinkAction::new(url.clone()))),
                                ),
                                Some(url.clone()),
                            ));
                        }
                    }
                }
                surface.finish();
            }
            for annotation in annotations {
                page.add_annotation(annotation);
            }
            page.finish();
        }
        document
            .finish()
            .map_err(|error| ExportError::Write("PDF", format!("{error:?}")))
    }
}

/// Break opportunities: words with the spaces after them, and each CJK character alone.
fn tokens(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    for c in text.chars() {
        if is_cjk(c) {
            if !word.is_empty() {
                out.push(std::mem::take(&mut word));
            }
            out.push(c.to_string());
        } else if c.is_whitespace() {
            word.push(' ');
            out.push(std::mem::take(&mut word));
        } else {
            if word.ends_with(' ') {
                out.push(std::mem::take(&mut word));
            }
            word.push(c);
        }
    }
    if !word.is_empty() {
        out.push(word);
    }
    out
}
