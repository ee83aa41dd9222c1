//! The wire format of an admission webhook, `admission.k8s.io/v1` (`types.go`):
//! an `AdmissionReview` with a `request` in, the same kind with a `response` out. Only the
//! fields the webhook reads are declared (`uid`, `kind`, `resource`, `subResource`, `name`,
//! `namespace`, `operation`, `object`, `dryRun`); the object stays the text it came in for
//! [`super::admission`] to read (a tree of JSON values would take many times its size). The answer carries `uid`, `allowed`, `status` (a
//! `metav1.Status` with `code`, `reason` and `message` when denied), `warnings`, and for a
//! mutation `patchType` (`JSONPatch`) and `patch` (the RFC 6902 patch, base64 as Go encodes a
//! `[]byte`), with the JSON names of the Go tags.

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

pub const API_VERSION: &str = "admission.k8s.io/v1";
pub const KIND: &str = "AdmissionReview";

/// What the API server sends.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionReview {
    pub api_version: String,
    pub kind: String,
    pub request: Option<AdmissionRequest>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AdmissionRequest {
    pub uid: String,
    pub kind: GroupVersionKind,
    pub resource: GroupVersionResource,
    #[serde(default)]
    pub sub_resource: String,
    #[serde(default)]
    pub name: String,
    #[serde(default)]
    pub namespace: String,
    pub operation: String,
    #[serde(default)]
    pub object: Option<Box<RawValue>>,
    #[serde(default)]
    pub dry_run: Option<bool>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionKind {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub kind: String,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct GroupVersionResource {
    #[serde(default)]
    pub group: String,
    #[serde(default)]
    pub version: String,
    #[serde(default)]
    pub resource: String,
}

/// What the webhook answers.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReviewAnswer {
    pub api_version: &'static str,
    pub kind: &'static str,
    pub response: AdmissionResponse,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct AdmissionResponse {
    pub uid: String,
    pub allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<Status>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    #[serde(rename = "patchType", skip_serializing_if = "Option::is_none")]
    pub patch_type: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub patch: Option<String>,
}

/// A `metav1.Status` of a denial.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Status {
    pub code: u16,
    pub reason: String,
    pub message: String,
}

impl AdmissionResponse {
    /// Wrapped in the review the API server expects back.
    pub fn into_review(self) -> ReviewAnswer {
        ReviewAnswer {
            api_version: API_VERSION,
            kind: KIND,
            response: self,
        }
    }
}
