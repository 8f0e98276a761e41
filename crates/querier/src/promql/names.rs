//! OTLP metric and attribute names as Prometheus sees them, following the
//! Prometheus OTLP translation (`UnderscoreEscapingWithSuffixes`): invalid
//! characters become `_`, a unit suffix is added (`s` → `_seconds`, `By` →
//! `_bytes`, `1` on a gauge → `_ratio`, `a/b` → `_a_per_b`), monotonic sums
//! get `_total`; histograms are `_bucket{le}`, `_sum` and `_count`.

/// A label name: every character outside `[A-Za-z0-9_]` becomes `_`, a
/// leading digit gets a `key_` prefix, runs of `_` stay as they are (a
/// leading `__` is reserved and kept only when the key had it).
pub fn label_name(key: &str) -> String {
    label_name_ref(key).into_owned()
}

/// [`label_name`], borrowing `key` when it is a label name already (the
/// common case: no allocation).
pub fn label_name_ref(key: &str) -> std::borrow::Cow<'_, str> {
    let valid = key.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && key.bytes().next().is_some_and(|b| !b.is_ascii_digit());
    if valid {
        return std::borrow::Cow::Borrowed(key);
    }
    let mut out: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '_' { c } else { '_' })
        .collect();
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert_str(0, "key_");
    }
    if out.is_empty() {
        out.push('_');
    }
    std::borrow::Cow::Owned(out)
}

fn unit_word(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "d" => "days",
        "h" => "hours",
        "min" => "minutes",
        "s" => "seconds",
        "ms" => "milliseconds",
        "us" => "microseconds",
        "ns" => "nanoseconds",
        "By" => "bytes",
        "KiBy" => "kibibytes",
        "MiBy" => "mebibytes",
        "GiBy" => "gibibytes",
        "TiBy" => "tibibytes",
        "KBy" => "kilobytes",
        "MBy" => "megabytes",
        "GBy" => "gigabytes",
        "TBy" => "terabytes",
        "m" => "meters",
        "V" => "volts",
        "A" => "amperes",
        "J" => "joules",
        "W" => "watts",
        "g" => "grams",
        "Cel" => "celsius",
        "Hz" => "hertz",
        "%" => "percent",
        _ => return None,
    })
}

fn per_word(unit: &str) -> Option<&'static str> {
    Some(match unit {
        "s" => "second",
        "m" => "minute",
        "h" => "hour",
        "d" => "day",
        "w" => "week",
        "mo" => "month",
        "y" => "year",
        _ => return None,
    })
}

/// Sanitizes a metric name: invalid characters to `_`, runs of `_`
/// collapsed, no leading digit.
fn sanitize_metric(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        let c = if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            c
        } else {
            '_'
        };
        if c == '_' && out.ends_with('_') {
            continue;
        }
        out.push(c);
    }
    if out.starts_with(|c: char| c.is_ascii_digit()) {
        out.insert(0, '_');
    }
    out
}

/// The Prometheus name of an OTLP metric (before `_bucket`/`_sum`/`_count`).
pub fn metric_name(name: &str, unit: &str, is_gauge: bool, is_monotonic_sum: bool) -> String {
    let mut out = sanitize_metric(name);
    // Units in braces are annotations, not units.
    let unit = if unit.starts_with('{') && unit.ends_with('}') {
        ""
    } else {
        unit
    };
    let (main, per) = match unit.split_once('/') {
        Some((m, p)) => (m, Some(p)),
        None => (unit, None),
    };
    let mut suffixes: Vec<String> = Vec::new();
    if let Some(w) = unit_word(main) {
        suffixes.push(w.to_owned());
    } else if !main.is_empty() && !main.starts_with('{') && main != "1" {
        suffixes.push(sanitize_metric(main).trim_matches('_').to_owned());
    }
    if let Some(p) = per.filter(|p| !p.is_empty() && !p.starts_with('{')) {
        let w = per_word(p).map_or_else(|| sanitize_metric(p).trim_matches('_').to_owned(), str::to_owned);
        suffixes.push(format!("per_{w}"));
    }
    if main == "1" && is_gauge && per.is_none() {
        suffixes.push("ratio".to_owned());
    }
    for s in suffixes.into_iter().filter(|s| !s.is_empty()) {
        if !out.ends_with(&format!("_{s}")) {
            out.push('_');
            out.push_str(&s);
        }
    }
    if is_monotonic_sum && !out.ends_with("_total") {
        out.push_str("_total");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_follow_the_prometheus_otlp_translation() {
        assert_eq!(
            metric_name("http.server.request.duration", "s", false, false),
            "http_server_request_duration_seconds"
        );
        assert_eq!(metric_name("requests", "1", false, true), "requests_total");
        assert_eq!(metric_name("requests", "{request}", false, true), "requests_total");
        assert_eq!(
            metric_name("cpu.utilization", "1", true, false),
            "cpu_utilization_ratio"
        );
        assert_eq!(metric_name("net.io", "By", false, true), "net_io_bytes_total");
        assert_eq!(
            metric_name("throughput", "By/s", true, false),
            "throughput_bytes_per_second"
        );
        assert_eq!(metric_name("latency_seconds", "s", true, false), "latency_seconds");
        assert_eq!(metric_name("9lives..x", "", true, false), "_9lives_x");
        assert_eq!(label_name("service.name"), "service_name");
        assert_eq!(label_name("http.response.status_code"), "http_response_status_code");
        assert_eq!(label_name("2xx"), "key_2xx");
    }

    /// The borrowing form borrows exactly the keys the mapping leaves as
    /// they are, and gives the mapped name for every other.
    #[test]
    fn label_names_are_borrowed_only_when_unchanged() {
        use std::borrow::Cow;
        for key in [
            "instance",
            "svc",
            "_x",
            "__name__",
            "a1",
            "",
            "1",
            "9lives",
            "service.name",
            "é",
            "a-b",
            "A_Z_09",
        ] {
            let r = label_name_ref(key);
            let unchanged = r == key;
            assert_eq!(matches!(r, Cow::Borrowed(_)), unchanged, "{key:?} -> {r:?}");
        }
        assert_eq!(label_name_ref("9lives"), "key_9lives");
        assert_eq!(label_name_ref(""), "_");
        assert_eq!(label_name_ref("é"), "_");
        assert_eq!(label_name_ref("service.name"), "service_name");
        assert!(matches!(label_name_ref("instance"), Cow::Borrowed("instance")));
    }
}
