//! Bar charts (one value, or succeeded and failed stacked) as inline SVG, drawn on the
//! server: no script, no style attribute (the CSP allows neither inline), only geometry; the
//! stylesheet colours it.

use maud::{html, Markup};

/// Bars for `values` (oldest first), each labelled by its `title` (a tooltip), with the
/// largest value written at the top left and a time axis below: each `(bar, label)` of
/// `axis` written under the left edge of that bar.
pub(crate) fn bars(
    values: &[u64],
    titles: &[String],
    axis: &[(usize, String)],
    caption: &str,
) -> Markup {
    let w = 600u64;
    let h = 120u64;
    let top = 14u64;
    let bottom = 16u64;
    let n = values.len().max(1) as u64;
    let max = values.iter().copied().max().unwrap_or(0).max(1);
    let slot = w / n;
    let bar = slot.saturating_sub(2).max(1);
    html! {
        svg.chart #throughput width=(w) height=(h + top + bottom) viewBox=(format!("0 0 {w} {}", h + top + bottom))
            role="img" aria-label=(caption) xmlns="http://www.w3.org/2000/svg" {
            title { (caption) }
            text x="2" y="10" { "max " (max) }
            @for (i, v) in values.iter().enumerate() {
                @let bh = (v * h / max).max(u64::from(*v > 0));
                rect x=(i as u64 * slot + 1) y=(top + h - bh) width=(bar) height=(bh) {
                    title { (titles.get(i).map(String::as_str).unwrap_or("")) ": " (v) }
                }
            }
            line.axis x1="0" y1=(top + h) x2=(w) y2=(top + h) {}
            @for (i, label) in axis {
                @let x = (*i as u64 * slot).min(w.saturating_sub(34));
                text.axis x=(x + 1) y=(top + h + 12) { (label) }
            }
        }
    }
}

/// Stacked bars: for each `(succeeded, failed)` of `values` (oldest first), the failed part
/// on top of the succeeded one (classes `ok` and `failed`), titled, with a time axis as in
/// [`bars`]; `id` names the chart.
pub(crate) fn stacked(
    id: &str,
    values: &[(u64, u64)],
    titles: &[String],
    axis: &[(usize, String)],
    caption: &str,
) -> Markup {
    let w = 600u64;
    let h = 80u64;
    let top = 14u64;
    let bottom = 16u64;
    let n = values.len().max(1) as u64;
    let max = values.iter().map(|(a, b)| a + b).max().unwrap_or(0).max(1);
    let slot = w / n;
    let bar = slot.saturating_sub(1).max(1);
    let height = |v: u64| (v * h / max).max(u64::from(v > 0));
    html! {
        svg.chart id=(id) width=(w) height=(h + top + bottom) viewBox=(format!("0 0 {w} {}", h + top + bottom))
            role="img" aria-label=(caption) xmlns="http://www.w3.org/2000/svg" {
            title { (caption) }
            text x="2" y="10" { "max " (max) }
            @for (i, (ok, failed)) in values.iter().enumerate() {
                @let (okh, fh) = (height(*ok), height(*failed));
                @let label = titles.get(i).map(String::as_str).unwrap_or("");
                @if *ok > 0 {
                    rect.ok x=(i as u64 * slot) y=(top + h - okh) width=(bar) height=(okh) {
                        title { (label) ": " (ok) " succeeded" }
                    }
                }
                @if *failed > 0 {
                    rect.failed x=(i as u64 * slot) y=(top + h - okh - fh) width=(bar) height=(fh) {
                        title { (label) ": " (failed) " failed" }
                    }
                }
            }
            line.axis x1="0" y1=(top + h) x2=(w) y2=(top + h) {}
            @for (i, label) in axis {
                @let x = (*i as u64 * slot).min(w.saturating_sub(34));
                text.axis x=(x + 1) y=(top + h + 12) { (label) }
            }
        }
    }
}
