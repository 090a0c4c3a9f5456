//! The sample-order contract (docs/sample-order.md), checked through the public API against the naive
//! reference "every sample exactly once, in one world-independent order":
//! - all ranks together read every sample exactly once, plus fewer than `processes` marked
//!   padding repeats, and every process reads the same number;
//! - the samples a job consumes, step by step, are always a prefix of the global order, for any
//!   nodes x processes x workers x batch size;
//! - a state saved mid-epoch (through JSON) resumes that prefix with another world: no sample
//!   lost, none repeated;
//! - shuffled epochs differ from each other and from the unshuffled order;
//! - locality: each node reads its own lanes' shards, and a rank's next samples come from a few
//!   shards.

#![allow(clippy::unwrap_used)] // helpers outside #[test] fns build fixtures

use std::collections::{BTreeMap, BTreeSet, HashMap};

use proptest::prelude::*;
use shardstream_streamer::order::{
    DatasetShape, EpochOrder, OrderConfig, Partition, Rank, RankSample, Remainder, Sampling,
    StreamShape, StreamState, Weight, World,
};
use shardstream_streamer::StreamerError;

fn sizes_strategy(max_shards: usize, max_len: u64) -> impl Strategy<Value = Vec<u64>> {
    prop::collection::vec(
        prop_oneof![1 => Just(0u64), 10 => 1..max_len],
        1..max_shards,
    )
}

