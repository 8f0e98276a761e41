//! Object paths of blocks: `{tenant}/{signal}/{YYYY-MM-DD}/{HH}/{block-id}.mira`,
//! partitioned by the UTC hour of the block's min time. Built and parsed
//! only here.

use object_store::path::Path;

use super::BlockError;
use crate::ids::{BlockId, Signal, TenantId};

const NANOS_PER_HOUR: u64 = 3_600 * 1_000_000_000;

/// The latest time an ingester accepts for a record: the catalog stores
/// times as `i64` nanoseconds and a block's min time must fall inside its
/// hour partition, whose end must be representable too, so the last
/// accepted hour is the last whole one below `i64::MAX` (ending
/// 2262-04-11T22:59:59.999999999Z). Later records are refused at the door.
pub const LAST_PUBLISHABLE_NS: u64 = (i64::MAX as u64 / NANOS_PER_HOUR) * NANOS_PER_HOUR - 1;
const SUFFIX: &str = ".mira";

/// Where a block lives, as recovered from its path.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BlockLocation {
    pub tenant: TenantId,
    pub signal: Signal,
    /// Start of the partition hour, Unix nanoseconds.
    pub hour_start: u64,
    pub block_id: BlockId,
}

/// The path of block `block_id` whose earliest record is at
/// `min_time_unix_nanos`.
pub fn block_path(tenant: &TenantId, signal: Signal, min_time_unix_nanos: u64, block_id: BlockId) -> Path {
    let (date, hour) = date_hour(min_time_unix_nanos);
    Path::from_iter([
        tenant.as_str(),
        signal.as_str(),
        date.as_str(),
        hour.as_str(),
        &format!("{block_id}{SUFFIX}"),
    ])
}

/// The directory holding all blocks of `tenant`'s `signal` whose min time
/// falls in the same UTC hour as `time_unix_nanos` (for listing).
pub fn partition_prefix(tenant: &TenantId, signal: Signal, time_unix_nanos: u64) -> Path {
    let (date, hour) = date_hour(time_unix_nanos);
    Path::from_iter([tenant.as_str(), signal.as_str(), date.as_str(), hour.as_str()])
}

/// Inverse of [`block_path`]; rejects anything [`block_path`] would not
/// produce.
pub fn parse_block_path(path: &Path) -> Result<BlockLocation, BlockError> {
    let bad = |reason| BlockError::InvalidPath {
        path: path.as_ref().chars().take(512).collect(),
        reason,
    };
    let parts: Vec<_> = path.parts().collect();
    let [tenant, signal, date, hour, file] = parts.as_slice() else {
        return Err(bad("expected tenant/signal/YYYY-MM-DD/HH/block-id.mira"));
    };
    let tenant = TenantId::new(tenant.as_ref()).map_err(|_| bad("invalid tenant"))?;
    let signal = signal.as_ref().parse::<Signal>().map_err(|_| bad("invalid signal"))?;
    let days = parse_date(date.as_ref()).ok_or_else(|| bad("invalid date"))?;
    let hour = parse_digits(hour.as_ref(), 2)
        .filter(|&h| h < 24)
        .ok_or_else(|| bad("invalid hour"))?;
    let id = file
        .as_ref()
        .strip_suffix(SUFFIX)
        .ok_or_else(|| bad("missing .mira suffix"))?;
    let block_id = id.parse::<BlockId>().map_err(|_| bad("invalid block id"))?;
    let hour_start = days
        .checked_mul(24)
        .and_then(|h| h.checked_add(hour))
        .and_then(|h| h.checked_mul(NANOS_PER_HOUR))
        .ok_or_else(|| bad("time out of range"))?;
    // Only the canonical spelling round-trips (e.g. no `block-id` in lower case).
    if block_path(&tenant, signal, hour_start, block_id) != *path {
        return Err(bad("not in canonical form"));
    }
    Ok(BlockLocation {
        tenant,
        signal,
        hour_start,
        block_id,
    })
}

