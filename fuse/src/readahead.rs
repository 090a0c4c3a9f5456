//! Read-ahead across shards: a reader that moves from shard `s` to `s + 1` is a sequential
//! stream; each step of a stream doubles its window (1, 2, 4, ... shards, up to a cap set by the
//! cache budget), and the shards of the window are fetched in the background into the node
//! cache. A reader that jumps starts a new stream with a window of one shard.

use std::collections::HashSet;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};

use crate::source::DatasetSource;

/// Streams followed at once (the oldest is forgotten beyond that).
const MAX_STREAMS: usize = 32;
/// Background fetches at once, for all streams together: each costs a download and a
/// decompression in flight, so they are few, whatever the number of readers.
pub const WORKERS: usize = 2;

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
    queue: Mutex<Option<Sender<usize>>>,
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
        }
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
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(s) = streams.iter_mut().find(|s| s.last == shard) {
            // Same shard again: nothing new.
            let _ = s;
            return Vec::new();
        }
        let (from, to) = match streams
            .iter_mut()
            .find(|s| shard > 0 && s.last == shard - 1)
        {
            Some(s) => {
                s.last = shard;
                s.window = (s.window * 2).min(self.cap);
                let from = (s.ahead + 1).max(shard + 1);
                let to = (shard + s.window).min(self.num_shards.saturating_sub(1));
                s.ahead = s.ahead.max(to);
                (from, to)
            }
            None => {
                if streams.len() >= MAX_STREAMS {
                    streams.remove(0);
                }
                let to = (shard + 1).min(self.num_shards.saturating_sub(1));
                streams.push(Stream {
                    last: shard,
                    window: 1,
                    ahead: to,
                });
                (shard + 1, to)
            }
        };
        drop(streams);
        if from > to {
            return Vec::new();
        }
        let mut in_flight = self
            .in_flight
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        (from..=to).filter(|s| in_flight.insert(*s)).collect()
    }

    /// Queues `shards` for the background workers, which fetch them into the cache (and
    /// release them at once: read-ahead pins nothing).
    pub fn spawn_fetch(&self, source: Arc<dyn DatasetSource>, shards: Vec<usize>) {
        if shards.is_empty() {
            return;
        }
        let mut queue = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
        if queue.is_none() {
            let (tx, rx) = channel::<usize>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..WORKERS {
                let (rx, source, in_flight) = (
                    Arc::clone(&rx),
                    Arc::clone(&source),
                    Arc::clone(&self.in_flight),
                );
                let spawned = std::thread::Builder::new()
                    .name(format!("shardstream-readahead-{i}"))
                    .spawn(move || worker(&rx, source.as_ref(), &in_flight));
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "cannot start a read-ahead thread");
                }
            }
            *queue = Some(tx);
        }
        if let Some(tx) = queue.as_ref() {
            for shard in shards {
                if tx.send(shard).is_err() {
                    self.in_flight
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .remove(&shard);
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
}
