use serde_json::json;

use super::*;

const MI2: PageSize = PageSize(2 << 20);
const GI1: PageSize = PageSize(1 << 30);

fn spec(value: serde_json::Value) -> PodSpec {
    serde_json::from_value(value).expect("pod spec")
}

/// The pod's need.
fn need(s: &PodSpec) -> Result<Hugepages, RequestError> {
    pod_hugepages(s).map(|p| p.total)
}

fn limits(pairs: &[(&str, &str)]) -> serde_json::Value {
    let map: serde_json::Map<_, _> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), json!(v)))
        .collect();
    json!({ "limits": map })
}

#[test]
fn resource_names_name_any_page_size() {
    assert_eq!(page_size("hugepages-2Mi", "f"), Ok(Some(MI2)));
    assert_eq!(page_size("hugepages-1Gi", "f"), Ok(Some(GI1)));
    assert_eq!(
        page_size("hugepages-16Gi", "f"),
        Ok(Some(PageSize(16 << 30)))
    );
    assert_eq!(page_size("memory", "f"), Ok(None));
    assert!(
        page_size("hugepages-3Mi", "f")
            .unwrap_err()
            .detail
            .contains("power of two")
    );
    assert!(
        page_size("hugepages-big", "f")
            .unwrap_err()
            .detail
            .contains("does not name a page size")
    );
}

#[test]
fn app_containers_add_up_and_other_resources_are_ignored() {
    let s = spec(json!({"containers": [
        {"name": "a", "resources": limits(&[("hugepages-2Mi", "4Gi"), ("memory", "1Gi")])},
        {"name": "b", "resources": limits(&[("hugepages-2Mi", "2Gi"), ("hugepages-1Gi", "1Gi")])},
    ]}));
    assert_eq!(
        need(&s),
        Ok(Hugepages::from([(MI2, 6 << 30), (GI1, 1 << 30)]))
    );
    let each = pod_hugepages(&s).expect("valid").containers;
    assert_eq!(
        each,
        vec![
            Hugepages::from([(MI2, 4 << 30)]),
            Hugepages::from([(MI2, 2 << 30), (GI1, 1 << 30)]),
        ]
    );
}

#[test]
fn an_init_container_larger_than_the_app_containers_sets_the_need() {
    let s = spec(json!({
        "initContainers": [{"name": "init", "resources": limits(&[("hugepages-2Mi", "8Gi")])}],
        "containers": [{"name": "app", "resources": limits(&[("hugepages-2Mi", "2Gi")])}],
    }));
    assert_eq!(need(&s), Ok(Hugepages::from([(MI2, 8 << 30)])));
}

#[test]
fn sidecars_run_with_the_app_and_beside_later_init_containers() {
    let s = spec(json!({
        "initContainers": [
            {"name": "sidecar", "restartPolicy": "Always", "resources": limits(&[("hugepages-2Mi", "1Gi")])},
            {"name": "init", "resources": limits(&[("hugepages-2Mi", "4Gi")])},
        ],
        "containers": [{"name": "app", "resources": limits(&[("hugepages-2Mi", "2Gi")])}],
    }));
    // app + sidecar = 3Gi; init beside the sidecar = 5Gi.
    assert_eq!(need(&s), Ok(Hugepages::from([(MI2, 5 << 30)])));
}

#[test]
fn pod_level_resources_and_overhead_apply() {
    let s = spec(json!({
        "containers": [{"name": "app", "resources": limits(&[("hugepages-2Mi", "2Gi")])}],
        "overhead": {"hugepages-1Gi": "1Gi"},
        "resources": limits(&[("hugepages-2Mi", "6Gi")]),
    }));
    assert_eq!(
        need(&s),
        Ok(Hugepages::from([(MI2, 6 << 30), (GI1, 1 << 30)]))
    );
}

