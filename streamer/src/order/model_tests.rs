//! Model checks: the O(shards) order, partition and planner against the naive reference, for
//! random datasets (with mixes), settings, epochs, worlds and resume points.

use proptest::prelude::*;

use super::reference::{naive_order, naive_padding_source, naive_partition};
use super::*;

/// Streams of up to 10 shards of up to 30 samples (empty shards included; now and then one of
/// hundreds, for the sample ramp's parts), with weights.
pub(crate) fn shape_strategy() -> impl Strategy<Value = DatasetShape> {
    let stream = prop::collection::vec(
        prop_oneof![1 => Just(0u64), 16 => 1u64..30, 1 => 128u64..700],
        0..10,
    );
    let weight = prop_oneof![
        3 => Just(Weight::Natural),
        1 => (0u32..30).prop_map(|r| Weight::Repeat(f64::from(r) / 10.0)),
        1 => (0u64..80).prop_map(Weight::Choose),
    ];
    let absolute =
        prop::collection::vec((stream.clone(), weight), 1..4).prop_map(|streams| (streams, None));
    let relative = (
        prop::collection::vec(
            (
                stream,
                (1u32..5).prop_map(|p| Weight::Proportion(f64::from(p))),
            ),
            1..4,
        ),
        prop::option::of(0u64..300),
    );
    (prop_oneof![3 => absolute, 1 => relative], any::<bool>()).prop_filter_map(
        "weights ask for samples of an empty stream",
        |((streams, epoch_size), fixed)| {
            let streams = streams
                .into_iter()
                .map(|(sizes, w)| (StreamShape::new(sizes).unwrap(), w))
                .collect();
            let sampling = if fixed {
                Sampling::Fixed
            } else {
                Sampling::Balanced
            };
            DatasetShape::mixed(streams, epoch_size, sampling).ok()
        },
    )
}

pub(crate) fn config_strategy() -> impl Strategy<Value = OrderConfig> {
    (
        any::<u64>(),
        any::<bool>(),
        1u32..6,
        1u32..10,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(seed, shuffle, window, lanes, drop, ramp, sample_ramp)| OrderConfig {
                seed,
                shuffle,
                window,
                lanes,
                remainder: if drop {
                    Remainder::Drop
                } else {
                    Remainder::Pad
                },
                ramp,
                sample_ramp,
            },
        )
}

