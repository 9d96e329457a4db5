//! A small in-memory Blob service: what the lease and job protocols depend on, and nothing
//! else. Blobs with a body, metadata, an ETag and `Last-Modified`; native leases with their
//! states and durations by the storage clock; `If-Match` / `If-None-Match: *`; blob index tags
//! (`x-ms-tags` on Put Blob, Get and Set Blob Tags) and the `x-ms-if-tags` condition
//! ([`crate::tags`]); the lease rules of writes; List Blobs by prefix (metadata and tags
//! included on request); Find Blobs by Tags in a container. And one account's tables
//! ([`crate::table`]). Each answer carries the storage clock's `Date`. The rules are those of
//! `REFERENCE.md` section 1, 2 and 10 (Azure's, which Azurite follows), the same tables the
//! project's tests check against the real Azurite.
//!
//! Not modeled: signatures (every request is taken as authorized), block and page contents,
//! snapshots, copies, Find Blobs by Tags across the account (`@container`), containers' own
//! leases; Azurite's quirk of ignoring `x-ms-if-tags` beside another condition (the model
//! evaluates both, as Azure does). The tag index follows every write at once (as Azurite's
//! does; Azure's may lag by minutes).

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use crate::table::Tables;
use crate::tags::{self, Tags};
use crate::wire::{WireRequest, WireResponse};

/// A native lease, as storage keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum NativeLease {
    /// No lease.
    Available,
    /// Held by `id` until `until` (storage seconds; `None`: infinite).
    Leased {
        /// The lease id.
        id: String,
        /// When it runs out.
        until: Option<u64>,
        /// Its duration in seconds (`None`: infinite): a renew runs it again from the renew.
        duration: Option<u64>,
    },
    /// Being broken: held by `id` until `until`, then broken.
    Breaking {
        /// The lease id.
        id: String,
        /// When the break completes.
        until: u64,
    },
    /// Broken (the last id is kept: it may still release).
    Broken {
        /// The lease id.
        id: String,
    },
}

/// A lease as it stands at a time: the stored state with time applied.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Effective {
    Available,
    Leased(String),
    Breaking(String),
    Broken(String),
    Expired(String),
}

/// One blob.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Blob {
    /// Its content.
    pub body: Vec<u8>,
    /// Its metadata, names lowercase.
    pub metadata: BTreeMap<String, String>,
    /// Its index tags (Put Blob's `x-ms-tags` sets them all; Set Blob Tags too).
    pub tags: Tags,
    /// Its ETag (a counter of the store's).
    pub etag: u64,
    /// When it was last written (storage seconds).
    pub last_modified: u64,
    /// Page blob (`true`) or block blob.
    pub page: bool,
    /// Its native lease.
    pub lease: NativeLease,
}

impl Blob {
    fn effective(&self, clock: u64) -> Effective {
        match &self.lease {
            NativeLease::Available => Effective::Available,
            NativeLease::Leased { id, until, .. } => match until {
                Some(u) if *u <= clock => Effective::Expired(id.clone()),
                _ => Effective::Leased(id.clone()),
            },
            NativeLease::Breaking { id, until } if *until <= clock => Effective::Broken(id.clone()),
            NativeLease::Breaking { id, .. } => Effective::Breaking(id.clone()),
            NativeLease::Broken { id } => Effective::Broken(id.clone()),
        }
    }

    /// The id that holds the blob's native lease at `clock`, if any.
    pub fn leased_by(&self, clock: u64) -> Option<&str> {
        match (&self.lease, self.effective(clock)) {
            (NativeLease::Leased { id, .. }, Effective::Leased(_))
            | (NativeLease::Breaking { id, .. }, Effective::Breaking(_)) => Some(id),
            _ => None,
        }
    }
}

