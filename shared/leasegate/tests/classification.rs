//! Recorded storage answers, table by table, and what the parsers make of them.
//!
//! Rows marked `AZURITE` are answers the emulator gives where Azure gives another one (or the
//! reverse); the classification is built so that both land on the same outcome, and no lease
//! algorithm depends on the cases where they disagree.

use leasegate::ops::{
    Condition, DeleteBlob, DeleteOutcome, GetProperties, Lease, LeaseAction, LeaseOutcome,
    Operation, Refusal, SetMetadata, WriteOutcome,
};
use leasegate::{BlobName, ContainerName, Error, ErrorClass, LeaseDuration, LeaseId};
use leasegate::{Response, StatusCode};

fn response(status: u16, code: Option<&str>, body: &str) -> Response {
    let mut r = Response::new(StatusCode::from_u16(status).unwrap())
        .with_header("x-ms-request-id", "0f6d1b0e-501e-0035-5a1c-1c2b3a000000")
        .with_header("date", "Sat, 21 Nov 2026 14:00:00 GMT");
    if let Some(code) = code {
        r = r.with_header("x-ms-error-code", code);
    }
    r.with_body(body.as_bytes().to_vec())
}

fn id(n: u8) -> LeaseId {
    LeaseId::from_random_bytes([n; 16])
}

fn lease(action: LeaseAction) -> Lease {
    Lease::new(
        ContainerName::try_new("leasegate").unwrap(),
        BlobName::try_new("locks/x").unwrap(),
        action,
    )
}

fn acquire() -> Lease {
    lease(LeaseAction::Acquire {
        duration: LeaseDuration::Seconds(15),
        proposed: id(1),
    })
}

fn set_metadata(condition: Condition) -> SetMetadata {
    SetMetadata {
        container: ContainerName::try_new("leasegate").unwrap(),
        blob: BlobName::try_new("locks/x").unwrap(),
        metadata: Default::default(),
        lease_id: Some(id(1)),
        condition,
    }
}

#[test]
fn lease_answers() {
    let renew = lease(LeaseAction::Renew(id(1)));
    let release = lease(LeaseAction::Release(id(1)));
    let brk = lease(LeaseAction::Break { period: Some(0) });
    let acq = acquire();
    let rows: Vec<(&Lease, u16, Option<&str>, LeaseOutcome)> = vec![
        (
            &acq,
            409,
            Some("LeaseAlreadyPresent"),
            LeaseOutcome::HeldByOther,
        ),
        (
            &acq,
            409,
            Some("LeaseIsBreakingAndCannotBeAcquired"),
            LeaseOutcome::HeldByOther,
        ),
        (
            &renew,
            409,
            Some("LeaseIdMismatchWithLeaseOperation"),
            LeaseOutcome::NotHeld,
        ),
        (
            &renew,
            409,
            Some("LeaseIsBrokenAndCannotBeRenewed"),
            LeaseOutcome::NotHeld,
        ),
        (
            &renew,
            409,
            Some("LeaseNotPresentWithLeaseOperation"),
            LeaseOutcome::NotHeld,
        ),
        // AZURITE: renewing an *expired* lease with another id answers 200 on Azurite; Azure
        // answers this 409. leasegate never renews with another id (it re-acquires), so the
        // difference cannot change a decision.
        (
            &renew,
            409,
            Some("LeaseIdMismatchWithLeaseOperation"),
            LeaseOutcome::NotHeld,
        ),
        (
            &release,
            409,
            Some("LeaseIdMismatchWithLeaseOperation"),
            LeaseOutcome::NotHeld,
        ),
        (
            &release,
            409,
            Some("LeaseNotPresentWithLeaseOperation"),
            LeaseOutcome::NotHeld,
        ),
        (
            &brk,
            409,
            Some("LeaseNotPresentWithLeaseOperation"),
            LeaseOutcome::NotHeld,
        ),
        (&release, 200, None, LeaseOutcome::Released),
    ];
    for (op, status, code, want) in rows {
        let got = op.parse(&response(status, code, "")).unwrap();
        assert_eq!(got, want, "{:?} {status} {code:?}", op.action);
    }
    // Success of acquire carries the id and the server's date.
    let ok = Response::new(StatusCode::CREATED)
        .with_header("x-ms-lease-id", id(1).to_string())
        .with_header("etag", "\"0x8DB\"")
        .with_header("date", "Sat, 21 Nov 2026 14:00:00 GMT");
    assert!(matches!(
        acquire().parse(&ok).unwrap(),
        LeaseOutcome::Held { lease_id, server_date: Some(_), .. } if lease_id == id(1)
    ));
}

