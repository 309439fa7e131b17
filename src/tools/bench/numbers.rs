//! Latency summaries and how numbers are printed.

use super::*;

pub(super) struct Latency {
    pub(super) n: usize,
    pub(super) p50: f64,
    pub(super) p95: f64,
    pub(super) p99: f64,
    pub(super) mean: f64,
    pub(super) max: f64,
    pub(super) results: f64,
}

impl Latency {
    pub(super) fn of(mut samples: Vec<f64>, results: f64) -> Self {
        samples.sort_by(f64::total_cmp);
        let n = samples.len();
        let at = |p: f64| {
            if n == 0 {
                return 0.0;
            }
            let rank = ((p / 100.0) * n as f64).ceil() as usize;
            samples[rank.clamp(1, n) - 1]
        };
        Self {
            n,
            p50: at(50.0),
            p95: at(95.0),
            p99: at(99.0),
            mean: if n == 0 {
                0.0
            } else {
                samples.iter().sum::<f64>() / n as f64
            },
            max: samples.last().copied().unwrap_or(0.0),
            results,
        }
    }

    pub(super) fn short(&self) -> String {
        format!(
            "p50 **{}** / p95 {} (mean {}, n = {})",
            ms_text(self.p50),
            ms_text(self.p95),
            ms_text(self.mean),
            self.n
        )
    }

    pub(super) fn long(&self) -> String {
        format!(
            "p50 **{}** / p95 {} / p99 **{}** (mean {}, max {}; {:.1} results)",
            ms_text(self.p50),
            ms_text(self.p95),
            ms_text(self.p99),
            ms_text(self.mean),
            ms_text(self.max),
            self.results
        )
    }
}

pub(super) fn millis(duration: Duration) -> f64 {
    duration.as_secs_f64() * 1000.0
}

pub(super) fn ms_text(ms: f64) -> String {
    if ms >= 1000.0 {
        format!("{:.2} s", ms / 1000.0)
    } else if ms >= 100.0 {
        format!("{ms:.0} ms")
    } else if ms >= 10.0 {
        format!("{ms:.1} ms")
    } else {
        format!("{ms:.2} ms")
    }
}

pub(super) fn seconds(duration: Duration) -> String {
    let secs = duration.as_secs_f64();
    if secs >= 120.0 {
        format!("{secs:.0} s ({:.1} min)", secs / 60.0)
    } else {
        format!("{secs:.1} s")
    }
}

pub(super) fn rate(n: usize, duration: Duration) -> String {
    let secs = duration.as_secs_f64().max(1e-9);
    count((n as f64 / secs).round() as usize)
}

/// `1234567` → `1,234,567`.
pub(super) fn count(n: usize) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (index, digit) in digits.chars().enumerate() {
        if index > 0 && (digits.len() - index).is_multiple_of(3) {
            out.push(',');
        }
        out.push(digit);
    }
    out
}

pub(super) fn bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

pub(super) fn verdict(target: &str, met: bool) -> String {
    format!("{target}: {}", if met { "met" } else { "**missed**" })
}

pub(super) fn progress(len: u64, message: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(
            "{msg:>32} {bar:40} {human_pos}/{human_len} ({per_sec}, eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar.set_message(message.to_string());
    bar
}

pub(super) fn spinner(message: &str) -> ProgressBar {
    let bar = ProgressBar::new_spinner();
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg} ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    bar.set_message(message.to_string());
    bar.enable_steady_tick(Duration::from_millis(200));
    bar
}
