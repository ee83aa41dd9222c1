//! Kubernetes identifiers, checked as the API server checks them, before anything is looked up,
//! reserved, written or logged under them.
//!
//! The rules are apimachinery's (`k8s.io/apimachinery/pkg/util/validation`) as the API server
//! applies them to a pod (`k8s.io/kubernetes/pkg/apis/core/validation`):
//!
//! * a **namespace** is a DNS-1123 label (`ValidateNamespaceName` = `IsDNS1123Label`): at most
//!   63 characters of `[a-z0-9-]`, beginning and ending with `[a-z0-9]`
//!   (regex `[a-z0-9]([-a-z0-9]*[a-z0-9])?`);
//! * a **pod name** is a DNS-1123 subdomain (`ValidatePodName` = `IsDNS1123Subdomain`): at most
//!   253 characters, labels of the same alphabet joined by `.`
//!   (regex `[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*`);
//! * a **container name** is a DNS-1123 label, unique among the pod's containers and init
//!   containers together (`validateContainers`, `validateInitContainers`: "Duplicate value");
//! * a **pod UID** is what the API server assigns (`uuid.NewUUID()` in `FillObjectMetaSystemFields`):
//!   an RFC 4122 UUID in its text form, 8-4-4-4-12 hexadecimal digits, in lowercase as the API
//!   server writes it (and as the kubelet puts it in cgroup paths).
//!
//! Each check is a pure function of the text; the caller names the field. The patterns and limits
//! are public so that the OpenAPI document says exactly what these functions accept.

use std::{
    collections::{HashMap, hash_map::Entry},
    fmt,
};

/// Longest DNS-1123 label (`DNS1123LabelMaxLength`).
pub const LABEL_MAX: usize = 63;
/// Longest DNS-1123 subdomain (`DNS1123SubdomainMaxLength`).
pub const SUBDOMAIN_MAX: usize = 253;
/// Length of a UUID's text form.
pub const UID_LENGTH: usize = 36;
/// [`dns1123_label`] as an ECMA-262 pattern (for the OpenAPI document).
pub const LABEL_PATTERN: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// [`dns1123_subdomain`] as an ECMA-262 pattern.
pub const SUBDOMAIN_PATTERN: &str =
    "^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// [`pod_uid`] as an ECMA-262 pattern.
pub const UID_PATTERN: &str = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$";

/// Why an identifier is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IdentifierError {
    #[error("{value} is {length} bytes long: must be no more than {max}")]
    TooLong {
        value: Shown,
        length: usize,
        max: usize,
    },
    #[error(
        "{0} is not a DNS-1123 label: lowercase letters, digits and '-', beginning and ending with a letter or digit (regex [a-z0-9]([-a-z0-9]*[a-z0-9])?)"
    )]
    NotLabel(Shown),
    #[error(
        "{0} is not a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', each '.'-separated part beginning and ending with a letter or digit (regex [a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)"
    )]
    NotSubdomain(Shown),
    #[error(
        "{0} is not a pod UID: an RFC 4122 UUID as the API server assigns it, 8-4-4-4-12 lowercase hexadecimal digits (e.g. 6b1c8a2e-3f4d-4e5a-9b7c-0d1e2f3a4b5c)"
    )]
    NotUid(Shown),
    #[error(
        "{0} is not a label key or value: at most 63 letters, digits, '-', '_' and '.', beginning and ending with a letter or digit (a key may have a DNS-1123 subdomain and '/' before it)"
    )]
    NotLabelText(Shown),
    #[error("duplicate value {value}: also the name of {first}")]
    Duplicate { value: Shown, first: Place },
}

/// A refused value as an error shows it: quoted and escaped, and cut short when long (a refused
/// value may be 100,000 characters of anything).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shown(String);

/// Characters of a refused value an error repeats.
const SHOWN_MAX: usize = 64;

impl Shown {
    pub fn new(value: &str) -> Shown {
        match value.char_indices().nth(SHOWN_MAX) {
            None => Shown(format!("{value:?}")),
            Some((cut, _)) => Shown(format!("{:?}…", &value[..cut])),
        }
    }
}

