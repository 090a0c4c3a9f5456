//! Where an epoch's samples go, as Python hands it over: the order of the run ([`PyOrder`],
//! `shardstream._native.Order`), the shape of the job ([`PyWorld`]), one reader in it
//! ([`PyRank`]), and what one reader streams ([`PyPlan`]: all of them, the epoch and the start).
//! Each is built by `shardstream.StreamingDataset` and passed to the calls that need it, and
//! checked when built; they wrap the streamer's own types.

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use shardstream_streamer::order::{OrderConfig, Rank, Remainder, World};
use shardstream_streamer::StreamPlan;

use crate::errors::from_streamer;

/// The settings that fix the order of every epoch of a run (the streamer's [`OrderConfig`]).
#[pyclass(name = "Order", module = "shardstream._native", frozen)]
pub struct PyOrder {
    pub(super) config: OrderConfig,
}

#[pymethods]
impl PyOrder {
    #[new]
    #[pyo3(signature = (*, seed, shuffle, window, lanes, remainder, ramp=true, sample_ramp=true))]
    fn new(
        seed: u64,
        shuffle: bool,
        window: u32,
        lanes: u32,
        remainder: &str,
        ramp: bool,
        sample_ramp: bool,
    ) -> PyResult<Self> {
        let config = OrderConfig {
            seed,
            shuffle,
            window,
            lanes,
            remainder: remainder_of(remainder)?,
            ramp,
            sample_ramp,
        };
        config.validate().map_err(from_streamer)?;
        Ok(PyOrder { config })
    }

    #[getter]
    fn seed(&self) -> u64 {
        self.config.seed
    }

    #[getter]
    fn shuffle(&self) -> bool {
        self.config.shuffle
    }

    /// Shards in a shuffle window.
    #[getter]
    fn window(&self) -> u32 {
        self.config.window
    }

    /// Lanes of the order (Mosaic's canonical nodes).
    #[getter]
    fn lanes(&self) -> u32 {
        self.config.lanes
    }

    /// `"pad"` or `"drop"`.
    #[getter]
    fn remainder(&self) -> &'static str {
        match self.config.remainder {
            Remainder::Pad => "pad",
            Remainder::Drop => "drop",
        }
    }

    #[getter]
    fn ramp(&self) -> bool {
        self.config.ramp
    }

    #[getter]
    fn sample_ramp(&self) -> bool {
        self.config.sample_ramp
    }

    fn __repr__(&self) -> String {
        let c = &self.config;
        format!(
            "Order(seed={}, shuffle={}, window={}, lanes={}, remainder={:?}, ramp={}, \
             sample_ramp={})",
            c.seed,
            py_bool(c.shuffle),
            c.window,
            c.lanes,
            self.remainder(),
            py_bool(c.ramp),
            py_bool(c.sample_ramp)
        )
    }
}

/// The shape of the job: nodes, processes per node, DataLoader workers per process and the
/// batch size they collate (the streamer's [`World`]).
#[pyclass(name = "World", module = "shardstream._native", frozen)]
pub struct PyWorld {
    pub(super) world: World,
}

#[pymethods]
impl PyWorld {
    #[new]
    #[pyo3(signature = (*, nodes, processes_per_node, workers=1, batch_size=1))]
    fn new(nodes: u32, processes_per_node: u32, workers: u32, batch_size: u32) -> PyResult<Self> {
        let world =
            World::new(nodes, processes_per_node, workers, batch_size).map_err(from_streamer)?;
        Ok(PyWorld { world })
    }

    fn __repr__(&self) -> String {
        let w = &self.world;
        format!(
            "World(nodes={}, processes_per_node={}, workers={}, batch_size={})",
            w.nodes(),
            w.processes_per_node(),
            w.workers(),
            w.batch_size()
        )
    }
}

/// One reader: DataLoader `worker` of process `local_process` on `node` (the streamer's
/// [`Rank`]).
#[pyclass(name = "Rank", module = "shardstream._native", frozen)]
pub struct PyRank {
    pub(super) rank: Rank,
}

#[pymethods]
impl PyRank {
    #[new]
    #[pyo3(signature = (*, node, local_process, worker=0))]
    fn new(node: u32, local_process: u32, worker: u32) -> Self {
        PyRank {
            rank: Rank {
                node,
                local_process,
                worker,
            },
        }
    }

    fn __repr__(&self) -> String {
        let r = &self.rank;
        format!(
            "Rank(node={}, local_process={}, worker={})",
            r.node, r.local_process, r.worker
        )
    }
}

/// What one reader streams (the streamer's [`StreamPlan`]): `rank`'s part of `epoch` in
/// `order` and `world`, from global position `start` (positions already consumed).
#[pyclass(name = "Plan", module = "shardstream._native", frozen)]
pub struct PyPlan {
    pub(super) plan: StreamPlan,
}

#[pymethods]
impl PyPlan {
    #[new]
    #[pyo3(signature = (*, order, epoch, world, rank, start=0))]
    fn new(order: &PyOrder, epoch: u64, world: &PyWorld, rank: &PyRank, start: u64) -> Self {
        PyPlan {
            plan: StreamPlan {
                order: order.config,
                epoch,
                world: world.world,
                rank: rank.rank,
                start,
            },
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "Plan(epoch={}, start={}, {:?}, {:?}, {:?})",
            self.plan.epoch, self.plan.start, self.plan.order, self.plan.world, self.plan.rank
        )
    }
}

fn remainder_of(name: &str) -> PyResult<Remainder> {
    match name {
        "pad" => Ok(Remainder::Pad),
        "drop" => Ok(Remainder::Drop),
        other => Err(PyValueError::new_err(format!(
            "remainder must be 'pad' or 'drop', got {other:?}"
        ))),
    }
}

fn py_bool(b: bool) -> &'static str {
    if b {
        "True"
    } else {
        "False"
    }
}
