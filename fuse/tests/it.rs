//! The integration tests of `fuse`, linked into one test binary (each file below is a
//! module): one link of tokio, object_store and the rest instead of one per file, which kept
//! CI's disk and link time down. A test that must own its process (it changes the process
//! environment, or installs signal handlers) stays a binary of its own (Cargo.toml).

#[macro_use]
mod support;

mod fs_formats;
mod fs_logic;
mod mount_s3;