/// The whole store: containers, blobs, the clock.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Storage {
    /// The storage clock, Unix seconds: every `Date`, every lease expiry.
    pub clock: u64,
    /// Leases acquired in a second run out at the end of their last second (acquired late in
    /// it) rather than at its start: at `Date` = grant + duration, such a lease is still held.
    pub leases_last_through_their_second: bool,
    /// `x-ms-if-tags` on a blob that does not exist lets the request through, unchecked (Azurite
    /// 3.35: `docs/protocol.md`, "Fenced writes"), rather than refusing it (412, as the model
    /// takes Azure to do by default).
    pub if_tags_unchecked_on_missing_blob: bool,
    containers: BTreeSet<String>,
    blobs: BTreeMap<(String, String), Blob>,
    etags: u64,
    /// The account's tables.
    pub tables: Tables,
}

/// An error answer.
fn error(status: u16, code: &str) -> WireResponse {
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>{code}</Code><Message>model</Message></Error>"
    );
    WireResponse {
        status,
        headers: vec![("x-ms-error-code".into(), code.into())],
        body: body.into_bytes(),
    }
}

fn http_date(secs: u64) -> String {
    httpdate::fmt_http_date(SystemTime::UNIX_EPOCH + Duration::from_secs(secs))
}

impl Storage {
    /// An empty store whose clock reads `clock`.
    pub fn new(clock: u64) -> Self {
        Storage {
            clock,
            leases_last_through_their_second: false,
            if_tags_unchecked_on_missing_blob: false,
            containers: BTreeSet::new(),
            blobs: BTreeMap::new(),
            etags: 0,
            tables: Tables::default(),
        }
    }

    /// Creates `container` (as a deployment's set-up would).
    pub fn create_container(&mut self, container: &str) {
        self.containers.insert(container.to_string());
    }

    /// Writes blob `name` of `container` with `body` (as an earlier run left it).
    pub fn seed_blob(&mut self, container: &str, name: &str, body: Vec<u8>) {
        let etag = self.next_etag();
        self.blobs.insert(
            (container.to_string(), name.to_string()),
            Blob {
                body,
                metadata: BTreeMap::new(),
                tags: Tags::new(),
                etag,
                last_modified: self.clock,
                page: false,
                lease: NativeLease::Available,
            },
        );
    }

    /// The blob `name` of `container`.
    pub fn blob(&self, container: &str, name: &str) -> Option<&Blob> {
        self.blobs.get(&(container.to_string(), name.to_string()))
    }

    /// Every blob, by container and name.
    pub fn blobs(&self) -> impl Iterator<Item = (&(String, String), &Blob)> {
        self.blobs.iter()
    }

    /// `503 ServerBusy`, dated: what a busy storage answers without doing anything.
    pub fn busy(&self) -> WireResponse {
        let mut answer = error(503, "ServerBusy");
        answer.headers.push(("date".into(), http_date(self.clock)));
        answer
    }

    /// `500 OperationTimedOut`, dated: what storage may answer after it applied a request.
    pub fn timed_out(&self) -> WireResponse {
        let mut answer = error(500, "OperationTimedOut");
        answer.headers.push(("date".into(), http_date(self.clock)));
        answer
    }

    /// Answers `request` to the Blob service and applies what it does. Every answer carries
    /// `Date`.
    pub fn handle(&mut self, request: &WireRequest) -> WireResponse {
        let answer = self.answer(request);
        self.dated(answer)
    }

    /// Answers `request` to the Table service ([`Tables::answer`]) and applies what it does.
    /// Every answer carries `Date`.
    pub fn handle_table(&mut self, request: &WireRequest) -> WireResponse {
        let answer = self.tables.answer(request, self.clock);
        self.dated(answer)
    }

    fn dated(&self, mut answer: WireResponse) -> WireResponse {
        answer.headers.push(("date".into(), http_date(self.clock)));
        answer
            .headers
            .push(("x-ms-request-id".into(), "model".into()));
        answer
    }

