//! The shape of a dataset as the order sees it: per-shard sample counts of one or more streams,
//! and how many samples each stream contributes to an epoch (MosaicML Streaming's `proportion`,
//! `repeat` and `choose`, with the same meaning).
//!
//! Weights (exactly as `streaming.Stream` reads them; at most one per stream):
//! - `Proportion(p)`: relative. Every stream must then have a proportion; the epoch has
//!   `epoch_size` samples (default: the sum of all streams' samples), split in proportion to `p`.
//!   Rounding leftovers go to the streams with the largest fractional parts (Mosaic draws them at
//!   random; a fixed rule needs no seed and is never further than one sample from exact).
//! - `Repeat(r)`: absolute, `floor(r * samples)` samples per epoch (`r` may be below 1).
//! - `Choose(k)`: absolute, `k` samples per epoch.
//! - `Natural`: absolute, every sample once; or, when all streams are `Natural` and an
//!   `epoch_size` is given, split in proportion to the streams' sizes.
//!
//! A stream that contributes `k = f * n + r` samples (n = its samples) gives every sample `f`
//! times plus a subset of `r` distinct samples; [`Sampling`] says whether that subset changes
//! each epoch.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::prp::{tag, Fingerprint};
use crate::error::{Result, StreamerError};

/// How much a stream contributes to each epoch. See the [module docs](self).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Weight {
    /// Every sample once (or, with an `epoch_size` and no other weights, a share proportional
    /// to the stream's size).
    Natural,
    /// A relative weight; all streams of the dataset must then have one.
    Proportion(f64),
    /// `floor(r * samples)` samples per epoch.
    Repeat(f64),
    /// Exactly this many samples per epoch.
    Choose(u64),
}

/// Which samples a partial repeat (`choose` not a multiple of the stream's size) keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Sampling {
    /// A fresh subset each epoch, so that over epochs every sample gets its turn
    /// (Mosaic's `sampling_method="balanced"`).
    #[default]
    Balanced,
    /// The same subset every epoch (Mosaic's `sampling_method="fixed"`).
    Fixed,
}

/// Per-shard sample counts of one stream (one dataset directory), in shard index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamShape {
    samples_per_shard: Vec<u64>,
    total: u64,
}

impl StreamShape {
    /// A stream with these shard sizes. Empty shards (an MDS writer can emit one) are allowed and
    /// never appear in the order.
    pub fn new(samples_per_shard: Vec<u64>) -> Result<Self> {
        let mut total = 0u64;
        for &n in &samples_per_shard {
            total = total
                .checked_add(n)
                .ok_or_else(|| StreamerError::TooLarge {
                    reason: "a stream holds more than 2^64 samples".into(),
                })?;
        }
        Ok(Self {
            samples_per_shard,
            total,
        })
    }

    /// Sample counts, one per shard.
    pub fn samples_per_shard(&self) -> &[u64] {
        &self.samples_per_shard
    }

    /// Number of shards.
    pub fn num_shards(&self) -> usize {
        self.samples_per_shard.len()
    }

    /// Number of samples.
    pub fn num_samples(&self) -> u64 {
        self.total
    }
}

/// One stream of a [`DatasetShape`] with its resolved epoch contribution.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamEntry {
    /// The stream's shards.
    pub shape: StreamShape,
    /// The weight it was given.
    pub weight: Weight,
    /// Samples it contributes to every epoch (`weight` resolved against the others).
    pub choose: u64,
    /// Global index of its first shard (shards of all streams are numbered in stream order).
    pub first_shard: u32,
}

/// Everything the order depends on about the data: streams, their shard sizes and their weights.
///
/// Global shard ids number the shards of all streams one after the other; global sample ids do the
/// same for samples (stream 0's samples first). Memory is O(shards).
#[derive(Debug, Clone)]
pub struct DatasetShape {
    streams: Vec<StreamEntry>,
    /// `shard_starts[s]` is the global sample id of global shard `s`'s first sample; one extra
    /// entry holds the total.
    shard_starts: Arc<[u64]>,
    sampling: Sampling,
    epoch_len: u64,
    fingerprint: u64,
}

impl DatasetShape {
    /// A single stream, every sample once per epoch.
    ///
    /// ```
    /// let shape = shardstream_streamer::order::DatasetShape::single(vec![100, 100, 37])?;
    /// assert_eq!(shape.epoch_len(), 237);
    /// # Ok::<(), shardstream_streamer::StreamerError>(())
    /// ```
    pub fn single(samples_per_shard: Vec<u64>) -> Result<Self> {
        Self::mixed(
            vec![(StreamShape::new(samples_per_shard)?, Weight::Natural)],
            None,
            Sampling::Balanced,
        )
    }

