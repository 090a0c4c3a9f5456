//! Inputs read from a finished dataset (MDS shards, LitData chunks) are runs of blocks laid end to
//! end. This is the bookkeeping they share: which block holds an item, where a block ends, and a
//! lazy read of a range that loads each block only when its first item is wanted.

use std::ops::Range;

use super::{clamp, SampleIter};
use crate::error::Result;
use crate::value::Sample;

/// The first item of each block, then the total.
#[derive(Debug, Clone)]
pub(crate) struct BlockStarts(Vec<u64>);

impl BlockStarts {
    /// From the number of items of each block, in order.
    pub(crate) fn from_counts(counts: impl IntoIterator<Item = u64>) -> Self {
        let mut starts = vec![0u64];
        let mut total = 0u64;
        for count in counts {
            total = total.saturating_add(count);
            starts.push(total);
        }
        BlockStarts(starts)
    }

    /// Total number of items.
    pub(crate) fn len(&self) -> u64 {
        self.0.last().copied().unwrap_or(0)
    }

    /// The last block whose first item is <= `item` (empty blocks are skipped over).
    pub(crate) fn block_of(&self, item: u64) -> usize {
        self.0.partition_point(|&s| s <= item).saturating_sub(1)
    }

    /// The end of the block that holds `start`.
    pub(crate) fn block_end(&self, start: u64) -> u64 {
        self.0
            .get(self.block_of(start) + 1)
            .copied()
            .unwrap_or_else(|| self.len())
    }

    /// The items of `range` (clamped), in order. `load(block)` is called once per block, when its
    /// first wanted item is reached; `sample(&loaded, i)` decodes item `i` of the block. The first
    /// error ends that block's items.
    pub(crate) fn read<'a, B, L, S>(&self, range: Range<u64>, load: L, sample: S) -> SampleIter<'a>
    where
        B: Send + 'a,
        L: Fn(usize) -> Result<B> + Clone + Send + 'a,
        S: Fn(&B, usize) -> Result<Sample> + Clone + Send + 'a,
    {
        let range = clamp(range, self.len());
        let blocks = self.0.len().saturating_sub(1);
        let mut parts: Vec<SampleIter<'a>> = Vec::new();
        for block in self.block_of(range.start)..blocks {
            let (first, end) = (self.0[block], self.0[block + 1]);
            if first >= range.end {
                break;
            }
            if first == end {
                continue;
            }
            let from = (range.start.max(first) - first) as usize;
            let to = (range.end.min(end) - first) as usize;
            let (load, sample) = (load.clone(), sample.clone());
            let mut loaded: Option<B> = None;
            let mut next = from;
            let mut failed = false;
            parts.push(Box::new(std::iter::from_fn(move || {
                if failed || next >= to {
                    return None;
                }
                if loaded.is_none() {
                    match load(block) {
                        Ok(b) => loaded = Some(b),
                        Err(e) => {
                            failed = true;
                            return Some(Err(e));
                        }
                    }
                }
                let item = sample(loaded.as_ref()?, next);
                next += 1;
                failed = item.is_err();
                Some(item)
            })));
        }
        Box::new(parts.into_iter().flatten())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::value::Value;

    #[test]
    fn blocks_are_found_and_read_lazily_across_empty_ones() {
        let starts = BlockStarts::from_counts([3, 0, 2]);
        assert_eq!(starts.len(), 5);
        assert_eq!(starts.block_of(2), 0);
        assert_eq!(starts.block_of(3), 2);
        assert_eq!(starts.block_end(1), 3);
        assert_eq!(starts.block_end(4), 5);
        let items: Vec<i64> = starts
            .read(
                2..5,
                |block| Ok(block as i64 * 100),
                |base: &i64, i| {
                    let mut s = Sample::new();
                    s.insert("v".into(), Value::Int(base + i as i64));
                    Ok(s)
                },
            )
            .map(|s| match s.unwrap().get("v") {
                Some(Value::Int(v)) => *v,
                other => panic!("unexpected {other:?}"),
            })
            .collect();
        assert_eq!(items, vec![2, 200, 201]);
    }
}