    fn answer(&mut self, r: &WireRequest) -> WireResponse {
        // Path style: /{account}/{container}[/{blob}].
        let path = percent_encoding::percent_decode_str(r.path())
            .decode_utf8_lossy()
            .into_owned();
        let mut parts = path.trim_start_matches('/').splitn(3, '/');
        let _account = parts.next();
        let container = parts.next().unwrap_or("").to_string();
        let blob = parts.next().map(str::to_string);
        let comp = r.query("comp");
        match (r.method.as_str(), blob, comp.as_deref()) {
            ("PUT", None, None) if r.query("restype").as_deref() == Some("container") => {
                if self.containers.insert(container) {
                    WireResponse::new(201)
                } else {
                    error(409, "ContainerAlreadyExists")
                }
            }
            ("GET", None, Some("list")) => self.list(&container, r),
            ("GET", None, Some("blobs")) if r.query("restype").as_deref() == Some("container") => {
                self.find(&container, r)
            }
            _ if !self.containers.contains(&container) => error(404, "ContainerNotFound"),
            ("HEAD" | "GET", Some(b), None) => self.head(&container, &b, r),
            ("PUT", Some(b), None) => self.put(&container, &b, r),
            ("PUT", Some(b), Some("metadata")) => self.set_metadata(&container, &b, r),
            ("GET", Some(b), Some("tags")) => self.get_tags(&container, &b, r),
            ("PUT", Some(b), Some("tags")) => self.set_tags(&container, &b, r),
            ("PUT", Some(b), Some("lease")) => self.lease(&container, &b, r),
            ("DELETE", Some(b), None) => self.delete(&container, &b, r),
            _ => error(400, "UnsupportedByTheModel"),
        }
    }

    fn properties(&self, blob: &Blob, mut answer: WireResponse) -> WireResponse {
        let (state, status) = match blob.effective(self.clock) {
            Effective::Available => ("available", "unlocked"),
            Effective::Leased(_) => ("leased", "locked"),
            Effective::Breaking(_) => ("breaking", "locked"),
            Effective::Broken(_) => ("broken", "unlocked"),
            Effective::Expired(_) => ("expired", "unlocked"),
        };
        answer = answer
            .with("etag", format!("\"0x{:X}\"", blob.etag))
            .with("last-modified", http_date(blob.last_modified))
            .with("x-ms-lease-state", state)
            .with("x-ms-lease-status", status)
            .with(
                "x-ms-blob-type",
                if blob.page { "PageBlob" } else { "BlockBlob" },
            )
            .with("content-length", blob.body.len().to_string());
        if !blob.tags.is_empty() {
            answer = answer.with("x-ms-tag-count", blob.tags.len().to_string());
        }
        if let NativeLease::Leased { until, .. } = &blob.lease {
            if state == "leased" {
                answer = answer.with(
                    "x-ms-lease-duration",
                    if until.is_some() { "fixed" } else { "infinite" },
                );
            }
        }
        for (k, v) in &blob.metadata {
            answer = answer.with(&format!("x-ms-meta-{k}"), v.clone());
        }
        answer
    }

    fn head(&self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let Some(blob) = self.blob(container, name) else {
            return error(404, "BlobNotFound");
        };
        if let Err(e) = self.tags_condition(Some(blob), r) {
            return e;
        }
        let with_body = r.method == "GET";
        let mut answer = self.properties(blob, WireResponse::new(200));
        if with_body {
            answer.body = blob.body.clone();
        }
        answer
    }

    /// `If-Match` / `If-None-Match: *` against the blob as it is.
    fn condition(&self, blob: Option<&Blob>, r: &WireRequest) -> Result<(), WireResponse> {
        if let Some(want) = r.header("if-match") {
            let want = want.trim_matches('"');
            match blob {
                Some(b) if want == "*" || want == format!("0x{:X}", b.etag) => {}
                Some(_) => return Err(error(412, "ConditionNotMet")),
                None => return Err(error(404, "BlobNotFound")),
            }
        }
        if r.header("if-none-match") == Some("*") && blob.is_some() {
            return Err(error(409, "BlobAlreadyExists"));
        }
        self.tags_condition(blob, r)
    }

