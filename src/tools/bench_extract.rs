//! `mnemo bench extract`: the extraction ceiling measured. Runs hostile documents (the shapes
//! that once killed the server, at growing sizes) and seeded random markup soups through the
//! extraction worker under the configured ceilings, and prints what each cost the worker
//! (peak resident memory, CPU time) or why it was refused — and this process's own peak
//! memory before and after, which the documents must not move.

use std::io::Write;
use std::time::Instant;

use anyhow::Context;
use rand::{Rng, SeedableRng};

use mnemo::config::ExtractSettings;
use mnemo::text::extract::{self, ExtractError};

pub struct ExtractBenchOptions {
    pub settings: ExtractSettings,
    /// Random soups run besides the hostile families.
    pub soups: usize,
    pub seed: u64,
}

/// One document to extract.
struct Case {
    family: &'static str,
    content_type: &'static str,
    bytes: Vec<u8>,
}

pub async fn run_extract_bench(
    options: ExtractBenchOptions,
    out: &mut impl Write,
) -> anyhow::Result<()> {
    extract::configure(&options.settings);
    let own_before = own_peak_kib();
    writeln!(
        out,
        "extraction ceiling: {} MiB of address space, {} s of CPU per document (worker: mnemo {})",
        options.settings.memory_mb,
        options.settings.cpu_secs,
        extract::WORKER_COMMAND
    )?;
    writeln!(
        out,
        "{:<44} {:>9} {:>10} {:>8} {:>8}  outcome",
        "document", "bytes", "peak MiB", "CPU s", "wall s"
    )?;
    let mut cases = hostile_cases();
    let mut rng = rand::rngs::StdRng::seed_from_u64(options.seed);
    for _ in 0..options.soups {
        cases.push(soup(&mut rng));
    }
    let (mut completed, mut refused) = (0usize, 0usize);
    let (mut max_rss, mut max_cpu) = (0u64, 0u64);
    for case in cases {
        let size = case.bytes.len();
        let started = Instant::now();
        let result = extract::extract_with_cost(case.content_type, case.bytes).await;
        let wall = started.elapsed().as_secs_f64();
        let (peak, cpu, outcome) = match result {
            Ok((extracted, cost)) => {
                completed += 1;
                max_rss = max_rss.max(cost.peak_rss_kib);
                max_cpu = max_cpu.max(cost.cpu_ms);
                (
                    format!("{:.0}", cost.peak_rss_kib as f64 / 1024.0),
                    format!("{:.2}", cost.cpu_ms as f64 / 1000.0),
                    format!("read, {} chars", extracted.text.chars().count()),
                )
            }
            Err(ExtractError::Worker(message)) => {
                anyhow::bail!("the extraction worker failed: {message}")
            }
            Err(error) => {
                refused += 1;
                ("-".into(), "-".into(), format!("refused: {error}"))
            }
        };
        writeln!(
            out,
            "{:<44} {:>9} {:>10} {:>8} {:>8.2}  {outcome}",
            case.family, size, peak, cpu, wall
        )?;
    }
    let own_after = own_peak_kib();
    writeln!(
        out,
        "\n{completed} read, {refused} refused at a ceiling or as unreadable; largest worker \
         that finished: {:.0} MiB resident, {:.2} s CPU (ceiling {} MiB, {} s)",
        max_rss as f64 / 1024.0,
        max_cpu as f64 / 1000.0,
        options.settings.memory_mb,
        options.settings.cpu_secs
    )?;
    writeln!(
        out,
        "this process (the server's side): peak resident {:.0} MiB before, {:.0} MiB after",
        own_before as f64 / 1024.0,
        own_after as f64 / 1024.0
    )
    .context("writing the report")?;
    Ok(())
}

fn own_peak_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("VmHWM:"))
                .and_then(|value| value.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// The shapes that killed the server, at growing sizes.
fn hostile_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    // Distinct attributes: the parser keeps at most three identical formatting elements.
    let open: String = (0..500).map(|i| format!("<b class=c{i}>")).collect();
    for paragraphs in [500, 2_000, 20_000, 120_000] {
        cases.push(Case {
            family: leak(format!("html: 500 formatting elements × {paragraphs} <p>")),
            content_type: "text/html",
            bytes: format!(
                "<html><body><p>{open}</p>{}</body></html>",
                "<p>x</p>".repeat(paragraphs)
            )
            .into_bytes(),
        });
    }
    for depth in [10_000, 100_000] {
        cases.push(Case {
            family: leak(format!("html: <!--> then {depth} nested <div>")),
            content_type: "text/html",
            bytes: format!("<!-->{}x", "<div>".repeat(depth)).into_bytes(),
        });
        cases.push(Case {
            family: leak(format!("html: {depth} × <span><div></span>")),
            content_type: "text/html",
            bytes: "<span><div></span>".repeat(depth).into_bytes(),
        });
    }
    for mib in [1usize, 4, 30] {
        cases.push(Case {
            family: leak(format!("pdf: {mib} MiB of (A) Tj, deflated")),
            content_type: "application/pdf",
            bytes: pdf(
                &[("/Filter /FlateDecode", deflate(&text_operators(mib << 20)))],
                1,
            ),
        });
    }
    cases.push(Case {
        family: "pdf: [/ASCII85Decode /FlateDecode] 40 MiB",
        content_type: "application/pdf",
        bytes: pdf(
            &[(
                "/Filter [/ASCII85Decode /FlateDecode]",
                ascii85(&deflate(&text_operators(40 << 20))),
            )],
            1,
        ),
    });
    cases.push(Case {
        family: "pdf: content marked /Subtype /Image, 40 MiB",
        content_type: "application/pdf",
        bytes: pdf(
            &[(
                "/Subtype /Image /Filter /FlateDecode",
                deflate(&text_operators(40 << 20)),
            )],
            1,
        ),
    });
    cases.push(Case {
        family: "pdf: one 1 MiB stream listed 64 times",
        content_type: "application/pdf",
        bytes: pdf(
            &[("/Filter /FlateDecode", deflate(&text_operators(1 << 20)))],
            64,
        ),
    });
    cases.push(Case {
        family: "pdf: an ordinary page",
        content_type: "application/pdf",
        bytes: pdf(
            &[(
                "",
                b"BT /F1 12 Tf 50 780 Td (Kelp forests shelter sea otters.) Tj ET".to_vec(),
            )],
            1,
        ),
    });
    cases
}

