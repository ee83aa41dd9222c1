use super::*;

const UID: &str = "6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b5c";

fn long(n: usize) -> String {
    "a".repeat(n)
}

#[test]
fn dns1123_labels_as_apimachinery_checks_them() {
    let good = [
        "a",
        "0",
        "abc",
        "a-b",
        "a--b",
        "123-abc",
        "my-name",
        &long(63),
    ];
    for value in good {
        assert_eq!(dns1123_label(value), Ok(()), "{value:?}");
    }
    let bad = [
        "",
        "-a",
        "a-",
        "A",
        "Batch",
        "a.b",
        "a_b",
        "a b",
        "a\n",
        "é",
        "../../etc/passwd",
    ];
    for value in bad {
        assert_eq!(
            dns1123_label(value),
            Err(IdentifierError::NotLabel(Shown::new(value))),
            "{value:?}"
        );
    }
    assert_eq!(
        dns1123_label(&long(64)),
        Err(IdentifierError::TooLong {
            value: Shown::new(&long(64)),
            length: 64,
            max: 63
        })
    );
}

#[test]
fn dns1123_subdomains_as_apimachinery_checks_them() {
    let label_of_100 = long(100);
    let good = [
        "a",
        "example.com",
        "a.b.c",
        "job-b",
        "0.0",
        label_of_100.as_str(),
        &long(253),
    ];
    for value in good {
        assert_eq!(dns1123_subdomain(value), Ok(()), "{value:?}");
    }
    let bad = [
        "", ".", "a.", ".a", "a..b", "a.-b", "a-.b", "Job", "a_b", "a/b", "../x",
    ];
    for value in bad {
        assert_eq!(
            dns1123_subdomain(value),
            Err(IdentifierError::NotSubdomain(Shown::new(value))),
            "{value:?}"
        );
    }
    assert!(matches!(
        dns1123_subdomain(&long(254)),
        Err(IdentifierError::TooLong { max: 253, .. })
    ));
}

#[test]
fn the_fields_of_a_pod_take_their_kubernetes_rule() {
    // Namespace and container: labels (63); pod name: subdomain (253).
    assert_eq!(namespace("team-a"), Ok(()));
    assert!(namespace("team.a").is_err());
    assert!(namespace(&long(64)).is_err());
    assert_eq!(pod_name("dpdk-0.web"), Ok(()));
    assert_eq!(pod_name(&long(253)), Ok(()));
    assert!(pod_name(&long(254)).is_err());
    assert_eq!(container_name("main"), Ok(()));
    assert!(container_name("main.sidecar").is_err());
}

#[test]
fn pod_uids_are_rfc_4122_text_in_lowercase() {
    let good = [
        UID,
        "00000000-0000-0000-0000-000000000000",
        "ffffffff-ffff-ffff-ffff-ffffffffffff",
        "14140000-0000-4000-8000-000000000001",
    ];
    for value in good {
        assert_eq!(pod_uid(value), Ok(()), "{value:?}");
    }
    let bad = [
        "",
        "u-1",
        "uid-b",
        "../../etc/passwd",
        "6B1C8A2E-3F4D-4E5A-9B7C-0D1E2F3A4B5C",
        "6b1c8a2e3f4d4e5a9b7c0d1e2f3a4b5c",
        "{6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b}",
        "6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b5g",
        "6b1c8a2e-3f4d-4e5a-9b7c_0d1e2f3a4b5c",
        "6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b5",
        "6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b5\n",
        "6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4bé",
    ];
    for value in bad {
        assert_eq!(
            pod_uid(value),
            Err(IdentifierError::NotUid(Shown::new(value))),
            "{value:?}"
        );
    }
    let huge = long(100_000);
    assert!(matches!(
        pod_uid(&huge),
        Err(IdentifierError::TooLong {
            length: 100_000,
            max: 36,
            ..
        })
    ));
}

#[test]
fn an_error_shows_a_long_or_strange_value_escaped_and_cut_short() {
    let huge = format!("../../{}", long(100_000));
    let message = pod_uid(&huge).expect_err("refused").to_string();
    assert!(message.len() < 200, "{message}");
    assert!(message.starts_with("\"../../aaaa"), "{message}");
    assert!(
        message.contains("aaaa\"… is 100006 bytes long"),
        "{message}"
    );
    let message = pod_uid("a\u{1b}[31m\n").expect_err("refused").to_string();
    assert!(
        message.starts_with(r#""a\u{1b}[31m\n" is not a pod UID"#),
        "{message}"
    );
    // Cut on a character boundary.
    let wide = "é".repeat(100);
    assert_eq!(
        Shown::new(&wide).to_string(),
        format!("{:?}…", "é".repeat(64))
    );
}

#[test]
fn container_names_are_unique_across_containers_and_init_containers() {
    let mut seen = Unique::with_capacity(3);
    let init = |index| Place {
        list: "spec.initContainers",
        index,
    };
    let app = |index| Place {
        list: "spec.containers",
        index,
    };
    assert_eq!(seen.insert("setup", init(0)), Ok(()));
    assert_eq!(seen.insert("main", app(0)), Ok(()));
    let again = seen.insert("setup", app(1)).expect_err("a duplicate");
    assert_eq!(
        again,
        IdentifierError::Duplicate {
            value: Shown::new("setup"),
            first: init(0)
        }
    );
    assert_eq!(
        again.to_string(),
        "duplicate value \"setup\": also the name of spec.initContainers[0].name"
    );
}

#[test]
fn label_keys_and_values_are_checked_as_the_api_server_checks_them() {
    for ok in ["app", "app.kubernetes.io/name", "a_b.C-1", "example.com/X"] {
        assert!(label_key(ok).is_ok(), "{ok}");
    }
    let long = "k".repeat(64);
    for bad in [
        "",
        "-a",
        "a-",
        "Bad_Prefix/a",
        "example.com/",
        "a b",
        long.as_str(),
    ] {
        assert!(label_key(bad).is_err(), "{bad}");
    }
    assert!(label_value("").is_ok());
    assert!(label_value("agent").is_ok());
    assert!(label_value("_x").is_err());
    assert!(label_value(&"v".repeat(64)).is_err());
}