#[test]
fn requests_must_equal_limits_and_limits_are_required() {
    let s = spec(json!({"containers": [{"resources": {
        "requests": {"hugepages-2Mi": "2Gi"}, "limits": {"hugepages-2Mi": "4Gi"}}}]}));
    let err = need(&s).unwrap_err();
    assert_eq!(
        err.field,
        "spec.containers[0].resources.requests.hugepages-2Mi"
    );
    assert!(err.detail.contains("must equal the limit 4Gi"), "{err}");
    let s = spec(json!({"containers": [{"resources": {"requests": {"hugepages-2Mi": "2Gi"}}}]}));
    assert_eq!(
        need(&s).unwrap_err().detail,
        "hugepages need a limit equal to the request"
    );
    let s = spec(json!({"containers": [{"resources": {
        "requests": {"hugepages-2Mi": "2048Mi"}, "limits": {"hugepages-2Mi": "2Gi"}}}]}));
    assert_eq!(need(&s), Ok(Hugepages::from([(MI2, 2 << 30)])));
}

#[test]
fn amounts_must_be_whole_pages_and_valid_quantities() {
    let s = spec(json!({"containers": [{"resources": limits(&[("hugepages-2Mi", "1G")])}]}));
    let err = need(&s).unwrap_err();
    assert_eq!(
        err.field,
        "spec.containers[0].resources.limits.hugepages-2Mi"
    );
    assert_eq!(
        err.detail,
        "1000000000 is not a whole multiple of the page size 2Mi"
    );
    let s = spec(json!({"containers": [{"resources": limits(&[("hugepages-2Mi", "lots")])}]}));
    assert!(
        need(&s)
            .unwrap_err()
            .detail
            .contains("\"lots\" is not a quantity")
    );
    let s = spec(json!({"containers": [{"resources": {"limits": {"hugepages-2Mi": 4194304}}}]}));
    assert_eq!(need(&s), Ok(Hugepages::from([(MI2, 4 << 20)])));
}

#[test]
fn the_short_form_list_counts_requests_as_limits() {
    let list: ResourceList = serde_json::from_value(
        json!({"hugepages-2Mi": "4Gi", "memory": "1Gi", "hugepages-1Gi": "0"}),
    )
    .expect("list");
    assert_eq!(
        from_list(&list, "containers[0].resources"),
        Ok(Hugepages::from([(MI2, 4 << 30)]))
    );
}

/// Bug (#23): sums saturated at `u64::MAX`, and four containers of 8000Pi were answered as a
/// verdict "requested 18446744073709551615". A total beyond 64 bits of bytes is an error naming
/// the resource, at the value that carried it over.
#[test]
fn a_total_that_overflows_64_bits_names_the_resource_instead_of_saturating() {
    let big = || json!({"resources": limits(&[("hugepages-2Mi", "8000Pi")])});
    let overflow = |s: PodSpec, field: &str| {
        let err = need(&s).expect_err("a total beyond 64 bits");
        assert_eq!(err.field, field);
        assert_eq!(
            err.detail,
            "the pod's total of hugepages-2Mi overflows 64 bits of bytes"
        );
    };
    // Two fit (2 × 8000Pi < 2^64 B); the third carries the sum over.
    let s = spec(json!({"containers": [big(), big()]}));
    assert_eq!(need(&s), Ok(Hugepages::from([(MI2, 16000 << 50)])));
    overflow(
        spec(json!({"containers": [big(), big(), big(), big()]})),
        "spec.containers[2].resources",
    );
    let mut sidecar = big();
    sidecar["restartPolicy"] = json!("Always");
    overflow(
        spec(json!({"containers": [big()], "initContainers": [sidecar, sidecar]})),
        "spec.initContainers[1].resources",
    );
    // An ordinary init container runs beside the sidecars started before it.
    overflow(
        spec(json!({"containers": [], "initContainers": [sidecar, sidecar, big()]})),
        "spec.initContainers[2].resources",
    );
    overflow(
        spec(json!({"containers": [big(), big()], "overhead": {"hugepages-2Mi": "8000Pi"}})),
        "spec.overhead",
    );
}
