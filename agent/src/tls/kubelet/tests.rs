use rcgen::ExtendedKeyUsagePurpose;
use rustls_pki_types::pem::PemObject;

use super::*;
use crate::tls::test_pki::{ca, kubelet_leaf};

fn der(pem: &str) -> CertificateDer<'static> {
    CertificateDer::from_pem_slice(pem.as_bytes()).expect("a certificate")
}

#[test]
fn the_node_travels_in_the_dialled_name_and_nothing_else_carries_one() {
    let name = |text: &str| ServerName::try_from(text.to_owned()).expect("a name");
    assert_eq!(
        node_of(&name(&server_name("node-a.zone1"))),
        Ok("node-a.zone1".to_owned())
    );
    for other in [
        KUBELET_DOMAIN,
        "node-a.node.hugepage-agent.internal",
        "node-akubelet.hugepage-agent.internal",
        "kubelet.hugepage-agent.internal.example",
    ] {
        assert!(
            matches!(node_of(&name(other)), Err(KubeletError::NotKubeletName(_))),
            "{other}"
        );
    }
}

#[test]
fn only_the_dialled_nodes_subject_with_the_signers_organization_passes() {
    let (_, issuer) = ca("cluster CA");
    let serving = &[ExtendedKeyUsagePurpose::ServerAuth];
    let (a, _) = kubelet_leaf(&issuer, "node-a", serving, Some(NODES));
    assert_eq!(check_subject(&der(&a), "node-a"), Ok(()));
    let err = check_subject(&der(&a), "node-b").expect_err("node A's is not node B's");
    let text = err.to_string();
    assert!(text.contains("system:node:node-a"), "{text}");
    assert!(text.contains("node \"node-b\""), "{text}");
    // A prefix of the node's name is another node.
    assert!(check_subject(&der(&a), "node-").is_err());
    let (masters, _) = kubelet_leaf(&issuer, "node-a", serving, Some("system:masters"));
    assert!(check_subject(&der(&masters), "node-a").is_err());
    let (none, _) = kubelet_leaf(&issuer, "node-a", serving, None);
    assert!(check_subject(&der(&none), "node-a").is_err());
    assert!(matches!(
        check_subject(
            &CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01]),
            "node-a"
        ),
        Err(KubeletError::Unreadable(_))
    ));
}