pub(crate) fn world_strategy() -> impl Strategy<Value = World> {
    (1u32..4, 1u32..4, 1u32..4, 1u32..6).prop_map(|(n, p, w, b)| World::new(n, p, w, b).unwrap())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn order_matches_naive_reference(
        shape in shape_strategy(),
        config in config_strategy(),
        epoch in 0u64..4,
    ) {
        let order = EpochOrder::new(&shape, &config, epoch).unwrap();
        let naive = naive_order(&shape, &config, epoch);
        prop_assert_eq!(order.global_len(), naive.len() as u64);
        prop_assert_eq!(order.global_len(), shape.epoch_len());
        for (p, want) in naive.iter().enumerate() {
            prop_assert_eq!(order.sample_at(p as u64), Some(*want), "position {}", p);
        }
        prop_assert_eq!(order.sample_at(order.global_len()), None);
    }

    #[test]
    fn rank_streams_match_naive_partition(
        shape in shape_strategy(),
        config in config_strategy(),
        world in world_strategy(),
        start_frac in 0.0f64..1.1,
    ) {
        let order = EpochOrder::new(&shape, &config, 1).unwrap();
        let n = order.global_len();
        let start = (n as f64 * start_frac) as u64;
        let naive = naive_partition(n, &world, start, config.remainder);
        for (flat, want) in naive.iter().enumerate() {
            let rank = world.rank_at(flat as u64).unwrap();
            prop_assert_eq!(world.flat_index(rank).unwrap(), flat as u64);
            let got: Vec<RankSample> = order.rank_iter(world, rank, start).unwrap().collect();
            prop_assert_eq!(got.len(), want.len(), "rank {:?}", rank);
            for (g, &(p, padding)) in got.iter().zip(want) {
                prop_assert_eq!((g.position, g.padding), (p, padding));
                let source = if padding {
                    naive_padding_source(p, n, world.processes())
                } else {
                    p
                };
                prop_assert_eq!(Some(g.sample), order.sample_at(source));
            }
        }
    }

    #[test]
    fn shards_needed_covers_every_read(
        shape in shape_strategy(),
        config in config_strategy(),
        world in world_strategy(),
        start_frac in 0.0f64..1.0,
        range in (0u64..200, 0u64..200),
    ) {
        let order = EpochOrder::new(&shape, &config, 2).unwrap();
        let start = (order.global_len() as f64 * start_frac) as u64;
        let partition = order.partition(world, start);
        let items = range.0.min(range.1)..range.0.max(range.1);
        for flat in 0..world.size() {
            let rank = world.rank_at(flat).unwrap();
            let needs = order.shards_needed(&partition, rank, items.clone()).unwrap();
            prop_assert!(needs.windows(2).all(|w| w[0].first_item <= w[1].first_item));
            let reads = order.rank_iter(world, rank, start).unwrap().enumerate()
                .skip(items.start as usize).take((items.end - items.start) as usize);
            for (i, s) in reads {
                let need = needs.iter().find(|n| n.shard == s.sample.shard);
                let shard = s.sample.shard;
                let missing = || TestCaseError::fail(format!("shard {shard} not planned"));
                let need = need.ok_or_else(missing)?;
                prop_assert!(need.first_item <= i as u64, "{:?} item {}", need, i);
                let index = s.sample.index;
                prop_assert!(need.samples.contains(&index), "{:?} index {}", need, index);
            }
        }
    }
}

#[test]
fn partition_counts_for_a_known_case() {
    // 10 positions over 4 processes: 3 rounds, positions 10 and 11 are padding.
    let world = World::new(2, 2, 1, 1).unwrap();
    let p = Partition::new(10, world, 0, Remainder::Pad);
    assert_eq!((p.per_process(), p.padding()), (3, 2));
    let d = Partition::new(10, world, 0, Remainder::Drop);
    assert_eq!((d.per_process(), d.padding(), d.end()), (2, 0, 8));
    // Resumed at 3: positions 3..11, two each; residue 3 reads 3, 7 and residue 2 reads 6, 10.
    let r = Partition::new(10, world, 3, Remainder::Pad);
    assert_eq!((r.per_process(), r.end(), r.padding()), (2, 11, 1));
    assert_eq!(
        (0..2).map(|j| r.process_position(3, j)).collect::<Vec<_>>(),
        vec![3, 7]
    );
    assert_eq!(r.process_position(2, 1), 10);
    assert_eq!(
        (0..2).map(|j| r.process_position(0, j)).collect::<Vec<_>>(),
        vec![4, 8]
    );
}

#[test]
fn workers_take_turns_by_batch() {
    let world = World::new(1, 1, 3, 2).unwrap();
    let p = Partition::new(11, world, 0, Remainder::Pad);
    // Batches [0,1] [2,3] [4,5] [6,7] [8,9] [10]: worker 0 gets batches 0 and 3, worker 1
    // batches 1 and 4, worker 2 batches 2 and 5 (the short last one).
    assert_eq!(
        [p.worker_len(0), p.worker_len(1), p.worker_len(2)],
        [4, 4, 3]
    );
    let w1: Vec<u64> = (0..4).map(|i| p.process_index(1, i)).collect();
    assert_eq!(w1, vec![2, 3, 8, 9]);
    assert_eq!(p.worker_index_at_or_after(1, 4), 2);
    assert_eq!(p.worker_index_at_or_after(1, 3), 1);
}
