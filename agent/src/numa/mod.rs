//! The per-NUMA hugepage map ([`map`]: one writer, lock-free readers) and how it is kept fresh
//! ([`refresh`]: fault-prompted re-reads, the reconcile, their microsecond [`timer`]; the
//! thread's real-time [`priority`], when asked). The words it is written in (NUMA node numbers,
//! page sizes, pools) are the host's vocabulary, in [`crate::host`].

pub mod flags;
pub mod map;
pub mod priority;
pub mod refresh;
pub mod timer;
