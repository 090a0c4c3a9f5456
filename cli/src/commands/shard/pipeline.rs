//! Parallel, ordered reading: `workers` threads read blocks of an input (cut where
//! [`Input::block_end`] says reading is cheap) and turn them into work for the writer (encoded MDS
//! samples, WebDataset samples); the writer receives the blocks strictly in input order.
//!
//! At most `window` blocks are read ahead of the one the writer waits for, which bounds memory to
//! about `window` blocks whatever the input's size.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};

use anyhow::anyhow;
use shardstream_sharding::input::{Input, SampleIter};

struct State {
    next_start: u64,
    next_seq: u64,
    consumed: u64,
    stop: bool,
}

/// Reads `range` of `input` on `workers` threads; `produce(first_item, samples)` turns one block
/// into a `T` on a worker thread, and `consume` receives every `T` in input order on the calling
/// thread. The first error (from reading, producing or consuming) stops everything and is returned.
pub fn run_ordered<T, P, C>(
    input: &dyn Input,
    range: Range<u64>,
    workers: usize,
    window: usize,
    produce: P,
    mut consume: C,
) -> anyhow::Result<()>
where
    T: Send,
    P: Fn(u64, SampleIter<'_>) -> anyhow::Result<T> + Sync,
    C: FnMut(T) -> anyhow::Result<()>,
{
    let window = window.max(1) as u64;
    let state = Mutex::new(State {
        next_start: range.start,
        next_seq: 0,
        consumed: 0,
        stop: false,
    });
    let wake = Condvar::new();
    let (tx, rx) = mpsc::channel::<(u64, anyhow::Result<T>)>();
    let stop_all = || {
        if let Ok(mut s) = state.lock() {
            s.stop = true;
        }
        wake.notify_all();
    };
    std::thread::scope(|scope| {
        for _ in 0..workers.max(1) {
            let tx = tx.clone();
            let (state, wake, produce) = (&state, &wake, &produce);
            scope.spawn(move || loop {
                let (seq, block) = {
                    let Ok(mut s) = state.lock() else { return };
                    while !s.stop && s.next_seq >= s.consumed + window {
                        s = match wake.wait(s) {
                            Ok(s) => s,
                            Err(_) => return,
                        };
                    }
                    if s.stop || s.next_start >= range.end {
                        return;
                    }
                    let start = s.next_start;
                    let end = input.block_end(start).clamp(start + 1, range.end);
                    s.next_start = end;
                    s.next_seq += 1;
                    (s.next_seq - 1, start..end)
                };
                let first = block.start;
                let result = input
                    .read(block)
                    .map_err(anyhow::Error::from)
                    .and_then(|samples| produce(first, samples));
                if tx.send((seq, result)).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        let mut pending: BTreeMap<u64, T> = BTreeMap::new();
        let mut expected = 0u64;
        let outcome = (|| {
            for (seq, result) in rx.iter() {
                pending.insert(seq, result?);
                while let Some(item) = pending.remove(&expected) {
                    consume(item)?;
                    expected += 1;
                    if let Ok(mut s) = state.lock() {
                        s.consumed = expected;
                    }
                    wake.notify_all();
                }
            }
            if pending.is_empty() {
                Ok(())
            } else {
                Err(anyhow!(
                    "internal error: {} blocks were read but not written",
                    pending.len()
                ))
            }
        })();
        stop_all();
        // Unblock workers stuck on a send by dropping the receiver (they then return).
        drop(rx);
        outcome
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use shardstream_sharding::input::{open, InputFormat, InputOptions};

    #[test]
    fn blocks_arrive_in_order_and_errors_stop_the_run() {
        let dir = tempfile::tempdir().unwrap();
        for i in 0..300u32 {
            std::fs::write(dir.path().join(format!("{i:04}")), i.to_le_bytes()).unwrap();
        }
        let input = open(dir.path(), InputFormat::Files, &InputOptions::default()).unwrap();
        let mut seen = Vec::new();
        run_ordered(
            input.as_ref(),
            10..290,
            4,
            3,
            |first, samples| Ok((first, samples.count() as u64)),
            |(first, n)| {
                seen.push((first, n));
                Ok(())
            },
        )
        .unwrap();
        let mut next = 10;
        for (first, n) in &seen {
            assert_eq!(*first, next);
            next += n;
        }
        assert_eq!(next, 290);

        let err = run_ordered(
            input.as_ref(),
            0..300,
            4,
            2,
            |first, _| {
                if first >= 128 {
                    Err(anyhow!("boom at {first}"))
                } else {
                    Ok(first)
                }
            },
            |_| Ok(()),
        )
        .unwrap_err();
        assert!(err.to_string().starts_with("boom at"), "{err}");
    }
}
