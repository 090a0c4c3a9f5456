//! The integration tests of `cli`, linked into one test binary (each file below is a
//! module): one link of tokio, object_store and the rest instead of one per file, which kept
//! CI's disk and link time down. A test that must own its process (it changes the process
//! environment, or installs signal handlers) stays a binary of its own (Cargo.toml).

#[macro_use]
mod common;
#[path = "run_support/mod.rs"]
#[macro_use]
mod support;

mod cache_gc;
mod ckpt;
mod manners;
mod mount;
mod mount_formats;
mod mount_pod;
mod path_safety;
mod run;
mod run_restart;
mod run_torchrun;
mod s3;
mod secrets;
mod shard;
mod simulate;
mod stream;
mod verify;
