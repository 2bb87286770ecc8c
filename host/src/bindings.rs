//! The generated bindings of the WIT world `nodeipam`: the one `bindgen!` of the host.
//!
//! Generated code stays in this module; the hand-written import implementations live in
//! `wiring`, and the public API (`plugin`) speaks host-native types only. The module is public
//! for embedders that want the raw bindings; nothing else in the public API uses them.
//!
//! Every import is trappable: a host function returns `wasmtime::Result<_>` and an `Err`
//! aborts the export call (a trap). `wiring` decides which backend failures become a WIT
//! `host-error` value and which become a trap.

wasmtime::component::bindgen!({
    path: "../wit",
    world: "nodeipam",
    imports: { default: trappable },
});
