//! The test app's bearer tokens and secrets, and the `Authorization` headers made of them.

/// The bearer token the test app's gate expects.
pub const GATE_TOKEN: &str = "test-gate-token-7f3a";
/// The bearer token the test app's telemetry endpoint expects.
pub const TELEMETRY_TOKEN: &str = "test-telemetry-token-91c2";
/// The bearer token the example ship-once expects.
pub const SHIP_TOKEN: &str = "test-ship-token-2a6f";
/// The bearer token the example daily-digest expects.
pub const DIGEST_TOKEN: &str = "test-digest-token-8c5d";

/// The example ledger's bearer token in tests (`ledger_token`).
pub const LEDGER_TOKEN: &str = "test-ledger-token-4e7a";
/// The test app's `lease_id_secret`.
pub const LEASE_ID_SECRET: &str = "test-lease-id-secret-5d0e";
/// The bearer token of the test app's timer routes (`/api/jobs/...`).
pub const TIMER_TOKEN: &str = "test-timer-token-3b8d";
/// `Authorization: Bearer <TIMER_TOKEN>`.
pub const TIMER_AUTH: (&str, &str) = ("authorization", "Bearer test-timer-token-3b8d");
/// The admin token of the timer routes' destructive forms (`PUT /api/ttl/...`,
/// `DELETE /api/init/...`, `DELETE /api/leader`, ticks for past occurrences).
pub const ADMIN_TOKEN: &str = "test-admin-token-c41e";
/// `Authorization: Bearer <ADMIN_TOKEN>`.
pub const ADMIN_AUTH: (&str, &str) = ("authorization", "Bearer test-admin-token-c41e");

/// `Authorization: Bearer <TELEMETRY_TOKEN>`.
pub const TELEMETRY_AUTH: (&str, &str) = ("authorization", "Bearer test-telemetry-token-91c2");
