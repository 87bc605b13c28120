//! The deferred graph runtime.
//!
//! This crate will hold Tessera's runtime: thin bindings over the PJRT C API,
//! `Tensor` handles that record a lazy graph, sync points that lower the
//! pending graph to one StableHLO module, a compile cache (in-process, on
//! disk, remote), shape buckets, and kernel nodes that lower per platform.
//!
//! Today it finds the PJRT plugin the set-up installed and reads its API
//! version: [`plugin::locate`] and [`plugin::PluginInfo::probe`].

pub mod backend;
pub mod cache;
pub mod graph;
pub mod host_call;
pub mod pjrt;
pub mod plugin;
