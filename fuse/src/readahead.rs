//! Read-ahead across shards: a reader that moves from shard `s` to `s + 1` is a sequential
//! stream; each step of a stream doubles its window (1, 2, 4, ... shards, up to a cap set by the
//! cache budget), and the shards of the window are fetched in the background into the node
//! cache. A reader that jumps starts a new stream with a window of one shard: random access
//! costs at most one shard of read-ahead.
//!
//! The worker threads grow with the work queued (one more per shard waiting, up to
//! [`MAX_WORKERS`]), so a long sequential stream gets its window fetched in parallel while a
//! lone random reader costs one thread.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use crate::source::DatasetSource;

/// Streams followed at once (the oldest is forgotten beyond that).
const MAX_STREAMS: usize = 32;
/// Most background fetches at once, for all streams together: each costs a download and a
/// decompression in flight, so they are few, whatever the number of readers.
pub const MAX_WORKERS: usize = 4;

#[derive(Debug, Clone, Copy)]
struct Stream {
    last: usize,
    window: usize,
    /// Highest shard already asked for by this stream.
    ahead: usize,
}

/// The read-ahead state of one mount.
#[derive(Debug)]
pub struct Readahead {
    cap: usize,
    num_shards: usize,
    streams: Mutex<Vec<Stream>>,
    in_flight: Arc<Mutex<HashSet<usize>>>,
    /// The queue of the worker threads, started on first use; dropping it stops them.
    queue: Mutex<Option<Queue>>,
    /// Worker threads started so far.
    workers: AtomicUsize,
}

#[derive(Debug)]
struct Queue {
    tx: Sender<usize>,
    rx: Arc<Mutex<Receiver<usize>>>,
}

impl Readahead {
    /// Read-ahead of at most `cap` shards per stream over `num_shards` shards (0: off).
    pub fn new(cap: usize, num_shards: usize) -> Self {
        Readahead {
            cap,
            num_shards,
            streams: Mutex::new(Vec::new()),
            in_flight: Arc::new(Mutex::new(HashSet::new())),
            queue: Mutex::new(None),
            workers: AtomicUsize::new(0),
        }
    }

    /// Worker threads started so far (they grow with the queue, up to [`MAX_WORKERS`]).
    pub fn workers(&self) -> usize {
        self.workers.load(Ordering::Relaxed)
    }

    /// The largest window a stream can reach.
    pub fn cap(&self) -> usize {
        self.cap
    }

    /// Notes that a reader touched `shard`; returns the shards to fetch ahead now.
    pub fn touch(&self, shard: usize) -> Vec<usize> {
        if self.cap == 0 {
            return Vec::new();
        }
        let last_shard = self.num_shards.saturating_sub(1);
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if streams.iter().any(|s| s.last == shard) {
            // Same shard again: nothing new.
            return Vec::new();
        }
        let pos = match streams
            .iter()
            .position(|s| shard > 0 && s.last == shard - 1)
        {
            Some(i) => {
                let s = &mut streams[i];
                s.last = shard;
                s.window = (s.window * 2).min(self.cap);
                i
            }
            None => {
                if streams.len() >= MAX_STREAMS {
                    streams.remove(0);
                }
                // A new stream (or a jump): window one, nothing asked for yet past `shard`.
                streams.push(Stream {
                    last: shard,
                    window: 1,
                    ahead: shard,
                });
                streams.len() - 1
            }
        };
        let s = &mut streams[pos];
        let from = (s.ahead + 1).max(shard + 1);
        let to = (shard + s.window).min(last_shard);
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let mut picked = Vec::new();
        for next in from..=to {
            if in_flight.insert(next) {
                picked.push(next);
            }
            s.ahead = next;
        }
        picked
    }

    /// Queues `shards` for the background workers, which fetch them into the cache (and
    /// release them at once: read-ahead pins nothing); starts a worker per shard waiting, up to
    /// [`MAX_WORKERS`].
    pub fn spawn_fetch(&self, source: Arc<dyn DatasetSource>, shards: Vec<usize>) {
        if shards.is_empty() {
            return;
        }
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        let q = queue.get_or_insert_with(|| {
            let (tx, rx) = channel::<usize>();
            Queue {
                tx,
                rx: Arc::new(Mutex::new(rx)),
            }
        });
        for &shard in &shards {
            if q.tx.send(shard).is_err() {
                self.in_flight
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .remove(&shard);
            }
        }
        let waiting = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len();
        let want = waiting.min(MAX_WORKERS).min(self.cap);
        while self.workers() < want {
            let i = self.workers();
            let (rx, source, in_flight) = (
                Arc::clone(&q.rx),
                Arc::clone(&source),
                Arc::clone(&self.in_flight),
            );
            let spawned = std::thread::Builder::new()
                .name(format!("shardstream-readahead-{i}"))
                .spawn(move || worker(&rx, source.as_ref(), &in_flight));
            match spawned {
                Ok(_) => {
                    self.workers.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot start a read-ahead thread");
                    break;
                }
            }
        }
    }
}

