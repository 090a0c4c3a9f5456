//! The integration tests of `streamer`, linked into one test binary (each file below is a
//! module): one link of tokio, object_store and the rest instead of one per file, which kept
//! CI's disk and link time down. A test that must own its process (it changes the process
//! environment, or installs signal handlers) stays a binary of its own (Cargo.toml).

#[macro_use]
mod common;

mod cache_multiprocess;
mod cache_recovery;
mod conformance;
mod dataset_binary_index;
mod dataset_deferred;
mod dataset_faults;
mod dataset_first_samples;
mod dataset_joined_download;
mod dataset_memory;
mod dataset_multiprocess;
mod dataset_prefetch;
mod dataset_random_access;
mod dataset_stream;
mod formats_litdata;
mod formats_wds;
mod order_contract;
mod storm;
