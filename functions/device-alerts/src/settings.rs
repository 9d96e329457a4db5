//! The device-alerts settings: the gate's (`Settings`), the device allow list and the basics read first.

use std::time::Duration;

use leasegate_spin::config::{self, ConfigError, Storage, Variables};

/// The device-alerts settings that gating a device needs (the others are [`Basics`]).
#[derive(Debug, Clone)]
pub(crate) struct Settings {
    /// Storage.
    pub storage: Storage,
    /// Readings at or above this alert.
    pub threshold: f64,
    /// Whether notifications carry the gate's fencing token (`alert_fencing`).
    pub fencing: bool,
    /// Where notifications are posted.
    pub notify_url: String,
    /// How long one invocation may go on starting devices (`alert_deadline_ms`): a device not
    /// started by then is answered `deadline_exceeded`, nothing done for it.
    pub deadline: Duration,
}

/// One entry of `device_ids`: an exact id, or a prefix (written with a trailing `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DevicePattern {
    /// This id only.
    Exact(String),
    /// Every id that starts with this.
    Prefix(String),
}

impl DevicePattern {
    /// Reads `device_ids`: entries separated by `,`, each an id or a prefix followed by one
    /// `*` (`sensor-*`); `*` alone allows any id.
    pub fn parse_list(value: &str) -> Result<Vec<DevicePattern>, ConfigError> {
        let mut list = Vec::new();
        for entry in value.split(',').map(str::trim).filter(|e| !e.is_empty()) {
            let (stem, prefix) = match entry.strip_suffix('*') {
                Some(stem) => (stem, true),
                None => (entry, false),
            };
            if stem.contains('*') {
                return Err(ConfigError(format!(
                    "variable device_ids: '{}' may hold '*' only at its end (a prefix)",
                    entry.chars().take(64).collect::<String>()
                )));
            }
            list.push(if prefix {
                DevicePattern::Prefix(stem.to_string())
            } else {
                DevicePattern::Exact(stem.to_string())
            });
        }
        Ok(list)
    }

    fn matches(&self, id: &str) -> bool {
        match self {
            DevicePattern::Exact(e) => e == id,
            DevicePattern::Prefix(p) => id.starts_with(p.as_str()),
        }
    }
}

/// Whether `list` (empty: any) serves the device `id`.
pub(crate) fn device_allowed(list: &[DevicePattern], id: &str) -> bool {
    list.is_empty() || list.iter().any(|p| p.matches(id))
}

/// What every request is answered with: the threshold, the window and the devices served. A
/// request with no reading at or above the threshold reads only these (and the bearer token):
/// the rest of [`Settings`] is what gating a device needs.
#[derive(Debug, Clone)]
pub(crate) struct Basics {
    /// Readings at or above this alert.
    pub threshold: f64,
    /// At most one alert per device per this long.
    pub window: Duration,
    /// The device ids served (`device_ids`); empty: any.
    pub device_ids: Vec<DevicePattern>,
}

impl Basics {
    /// Reads `temperature_threshold`, `alert_window_seconds` and `device_ids`.
    pub fn load(vars: &dyn Variables) -> Result<Basics, ConfigError> {
        let threshold = config::number(
            vars,
            "temperature_threshold",
            30.0,
            -1_000_000_000..=1_000_000_000,
        )?;
        let window = config::number(vars, "alert_window_seconds", 60.0, 1..=86_400)?;
        if window.fract() != 0.0 {
            return Err(ConfigError(
                "variable alert_window_seconds must be whole seconds".into(),
            ));
        }
        let device_ids =
            DevicePattern::parse_list(&config::var(vars, "device_ids").unwrap_or_default())?;
        Ok(Basics {
            threshold,
            window: Duration::from_secs(window as u64),
            device_ids,
        })
    }
}

impl Settings {
    /// Reads the settings gating needs from variables (`threshold`: the basics').
    pub fn load_with(vars: &dyn Variables, threshold: f64) -> Result<Settings, ConfigError> {
        let fencing = match config::var(vars, "alert_fencing").as_deref() {
            None | Some("on") | Some("true") => true,
            Some("off") | Some("false") => false,
            Some(_) => {
                return Err(ConfigError(
                    "variable alert_fencing must be on or off".into(),
                ))
            }
        };
        let notify_url = config::url(vars, "notify_url")?;
        let deadline = config::number(vars, "alert_deadline_ms", 20_000.0, 100..=600_000)?;
        Ok(Settings {
            storage: config::storage(vars)?,
            threshold,
            fencing,
            notify_url,
            deadline: Duration::from_millis(deadline as u64),
        })
    }
}
