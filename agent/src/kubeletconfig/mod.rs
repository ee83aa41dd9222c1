//! The node's kubelet settings that decide NUMA selection (Topology Manager policy, scope and
//! options, Memory Manager policy, reserved memory, the feature gates the agent mirrors), taken
//! from the node's own kubelet so that the agent answers as that kubelet would: from the running
//! kubelet's command line and the files it names, else from the places installers write them,
//! else the kubelet's defaults; the agent's flags override. [`file`], [`cmdline`] and
//! [`settings`] parse, merge and lay the sources over each other (pure); [`discovery`] reads
//! `/proc` and the files through the `--host-root` seam; [`live`] keeps the settings current.

pub mod cmdline;
pub mod discovery;
pub mod file;
pub mod flags;
pub mod live;
pub mod settings;