    /// `x-ms-if-tags` against the blob's tags: 412 `ConditionNotMet` when they do not meet it,
    /// or when there is no blob (no tags to meet it; Azurite lets the request through then,
    /// [`Storage::if_tags_unchecked_on_missing_blob`]); 400 when the model cannot read it.
    /// Evaluated beside `If-Match` / `If-None-Match` (all must hold), as Azure does: Azurite
    /// ignores it when another condition rides on the request (`docs/ttl-sweeper.md`).
    fn tags_condition(&self, blob: Option<&Blob>, r: &WireRequest) -> Result<(), WireResponse> {
        let Some(condition) = r.header("x-ms-if-tags") else {
            return Ok(());
        };
        let empty = Tags::new();
        match tags::holds(condition, blob.map_or(&empty, |b| &b.tags)) {
            Some(_) if blob.is_none() && self.if_tags_unchecked_on_missing_blob => Ok(()),
            Some(true) if blob.is_some() => Ok(()),
            Some(_) => Err(error(412, "ConditionNotMet")),
            None => Err(error(400, "InvalidHeaderValue")),
        }
    }

    /// The lease rule of a write (REFERENCE.md, "Writes to a blob versus its lease"). `Ok`:
    /// allowed; a broken or expired lease is then cleared by a write without an id.
    fn write_allowed(&self, blob: &Blob, r: &WireRequest) -> Result<bool, WireResponse> {
        let given = r.header("x-ms-lease-id");
        match (blob.effective(self.clock), given) {
            (Effective::Available, None) => Ok(false),
            (Effective::Available, Some(_)) => Err(error(412, "LeaseNotPresentWithBlobOperation")),
            (Effective::Leased(id), Some(g)) if id == g => Ok(false),
            (Effective::Leased(_), Some(_)) => Err(error(409, "LeaseIdMismatchWithBlobOperation")),
            (Effective::Leased(_) | Effective::Breaking(_), None) => {
                Err(error(412, "LeaseIdMissing"))
            }
            (Effective::Breaking(id), Some(g)) if id == g => Ok(false),
            (Effective::Breaking(_), Some(_)) => {
                Err(error(412, "LeaseIdMismatchWithBlobOperation"))
            }
            (Effective::Broken(_) | Effective::Expired(_), Some(_)) => {
                Err(error(412, "LeaseNotPresentWithBlobOperation"))
            }
            (Effective::Broken(_) | Effective::Expired(_), None) => Ok(true),
        }
    }

    fn metadata_of(r: &WireRequest) -> BTreeMap<String, String> {
        r.headers
            .iter()
            .filter_map(|(n, v)| Some((n.strip_prefix("x-ms-meta-")?.to_string(), v.clone())))
            .collect()
    }

    fn next_etag(&mut self) -> u64 {
        self.etags += 1;
        self.etags
    }

    fn written(&self, blob: &Blob, status: u16) -> WireResponse {
        WireResponse::new(status)
            .with("etag", format!("\"0x{:X}\"", blob.etag))
            .with("last-modified", http_date(blob.last_modified))
    }

    fn put(&mut self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let key = (container.to_string(), name.to_string());
        let existing = self.blobs.get(&key);
        if let Err(e) = self.condition(existing, r) {
            return e;
        }
        let lease = match existing {
            Some(b) => match self.write_allowed(b, r) {
                Ok(true) => NativeLease::Available,
                Ok(false) => b.lease.clone(),
                Err(e) => return e,
            },
            None if r.header("x-ms-lease-id").is_some() => {
                return error(412, "LeaseNotPresentWithBlobOperation")
            }
            None => NativeLease::Available,
        };
        // The write replaces the blob, its tags with it: those of `x-ms-tags`, or none.
        let tags = match r.header("x-ms-tags").map(tags::parse_header) {
            None => Tags::new(),
            Some(Some(tags)) => tags,
            Some(None) => return error(400, "InvalidHeaderValue"),
        };
        let blob = Blob {
            body: r.body.clone(),
            metadata: Self::metadata_of(r),
            tags,
            etag: self.next_etag(),
            last_modified: self.clock,
            page: r.header("x-ms-blob-type") == Some("PageBlob"),
            lease,
        };
        let answer = self.written(&blob, 201);
        self.blobs.insert(key, blob);
        answer
    }

