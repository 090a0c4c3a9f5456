//! Where each sample's columns lie inside a decompressed MDS shard.
//!
//! An MDS shard starts with `u32 n`, then `n + 1` `u32` sample offsets; each sample starts with
//! one `u32` size per variable-size column, then the columns' bytes in column order. Sizes of
//! fixed-size columns are in the index; the rest needs the shard's header and each sample's size
//! prefix, read here with small positioned reads of the shard (all little-endian).

use crate::error::{FsError, Result};
use crate::source::ShardData;

/// The byte range of every column of every sample of one shard.
#[derive(Debug)]
pub struct ShardLayout {
    starts: Vec<u32>,
    /// `n * variable_columns` sizes, sample-major.
    variable: Vec<u32>,
    fixed: Vec<Option<u64>>,
    num_variable: usize,
}

fn u32_at(shard: usize, data: &dyn ShardData, offset: u64, buf: &mut [u8]) -> Result<()> {
    let n = data.read_full_at(offset, buf)?;
    if n != buf.len() {
        return Err(FsError::Corrupt {
            shard,
            reason: format!(
                "{} bytes at offset {offset} run past the end ({} bytes)",
                buf.len(),
                data.len()
            ),
        });
    }
    Ok(())
}

fn le_u32s(bytes: &[u8]) -> impl Iterator<Item = u32> + '_ {
    bytes
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
}

impl ShardLayout {
    /// Reads the layout of shard `shard` (`expected` samples; `fixed` the index's column sizes).
    pub fn read(
        shard: usize,
        data: &dyn ShardData,
        expected: u64,
        fixed: &[Option<u64>],
    ) -> Result<ShardLayout> {
        let corrupt = |reason: String| FsError::Corrupt { shard, reason };
        let mut head = [0u8; 4];
        u32_at(shard, data, 0, &mut head)?;
        let n = u32::from_le_bytes(head);
        if u64::from(n) != expected {
            return Err(corrupt(format!(
                "header holds {n} samples, the index says {expected}"
            )));
        }
        let mut table = vec![0u8; 4 * (n as usize + 1)];
        u32_at(shard, data, 4, &mut table)?;
        let starts: Vec<u32> = le_u32s(&table).collect();
        let len = data.len();
        if starts.windows(2).any(|w| w[1] < w[0])
            || starts.last().map(|&e| u64::from(e)) != Some(len)
        {
            return Err(corrupt(format!(
                "sample offsets are not rising to the shard's end ({len} bytes)"
            )));
        }
        let num_variable = fixed.iter().filter(|s| s.is_none()).count();
        let fixed_total: u64 = fixed.iter().flatten().sum();
        let mut variable = Vec::with_capacity(n as usize * num_variable);
        let mut prefix = vec![0u8; 4 * num_variable];
        for i in 0..n as usize {
            let span = u64::from(starts[i + 1] - starts[i]);
            let before = variable.len();
            if num_variable > 0 {
                u32_at(shard, data, u64::from(starts[i]), &mut prefix)?;
                variable.extend(le_u32s(&prefix));
            }
            let var_total: u64 = variable[before..].iter().map(|&s| u64::from(s)).sum();
            let total = 4 * num_variable as u64 + fixed_total + var_total;
            if total != span {
                return Err(corrupt(format!(
                    "sample {i}: columns take {total} bytes, the offsets give {span}"
                )));
            }
        }
        Ok(ShardLayout {
            starts,
            variable,
            fixed: fixed.to_vec(),
            num_variable,
        })
    }

    /// Number of samples.
    pub fn len(&self) -> usize {
        self.starts.len().saturating_sub(1)
    }

    /// Whether the shard holds no sample.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `(offset in the shard, length)` of column `column` of sample `sample`, if both exist.
    pub fn column_range(&self, sample: usize, column: usize) -> Option<(u64, u64)> {
        if sample >= self.len() || column >= self.fixed.len() {
            return None;
        }
        let vars = &self.variable[sample * self.num_variable..(sample + 1) * self.num_variable];
        let mut offset = u64::from(self.starts[sample]) + 4 * self.num_variable as u64;
        let mut v = 0;
        for (c, fixed) in self.fixed.iter().enumerate() {
            let size = match fixed {
                Some(s) => *s,
                None => {
                    v += 1;
                    u64::from(vars[v - 1])
                }
            };
            if c == column {
                return Some((offset, size));
            }
            offset += size;
        }
        None
    }
}
