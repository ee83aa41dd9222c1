//! Admission: whether the kernel can serve a pod's hugepages (the pod model is `kube`) on the
//! selected NUMA nodes right now ([`verify`], KEP-5759's check, read fresh from sysfs), on which
//! nodes each part is verified ([`plan`]), what admitted pods hold until they start
//! ([`reservations`]), and when that ends ([`release`]).

pub mod flags;
pub mod plan;
pub mod release;
pub mod reservations;
pub mod verify;
