//! The operations' requests and answers, without storage.
use super::*;

#[test]
fn metadata_is_a_map_sorted_by_name() {
    let mut m: Metadata = [("b".to_string(), "2".to_string())].into();
    assert_eq!(m.insert("c".into(), "3".into()), None);
    assert_eq!(m.insert("a".into(), "1".into()), None);
    assert_eq!(m.insert("b".into(), "two".into()), Some("2".into()));
    assert_eq!(
        m.keys().map(String::as_str).collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
}

#[test]
fn list_xml_is_parsed() {
    let xml = "\u{feff}<?xml version=\"1.0\" encoding=\"utf-8\"?>\
<EnumerationResults ServiceEndpoint=\"http://127.0.0.1:10000/devstoreaccount1\" ContainerName=\"c\">\
<Prefix>ttl/</Prefix><MaxResults>2</MaxResults><Blobs>\
<Blob><Name>ttl/a</Name><Properties><Last-Modified>Sat, 21 Nov 2026 14:00:00 GMT</Last-Modified>\
<Etag>0x8DB1</Etag><Content-Length>3</Content-Length><BlobType>BlockBlob</BlobType>\
<LeaseStatus>locked</LeaseStatus><LeaseState>leased</LeaseState></Properties>\
<Metadata><TimeToLive>2026-11-21T14:00:00Z</TimeToLive><DeadBlobContainer>dead</DeadBlobContainer></Metadata></Blob>\
<Blob><Name>ttl/b &amp; c</Name><Properties><Etag>\"0x8DB2\"</Etag></Properties></Blob>\
</Blobs><NextMarker>2!8!dHRsL2M-</NextMarker></EnumerationResults>";
    let page = parse_list_blobs(xml.as_bytes()).unwrap();
    assert_eq!(page.next_marker.as_deref(), Some("2!8!dHRsL2M-"));
    assert_eq!(page.blobs.len(), 2);
    let a = &page.blobs[0];
    assert_eq!(a.name, "ttl/a");
    assert_eq!(a.properties.etag, Some(ETag::new("0x8DB1")));
    assert_eq!(a.properties.lease_state, Some(LeaseState::Leased));
    assert_eq!(a.properties.content_length, Some(3));
    assert_eq!(
        a.properties.metadata.get("timetolive").unwrap().as_str(),
        "2026-11-21T14:00:00Z"
    );
    assert_eq!(
        a.properties
            .metadata
            .get("deadblobcontainer")
            .unwrap()
            .as_str(),
        "dead"
    );
    assert_eq!(page.blobs[1].name, "ttl/b & c");
    assert_eq!(page.blobs[1].properties.etag, Some(ETag::new("0x8DB2")));
}

#[test]
fn last_page_has_no_marker_and_junk_is_refused() {
    let page = parse_list_blobs(b"<EnumerationResults><Blobs/><NextMarker/></EnumerationResults>")
        .unwrap();
    assert_eq!(page, ListBlobsPage::default());
    assert!(parse_list_blobs(b"<html>").is_err());
    assert!(parse_list_blobs(b"<Other/>").is_err());
}

#[test]
fn encoded_names_are_decoded() {
    // Azure percent-encodes (UTF-8) a name holding characters XML cannot carry (here U+FFFF
    // and a control character) and marks it `Encoded="true"`; other names come as they are.
    let xml = "<EnumerationResults><Blobs>\
<Blob><Name Encoded=\"true\">ttl%2Fa%EF%BF%BFb%01%25</Name><Properties/></Blob>\
<Blob><Name Encoded=\"false\">ttl/100%25</Name></Blob>\
<Blob><Name>ttl/%41</Name></Blob>\
</Blobs></EnumerationResults>";
    let page = parse_list_blobs(xml.as_bytes()).unwrap();
    let names: Vec<&str> = page.blobs.iter().map(|b| b.name.as_str()).collect();
    assert_eq!(names, ["ttl/a\u{ffff}b\u{1}%", "ttl/100%25", "ttl/%41"]);
    let bad = b"<EnumerationResults><Blobs><Blob><Name Encoded=\"true\">a%FF</Name></Blob>\
</Blobs></EnumerationResults>";
    let err = parse_list_blobs(bad).unwrap_err();
    assert!(err.contains("encoded Name is not UTF-8"), "{err}");
}

#[test]
fn malformed_listings_are_clear_errors() {
    for bad in [
        &b""[..],
        b"<EnumerationResults><Blobs>",
        b"<EnumerationResults></Blobs></EnumerationResults>",
        b"<EnumerationResults><Blobs><Blob><Name>a &nope; b</Name></Blob></Blobs></EnumerationResults>",
        b"<!DOCTYPE x [<!ENTITY a \"aaaa\">]><EnumerationResults/>",
        b"<EnumerationResults/><EnumerationResults/>",
        b"\xff\xfe<EnumerationResults/>",
    ] {
        let err = parse_list_blobs(bad).unwrap_err();
        assert!(
            err.starts_with("listing is not XML: ") || err == "listing is not UTF-8",
            "{err}"
        );
    }
    let nameless = b"<EnumerationResults><Blobs><Blob><Name/></Blob></Blobs></EnumerationResults>";
    assert_eq!(
        parse_list_blobs(nameless).unwrap_err(),
        "a listed blob has no Name"
    );
    // An error body that is not XML has no code, and no panic.
    for body in [&b"<Error><Code>"[..], b"\xff", b"Code", b""] {
        assert_eq!(xml_error_code(body), None);
    }
    assert_eq!(
        xml_error_code(b"<Error><Code> LeaseIdMissing </Code><Message>x</Message></Error>")
            .as_deref(),
        Some("LeaseIdMissing")
    );
}

#[test]
fn found_blobs_and_tags_are_parsed() {
    let xml = "\u{feff}<?xml version=\"1.0\" encoding=\"UTF-8\"?><EnumerationResults \
ServiceEndpoint=\"http://127.0.0.1:10000/devstoreaccount1\"><Where>\"k\" &lt;= '2'</Where><Blobs>\
<Blob><Name>a/b</Name><ContainerName>c</ContainerName><Tags><TagSet><Tag><Key>k</Key>\
<Value>2026-01-01T00:00:00Z</Value></Tag></TagSet></Tags></Blob>\
<Blob><Name Encoded=\"true\">x%01</Name><ContainerName>c</ContainerName></Blob>\
</Blobs><NextMarker>m-1</NextMarker></EnumerationResults>";
    let page = parse_found_blobs(xml.as_bytes()).unwrap();
    assert_eq!(page.next_marker.as_deref(), Some("m-1"));
    assert_eq!(page.blobs[0].name, "a/b");
    assert_eq!(page.blobs[0].tags["k"], "2026-01-01T00:00:00Z");
    assert_eq!(page.blobs[1].name, "x\u{1}");
    assert!(page.blobs[1].tags.is_empty());
    let last = parse_found_blobs(b"<EnumerationResults><Blobs/><NextMarker/></EnumerationResults>")
        .unwrap();
    assert_eq!(last, FoundBlobs::default());
    assert!(parse_found_blobs(b"<Other/>").is_err());
    assert!(
        parse_found_blobs(b"<EnumerationResults><Blobs><Blob/></Blobs></EnumerationResults>")
            .is_err()
    );
}

#[test]
fn tag_expressions_refuse_what_could_end_a_quote() {
    assert_eq!(
        tag_equals("leasegate_expires_at", "2026-01-01T00:00:00Z").unwrap(),
        "\"leasegate_expires_at\" = '2026-01-01T00:00:00Z'"
    );
    assert_eq!(tag_at_most("k", "v 1").unwrap(), "\"k\" <= 'v 1'");
    for (k, v) in [
        ("k", "a'b"),
        ("k\"", "v"),
        ("", "v"),
        ("k", "<x>"),
        ("k", "é"),
    ] {
        assert!(tag_equals(k, v).is_err(), "{k} {v}");
    }
    assert!(check_tag(&"k".repeat(129), "").is_err());
    assert!(check_tag("k", &"v".repeat(257)).is_err());
}

/// Find Blobs by Tags signs its `where` decoded (the canonicalized resource takes query
/// values URL-decoded), and Set Blob Tags signs its XML body's length and type.
#[test]
fn tag_requests_sign_what_storage_checks() {
    let account = Account::development("http://127.0.0.1:10000/devstoreaccount1").unwrap();
    let c = ContainerName::try_new("logs").unwrap();
    let find = FindBlobsByTags {
        container: c.clone(),
        expression: tag_at_most("leasegate_expires_at", "2026-11-27T10:00:00Z").unwrap(),
        marker: Some("m/1".into()),
        max_results: Some(100),
    };
    let r = find.request(&account).unwrap();
    assert_eq!(
        r.query(),
        Some("restype=container&comp=blobs&where=%22leasegate_expires_at%22%20%3C%3D%20%272026-11-27T10%3A00%3A00Z%27&marker=m%2F1&maxresults=100")
    );
    assert_eq!(
        crate::signing::canonicalized_resource(&r, "devstoreaccount1"),
        "/devstoreaccount1/devstoreaccount1/logs\ncomp:blobs\nmarker:m/1\nmaxresults:100\nrestype:container\nwhere:\"leasegate_expires_at\" <= '2026-11-27T10:00:00Z'"
    );
    let set = SetBlobTags {
        container: c.clone(),
        blob: BlobName::try_new("a").unwrap(),
        tags: [("k".to_string(), "v".to_string())].into(),
        lease_id: None,
    };
    let r = set.request(&account).unwrap();
    let body = "<?xml version=\"1.0\" encoding=\"utf-8\"?><Tags><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tags>";
    assert_eq!(r.body(), body.as_bytes());
    let sts = crate::signing::string_to_sign(&r, "devstoreaccount1");
    assert!(
        sts.starts_with(&format!(
            "PUT\n\n\n{}\n\napplication/xml; charset=utf-8\n",
            body.len()
        )),
        "{sts}"
    );
    let too_many: Tags = (0..11).map(|i| (format!("k{i}"), String::new())).collect();
    assert!(SetBlobTags {
        tags: too_many,
        ..set.clone()
    }
    .request(&account)
    .is_err());
    let cond = IfTags {
        op: GetProperties {
            container: c,
            blob: BlobName::try_new("a").unwrap(),
        },
        condition: tag_equals("leasegate_expires_at", "2026-11-27T10:00:00Z").unwrap(),
    };
    let r = cond.request(&account).unwrap();
    assert_eq!(
        r.headers().get("x-ms-if-tags"),
        Some("\"leasegate_expires_at\" = '2026-11-27T10:00:00Z'")
    );
}
