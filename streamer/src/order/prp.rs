//! Keyed pseudo-random primitives the sample order is built from: a 64-bit mixer, a counter-based
//! generator, an unbiased Fisher–Yates shuffle and a Feistel permutation of `0..n` for any `n`.
//!
//! They are written out here instead of taken from `rand` on purpose: a saved training state must
//! resume to the same order after any upgrade, and `rand` makes no promise that its shuffles
//! produce the same values across releases. Everything below is a published, fixed algorithm
//! (SplitMix64 by Steele, Lea and Flood; Lemire's bounded integers; a Luby–Rackoff style Feistel
//! network with cycle walking), so the order is stable across versions and platforms by
//! construction. These are statistical, not cryptographic, permutations.

/// The SplitMix64 increment (2^64 / golden ratio).
const GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// Rounds of the Feistel network; six rounds of a full 64-bit mixer give well-mixed permutations
/// even on the small domains (a few bits) that short blocks produce.
const FEISTEL_ROUNDS: usize = 6;

/// Domain-separation tags, so that two keys derived for different purposes from the same seed
/// never coincide.
pub(crate) mod tag {
    /// The shuffle of the epoch's units (shards and shard copies).
    pub const UNIT_ORDER: u64 = 0x756e_6974_5f6f_7264;
    /// The permutation inside one block of one lane.
    pub const BLOCK: u64 = 0x626c_6f63_6b5f_7065;
    /// The subset of a shard that a partial repeat (`choose` < samples) keeps.
    pub const SUBSET: u64 = 0x7375_6273_6574_5f6b;
    /// Which shards take the leftover samples of a partial repeat.
    pub const LEFTOVER: u64 = 0x6c65_6674_6f76_6572;
    /// The dataset shape fingerprint.
    pub const FINGERPRINT: u64 = 0x7368_6170_655f_6670;
}

/// The SplitMix64 output function: a bijective 64-bit mixer with full avalanche.
#[inline]
pub(crate) const fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Derives a key from a purpose tag and a list of values; order-sensitive, so that
/// `(lane 1, block 2)` and `(lane 2, block 1)` get unrelated keys.
#[inline]
pub(crate) fn derive_key(tag: u64, parts: &[u64]) -> u64 {
    parts
        .iter()
        .fold(mix64(tag), |h, &p| mix64(h.wrapping_add(GAMMA) ^ mix64(p)))
}

/// An incremental 64-bit hash over integers, for fingerprints (stable across builds, unlike
/// `std::collections::hash_map::DefaultHasher`).
#[derive(Debug, Clone)]
pub(crate) struct Fingerprint(u64);

impl Fingerprint {
    /// Starts a fingerprint for a purpose tag.
    pub(crate) fn new(tag: u64) -> Self {
        Self(mix64(tag))
    }

    /// Adds one value.
    pub(crate) fn add(&mut self, value: u64) {
        self.0 = mix64(self.0.wrapping_add(GAMMA) ^ mix64(value));
    }

    /// The fingerprint so far.
    pub(crate) fn finish(&self) -> u64 {
        self.0
    }
}

/// SplitMix64 as a generator: the `i`-th output is `mix64(seed + (i + 1) * GAMMA)`.
#[derive(Debug, Clone)]
pub(crate) struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose stream is fixed by `key`.
    pub(crate) fn new(key: u64) -> Self {
        Self { state: key }
    }

    /// The next 64 random bits.
    #[inline]
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(GAMMA);
        mix64(self.state)
    }

    /// A uniform integer in `0..n` without modulo bias (Lemire 2019). `n` must be non-zero.
    #[inline]
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        let mut m = u128::from(self.next_u64()) * u128::from(n);
        if (m as u64) < n {
            let threshold = n.wrapping_neg() % n;
            while (m as u64) < threshold {
                m = u128::from(self.next_u64()) * u128::from(n);
            }
        }
        (m >> 64) as u64
    }

    /// Shuffles `items` in place (Fisher–Yates, from the end).
    pub(crate) fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.below(i as u64 + 1) as usize;
            items.swap(i, j);
        }
    }
}

/// A keyed permutation of `0..n`, computed one value at a time in O(1) memory.
///
/// A Feistel network permutes the smallest power-of-two domain `2^b >= n` (the two halves may
/// differ by one bit); values that land at or past `n` are sent through the network again (cycle
/// walking), which stays inside `0..n` and takes fewer than two passes on average because
/// `2^b < 2n`.
#[derive(Debug, Clone)]
pub(crate) struct Feistel {
    n: u64,
    bits: u32,
    keys: [u64; FEISTEL_ROUNDS],
}

impl Feistel {
    /// The permutation of `0..n` selected by `key`.
    pub(crate) fn new(n: u64, key: u64) -> Self {
        let bits = if n <= 1 {
            0
        } else {
            64 - (n - 1).leading_zeros()
        };
        let mut keys = [0u64; FEISTEL_ROUNDS];
        for (round, k) in keys.iter_mut().enumerate() {
            *k = mix64(key ^ (round as u64 + 1).wrapping_mul(GAMMA));
        }
        Self { n, bits, keys }
    }