#[test]
fn write_answers() {
    let cas = set_metadata(Condition::IfMatch(leasegate::ETag::new("0x1")));
    let plain = set_metadata(Condition::None);
    let rows: Vec<(&SetMetadata, u16, Option<&str>, WriteOutcome)> = vec![
        (
            &cas,
            412,
            Some("ConditionNotMet"),
            WriteOutcome::Refused(Refusal::ConditionFailed),
        ),
        (
            &plain,
            412,
            Some("LeaseIdMissing"),
            WriteOutcome::Refused(Refusal::LeaseHeld),
        ),
        // Azure: a write with another id on a leased blob is 409; AZURITE answers 412 with the
        // same code. Both are "lease lost".
        (
            &plain,
            409,
            Some("LeaseIdMismatchWithBlobOperation"),
            WriteOutcome::Refused(Refusal::LeaseLost),
        ),
        (
            &plain,
            412,
            Some("LeaseIdMismatchWithBlobOperation"),
            WriteOutcome::Refused(Refusal::LeaseLost),
        ),
        (
            &plain,
            412,
            Some("LeaseNotPresentWithBlobOperation"),
            WriteOutcome::Refused(Refusal::LeaseLost),
        ),
    ];
    for (op, status, code, want) in rows {
        assert_eq!(
            op.parse(&response(status, code, "")).unwrap(),
            want,
            "{status} {code:?}"
        );
    }
    // Create-if-absent: Azure and Azurite say 409 BlobAlreadyExists; some peers say 412.
    let create = leasegate::ops::PutBlob::block(
        ContainerName::try_new("leasegate").unwrap(),
        BlobName::try_new("b").unwrap(),
        Vec::new(),
    )
    .with_condition(Condition::IfNotExists);
    for (status, code) in [(409, "BlobAlreadyExists"), (412, "ConditionNotMet")] {
        assert_eq!(
            create.parse(&response(status, Some(code), "")).unwrap(),
            WriteOutcome::Refused(Refusal::AlreadyExists),
            "{status} {code}"
        );
    }
    // A copy that must not overwrite (If-None-Match: *) and copies only the listed version
    // (x-ms-source-if-match): the source's refusal is told apart by its code.
    let copy = leasegate::ops::CopyBlob {
        condition: Condition::IfNotExists,
        source_etag: Some(leasegate::ETag::new("0x1")),
        ..leasegate::ops::CopyBlob::new(
            ContainerName::try_new("src").unwrap(),
            BlobName::try_new("b").unwrap(),
            ContainerName::try_new("dead").unwrap(),
            BlobName::try_new("b").unwrap(),
        )
    };
    for (status, code, want) in [
        (412, "SourceConditionNotMet", Refusal::ConditionFailed),
        (412, "TargetConditionNotMet", Refusal::AlreadyExists),
        (409, "BlobAlreadyExists", Refusal::AlreadyExists),
    ] {
        assert_eq!(
            copy.parse(&response(status, Some(code), "")).unwrap(),
            leasegate::ops::CopyOutcome::Refused(want),
            "{status} {code}"
        );
    }
    let delete = DeleteBlob {
        container: ContainerName::try_new("leasegate").unwrap(),
        blob: BlobName::try_new("b").unwrap(),
        lease_id: None,
        condition: Condition::None,
    };
    assert_eq!(
        delete
            .parse(&response(404, Some("BlobNotFound"), ""))
            .unwrap(),
        DeleteOutcome::NotFound
    );
    assert_eq!(
        delete.parse(&response(202, None, "")).unwrap(),
        DeleteOutcome::Deleted
    );
    assert_eq!(
        delete
            .parse(&response(412, Some("LeaseIdMissing"), ""))
            .unwrap(),
        DeleteOutcome::Refused(Refusal::LeaseHeld)
    );
}

