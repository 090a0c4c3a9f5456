//! The integration tests of `sharding`, linked into one test binary (each file below is a
//! module): one link of tokio, object_store and the rest instead of one per file, which kept
//! CI's disk and link time down. A test that must own its process (it changes the process
//! environment, or installs signal handlers) stays a binary of its own (Cargo.toml).

mod input_adapters;
mod input_files;
mod input_jsonl;
mod litdata_interop;
mod mds_errors;
mod mds_format;
mod mds_interop;
mod mds_prefixes;
mod mds_proptest;
mod mds_pyjson;
mod wds_interop;
