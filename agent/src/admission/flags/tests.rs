use super::*;

#[test]
fn a_namespace_limit_is_bytes_or_a_whole_percentage() {
    assert_eq!(
        namespace_limit("100%").ok(),
        Some(NamespaceLimit::Percent(100))
    );
    assert_eq!(
        namespace_limit("4Gi").ok(),
        Some(NamespaceLimit::Bytes(4 << 30))
    );
    for wrong in ["0%", "101%", "1.5%", "%", "0", "lots"] {
        let e = namespace_limit(wrong).expect_err(wrong).to_string();
        assert!(e.starts_with("--namespace-reservation-limit"), "{e}");
    }
}
