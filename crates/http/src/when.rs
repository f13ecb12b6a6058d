//! Times as RMQTT's API writes them, `YYYY-MM-DD HH:MM:SS`, here always in UTC (a server's
//! local zone is not something a script can know).

/// Days since 1970-01-01 of a civil date (proleptic Gregorian).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The civil date of a day count since 1970-01-01.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// Unix seconds as `YYYY-MM-DD HH:MM:SS` (UTC).
pub(crate) fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Unix seconds, or `YYYY-MM-DD HH:MM:SS` read as UTC.
pub(crate) fn parse_when(v: &str) -> Option<u64> {
    if let Ok(n) = v.parse::<u64>() {
        return Some(n);
    }
    let (date, clock) = v.trim().split_once(' ')?;
    let mut d = date.split('-').map(str::parse::<u32>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut c = clock.split(':').map(str::parse::<u32>);
    let (h, min, s) = (c.next()?.ok()?, c.next()?.ok()?, c.next()?.ok()?);
    if d.next().is_some() || c.next().is_some() {
        return None;
    }
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    let days = days_from_civil(i64::from(y), m, day);
    let secs = days * 86_400 + i64::from(h * 3600 + min * 60 + s);
    u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn known_instants() {
        assert_eq!(format_utc(0), "1970-01-01 00:00:00");
        assert_eq!(format_utc(951_782_400), "2000-02-29 00:00:00");
        assert_eq!(format_utc(1_798_761_599), "2026-12-31 23:59:59");
        assert_eq!(parse_when("2000-02-29 00:00:00"), Some(951_782_400));
        assert_eq!(parse_when("42"), Some(42));
        assert_eq!(parse_when("2026-13-01 00:00:00"), None);
        assert_eq!(parse_when("yesterday"), None);
    }

    proptest! {
        #[test]
        fn format_and_parse_round_trip(secs in 0u64..8_000_000_000) {
            prop_assert_eq!(parse_when(&format_utc(secs)), Some(secs));
        }
    }
}
