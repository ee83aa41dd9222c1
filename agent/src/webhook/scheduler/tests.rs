use super::*;

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|n| (*n).to_owned()).collect()
}

#[test]
fn names_are_kept_once_in_their_first_order_and_bounded_by_the_cache() {
    assert_eq!(
        distinct(&names(&["b", "a", "b", "a", "c"]), 3),
        Ok(names(&["b", "a", "c"]))
    );
    // A thousand repeats of one name are one node.
    assert_eq!(distinct(&vec!["a".to_owned(); 1000], 1), Ok(names(&["a"])));
    assert_eq!(
        distinct(&names(&["a", "b", "c"]), 2),
        Err(
            "nodes.items names more distinct nodes than the 2 the webhook's Node cache holds"
                .to_owned()
        )
    );
    assert!(distinct(&names(&["a"]), 0).is_err());
}