    /// Several streams mixed by weight; `epoch_size` is Mosaic's `epoch_size` (samples per epoch
    /// when weights are relative).
    pub fn mixed(
        streams: Vec<(StreamShape, Weight)>,
        epoch_size: Option<u64>,
        sampling: Sampling,
    ) -> Result<Self> {
        let chooses = resolve_weights(&streams, epoch_size)?;
        let mut entries = Vec::with_capacity(streams.len());
        let mut starts =
            Vec::with_capacity(streams.iter().map(|(s, _)| s.num_shards()).sum::<usize>() + 1);
        let mut next_sample = 0u64;
        let too_many_shards = || StreamerError::TooLarge {
            reason: "more than 2^32 - 1 shards in all streams".into(),
        };
        for ((shape, weight), choose) in streams.into_iter().zip(chooses) {
            let first_shard = u32::try_from(starts.len()).map_err(|_| too_many_shards())?;
            for &n in shape.samples_per_shard() {
                starts.push(next_sample);
                next_sample =
                    next_sample
                        .checked_add(n)
                        .ok_or_else(|| StreamerError::TooLarge {
                            reason: "more than 2^64 samples in all streams".into(),
                        })?;
            }
            entries.push(StreamEntry {
                shape,
                weight,
                choose,
                first_shard,
            });
        }
        starts.push(next_sample);
        u32::try_from(starts.len() - 1).map_err(|_| too_many_shards())?;
        let mut epoch_len = 0u64;
        for e in &entries {
            epoch_len = epoch_len
                .checked_add(e.choose)
                .ok_or_else(|| StreamerError::TooLarge {
                    reason: "more than 2^64 samples per epoch".into(),
                })?;
        }
        let fingerprint = fingerprint(&entries, sampling);
        Ok(Self {
            streams: entries,
            shard_starts: starts.into(),
            sampling,
            epoch_len,
            fingerprint,
        })
    }

    /// The streams, in order.
    pub fn streams(&self) -> &[StreamEntry] {
        &self.streams
    }

    /// Samples in one epoch (the sum of the streams' contributions; padding not included).
    pub fn epoch_len(&self) -> u64 {
        self.epoch_len
    }

    /// Shards in all streams.
    pub fn num_shards(&self) -> u32 {
        // `mixed` checked that the count fits.
        (self.shard_starts.len() - 1) as u32
    }

    /// Samples in all streams, each counted once.
    pub fn num_samples(&self) -> u64 {
        self.shard_starts.last().copied().unwrap_or(0)
    }

    /// How partial repeats choose their subset.
    pub fn sampling(&self) -> Sampling {
        self.sampling
    }

    /// A 64-bit digest of the streams' shard sizes, weights and sampling; a saved state records
    /// it so that it is never applied to another dataset.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Global sample id of a global shard's first sample (`None` past the last shard).
    pub fn shard_start(&self, shard: u32) -> Option<u64> {
        let s = shard as usize;
        if s + 1 < self.shard_starts.len() {
            self.shard_starts.get(s).copied()
        } else {
            None
        }
    }

    /// Samples in a global shard (`None` past the last shard).
    pub fn shard_len(&self, shard: u32) -> Option<u64> {
        let s = shard as usize;
        Some(self.shard_starts.get(s + 1)? - self.shard_starts.get(s)?)
    }

    /// The stream a global shard belongs to.
    pub fn stream_of(&self, shard: u32) -> Option<u32> {
        if shard >= self.num_shards() {
            return None;
        }
        let i = self.streams.partition_point(|e| e.first_shard <= shard);
        u32::try_from(i.checked_sub(1)?).ok()
    }

    /// Heap bytes of the shape (shard sizes and offsets).
    pub(crate) fn heap_bytes(&self) -> usize {
        let sizes: usize = self
            .streams
            .iter()
            .map(|e| e.shape.samples_per_shard.capacity() * std::mem::size_of::<u64>())
            .sum();
        sizes
            + self.streams.capacity() * std::mem::size_of::<StreamEntry>()
            + self.shard_starts.len() * std::mem::size_of::<u64>()
    }

    pub(crate) fn shard_starts(&self) -> &Arc<[u64]> {
        &self.shard_starts
    }
}