    fn set_metadata(&mut self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let key = (container.to_string(), name.to_string());
        let Some(existing) = self.blobs.get(&key) else {
            return error(404, "BlobNotFound");
        };
        if let Err(e) = self.condition(Some(existing), r) {
            return e;
        }
        let clear = match self.write_allowed(existing, r) {
            Ok(clear) => clear,
            Err(e) => return e,
        };
        let etag = self.next_etag();
        let clock = self.clock;
        let blob = self.blobs.get_mut(&key).expect("read above");
        blob.metadata = Self::metadata_of(r);
        blob.etag = etag;
        blob.last_modified = clock;
        if clear {
            blob.lease = NativeLease::Available;
        }
        let blob = blob.clone();
        self.written(&blob, 200)
    }

    /// [Get Blob Tags](https://learn.microsoft.com/rest/api/storageservices/get-blob-tags).
    fn get_tags(&self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let Some(blob) = self.blob(container, name) else {
            return error(404, "BlobNotFound");
        };
        if let Err(e) = self.tags_condition(Some(blob), r) {
            return e;
        }
        WireResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/xml".into())],
            body: tags::tag_set_xml(&blob.tags).into_bytes(),
        }
    }

    /// [Set Blob Tags](https://learn.microsoft.com/rest/api/storageservices/set-blob-tags):
    /// replaces every tag; the ETag and `Last-Modified` stay. A leased blob needs its lease id
    /// (the model applies the rule of writes).
    fn set_tags(&mut self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let key = (container.to_string(), name.to_string());
        let Some(existing) = self.blobs.get(&key) else {
            return error(404, "BlobNotFound");
        };
        if let Err(e) = self.tags_condition(Some(existing), r) {
            return e;
        }
        if let Err(e) = self.write_allowed(existing, r) {
            return e;
        }
        let Some(tags) = std::str::from_utf8(&r.body)
            .ok()
            .and_then(tags::parse_tag_set_xml)
        else {
            return error(400, "InvalidXmlDocument");
        };
        self.blobs.get_mut(&key).expect("read above").tags = tags;
        WireResponse::new(204)
    }

    fn delete(&mut self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let key = (container.to_string(), name.to_string());
        let Some(existing) = self.blobs.get(&key) else {
            return error(404, "BlobNotFound");
        };
        if let Err(e) = self.condition(Some(existing), r) {
            return e;
        }
        if let Err(e) = self.write_allowed(existing, r) {
            return e;
        }
        self.blobs.remove(&key);
        WireResponse::new(202)
    }

    /// Lease Blob (REFERENCE.md, the table of outcomes by lease state).
    fn lease(&mut self, container: &str, name: &str, r: &WireRequest) -> WireResponse {
        let key = (container.to_string(), name.to_string());
        let clock = self.clock;
        let Some(blob) = self.blobs.get(&key) else {
            return error(404, "BlobNotFound");
        };
        if let Err(e) = self.condition(Some(blob), r) {
            return e;
        }
        let state = blob.effective(clock);
        let given = r.header("x-ms-lease-id").map(str::to_string);
        let proposed = r.header("x-ms-proposed-lease-id").map(str::to_string);
        let action = r.header("x-ms-lease-action").unwrap_or("");
        let (lease, answer) = match action {
            "acquire" => {
                let duration = match r
                    .header("x-ms-lease-duration")
                    .and_then(|d| d.parse::<i64>().ok())
                {
                    Some(-1) => None,
                    Some(d @ 15..=60) => Some(d as u64),
                    _ => return error(400, "InvalidHeaderValue"),
                };
                let until =
                    duration.map(|d| clock + d + u64::from(self.leases_last_through_their_second));
                let Some(id) = proposed else {
                    return error(400, "UnsupportedByTheModel");
                };
                match state {
                    Effective::Leased(held) if held != id => {
                        return error(409, "LeaseAlreadyPresent")
                    }
                    Effective::Breaking(_) => {
                        return error(409, "LeaseIsBreakingAndCannotBeAcquired")
                    }
                    _ => (
                        NativeLease::Leased {
                            id: id.clone(),
                            until,
                            duration,
                        },
                        WireResponse::new(201).with("x-ms-lease-id", id),
                    ),
                }
            }
            // Renew (A): Leased(A) runs again from now; Expired(A) too (the model clears an
            // expired lease at the blob's next write, so an expired one is unmodified since);
            // Available, Breaking, Broken or another id: 409.
            "renew" => match (state, given, &blob.lease) {
                (
                    Effective::Leased(held) | Effective::Expired(held),
                    Some(g),
                    NativeLease::Leased { duration, .. },
                ) if held == g => (
                    NativeLease::Leased {
                        id: g.clone(),
                        until: duration
                            .map(|d| clock + d + u64::from(self.leases_last_through_their_second)),
                        duration: *duration,
                    },
                    WireResponse::new(200).with("x-ms-lease-id", g),
                ),
                (Effective::Available, _, _) => {
                    return error(409, "LeaseNotPresentWithLeaseOperation")
                }
                (Effective::Broken(held) | Effective::Breaking(held), Some(g), _) if held == g => {
                    return error(409, "LeaseIsBrokenAndCannotBeRenewed")
                }
                _ => return error(409, "LeaseIdMismatchWithLeaseOperation"),
            },
            "release" => match (state, given) {
                (Effective::Available, _) => {
                    return error(409, "LeaseNotPresentWithLeaseOperation")
                }
                (
                    Effective::Leased(held)
                    | Effective::Breaking(held)
                    | Effective::Broken(held)
                    | Effective::Expired(held),
                    Some(g),
                ) if held == g => (NativeLease::Available, WireResponse::new(200)),
                _ => return error(409, "LeaseIdMismatchWithLeaseOperation"),
            },
            "break" => {
                let period: u64 = r
                    .header("x-ms-lease-break-period")
                    .and_then(|p| p.parse().ok())
                    .unwrap_or(60);
                match state {
                    Effective::Available => return error(409, "LeaseNotPresentWithLeaseOperation"),
                    Effective::Leased(id) | Effective::Breaking(id) if period > 0 => {
                        let remaining = match &blob.lease {
                            NativeLease::Leased { until: Some(u), .. }
                            | NativeLease::Breaking { until: u, .. } => u.saturating_sub(clock),
                            _ => period,
                        };
                        let until = clock + period.min(remaining);
                        (
                            NativeLease::Breaking { id, until },
                            WireResponse::new(202)
                                .with("x-ms-lease-time", (until - clock).to_string()),
                        )
                    }
                    Effective::Leased(id)
                    | Effective::Breaking(id)
                    | Effective::Broken(id)
                    | Effective::Expired(id) => (
                        NativeLease::Broken { id },
                        WireResponse::new(202).with("x-ms-lease-time", "0"),
                    ),
                }
            }
            _ => return error(400, "UnsupportedByTheModel"),
        };
        let blob = self.blobs.get_mut(&key).expect("read above");
        blob.lease = lease;
        let blob = blob.clone();
        // Lease operations change neither the ETag nor Last-Modified.
        let mut answer = answer;
        answer.headers.extend(self.written(&blob, 0).headers);
        answer
    }

    fn list(&self, container: &str, r: &WireRequest) -> WireResponse {
        if !self.containers.contains(container) {
            return error(404, "ContainerNotFound");
        }
        let prefix = r.query("prefix").unwrap_or_default();
        let marker = r.query("marker").unwrap_or_default();
        let max: usize = r
            .query("maxresults")
            .and_then(|m| m.parse().ok())
            .unwrap_or(5000);
        let include = |what: &str| {
            r.query("include")
                .is_some_and(|i| i.split(',').any(|x| x == what))
        };
        let (metadata, with_tags) = (include("metadata"), include("tags"));
        let names: Vec<&(String, String)> = self
            .blobs
            .keys()
            .filter(|(c, n)| c == container && n.starts_with(&prefix) && *n >= marker)
            .collect();
        let mut xml =
            String::from("<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults><Blobs>");
        for key in names.iter().take(max) {
            let blob = &self.blobs[*key];
            let state = match blob.effective(self.clock) {
                Effective::Available => "available",
                Effective::Leased(_) => "leased",
                Effective::Breaking(_) => "breaking",
                Effective::Broken(_) => "broken",
                Effective::Expired(_) => "expired",
            };
            xml.push_str(&format!(
                "<Blob><Name>{}</Name><Properties><Last-Modified>{}</Last-Modified><Etag>\"0x{:X}\"</Etag><Content-Length>{}</Content-Length><BlobType>{}</BlobType><LeaseState>{}</LeaseState>",
                escape(&key.1),
                http_date(blob.last_modified),
                blob.etag,
                blob.body.len(),
                if blob.page { "PageBlob" } else { "BlockBlob" },
                state
            ));
            // A blob with tags lists their count among its properties.
            if !blob.tags.is_empty() {
                xml.push_str(&format!("<TagCount>{}</TagCount>", blob.tags.len()));
            }
            xml.push_str("</Properties>");
            if metadata {
                xml.push_str("<Metadata>");
                for (k, v) in &blob.metadata {
                    xml.push_str(&format!("<{k}>{}</{k}>", escape(v)));
                }
                xml.push_str("</Metadata>");
            }
            if with_tags && !blob.tags.is_empty() {
                xml.push_str(&tags::tags_element(&blob.tags));
            }
            xml.push_str("</Blob>");
        }
        xml.push_str("</Blobs>");
        match names.get(max) {
            Some(next) => xml.push_str(&format!("<NextMarker>{}</NextMarker>", escape(&next.1))),
            None => xml.push_str("<NextMarker/>"),
        }
        xml.push_str("</EnumerationResults>");
        WireResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/xml".into())],
            body: xml.into_bytes(),
        }
    }
}

