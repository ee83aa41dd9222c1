//! The version-skew policy between the webhook and the agents it follows: an agent is within it
//! when its version (the `agentVersion` of its stream's events) has the webhook's major version
//! and its minor version or the next one (`0.1.x` and `0.2.x` agents beside a `0.1.y` webhook),
//! since agents are upgraded first and the webhook after them; an agent that names no version
//! (older than the field), an older minor or another major, or a version that does not parse,
//! is outside. Outside the policy the webhook still follows and asks the agent, and says so: a
//! gauge, and the nodes on `/readyz` (docs/install/release.md, versions).
//!
//! What an agent names is its to write, and `/readyz` is served unauthenticated: the table keeps
//! a version only when it reads as one ([`kept`]: at most [`MAX_VERSION`] bytes of digits,
//! letters, `.`, `-` and `+`), and [`UNREADABLE`] for anything else.

/// The webhook's own version.
pub const OURS: &str = env!("CARGO_PKG_VERSION");
/// The longest version kept as named.
pub const MAX_VERSION: usize = 64;
/// What is kept of a version that does not read as one.
pub const UNREADABLE: &str = "(not a version)";

/// `version` when it reads as one (bounded, and only the characters of a semantic version),
/// else [`UNREADABLE`]: what the table keeps and `/readyz` shows.
pub fn kept(version: &str) -> &str {
    let readable = !version.is_empty()
        && version.len() <= MAX_VERSION
        && version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'+'));
    if readable { version } else { UNREADABLE }
}

/// The major and minor numbers of a version (`1.2.3`, `0.1.0-rc.1`); `None` when it has no
/// two leading numbers.
fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split(['.', '-', '+']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// Whether an agent of version `theirs` may run beside a webhook of version `ours`.
pub fn within(ours: &str, theirs: Option<&str>) -> bool {
    match (major_minor(ours), theirs.and_then(major_minor)) {
        (Some((major, minor)), Some(theirs)) => {
            theirs == (major, minor) || theirs == (major, minor + 1)
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_minor_or_the_next_is_within_and_any_other_is_not() {
        assert!(within("0.1.0", Some("0.1.0")));
        assert!(within("0.1.0", Some("0.1.7")));
        assert!(within("0.1.3", Some("0.1.0-rc.1")));
        assert!(within("1.4.0", Some("1.4.2+build.5")));
        assert!(within("0.1.0", Some("0.2.0")), "agents upgraded first");
        assert!(!within("0.1.0", Some("0.3.0")));
        assert!(
            !within("0.2.0", Some("0.1.9")),
            "an agent older than the webhook"
        );
        assert!(!within("1.4.0", Some("2.4.0")));
        assert!(!within("0.1.0", Some("0.10.0")));
        assert!(!within("0.1.0", None));
        assert!(!within("0.1.0", Some("")));
        assert!(!within("0.1.0", Some("v0.1.0")));
        assert!(!within("0.1.0", Some("0")));
        assert!(!within("0.1.0", Some(UNREADABLE)));
    }

    #[test]
    fn only_a_bounded_version_of_its_own_characters_is_kept_as_named() {
        assert_eq!(kept("0.2.0-rc.1+build.5"), "0.2.0-rc.1+build.5");
        let longest = format!("0.1.{}", "9".repeat(MAX_VERSION - 4));
        assert_eq!(kept(&longest), longest);
        assert_eq!(kept(&format!("{longest}9")), UNREADABLE);
        assert_eq!(kept(""), UNREADABLE);
        assert_eq!(kept("0.1.0\n<script>"), UNREADABLE);
        assert_eq!(kept("0.1.0 "), UNREADABLE);
        assert_eq!(kept("0.1.\u{e9}"), UNREADABLE);
    }
}
