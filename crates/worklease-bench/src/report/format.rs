//! How figures read in the report: rates and counts with thousands
//! separators, milliseconds to about three digits, a goal's mark, a list
//! of failures.

/// A rate with thousands separators.
pub fn rate(x: f64) -> String {
    if x < 10.0 {
        return format!("{x:.1}");
    }
    let s = format!("{:.0}", x);
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A count with thousands separators.
pub fn count(n: u64) -> String {
    rate(n as f64).trim_end_matches(".0").to_string()
}

/// Microseconds as milliseconds, to 3 significant digits or so.
pub fn ms(us: u64) -> String {
    ms_f(us as f64 / 1000.0)
}

pub fn ms_f(v: f64) -> String {
    if v < 1.0 {
        format!("{v:.3}")
    } else if v < 10.0 {
        format!("{v:.2}")
    } else if v < 100.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.0}")
    }
}

pub fn mark(met: bool) -> &'static str {
    if met {
        "met"
    } else {
        "**not met**"
    }
}

/// A list of failures under `heading` (`Failures`), or nothing.
pub fn failures(w: &mut String, heading: &str, items: &[String]) {
    use std::fmt::Write as _;
    if items.is_empty() {
        return;
    }
    let _ = writeln!(w, "\n{heading}:\n");
    for i in items {
        let _ = writeln!(w, "- {i}");
    }
}

/// "LABEL: N failed calls (first: E)" for a row of a hand-off table with
/// failures, or nothing.
pub fn failed_calls(label: String, errors: u64, first: Option<&str>) -> Option<String> {
    (errors > 0).then(|| {
        format!(
            "{label}: {errors} failed calls (first: {})",
            first.unwrap_or("?")
        )
    })
}