    /// The image of `x` (`x < n`); values outside the domain are returned unchanged.
    #[inline]
    pub(crate) fn permute(&self, x: u64) -> u64 {
        if self.n <= 1 || x >= self.n {
            return x;
        }
        let mut y = self.encrypt(x);
        while y >= self.n {
            y = self.encrypt(y);
        }
        y
    }

    /// One pass of the network over the `bits`-bit domain.
    #[inline]
    fn encrypt(&self, x: u64) -> u64 {
        // `left` holds the high `lw` bits and `right` the low `rw` bits; each round moves the right
        // half to the left and replaces it by `left ^ F(right)`, so the two widths swap roles.
        let mut lw = self.bits - self.bits / 2;
        let mut rw = self.bits / 2;
        let mut left = x >> rw;
        let mut right = x & mask(rw);
        for &k in &self.keys {
            let f = mix64(right ^ k) & mask(lw);
            let new_right = left ^ f;
            left = right;
            right = new_right;
            std::mem::swap(&mut lw, &mut rw);
        }
        (left << rw) | right
    }
}

/// The low `bits` bits set (`bits <= 32` here, so the shift never overflows).
#[inline]
const fn mask(bits: u32) -> u64 {
    (1u64 << bits) - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn feistel_is_a_bijection_for_every_small_domain() {
        for n in 0..300u64 {
            for key in [0u64, 1, 0xdead_beef, u64::MAX] {
                let p = Feistel::new(n, key);
                let mut seen = vec![false; n as usize];
                for x in 0..n {
                    let y = p.permute(x);
                    assert!(y < n, "n={n} key={key} x={x} -> {y}");
                    assert!(!seen[y as usize], "n={n} key={key}: {y} hit twice");
                    seen[y as usize] = true;
                }
            }
        }
    }

    #[test]
    fn feistel_keys_give_different_permutations() {
        let n = 1000;
        let a: Vec<u64> = (0..n).map(|x| Feistel::new(n, 1).permute(x)).collect();
        let b: Vec<u64> = (0..n).map(|x| Feistel::new(n, 2).permute(x)).collect();
        let fixed_a = a
            .iter()
            .enumerate()
            .filter(|&(i, &y)| i as u64 == y)
            .count();
        let same = a.iter().zip(&b).filter(|(x, y)| x == y).count();
        // A uniform permutation has ~1 fixed point and agrees with another in ~1 place.
        assert!(fixed_a < 10, "{fixed_a} fixed points");
        assert!(same < 10, "{same} equal images");
    }

    #[test]
    fn feistel_mixes_positions_evenly() {
        // Where does the first tenth of the domain go? A good shuffle spreads it over all tenths.
        let n = 10_000u64;
        let mut buckets = [0u32; 10];
        for key in 0..20u64 {
            let p = Feistel::new(n, key);
            for x in 0..n / 10 {
                buckets[(p.permute(x) * 10 / n) as usize] += 1;
            }
        }
        // 20 keys x 1000 values = 20,000 draws, 2,000 expected per bucket.
        for (i, &b) in buckets.iter().enumerate() {
            assert!((1700..2300).contains(&b), "bucket {i}: {b}");
        }
    }

    #[test]
    fn feistel_handles_the_largest_domain() {
        let p = Feistel::new(u64::MAX, 7);
        for x in [0, 1, u64::MAX / 2, u64::MAX - 1] {
            assert!(p.permute(x) < u64::MAX);
        }
    }

    #[test]
    fn below_is_unbiased_on_a_small_range() {
        let mut rng = SplitMix64::new(42);
        let mut counts = [0u32; 3];
        for _ in 0..30_000 {
            counts[rng.below(3) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn generator_output_is_pinned() {
        // Resume across upgrades depends on these exact values never changing.
        let mut rng = SplitMix64::new(0);
        assert_eq!(rng.next_u64(), 0xe220_a839_7b1d_cdaf);
        assert_eq!(rng.next_u64(), 0x6e78_9e6a_a1b9_65f4);
        assert_eq!(
            Feistel::new(10, 3).permute(0),
            Feistel::new(10, 3).permute(0)
        );
        assert_eq!(derive_key(1, &[2, 3]), derive_key(1, &[2, 3]));
        assert_ne!(derive_key(1, &[2, 3]), derive_key(1, &[3, 2]));
    }

    #[test]
    fn shuffle_keeps_every_item() {
        let mut items: Vec<u32> = (0..1000).collect();
        SplitMix64::new(9).shuffle(&mut items);
        assert_ne!(items, (0..1000).collect::<Vec<_>>());
        items.sort_unstable();
        assert_eq!(items, (0..1000).collect::<Vec<_>>());
    }
}