/// Random markup: tags, comments, entities and text, some of them repeated many times.
fn soup(rng: &mut rand::rngs::StdRng) -> Case {
    const PIECES: &[&str] = &[
        "<p>",
        "</p>",
        "<b>",
        "</b>",
        "<i>",
        "<div>",
        "</div>",
        "<span>",
        "</span>",
        "<table>",
        "<td>",
        "<tr>",
        "<!--",
        "-->",
        "<!-->",
        "<script>",
        "</script>",
        "<a href=x>",
        "</a>",
        "&amp;",
        "&#x1F600;",
        "text ",
        "文字",
        "<br>",
        "<li>",
        "<ul>",
        "</ul>",
        "<font>",
        "<nobr>",
        "<svg>",
        "<math>",
        "<template>",
        "<select>",
        "<option>",
    ];
    let mut html = String::new();
    let runs = rng.random_range(1..40);
    for _ in 0..runs {
        let piece = PIECES[rng.random_range(0..PIECES.len())];
        let times = if rng.random_bool(0.2) {
            rng.random_range(100..5_000)
        } else {
            rng.random_range(1..20)
        };
        html.push_str(&piece.repeat(times));
    }
    Case {
        family: "html: random soup",
        content_type: "text/html",
        bytes: html.into_bytes(),
    }
}

fn leak(text: String) -> &'static str {
    Box::leak(text.into_boxed_str())
}

/// `n` bytes of text-showing operators in one text object.
fn text_operators(n: usize) -> Vec<u8> {
    let mut content = b"BT /F1 12 Tf 50 780 Td ".to_vec();
    while content.len() < n {
        content.extend_from_slice(b"(A) Tj ");
    }
    content.extend_from_slice(b"ET");
    content
}

fn deflate(bytes: &[u8]) -> Vec<u8> {
    let mut encoder = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::best());
    let _ = encoder.write_all(bytes);
    encoder.finish().unwrap_or_default()
}

fn ascii85(bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes.len() * 5 / 4 + 8);
    for chunk in bytes.chunks(4) {
        let mut group = [0u8; 4];
        group[..chunk.len()].copy_from_slice(chunk);
        let value = u32::from_be_bytes(group);
        if value == 0 && chunk.len() == 4 {
            out.push(b'z');
            continue;
        }
        let mut digits = [0u8; 5];
        let mut rest = value;
        for digit in digits.iter_mut().rev() {
            *digit = (rest % 85) as u8 + b'!';
            rest /= 85;
        }
        out.extend_from_slice(&digits[..chunk.len() + 1]);
    }
    out.extend_from_slice(b"~>");
    out
}

/// A one-page PDF (with a cross-reference table) whose page lists the `streams` (their extra
/// dictionary entries and bytes) as its contents, `refs` times over.
fn pdf(streams: &[(&str, Vec<u8>)], refs: usize) -> Vec<u8> {
    let mut out: Vec<u8> = b"%PDF-1.5\n".to_vec();
    let mut offsets = Vec::new();
    let first_stream = 5;
    let contents: Vec<String> = (0..refs)
        .flat_map(|_| (0..streams.len()).map(|i| format!("{} 0 R", first_stream + i)))
        .collect();
    let objects = [
        "<< /Type /Catalog /Pages 2 0 R >>".to_string(),
        "<< /Type /Pages /Kids [3 0 R] /Count 1 /Resources << /Font << /F1 4 0 R >> >> \
         /MediaBox [0 0 595 842] >>"
            .to_string(),
        format!(
            "<< /Type /Page /Parent 2 0 R /Contents [{}] >>",
            contents.join(" ")
        ),
        "<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>".to_string(),
    ];
    for (index, object) in objects.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(format!("{} 0 obj\n{object}\nendobj\n", index + 1).as_bytes());
    }
    for (index, (extra, bytes)) in streams.iter().enumerate() {
        offsets.push(out.len());
        out.extend_from_slice(
            format!(
                "{} 0 obj\n<< /Length {} {extra} >>\nstream\n",
                first_stream + index,
                bytes.len()
            )
            .as_bytes(),
        );
        out.extend_from_slice(bytes);
        out.extend_from_slice(b"\nendstream\nendobj\n");
    }
    let xref = out.len();
    out.extend_from_slice(
        format!("xref\n0 {}\n0000000000 65535 f \n", offsets.len() + 1).as_bytes(),
    );
    for offset in &offsets {
        out.extend_from_slice(format!("{offset:010} 00000 n \n").as_bytes());
    }
    out.extend_from_slice(
        format!(
            "trailer\n<< /Size {} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n",
            offsets.len() + 1
        )
        .as_bytes(),
    );
    out
}