#[test]
fn errors_keep_status_code_and_request_id() {
    let xml_403 = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?><Error><Code>AuthenticationFailed</Code>\
<Message>Server failed to authenticate the request. The MAC signature found in the HTTP request 'c2lnbmF0dXJl' is not the same as any computed signature.</Message></Error>";
    let rows: Vec<(u16, Option<&str>, &str, ErrorClass, bool)> = vec![
        (
            404,
            Some("BlobNotFound"),
            "",
            ErrorClass::BlobMissing,
            false,
        ),
        (
            404,
            Some("ContainerNotFound"),
            "",
            ErrorClass::ContainerMissing,
            false,
        ),
        // The code only in the XML body (no header): still read.
        (403, None, xml_403, ErrorClass::Auth, false),
        (
            403,
            Some("AuthorizationPermissionMismatch"),
            "",
            ErrorClass::Auth,
            false,
        ),
        (
            400,
            Some("InvalidHeaderValue"),
            "",
            ErrorClass::BadRequest,
            false,
        ),
        (
            400,
            Some("MissingRequiredHeader"),
            "",
            ErrorClass::BadRequest,
            false,
        ),
        (503, Some("ServerBusy"), "", ErrorClass::ServerBusy, true),
        (
            500,
            Some("OperationTimedOut"),
            "",
            ErrorClass::ServerBusy,
            true,
        ),
        (500, Some("InternalError"), "", ErrorClass::ServerBusy, true),
        (
            502,
            None,
            "<html>bad gateway</html>",
            ErrorClass::ServerBusy,
            true,
        ),
    ];
    for (status, code, body, class, unknown) in rows {
        let err = acquire().parse(&response(status, code, body)).unwrap_err();
        let Error::Storage(e) = &err else {
            panic!("{err:?}")
        };
        assert_eq!(e.class, class, "{status} {code:?}");
        assert_eq!(e.status.as_u16(), status);
        assert_eq!(
            e.request_id.as_deref(),
            Some("0f6d1b0e-501e-0035-5a1c-1c2b3a000000")
        );
        assert_eq!(err.outcome_unknown(), unknown, "{status} {code:?}");
        // The body's message (which can echo request details) never reaches the error.
        assert!(!err.to_string().contains("MAC signature"), "{err}");
    }
    let err = acquire().parse(&response(403, None, xml_403)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "storage answered 403 Forbidden: AuthenticationFailed (Auth), request id 0f6d1b0e-501e-0035-5a1c-1c2b3a000000"
    );
}

#[test]
fn malformed_answers_are_errors_not_outcomes() {
    // 200 where acquire answers 201; 201 without a lease id.
    assert!(matches!(
        acquire().parse(&response(200, None, "")),
        Err(Error::UnexpectedResponse { .. })
    ));
    assert!(matches!(
        acquire().parse(&response(201, None, "")),
        Err(Error::UnexpectedResponse { .. })
    ));
    // A HEAD error has no body; some peers send no code either: 404 alone means missing.
    let head = GetProperties {
        container: ContainerName::try_new("leasegate").unwrap(),
        blob: BlobName::try_new("b").unwrap(),
    };
    assert_eq!(head.parse(&response(404, None, "")).unwrap(), None);
    assert!(head.parse(&response(403, None, "")).is_err());
}