fn worker(
    rx: &Mutex<Receiver<usize>>,
    source: &dyn DatasetSource,
    in_flight: &Mutex<HashSet<usize>>,
) {
    loop {
        let next = rx.lock().unwrap_or_else(PoisonError::into_inner).recv();
        let Ok(shard) = next else {
            return;
        };
        match source.open_shard(shard) {
            Ok(_) => tracing::debug!(shard, "read ahead"),
            Err(e) => tracing::debug!(shard, error = %e, "read-ahead failed"),
        }
        in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&shard);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_doubles_on_sequential_steps_up_to_the_cap() {
        let r = Readahead::new(4, 100);
        assert_eq!(r.touch(10), vec![11]);
        r.in_flight.lock().unwrap().clear();
        assert_eq!(r.touch(11), vec![12, 13]);
        r.in_flight.lock().unwrap().clear();
        assert_eq!(r.touch(12), vec![14, 15, 16]);
        r.in_flight.lock().unwrap().clear();
        assert_eq!(r.touch(13), vec![17]);
        assert_eq!(r.touch(13), Vec::<usize>::new());
        // A jump starts a new stream with a window of one.
        assert_eq!(r.touch(50), vec![51]);
    }

    #[test]
    fn no_readahead_when_the_cap_is_zero_or_at_the_end() {
        assert!(Readahead::new(0, 10).touch(1).is_empty());
        let r = Readahead::new(8, 3);
        assert!(r.touch(2).is_empty());
    }

    #[test]
    fn a_jump_resets_the_window_and_a_return_grows_it_again() {
        let r = Readahead::new(8, 100);
        assert_eq!(r.touch(0), vec![1]);
        assert_eq!(r.touch(1), vec![2, 3]);
        assert_eq!(r.touch(2), vec![4, 5, 6]);
        // Random access: one shard ahead, not the grown window.
        assert_eq!(r.touch(60), vec![61]);
        assert_eq!(r.touch(30), vec![31]);
        // Sequential again from there: the window grows anew.
        assert_eq!(r.touch(31), vec![32, 33]);
    }

    /// A source whose fetches block until the gate opens, counting those running at once.
    #[derive(Default)]
    struct Gated {
        state: Mutex<(bool, usize, usize)>,
        changed: std::sync::Condvar,
    }

    impl DatasetSource for Gated {
        fn index_json(&self) -> &[u8] {
            b"{}"
        }
        fn open_shard(
            &self,
            _shard: usize,
        ) -> Result<Arc<dyn crate::source::ShardData>, crate::error::SourceError> {
            let mut st = self.state.lock().unwrap();
            st.1 += 1;
            st.2 = st.2.max(st.1);
            self.changed.notify_all();
            while !st.0 {
                st = self.changed.wait(st).unwrap();
            }
            st.1 -= 1;
            self.changed.notify_all();
            Ok(Arc::new(crate::source::MemoryShard(Arc::new(Vec::new()))))
        }
        fn readahead_budget(&self) -> Option<u64> {
            None
        }
    }

    #[test]
    fn workers_grow_with_the_window_up_to_the_maximum() {
        let source = Arc::new(Gated::default());
        let r = Readahead::new(16, 100);
        let dyn_source = || Arc::clone(&source) as Arc<dyn DatasetSource>;
        r.spawn_fetch(dyn_source(), r.touch(0));
        assert_eq!(r.workers(), 1, "one shard ahead: one worker");
        r.spawn_fetch(dyn_source(), r.touch(1));
        assert_eq!(r.workers(), 3);
        r.spawn_fetch(dyn_source(), r.touch(2));
        assert_eq!(r.workers(), MAX_WORKERS);
        // They all fetch at once.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut st = source.state.lock().unwrap();
        while st.1 < MAX_WORKERS {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "only {} fetches at once", st.1);
            st = source.changed.wait_timeout(st, left).unwrap().0;
        }
        assert_eq!(st.2, MAX_WORKERS, "never more than the maximum");
        st.0 = true;
        source.changed.notify_all();
        drop(st);
        // Every queued shard is fetched and leaves the in-flight set.
        while !r.in_flight.lock().unwrap().is_empty() {
            assert!(
                std::time::Instant::now() < deadline,
                "read-ahead did not finish"
            );
            let st = source.state.lock().unwrap();
            let _ = source
                .changed
                .wait_timeout(st, std::time::Duration::from_millis(50))
                .unwrap();
        }
        assert_eq!(r.workers(), MAX_WORKERS);
    }
}