impl fmt::Display for Shown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn at_most(value: &str, max: usize) -> Result<(), IdentifierError> {
    if value.len() > max {
        return Err(IdentifierError::TooLong {
            value: Shown::new(value),
            length: value.len(),
            max,
        });
    }
    Ok(())
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, whatever the length.
fn is_label_text(value: &str) -> bool {
    let b = value.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
}

/// `IsDNS1123Label`: at most 63 characters, `[a-z0-9]([-a-z0-9]*[a-z0-9])?`.
pub fn dns1123_label(value: &str) -> Result<(), IdentifierError> {
    at_most(value, LABEL_MAX)?;
    if !is_label_text(value) {
        return Err(IdentifierError::NotLabel(Shown::new(value)));
    }
    Ok(())
}

/// `IsDNS1123Subdomain`: at most 253 characters, labels of `[a-z0-9]([-a-z0-9]*[a-z0-9])?`
/// joined by `.` (each label is not limited to 63 characters: apimachinery does not limit it).
pub fn dns1123_subdomain(value: &str) -> Result<(), IdentifierError> {
    at_most(value, SUBDOMAIN_MAX)?;
    if !value.split('.').all(is_label_text) {
        return Err(IdentifierError::NotSubdomain(Shown::new(value)));
    }
    Ok(())
}

/// A label's name part or value (`IsQualifiedName`'s name, `IsValidLabelValue`): at most 63
/// characters, `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`; a value may also be empty.
fn label_text(value: &str, empty: bool) -> Result<(), IdentifierError> {
    at_most(value, LABEL_MAX)?;
    let b = value.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    let ok = (empty && b.is_empty())
        || (b.first().is_some_and(edge)
            && b.last().is_some_and(edge)
            && b.iter().all(|c| edge(c) || b"-_.".contains(c)));
    if !ok {
        return Err(IdentifierError::NotLabelText(Shown::new(value)));
    }
    Ok(())
}

/// A label key (`IsQualifiedName`): a name part, with a DNS-1123 subdomain and `/` before it or
/// not.
pub fn label_key(value: &str) -> Result<(), IdentifierError> {
    match value.split_once('/') {
        Some((prefix, name)) => {
            dns1123_subdomain(prefix)?;
            label_text(name, false)
        }
        None => label_text(value, false),
    }
}

/// A label value (`IsValidLabelValue`): empty, or a name part.
pub fn label_value(value: &str) -> Result<(), IdentifierError> {
    label_text(value, true)
}

/// A namespace: a DNS-1123 label.
pub fn namespace(value: &str) -> Result<(), IdentifierError> {
    dns1123_label(value)
}

/// A pod's name: a DNS-1123 subdomain.
pub fn pod_name(value: &str) -> Result<(), IdentifierError> {
    dns1123_subdomain(value)
}

/// A container's name: a DNS-1123 label (unique within the pod: [`Unique`]).
pub fn container_name(value: &str) -> Result<(), IdentifierError> {
    dns1123_label(value)
}

/// A pod UID: an RFC 4122 UUID's text, `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` in lowercase hex.
pub fn pod_uid(value: &str) -> Result<(), IdentifierError> {
    at_most(value, UID_LENGTH)?;
    let b = value.as_bytes();
    let ok = b.len() == UID_LENGTH
        && b.iter().enumerate().all(|(i, c)| match i {
            8 | 13 | 18 | 23 => *c == b'-',
            _ => c.is_ascii_digit() || (b'a'..=b'f').contains(c),
        });
    if !ok {
        return Err(IdentifierError::NotUid(Shown::new(value)));
    }
    Ok(())
}

/// Where a name was first seen: a list of containers and an index in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    /// The list's path, e.g. `spec.initContainers`.
    pub list: &'static str,
    pub index: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[{}].name", self.list, self.index)
    }
}

/// The container names of one pod seen so far: the API server refuses a name used twice among
/// `containers` and `initContainers` together.
#[derive(Debug, Default)]
pub struct Unique<'a> {
    seen: HashMap<&'a str, Place>,
}

impl<'a> Unique<'a> {
    pub fn with_capacity(n: usize) -> Unique<'a> {
        Unique {
            seen: HashMap::with_capacity(n),
        }
    }

    /// Records `name`, seen at `place`; refused if it was seen before.
    pub fn insert(&mut self, name: &'a str, place: Place) -> Result<(), IdentifierError> {
        match self.seen.entry(name) {
            Entry::Occupied(first) => Err(IdentifierError::Duplicate {
                value: Shown::new(name),
                first: *first.get(),
            }),
            Entry::Vacant(slot) => {
                slot.insert(place);
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests;