/// `("YYYY-MM-DD", "HH")` of a Unix-nanosecond time, in UTC.
fn date_hour(unix_nanos: u64) -> (String, String) {
    let hours = unix_nanos / NANOS_PER_HOUR;
    let (y, m, d) = civil_from_days(hours / 24);
    (format!("{y:04}-{m:02}-{d:02}"), format!("{:02}", hours % 24))
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`, non-negative days only).
fn civil_from_days(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

/// (year, month, day) to days since 1970-01-01; `None` before 1970.
fn days_from_civil(y: u64, m: u64, d: u64) -> Option<u64> {
    let y = if m <= 2 { y.checked_sub(1)? } else { y };
    let era = y / 400;
    let yoe = y % 400;
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    (era * 146_097 + doe).checked_sub(719_468)
}

fn is_leap(y: u64) -> bool {
    y.is_multiple_of(4) && (!y.is_multiple_of(100) || y.is_multiple_of(400))
}

fn days_in_month(y: u64, m: u64) -> u64 {
    match m {
        2 if is_leap(y) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since the epoch of a strict `YYYY-MM-DD`.
fn parse_date(s: &str) -> Option<u64> {
    let (y, rest) = s.split_at_checked(4)?;
    let rest = rest.strip_prefix('-')?;
    let (m, rest) = rest.split_at_checked(2)?;
    let d = rest.strip_prefix('-')?;
    let (y, m, d) = (parse_digits(y, 4)?, parse_digits(m, 2)?, parse_digits(d, 2)?);
    if !(1..=12).contains(&m) || d == 0 || d > days_in_month(y, m) {
        return None;
    }
    days_from_civil(y, m, d)
}

/// Exactly `len` ASCII digits.
fn parse_digits(s: &str, len: usize) -> Option<u64> {
    if s.len() != len || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SEC: u64 = 1_000_000_000;

    fn tenant() -> TenantId {
        TenantId::new("acme").expect("valid tenant")
    }

    #[test]
    fn known_dates_and_boundaries() {
        let id = BlockId::from_u128(42);
        let cases = [
            (0, "1970-01-01", "00"),
            (3_599 * SEC + (SEC - 1), "1970-01-01", "00"),
            (3_600 * SEC, "1970-01-01", "01"),
            (86_399 * SEC, "1970-01-01", "23"),
            (86_400 * SEC, "1970-01-02", "00"),
            // 2024-02-29 (leap day) 23:59:59 and the next second.
            (1_709_251_199 * SEC, "2024-02-29", "23"),
            (1_709_251_200 * SEC, "2024-03-01", "00"),
            // 2023-02-28 23:00 and the next day (no leap day).
            (1_677_625_200 * SEC, "2023-02-28", "23"),
            (1_677_628_800 * SEC, "2023-03-01", "00"),
            // 2000 is a leap year, 2100 is not.
            (951_782_400 * SEC, "2000-02-29", "00"),
            (4_107_542_399 * SEC, "2100-02-28", "23"),
            (4_107_542_400 * SEC, "2100-03-01", "00"),
            // New year.
            (1_735_689_599 * SEC, "2024-12-31", "23"),
            (1_735_689_600 * SEC, "2025-01-01", "00"),
        ];
        for (t, date, hour) in cases {
            let p = block_path(&tenant(), Signal::Logs, t, id);
            assert_eq!(p.as_ref(), format!("acme/logs/{date}/{hour}/{id}.mira"), "time {t}");
            let loc = parse_block_path(&p).expect("own path parses");
            assert_eq!(loc.hour_start, t / (3_600 * SEC) * 3_600 * SEC);
            assert_eq!((loc.tenant, loc.signal, loc.block_id), (tenant(), Signal::Logs, id));
            assert_eq!(
                partition_prefix(&tenant(), Signal::Logs, t).as_ref(),
                format!("acme/logs/{date}/{hour}")
            );
        }
    }

    #[test]
    fn every_day_for_five_centuries_round_trips() {
        let id = BlockId::new();
        let mut expected_next = (1970, 1, 1);
        for day in 0..(u64::MAX / (86_400 * SEC)) {
            let (y, m, d) = civil_from_days(day);
            assert_eq!((y, m, d), expected_next, "day {day}");
            assert_eq!(days_from_civil(y, m, d), Some(day));
            expected_next = if d < days_in_month(y, m) {
                (y, m, d + 1)
            } else if m < 12 {
                (y, m + 1, 1)
            } else {
                (y + 1, 1, 1)
            };
            if day % 97 == 0 {
                let t = day * 86_400 * SEC + (day % 24) * 3_600 * SEC;
                let p = block_path(&tenant(), Signal::Traces, t, id);
                assert_eq!(parse_block_path(&p).map(|l| l.hour_start).ok(), Some(t));
            }
        }
        let last = block_path(&tenant(), Signal::Metrics, u64::MAX, id);
        assert!(last.as_ref().contains("2554-07-21/23"), "{last}");
    }

    #[test]
    fn rejects_non_canonical_paths() {
        let id = BlockId::from_u128(u128::MAX >> 3);
        assert!(id.to_string().chars().any(|c| c.is_ascii_uppercase()));
        let bad = [
            "acme/logs/2024-02-29/23".to_owned(),
            format!("acme/logs/2024-02-29/23/{id}.mira/x"),
            format!("acme/logs/2023-02-29/23/{id}.mira"),
            format!("acme/logs/2024-13-01/23/{id}.mira"),
            format!("acme/logs/2024-2-01/23/{id}.mira"),
            format!("acme/logs/2024-02-29/24/{id}.mira"),
            format!("acme/logs/2024-02-29/7/{id}.mira"),
            format!("acme/logs/2024-02-29/+7/{id}.mira"),
            format!("acme/logs/1969-12-31/23/{id}.mira"),
            format!("acme/spans/2024-02-29/23/{id}.mira"),
            format!("a%20b/logs/2024-02-29/23/{id}.mira"),
            format!("acme/logs/2024-02-29/23/{id}.parquet"),
            format!("acme/logs/2024-02-29/23/{}.mira", id.to_string().to_lowercase()),
            "acme/logs/2024-02-29/23/nope.mira".to_owned(),
        ];
        for p in bad {
            let path = Path::parse(&p).unwrap_or_else(|_| Path::from(p.as_str()));
            let err = parse_block_path(&path).expect_err(&p);
            assert!(matches!(err, BlockError::InvalidPath { .. }), "{p}: {err}");
        }
    }
}
