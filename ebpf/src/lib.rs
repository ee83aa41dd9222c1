//! Library target of the kernel crate. It is empty: it exists so that `agent` can list this crate
//! as a build-dependency and cargo rebuilds the agent when the kernel programs change.
#![no_std]
