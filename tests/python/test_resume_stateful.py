"""Resume through torchdata's StatefulDataLoader: its `state_dict()` (which asks every worker's
copy of the dataset for its state) taken mid-epoch and loaded into a new loader over a new
dataset continues with exactly the batches the first loader would have produced next, with
0 and 2 workers; together with the first part, every sample of the epoch exactly once."""

from __future__ import annotations

import pytest
from torchdata.stateful_dataloader import StatefulDataLoader

import shardstream
from conftest import write_ids

N = 157
BATCH = 4


@pytest.mark.parametrize("workers,stop", [(0, 9), (2, 9), (2, 10), (2, 38)])
def test_stateful_dataloader_resumes_exactly(tmp_path, stream_env, workers, stop):
    write_ids(tmp_path / "mds", N, size_limit=500)

    def loader():
        ds = shardstream.StreamingDataset(local=str(tmp_path / "mds"), shuffle=True,
                                          shuffle_seed=11, batch_size=BATCH, shuffle_window=2)
        return StatefulDataLoader(ds, batch_size=BATCH, num_workers=workers,
                                  multiprocessing_context="fork" if workers else None)

    first = loader()
    it = iter(first)
    head = [next(it)["id"].tolist() for _ in range(stop)]
    state = first.state_dict()
    straight = head + [b["id"].tolist() for b in it]
    ids = sorted(i for b in straight for i in b)
    assert ids == list(range(N))

    second = loader()
    second.load_state_dict(state)
    rest = [b["id"].tolist() for b in second]
    assert head + rest == straight
