//! The wasmtime host for the nodeipam component (in progress).

pub mod backend;
