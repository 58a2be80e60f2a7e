//! The C++ shims of rn50 and rn50-distributed, compiled by this crate's build script (build.rs says what each file
//! holds) and linked into every binary that links this crate. Their C ABI is declared where it is used: rn50's
//! `shim` module and rn50-distributed's `ffi` module, each of which names this crate (`extern crate rn50_shim`) so
//! that the libraries are linked.