impl Storage {
    /// [Find Blobs by Tags](https://learn.microsoft.com/rest/api/storageservices/find-blobs-by-tags)
    /// in one container (`?restype=container&comp=blobs&where=...`): the blobs whose tags meet
    /// the query, by name from `marker`, `maxresults` (default 5000) at a time; each with its
    /// container and the tags the query names, no property.
    fn find(&self, container: &str, r: &WireRequest) -> WireResponse {
        if !self.containers.contains(container) {
            return error(404, "ContainerNotFound");
        }
        let query = r.query("where").unwrap_or_default();
        let Some(keys) = tags::query_keys(&query) else {
            return error(400, "InvalidQueryParameterValue");
        };
        let marker = r.query("marker").unwrap_or_default();
        let max: usize = match r.query("maxresults").map(|m| m.parse()) {
            None => 5000,
            Some(Ok(m @ 1..=5000)) => m,
            Some(_) => return error(400, "OutOfRangeQueryParameterValue"),
        };
        let found: Vec<(&String, &Blob)> = self
            .blobs
            .iter()
            .filter(|((c, n), b)| {
                c == container && *n >= marker && tags::holds(&query, &b.tags) == Some(true)
            })
            .map(|((_, n), b)| (n, b))
            .collect();
        let mut xml = format!(
            "<?xml version=\"1.0\" encoding=\"utf-8\"?><EnumerationResults><Where>{}</Where><Blobs>",
            escape(&query)
        );
        for (name, blob) in found.iter().take(max) {
            let matched: Tags = blob
                .tags
                .iter()
                .filter(|(k, _)| keys.contains(k))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            xml.push_str(&format!(
                "<Blob><Name>{}</Name><ContainerName>{}</ContainerName>{}</Blob>",
                escape(name),
                escape(container),
                tags::tags_element(&matched)
            ));
        }
        xml.push_str("</Blobs>");
        match found.get(max) {
            Some((next, _)) => xml.push_str(&format!("<NextMarker>{}</NextMarker>", escape(next))),
            None => xml.push_str("<NextMarker/>"),
        }
        xml.push_str("</EnumerationResults>");
        WireResponse {
            status: 200,
            headers: vec![("content-type".into(), "application/xml".into())],
            body: xml.into_bytes(),
        }
    }
}

fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
