//! Tessera's integration tests, one binary (see the crate docs).
mod common;
mod graph_runtime;
mod language;
mod library;
mod structure;
mod targets;