/// Samples per epoch for each stream, following Mosaic's `Stream.apply_weights`.
fn resolve_weights(streams: &[(StreamShape, Weight)], epoch_size: Option<u64>) -> Result<Vec<u64>> {
    let bad = |reason: String| StreamerError::InvalidWeights { reason };
    for (i, (_, w)) in streams.iter().enumerate() {
        let v = match *w {
            Weight::Proportion(v) | Weight::Repeat(v) => v,
            Weight::Natural | Weight::Choose(_) => 0.0,
        };
        if !v.is_finite() || v < 0.0 {
            return Err(bad(format!(
                "stream {i}: weight {v} is not a finite non-negative number"
            )));
        }
    }
    let relative = streams
        .iter()
        .filter(|(_, w)| matches!(w, Weight::Proportion(_)))
        .count();
    if relative != 0 && relative != streams.len() {
        return Err(bad(
            "relative (`proportion`) and absolute (`repeat`, `choose`, none) weights cannot be \
             mixed"
                .into(),
        ));
    }
    let all_natural = streams.iter().all(|(_, w)| *w == Weight::Natural);
    let chooses: Vec<u64> = if relative > 0 || (all_natural && epoch_size.is_some()) {
        let total = match epoch_size {
            Some(n) => n,
            None => streams
                .iter()
                .try_fold(0u64, |acc, (s, _)| acc.checked_add(s.num_samples()))
                .ok_or_else(|| bad("more than 2^64 samples".into()))?,
        };
        let shares: Vec<f64> = streams
            .iter()
            .map(|(s, w)| match *w {
                Weight::Proportion(p) => p,
                _ => s.num_samples() as f64,
            })
            .collect();
        apportion(total, &shares).ok_or_else(|| bad("every stream has weight 0".into()))?
    } else {
        if epoch_size.is_some() {
            return Err(bad(
                "`epoch_size` needs relative weights (`proportion`) or none".into(),
            ));
        }
        streams
            .iter()
            .map(|(s, w)| match *w {
                Weight::Natural => s.num_samples(),
                Weight::Choose(k) => k,
                // Exact for streams below 2^53 samples, as in Mosaic (`int(repeat * samples)`).
                Weight::Repeat(r) => (r * s.num_samples() as f64).floor() as u64,
                Weight::Proportion(_) => 0,
            })
            .collect()
    };
    for (i, ((s, _), &k)) in streams.iter().zip(&chooses).enumerate() {
        if k > 0 && s.num_samples() == 0 {
            return Err(bad(format!(
                "stream {i} has no samples but is asked for {k}"
            )));
        }
    }
    Ok(chooses)
}

/// Splits `total` in proportion to `shares` with the largest-remainder rule (ties to the earlier
/// stream). `None` when all shares are zero.
fn apportion(total: u64, shares: &[f64]) -> Option<Vec<u64>> {
    let sum: f64 = shares.iter().sum();
    if sum <= 0.0 {
        return if total == 0 {
            Some(vec![0; shares.len()])
        } else {
            None
        };
    }
    let exact: Vec<f64> = shares.iter().map(|s| total as f64 * (s / sum)).collect();
    let mut out: Vec<u64> = exact.iter().map(|e| e.floor() as u64).collect();
    let given: u64 = out.iter().sum();
    // Floating point can land a hair above `total`; take back from the largest first.
    let mut order: Vec<usize> = (0..shares.len()).collect();
    if given > total {
        order.sort_by(|&a, &b| out[b].cmp(&out[a]).then(a.cmp(&b)));
        let mut excess = given - total;
        for &i in order.iter().cycle() {
            if excess == 0 {
                break;
            }
            if out[i] > 0 {
                out[i] -= 1;
                excess -= 1;
            }
        }
        return Some(out);
    }
    order.sort_by(|&a, &b| {
        let fa = exact[a] - exact[a].floor();
        let fb = exact[b] - exact[b].floor();
        fb.total_cmp(&fa).then(a.cmp(&b))
    });
    let mut short = total - given;
    for &i in order.iter().filter(|&&i| shares[i] > 0.0).cycle() {
        if short == 0 {
            break;
        }
        out[i] += 1;
        short -= 1;
    }
    Some(out)
}

