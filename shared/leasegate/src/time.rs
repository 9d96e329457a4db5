//! Times as storage, logs and answers write them: Unix seconds and RFC 3339. The one place
//! these conversions are written; every crate of the workspace uses them.

use std::time::{Duration, SystemTime};

/// The last second RFC 3339 can write (9999-12-31T23:59:59Z), in Unix seconds.
const LAST_RFC3339_SECOND: u64 = 253_402_300_799;

/// Unix seconds of a time (0 before 1970).
pub fn unix_secs(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The time of Unix seconds (saturating at the latest time the platform holds).
pub fn at_unix_secs(secs: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH
        .checked_add(Duration::from_secs(secs))
        .unwrap_or(SystemTime::UNIX_EPOCH + Duration::from_secs(LAST_RFC3339_SECOND))
}

/// A time as RFC 3339 in whole seconds (`2026-11-21T14:00:00Z`). A time before 1970 is written
/// as 1970's first second and one after the year 9999 (which RFC 3339 cannot write) as its
/// last, rather than failing.
pub fn rfc3339(t: SystemTime) -> String {
    let last = SystemTime::UNIX_EPOCH + Duration::from_secs(LAST_RFC3339_SECOND);
    let t = t.clamp(SystemTime::UNIX_EPOCH, last);
    humantime::format_rfc3339_seconds(t).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_convert_and_out_of_range_ones_are_clamped() {
        let t = at_unix_secs(1_795_096_800);
        assert_eq!(unix_secs(t), 1_795_096_800);
        assert_eq!(rfc3339(t), "2026-11-19T14:00:00Z");
        assert_eq!(
            unix_secs(SystemTime::UNIX_EPOCH - Duration::from_secs(5)),
            0
        );
        assert_eq!(
            rfc3339(SystemTime::UNIX_EPOCH - Duration::from_secs(5)),
            "1970-01-01T00:00:00Z"
        );
        assert_eq!(
            rfc3339(at_unix_secs(LAST_RFC3339_SECOND + 10)),
            "9999-12-31T23:59:59Z"
        );
    }
}