fn config_strategy() -> impl Strategy<Value = OrderConfig> {
    (
        any::<u64>(),
        any::<bool>(),
        1u32..6,
        1u32..13,
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

fn world_strategy() -> impl Strategy<Value = World> {
    (1u32..5, 1u32..4, 1u32..4, 1u32..9).prop_map(|(n, p, w, b)| World::new(n, p, w, b).unwrap())
}

/// Every rank's stream, keyed by (global process rank, worker).
fn all_streams(
    order: &EpochOrder,
    world: World,
    start: u64,
) -> BTreeMap<(u64, u32), Vec<RankSample>> {
    let mut out = BTreeMap::new();
    for flat in 0..world.size() {
        let rank = world.rank_at(flat).unwrap();
        let process = flat / u64::from(world.workers());
        out.insert(
            (process, rank.worker),
            order.rank_iter(world, rank, start).unwrap().collect(),
        );
    }
    out
}

/// Replays a job: at each step every process takes its next batch, from worker
/// `step % workers` (PyTorch's DataLoader order). Returns the batches of each step, up to
/// `max_steps`, and the number of samples each process consumed.
fn consume(
    order: &EpochOrder,
    world: World,
    start: u64,
    max_steps: u64,
) -> (Vec<Vec<RankSample>>, u64) {
    let streams = all_streams(order, world, start);
    let b = world.batch_size() as usize;
    let nw = u64::from(world.workers());
    let mut cursor: HashMap<(u64, u32), usize> = HashMap::new();
    let mut steps = Vec::new();
    let mut per_process = 0;
    for t in 0..max_steps {
        let worker = (t % nw) as u32;
        let mut step = Vec::new();
        let mut took = 0;
        for process in 0..world.processes() {
            let stream = &streams[&(process, worker)];
            let at = cursor.entry((process, worker)).or_default();
            let batch = &stream[(*at).min(stream.len())..(*at + b).min(stream.len())];
            *at += batch.len();
            took = batch.len();
            step.extend_from_slice(batch);
        }
        if step.is_empty() {
            break;
        }
        per_process += took as u64;
        steps.push(step);
    }
    (steps, per_process)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn every_sample_exactly_once_for_any_world(
        sizes in sizes_strategy(20, 40),
        config in config_strategy(),
        world in world_strategy(),
        epoch in 0u64..5,
    ) {
        let shape = DatasetShape::single(sizes).unwrap();
        let order = EpochOrder::new(&shape, &config, epoch).unwrap();
        let n = order.global_len();
        let partition = order.partition(world, 0);
        let streams = all_streams(&order, world, 0);
        let mut seen = vec![0u32; n as usize];
        let mut padding = 0;
        let mut per_process: BTreeMap<u64, u64> = BTreeMap::new();
        for (&(process, _), stream) in &streams {
            *per_process.entry(process).or_default() += stream.len() as u64;
            for s in stream {
                if s.padding {
                    padding += 1;
                    prop_assert!(s.position >= n);
                } else {
                    // One order for every world: what a rank reads is the order's sample there.
                    prop_assert_eq!(Some(s.sample), order.sample_at(s.position));
                    seen[s.sample.sample as usize] += 1;
                }
            }
        }
        let dropped = seen.iter().filter(|&&c| c == 0).count() as u64;
        prop_assert!(seen.iter().all(|&c| c <= 1), "a sample was read twice");
        match config.remainder {
            Remainder::Pad => prop_assert_eq!(dropped, 0),
            Remainder::Drop => prop_assert_eq!(dropped, n % world.processes()),
        }
        prop_assert_eq!(padding, partition.padding());
        prop_assert!(padding < world.processes());
        let equal = per_process.values().all(|&c| c == partition.per_process());
        prop_assert!(equal, "{:?}", per_process);
        prop_assert_eq!(per_process.len() as u64, world.processes());
    }

    #[test]
    fn consumption_is_a_prefix_and_resume_with_another_world_continues_it(
        sizes in sizes_strategy(20, 40),
        config in config_strategy(),
        before in world_strategy(),
        after in world_strategy(),
        stop_at in 0u64..30,
    ) {
        let shape = DatasetShape::single(sizes).unwrap();
        let order = EpochOrder::new(&shape, &config, 3).unwrap();
        let n = order.global_len();

        // Phase 1: run `stop_at` steps; after each one the consumed positions are a prefix.
        let (steps, per_process) = consume(&order, before, 0, stop_at);
        let mut consumed: Vec<u64> = Vec::new();
        for step in &steps {
            consumed.extend(step.iter().filter(|s| !s.padding).map(|s| s.position));
            let mut sorted = consumed.clone();
            sorted.sort_unstable();
            prop_assert_eq!(sorted, (0..consumed.len() as u64).collect::<Vec<_>>());
        }
        let consumed_count = order.partition(before, 0).consumed_after(per_process);
        let saved = StreamState::new(&order, consumed_count);
        prop_assert_eq!(saved.consumed, consumed.len() as u64);

        // Phase 2: through JSON, into a new world, to the end of the epoch.
        let json = serde_json::to_string(&saved).unwrap();
        let loaded: StreamState = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(&loaded, &saved);
        let resumed = loaded.resume(&shape).unwrap();
        let (rest, _) = consume(&resumed, after, loaded.consumed, u64::MAX);
        let mut all: Vec<u64> = consumed;
        for s in rest.iter().flatten().filter(|s| !s.padding) {
            prop_assert_eq!(Some(s.sample), order.sample_at(s.position));
            all.push(s.position);
        }
        all.sort_unstable();
        let end = match config.remainder {
            Remainder::Pad => n,
            Remainder::Drop => Partition::new(n, after, loaded.consumed, Remainder::Drop).end(),
        };
        prop_assert_eq!(all, (0..end).collect::<Vec<_>>(), "lost or repeated samples");
    }

    #[test]
    fn the_ramp_reads_the_first_shard_alone(
        sizes in prop::collection::vec(1u64..30, 3..40),
        seed in any::<u64>(),
        window in 3u32..20,
        epoch in 0u64..4,
    ) {
        let shape = DatasetShape::single(sizes).unwrap();
        let config = OrderConfig { seed, shuffle: true, window, ..OrderConfig::default() };
        prop_assert!(config.ramp, "the ramp is on by default");
        let order = EpochOrder::new(&shape, &config, epoch).unwrap();
        let shard_at = |p: u64| order.sample_at(p).unwrap().shard;
        let first = shard_at(0);
        let first_len = shape.shard_len(first).unwrap();
        let head: BTreeSet<u32> = (0..first_len).map(shard_at).collect();
        prop_assert_eq!(&head, &BTreeSet::from([first]), "the first block is one shard");
    }

    #[test]
    fn shuffled_epochs_differ(
        sizes in prop::collection::vec(10u64..40, 3..12),
        seed in any::<u64>(),
        window in 1u32..5,
        lanes in 1u32..4,
    ) {
        let shape = DatasetShape::single(sizes).unwrap();
        let shuffled = OrderConfig { seed, shuffle: true, window, lanes, ..OrderConfig::default() };
        let plain = OrderConfig { shuffle: false, ..shuffled };
        let list = |config: &OrderConfig, epoch| {
            let order = EpochOrder::new(&shape, config, epoch).unwrap();
            (0..order.global_len()).map(|p| order.sample_at(p).unwrap().sample).collect::<Vec<_>>()
        };
        let (e0, e1, unshuffled) = (list(&shuffled, 0), list(&shuffled, 1), list(&plain, 0));
        prop_assert_ne!(&e0, &e1);
        prop_assert_ne!(&e0, &unshuffled);
        prop_assert_eq!(&unshuffled, &list(&plain, 1), "the unshuffled order depends on the epoch");
        let mut sorted = e0.clone();
        sorted.sort_unstable();
        prop_assert_eq!(sorted, (0..shape.epoch_len()).collect::<Vec<_>>());
    }

    #[test]
    fn each_node_reads_its_own_shards(
        sizes in prop::collection::vec(1u64..30, 1..60),
        seed in any::<u64>(),
        shuffle in any::<bool>(),
        window in 1u32..5,
        nodes in 1u32..5,
        lanes_per_node in 1u32..4,
        processes_per_node in 1u32..4,
        workers in 1u32..3,
    ) {
        let shape = DatasetShape::single(sizes).unwrap();
        let lanes = nodes * lanes_per_node;
        let config = OrderConfig { seed, shuffle, window, lanes, ..OrderConfig::default() };
        let order = EpochOrder::new(&shape, &config, 1).unwrap();
        let world = World::new(nodes, processes_per_node, workers, 4).unwrap();
        prop_assert_eq!(world.locality(lanes).nodes_per_lane, 1);
        let mut readers: HashMap<u32, BTreeSet<u32>> = HashMap::new();
        for flat in 0..world.size() {
            let rank = world.rank_at(flat).unwrap();
            for s in order.rank_iter(world, rank, 0).unwrap() {
                readers.entry(s.sample.shard).or_default().insert(rank.node);
            }
        }
        // Only a shard cut by a lane boundary is shared, and then each node reads its own part.
        let shared = readers.values().filter(|nodes| nodes.len() > 1).count() as u64;
        prop_assert!(shared < u64::from(lanes), "{} shards read by several nodes", shared);
    }

    #[test]
    fn a_ranks_next_samples_come_from_a_few_shards(
        sizes in prop::collection::vec(20u64..40, 1..80),
        config in config_strategy(),
        world in world_strategy(),
        k in 1usize..64,
    ) {
        let shape = DatasetShape::single(sizes.clone()).unwrap();
        let order = EpochOrder::new(&shape, &config, 2).unwrap();
        let lanes = u64::from(config.lanes);
        let w = u64::from(config.window);
        let min_shard = *sizes.iter().min().unwrap();
        for flat in 0..world.size() {
            let rank = world.rank_at(flat).unwrap();
            let stream: Vec<RankSample> = order.rank_iter(world, rank, 0).unwrap().collect();
            for window in stream.windows(k) {
                let shards: BTreeSet<u32> = window.iter().map(|s| s.sample.shard).collect();
                // Per lane read: a lane's blocks hold `w` whole shards (>= w * min_shard samples),
                // except its ramp (blocks of 1, 2, 4, ... shards, fewer than `w` together) and its
                // first and last block, so `l` lane samples touch at most
                // w * (ceil(l / (w * min_shard)) + 2) shards.
                let mut per_lane: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
                for s in window.iter().filter(|s| !s.padding) {
                    let e = per_lane.entry(s.position % lanes).or_insert((u64::MAX, 0));
                    *e = (e.0.min(s.position / lanes), e.1.max(s.position / lanes));
                }
                let bound: u64 = per_lane
                    .values()
                    .map(|&(lo, hi)| w * ((hi - lo + 1).div_ceil(w * min_shard) + 2))
                    .sum::<u64>()
                    + window.iter().filter(|s| s.padding).count() as u64;
                let touched = shards.len() as u64;
                prop_assert!(touched <= bound, "{} shards > bound {}", touched, bound);
            }
        }
    }
}

proptest! {
    #[test]
    fn mixing_gives_each_stream_its_share(
        natural in prop::collection::vec(1u64..20, 1..6),
        repeated in prop::collection::vec(0u64..20, 1..6),
        chosen in prop::collection::vec(1u64..20, 1..6),
        repeat_tenths in 0u32..35,
        choose_frac in 0.0f64..1.0,
        config in config_strategy(),
        epoch in 0u64..4,
    ) {
        let repeat = f64::from(repeat_tenths) / 10.0;
        let chosen_total: u64 = chosen.iter().sum();
        let choose = (chosen_total as f64 * choose_frac) as u64;
        let repeated_total: u64 = repeated.iter().sum();
        let shape = DatasetShape::mixed(
            vec![
                (StreamShape::new(natural).unwrap(), Weight::Natural),
                (StreamShape::new(repeated).unwrap(), Weight::Repeat(repeat)),
                (StreamShape::new(chosen).unwrap(), Weight::Choose(choose)),
            ],
            None,
            Sampling::Balanced,
        ).unwrap();
        let order = EpochOrder::new(&shape, &config, epoch).unwrap();
        let mut count: BTreeMap<u64, u64> = BTreeMap::new();
        let mut per_stream = [0u64; 3];
        for p in 0..order.global_len() {
            let s = order.sample_at(p).unwrap();
            prop_assert_eq!(shape.stream_of(s.shard), Some(s.stream));
            prop_assert_eq!(shape.shard_start(s.shard).unwrap() + s.index, s.sample);
            prop_assert!(s.index < shape.shard_len(s.shard).unwrap());
            *count.entry(s.sample).or_default() += 1;
            per_stream[s.stream as usize] += 1;
        }
        let firsts: Vec<u64> = (0..3).map(|i| {
            let e = &shape.streams()[i];
            shape.shard_start(e.first_shard).unwrap_or(shape.num_samples())
        }).collect();
        let natural_total = shape.streams()[0].shape.num_samples();
        let want_repeated = (repeat * repeated_total as f64).floor() as u64;
        prop_assert_eq!(per_stream, [natural_total, want_repeated, choose]);
        for id in 0..shape.num_samples() {
            let c = count.get(&id).copied().unwrap_or(0);
            if id < firsts[1] {
                prop_assert_eq!(c, 1, "natural sample {}", id);
            } else if id < firsts[2] {
                let floor = repeat.floor() as u64;
                let ok = c == floor || c == floor + 1;
                prop_assert!(ok, "repeated sample {} seen {} times", id, c);
            } else {
                prop_assert!(c <= 1, "chosen sample {} seen {} times", id, c);
            }
        }
    }
}

#[test]
fn fixed_sampling_keeps_its_subset_and_balanced_rotates_it() {
    let subset = |sampling, epoch| {
        let shape = DatasetShape::mixed(
            vec![(
                StreamShape::new(vec![50, 50, 50]).unwrap(),
                Weight::Choose(40),
            )],
            None,
            sampling,
        )
        .unwrap();
        let config = OrderConfig {
            shuffle: true,
            ..OrderConfig::default()
        };
        let order = EpochOrder::new(&shape, &config, epoch).unwrap();
        (0..order.global_len())
            .map(|p| order.sample_at(p).unwrap().sample)
            .collect::<BTreeSet<_>>()
    };
    assert_eq!(subset(Sampling::Fixed, 0).len(), 40);
    assert_eq!(subset(Sampling::Fixed, 0), subset(Sampling::Fixed, 1));
    assert_ne!(subset(Sampling::Balanced, 0), subset(Sampling::Balanced, 1));
}

#[test]
fn unshuffled_single_lane_is_the_dataset_order() {
    let shape = DatasetShape::single(vec![3, 0, 4, 2]).unwrap();
    let order = EpochOrder::new(&shape, &OrderConfig::default(), 5).unwrap();
    let ids: Vec<(u32, u64, u64)> = (0..order.global_len())
        .map(|p| order.sample_at(p).unwrap())
        .map(|s| (s.shard, s.index, s.sample))
        .collect();
    let want = vec![
        (0, 0, 0),
        (0, 1, 1),
        (0, 2, 2),
        (2, 0, 3),
        (2, 1, 4),
        (2, 2, 5),
        (2, 3, 6),
        (3, 0, 7),
        (3, 1, 8),
    ];
    assert_eq!(ids, want);
}

#[test]
fn lanes_interleave_contiguous_runs() {
    // 10 samples in 3 lanes of 4, 3, 3: position p is sample p / 3 of lane p % 3.
    let shape = DatasetShape::single(vec![10]).unwrap();
    let config = OrderConfig {
        lanes: 3,
        ..OrderConfig::default()
    };
    let order = EpochOrder::new(&shape, &config, 0).unwrap();
    let ids: Vec<u64> = (0..10)
        .map(|p| order.sample_at(p).unwrap().sample)
        .collect();
    assert_eq!(ids, vec![0, 4, 7, 1, 5, 8, 2, 6, 9, 3]);
}

#[test]
fn empty_dataset_gives_empty_streams() {
    let shape = DatasetShape::single(vec![0, 0]).unwrap();
    let config = OrderConfig {
        shuffle: true,
        lanes: 4,
        ..OrderConfig::default()
    };
    let order = EpochOrder::new(&shape, &config, 0).unwrap();
    assert_eq!(order.global_len(), 0);
    let world = World::new(2, 2, 2, 2).unwrap();
    let rank = Rank {
        node: 1,
        local_process: 1,
        worker: 1,
    };
    assert_eq!(order.rank_iter(world, rank, 0).unwrap().count(), 0);
    assert!(order
        .shards_needed(&order.partition(world, 0), rank, 0..10)
        .unwrap()
        .is_empty());
}

#[test]
fn more_processes_than_samples_still_balances() {
    // 3 samples over 8 processes: 5 of them read one padding sample each.
    let shape = DatasetShape::single(vec![3]).unwrap();
    let order = EpochOrder::new(&shape, &OrderConfig::default(), 0).unwrap();
    let world = World::new(2, 4, 1, 1).unwrap();
    let streams = all_streams(&order, world, 0);
    assert!(streams.values().all(|s| s.len() == 1));
    assert_eq!(streams.values().filter(|s| s[0].padding).count(), 5);
    assert!(streams.values().all(|s| s[0].sample.sample < 3));
}

#[test]
fn each_ramp_setting_keeps_the_state_version_that_builds_before_it_read() {
    // Builds before the shard ramp read only version 1 and would ignore `ramp`; builds before
    // the sample ramp read versions 1 and 2 and would ignore `sample_ramp`. A state must be one
    // that a build refuses unless that build resumes it in the saved order.
    let shape = DatasetShape::single(vec![300; 40]).unwrap();
    let both = OrderConfig {
        shuffle: true,
        ..OrderConfig::default()
    };
    let shard_ramp = OrderConfig {
        sample_ramp: false,
        ..both
    };
    let flat = OrderConfig {
        ramp: false,
        ..shard_ramp
    };
    let at = |o: &EpochOrder| {
        (0..o.global_len())
            .map(|p| o.sample_at(p).unwrap())
            .collect::<Vec<_>>()
    };
    let orders = [both, shard_ramp, flat].map(|c| EpochOrder::new(&shape, &c, 0).unwrap());
    let states = orders.each_ref().map(|o| StreamState::new(o, 5));
    assert_eq!(states.each_ref().map(|s| s.version), [3, 2, 1]);
    assert_ne!(at(&orders[0]), at(&orders[1]));
    assert_ne!(at(&orders[1]), at(&orders[2]));
    // What the builds before each setting wrote: no field for it (nor for later ones).
    let mut v2 = serde_json::to_value(&states[1]).unwrap();
    v2["config"].as_object_mut().unwrap().remove("sample_ramp");
    let mut v1 = serde_json::to_value(&states[2]).unwrap();
    for field in ["ramp", "sample_ramp"] {
        v1["config"].as_object_mut().unwrap().remove(field);
    }
    for (old, order) in [(v2, &orders[1]), (v1, &orders[2])] {
        let old: StreamState = serde_json::from_value(old).unwrap();
        assert_eq!(at(&old.resume(&shape).unwrap()), at(order));
    }
    for (state, order) in states.iter().zip(&orders) {
        assert_eq!(at(&state.resume(&shape).unwrap()), at(order));
    }
    // Version 1 with a ramp on, or version 2 with the sample ramp, is nothing any build wrote.
    for (version, state) in [(1, &states[0]), (1, &states[1]), (2, &states[0])] {
        let forged = StreamState {
            version,
            ..state.clone()
        };
        assert!(matches!(
            forged.resume(&shape),
            Err(StreamerError::UnsupportedStateVersion { found, .. }) if found == version
        ));
    }
}

#[test]
fn the_sample_ramp_starts_an_epoch_near_the_start_of_its_first_shard() {
    // 6,700 samples per shard (a 64 MiB shard of 10 KB samples): the first 104 positions come
    // from the first shard's first 104 samples, the next 105 from its next 105, and so on.
    let shape = DatasetShape::single(vec![6_700; 8]).unwrap();
    let config = OrderConfig {
        shuffle: true,
        ..OrderConfig::default()
    };
    let order = EpochOrder::new(&shape, &config, 0).unwrap();
    let first = order.sample_at(0).unwrap().shard;
    let mut lo = 0;
    for hi in [104u64, 209, 418, 837, 1675, 3350, 6700] {
        let mut got: Vec<u64> = (lo..hi)
            .map(|p| {
                let s = order.sample_at(p).unwrap();
                assert_eq!(s.shard, first, "position {p}");
                s.index
            })
            .collect();
        assert_ne!(
            got,
            (lo..hi).collect::<Vec<_>>(),
            "part {lo}..{hi} is shuffled"
        );
        got.sort_unstable();
        assert_eq!(got, (lo..hi).collect::<Vec<_>>(), "part {lo}..{hi}");
        lo = hi;
    }
    // Without it, the first 104 positions are spread over the whole shard.
    let plain = EpochOrder::new(
        &shape,
        &OrderConfig {
            sample_ramp: false,
            ..config
        },
        0,
    )
    .unwrap();
    let spread = (0..104).map(|p| plain.sample_at(p).unwrap().index).max();
    assert!(spread > Some(3_000), "{spread:?}");
}

#[test]
fn state_refuses_another_dataset_and_unknown_versions() {
    let shape = DatasetShape::single(vec![10, 10]).unwrap();
    let order = EpochOrder::new(&shape, &OrderConfig::default(), 0).unwrap();
    let state = StreamState::new(&order, 7);
    let other = DatasetShape::single(vec![10, 11]).unwrap();
    assert!(matches!(
        state.resume(&other),
        Err(StreamerError::ShapeMismatch { .. })
    ));
    let future = StreamState {
        version: 99,
        ..state.clone()
    };
    assert!(matches!(
        future.resume(&shape),
        Err(StreamerError::UnsupportedStateVersion { found: 99, .. })
    ));
    let done = StreamState::new(&order, 1_000);
    assert_eq!(done.consumed, 20);
    assert!(done.epoch_done(&order));
    // The JSON a checkpoint stores: small, readable, world-free.
    let json = serde_json::to_value(&state).unwrap();
    assert_eq!(json["consumed"], 7);
    assert_eq!(json["config"]["seed"], 9176);
    assert_eq!(json["config"]["remainder"], "pad");
    assert_eq!(json["shape_fingerprint"].as_str().unwrap().len(), 16);
}

#[test]
fn world_and_rank_validation() {
    assert!(matches!(
        World::new(1, 0, 1, 1),
        Err(StreamerError::InvalidConfig {
            setting: "processes_per_node",
            ..
        })
    ));
    let world = World::new(2, 4, 3, 8).unwrap();
    assert_eq!(world.size(), 24);
    let rank = world.rank_of_process(6, 2).unwrap();
    assert_eq!(
        rank,
        Rank {
            node: 1,
            local_process: 2,
            worker: 2
        }
    );
    assert_eq!(world.flat_index(rank).unwrap(), 20);
    assert_eq!(world.rank_at(20).unwrap(), rank);
    assert!(matches!(
        world.rank_at(24),
        Err(StreamerError::RankOutOfRange { .. })
    ));
    assert!(matches!(
        world.rank_of_process(8, 0),
        Err(StreamerError::RankOutOfRange { .. })
    ));
    let shape = DatasetShape::single(vec![5]).unwrap();
    let order = EpochOrder::new(&shape, &OrderConfig::default(), 0).unwrap();
    let outside = Rank {
        node: 0,
        local_process: 0,
        worker: 3,
    };
    assert!(order.rank_iter(world, outside, 0).is_err());
    let zero_window = OrderConfig {
        window: 0,
        ..OrderConfig::default()
    };
    assert!(matches!(
        EpochOrder::new(&shape, &zero_window, 0),
        Err(StreamerError::InvalidConfig {
            setting: "window",
            ..
        })
    ));
}

#[test]
fn memory_grows_with_shards_not_samples() {
    let config = OrderConfig {
        shuffle: true,
        lanes: 8,
        ..OrderConfig::default()
    };
    let bytes = |per_shard: u64| {
        let shape = DatasetShape::single(vec![per_shard; 10_000]).unwrap();
        let order = EpochOrder::new(&shape, &config, 0).unwrap();
        assert_eq!(order.global_len(), per_shard * 10_000);
        order.heap_bytes()
    };
    // 10^4 samples and 10^10 samples over the same 10^4 shards: the same memory, ~32 B/shard.
    assert_eq!(bytes(1), bytes(1_000_000));
    assert!(bytes(1) < 10_000 * 40, "{} bytes", bytes(1));
}

#[test]
fn locality_figures() {
    let world = World::new(48, 8, 4, 32).unwrap();
    let l = world.locality(64);
    assert_eq!((l.lanes_per_node, l.nodes_per_lane), (4, 3));
    let l = World::new(16, 8, 1, 1).unwrap().locality(64);
    assert_eq!((l.lanes_per_node, l.nodes_per_lane), (4, 1));
}