fn fingerprint(entries: &[StreamEntry], sampling: Sampling) -> u64 {
    let mut f = Fingerprint::new(tag::FINGERPRINT);
    f.add(entries.len() as u64);
    for e in entries {
        f.add(e.shape.num_shards() as u64);
        for &n in e.shape.samples_per_shard() {
            f.add(n);
        }
        let (kind, bits) = match e.weight {
            Weight::Natural => (0, 0),
            Weight::Proportion(p) => (1, p.to_bits()),
            Weight::Repeat(r) => (2, r.to_bits()),
            Weight::Choose(k) => (3, k),
        };
        f.add(kind);
        f.add(bits);
        f.add(e.choose);
    }
    f.add(match sampling {
        Sampling::Balanced => 0,
        Sampling::Fixed => 1,
    });
    f.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream(sizes: &[u64]) -> StreamShape {
        StreamShape::new(sizes.to_vec()).unwrap()
    }

    fn chooses(shape: &DatasetShape) -> Vec<u64> {
        shape.streams().iter().map(|e| e.choose).collect()
    }

    #[test]
    fn absolute_weights_follow_mosaic() {
        let shape = DatasetShape::mixed(
            vec![
                (stream(&[10, 10]), Weight::Natural),
                (stream(&[7]), Weight::Repeat(2.5)),
                (stream(&[4, 4]), Weight::Choose(3)),
            ],
            None,
            Sampling::Balanced,
        )
        .unwrap();
        assert_eq!(chooses(&shape), vec![20, 17, 3]);
        assert_eq!(shape.epoch_len(), 40);
        assert_eq!(shape.num_shards(), 5);
        assert_eq!(shape.stream_of(2), Some(1));
        assert_eq!(shape.stream_of(4), Some(2));
        assert_eq!(shape.stream_of(5), None);
        assert_eq!(shape.shard_start(3), Some(27));
        assert_eq!(shape.shard_len(2), Some(7));
    }

    #[test]
    fn proportions_split_the_epoch_size_exactly() {
        let shape = DatasetShape::mixed(
            vec![
                (stream(&[100]), Weight::Proportion(1.0)),
                (stream(&[5]), Weight::Proportion(1.0)),
                (stream(&[50]), Weight::Proportion(1.0)),
            ],
            Some(100),
            Sampling::Balanced,
        )
        .unwrap();
        // 33.33 each; the leftover sample goes to the first stream (ties to the earlier one).
        assert_eq!(chooses(&shape), vec![34, 33, 33]);
        assert_eq!(shape.epoch_len(), 100);
    }

    #[test]
    fn natural_with_epoch_size_scales_by_stream_size() {
        let shape = DatasetShape::mixed(
            vec![
                (stream(&[30]), Weight::Natural),
                (stream(&[10]), Weight::Natural),
            ],
            Some(8),
            Sampling::Balanced,
        )
        .unwrap();
        assert_eq!(chooses(&shape), vec![6, 2]);
    }

    #[test]
    fn refuses_what_mosaic_refuses() {
        let mixed = DatasetShape::mixed(
            vec![
                (stream(&[3]), Weight::Proportion(1.0)),
                (stream(&[3]), Weight::Repeat(1.0)),
            ],
            None,
            Sampling::Balanced,
        );
        assert!(matches!(mixed, Err(StreamerError::InvalidWeights { .. })));
        let size_with_absolute = DatasetShape::mixed(
            vec![(stream(&[3]), Weight::Choose(2))],
            Some(5),
            Sampling::Fixed,
        );
        assert!(matches!(
            size_with_absolute,
            Err(StreamerError::InvalidWeights { .. })
        ));
        let negative = DatasetShape::mixed(
            vec![(stream(&[3]), Weight::Repeat(-1.0))],
            None,
            Sampling::Fixed,
        );
        assert!(matches!(
            negative,
            Err(StreamerError::InvalidWeights { .. })
        ));
        let from_nothing = DatasetShape::mixed(
            vec![(stream(&[0]), Weight::Choose(2))],
            None,
            Sampling::Fixed,
        );
        assert!(matches!(
            from_nothing,
            Err(StreamerError::InvalidWeights { .. })
        ));
    }

    #[test]
    fn fingerprint_sees_every_input() {
        let base = DatasetShape::single(vec![5, 5]).unwrap().fingerprint();
        assert_eq!(
            base,
            DatasetShape::single(vec![5, 5]).unwrap().fingerprint()
        );
        assert_ne!(
            base,
            DatasetShape::single(vec![5, 6]).unwrap().fingerprint()
        );
        assert_ne!(base, DatasetShape::single(vec![10]).unwrap().fingerprint());
        let repeated = DatasetShape::mixed(
            vec![(stream(&[5, 5]), Weight::Repeat(1.0))],
            None,
            Sampling::Balanced,
        )
        .unwrap();
        assert_ne!(base, repeated.fingerprint());
        let fixed = DatasetShape::mixed(
            vec![(stream(&[5, 5]), Weight::Natural)],
            None,
            Sampling::Fixed,
        )
        .unwrap();
        assert_ne!(base, fixed.fingerprint());
    }
}
