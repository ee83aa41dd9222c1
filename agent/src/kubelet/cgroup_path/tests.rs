use super::*;

const UID: &str = "1d3d7c5e-9b8a-4f3e-8c2d-0a1b2c3d4e5f";
const UID_: &str = "1d3d7c5e_9b8a_4f3e_8c2d_0a1b2c3d4e5f";
const ID: &str = "8c5e1fbd03a4c1e2b3f4a5b6c7d8e9f00112233445566778899aabbccddeeff0";

fn pod(qos: Qos, container: Option<(Option<&str>, &str)>) -> Owner {
    Owner::Pod {
        uid: PodUid(UID.to_owned()),
        qos,
        container: container.map(|(runtime, id)| ContainerRef {
            runtime: runtime.map(str::to_owned),
            id: id.to_owned(),
        }),
    }
}

#[test]
fn real_world_paths_for_both_drivers_and_every_runtime() {
    let cases: Vec<(String, Owner)> = vec![
        // cgroupfs driver (containerd, Docker: plain ids; CRI-O: crio- prefix)
        (format!("/kubepods/pod{UID}"), pod(Qos::Guaranteed, None)),
        (
            format!("/kubepods/pod{UID}/{ID}"),
            pod(Qos::Guaranteed, Some((None, ID))),
        ),
        (
            format!("/kubepods/burstable/pod{UID}/{ID}"),
            pod(Qos::Burstable, Some((None, ID))),
        ),
        (
            format!("/kubepods/besteffort/pod{UID}/crio-{ID}"),
            pod(Qos::BestEffort, Some((Some("crio"), ID))),
        ),
        (
            format!("/kubepods/burstable/pod{UID}"),
            pod(Qos::Burstable, None),
        ),
        // a --cgroup-root prefix
        (
            format!("/kubelet/kubepods/burstable/pod{UID}/{ID}"),
            pod(Qos::Burstable, Some((None, ID))),
        ),
        // systemd driver
        (
            format!("/kubepods.slice/kubepods-pod{UID_}.slice"),
            pod(Qos::Guaranteed, None),
        ),
        (
            format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"),
            pod(Qos::Guaranteed, Some((Some("cri-containerd"), ID))),
        ),
        (
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"
            ),
            pod(Qos::Burstable, Some((Some("cri-containerd"), ID))),
        ),
        (
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"
            ),
            pod(Qos::BestEffort, Some((Some("crio"), ID))),
        ),
        (
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope"
            ),
            pod(Qos::Burstable, Some((Some("docker"), ID))),
        ),
        // CRI-O's conmon runs in the pod, not in a container
        (
            format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/crio-conmon-{ID}.scope"
            ),
            pod(Qos::Burstable, None),
        ),
        // not a pod's
        ("/".to_owned(), Owner::System),
        ("/system.slice/containerd.service".to_owned(), Owner::System),
        (
            "/user.slice/user-0.slice/session-3.scope".to_owned(),
            Owner::System,
        ),
        ("/kubepods".to_owned(), Owner::System),
        ("/kubepods/burstable".to_owned(), Owner::System),
        (
            "/kubepods.slice/kubepods-besteffort.slice".to_owned(),
            Owner::System,
        ),
        ("/kubepods/podnot-a-uid/abc".to_owned(), Owner::System),
        // a burstable pod slice under the wrong QoS parent is not trusted
        (
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-burstable-pod{UID_}.slice"),
            Owner::System,
        ),
    ];
    for (path, expected) in cases {
        assert_eq!(classify(&path), expected, "{path}");
    }
}

#[test]
fn uids_are_lower_cased_and_ids_must_be_64_hex_digits() {
    let upper = UID.to_ascii_uppercase();
    assert_eq!(
        classify(&format!("/kubepods/pod{upper}")),
        pod(Qos::Guaranteed, None)
    );
    assert_eq!(
        classify(&format!("/kubepods/pod{UID}/{}", &ID[..12])),
        pod(Qos::Guaranteed, None),
        "a short id is not a container"
    );
}
