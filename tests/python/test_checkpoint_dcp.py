"""shardstream.checkpoint with the real torch.distributed.checkpoint: saves under torchrun (gloo on
127.0.0.1) to a real moto S3 server, loads at other world sizes, async saves, kill -9 during a
save, interop with torch's FileSystemWriter/FileSystemReader, and corruption detection."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter

import shardstream
from shardstream.checkpoint import StorageReader, StorageWriter, latest, list_checkpoints, verify

from ckpt_helpers import kill_at, result_lines, run_workers

MIB = 1 << 20


def dcp_root_error(call) -> BaseException:
    """Runs a DCP call that must fail and returns the error raised inside the storage layer
    (DCP wraps errors raised on a rank in a CheckpointException)."""
    from torch.distributed.checkpoint.api import CheckpointException

    try:
        call()
    except CheckpointException as e:
        [wrapped] = list(e.failures.values())
        return wrapped[0] if isinstance(wrapped, tuple) else wrapped.exception
    except Exception as e:  # raised outside DCP's collectives
        return e
    raise AssertionError("the DCP call did not fail")


@pytest.fixture(scope="module")
def s3_root(moto):
    """A fresh bucket on the moto server and the env that points shardstream at it."""
    with pytest.MonkeyPatch.context() as mp:
        for k, v in moto.env.items():  # the in-process reader/writer in these tests, too
            mp.setenv(k, v)
        bucket = moto.create_bucket(f"ckpt-{uuid.uuid4().hex[:8]}")
        yield f"{bucket}/run"


@pytest.fixture(scope="module")
def saved_step1(s3_root, tmp_path_factory, moto):
    """step_1 saved by 4 ranks under torchrun: model + Adam state sharded as DTensors."""
    ref = tmp_path_factory.mktemp("ref")
    url = f"{s3_root}/step_1"
    proc = run_workers(4, "save", url, str(ref), env=moto.env)
    assert sorted(r["rank"] for r in result_lines(proc)) == [0, 1, 2, 3]
    return url, ref


def _load_and_check(nproc: int, url: str, ref: Path, env: dict) -> list[dict]:
    proc = run_workers(nproc, "load", url, str(ref), env=env)
    results = result_lines(proc)
    assert sorted(r["rank"] for r in results) == list(range(nproc))
    assert all(r["world"] == nproc for r in results)
    # Every model and optimizer tensor was compared (2 weights + 2 biases, Adam exp_avg and
    # exp_avg_sq of each): a load that silently skipped tensors would fail here.
    assert all(r["tensors"] == 4 + 2 * 4 for r in results), results
    # Each rank fetched only the saved chunks its own shards overlap (the saved shards of 4
    # ranks nest in those of 4, 2 and 1): tensor bytes plus torch.save framing of each item.
    for r in results:
        assert r["needed"] <= r["fetched"] <= 1.1 * r["needed"], r
    return results


@pytest.mark.parametrize("world", [4, 2, 1])
def test_torchrun4_save_loads_equal_at_world_size(saved_step1, world, moto):
    url, ref = saved_step1
    _load_and_check(world, url, ref, moto.env)


def test_saved_checkpoint_is_latest_and_verifies(saved_step1, s3_root):
    url, _ = saved_step1
    assert latest(s3_root) == url
    [info] = [i for i in list_checkpoints(s3_root) if i["id"] == "step_1"]
    assert info["world_size"] == 4 and info["step"] == 1
    report = verify(url)
    assert report["failures"] == []
    # 4 rank files + .metadata + the .metadata alias
    assert report["files"] == 6 and report["bytes"] > 0


def test_committed_checkpoint_is_never_overwritten(saved_step1):
    url, _ = saved_step1
    err = dcp_root_error(
        lambda: dcp.save({"x": torch.zeros(3)}, storage_writer=StorageWriter(url), no_dist=True)
    )
    assert isinstance(err, shardstream.CheckpointError) and "already committed" in str(err), err


def test_async_save_while_training_continues(s3_root, tmp_path, moto):
    url = f"{s3_root}_async/step_7"  # its own root: the kill tests expect step_1 as latest
    proc = run_workers(2, "async", url, str(tmp_path), "--ballast-mb", "48", env=moto.env)
    results = result_lines(proc)
    assert len(results) == 2
    # Each rank ran optimizer steps while its upload was in flight, and they changed the model.
    assert all(r["steps_during_upload"] >= 1 and r["params_changed"] for r in results), results
    # What was saved is the state at async_save time (staged), not the values after it.
    proc = run_workers(1, "load", url, str(tmp_path), env=moto.env)
    [res] = result_lines(proc)
    assert res["tensors"] == 4 + 2 * 4 + 1
    assert verify(url)["failures"] == []


@pytest.mark.parametrize(
    "phase,rank",
    [("mid-upload", 2), ("mid-upload", 0), ("before-commit", 0)],
    ids=["rank2-mid-upload", "coordinator-mid-upload", "coordinator-before-manifest"],
)
def test_kill9_during_save_leaves_previous_checkpoint_latest(
    saved_step1, s3_root, tmp_path, phase, rank, moto
):
    url1, ref = saved_step1
    new_url = f"{s3_root}/step_{100 + len(phase) + rank}"
    # 5 MiB parts (S3's minimum) and 24 MiB of ballast (6 MiB per rank): each rank file is a
    # multipart upload, killed with a part in flight in the mid-upload cases.
    code = kill_at(4, phase, rank, new_url, tmp_path, tmp_path, env=moto.env,
                   part_size=5 * MIB, ballast_mb=24)
    assert code != 0, "torchrun should report the killed worker"
    if phase == "mid-upload":
        # The kill really landed inside a multipart upload: it is left open on the server
        # (invisible to readers; see docs/checkpoints.md for the lifecycle rule that reaps it).
        bucket, prefix = new_url.removeprefix("s3://").split("/", 1)
        open_uploads = _s3(moto).list_multipart_uploads(Bucket=bucket, Prefix=prefix + "/")
        assert open_uploads.get("Uploads"), "no multipart upload was in flight at the kill"
    assert latest(s3_root) == url1
    assert new_url.rsplit("/", 1)[1] not in {i["id"] for i in list_checkpoints(s3_root)}
    err = dcp_root_error(
        lambda: dcp.load({"x": torch.zeros(1)}, storage_reader=StorageReader(new_url), no_dist=True)
    )
    assert "not committed" in str(err), err
    # The previous checkpoint still loads, with tensors equal to the saved ones, and verifies.
    _load_and_check(1, url1, ref, moto.env)
    assert verify(url1)["failures"] == []


@pytest.mark.parametrize("tensors", [1, 64])
def test_save_memory_stays_within_the_upload_budget(tmp_path, tensors):
    """512 MiB saved with a 64 MiB budget, as one tensor (one multipart file) or as 64 tensors
    (64 single-PUT files in flight at once, sharing the rank's budget): torch.save's output
    streams to the uploader in pieces, so the process grows by about the budget, not by the
    data."""
    proc = run_workers(1, "memory", str(tmp_path / "step_1"), str(tmp_path),
                       "--ballast-mb", "512", "--budget-mb", "64", "--part-size", str(16 * MIB),
                       "--ballast-tensors", str(tensors))
    [res] = result_lines(proc)
    # budget + one 16 MiB piece in flight to the uploader + allocator slack
    assert res["growth"] <= (64 + 16 + 48) * MIB, res
    assert verify(tmp_path / "step_1")["failures"] == []


def _s3(moto):
    import boto3

    return boto3.client("s3", endpoint_url=moto.endpoint, aws_access_key_id="testing",
                        aws_secret_access_key="testing", region_name="us-east-1")


def _small_state() -> dict:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 64)).sum().backward()
    opt.step()
    return {"model": model.state_dict(), "optim": opt.state_dict(), "epoch": 5}


def _empty_like(state: dict) -> dict:
    return {
        "model": {k: torch.zeros_like(v) for k, v in state["model"].items()},
        "optim": {"state": {0: {"momentum_buffer": torch.zeros(32, 64)},
                            1: {"momentum_buffer": torch.zeros(32)}},
                  "param_groups": state["optim"]["param_groups"]},
        "epoch": 0,
    }


def _assert_equal(got: dict, want: dict) -> None:
    for k, v in want["model"].items():
        assert torch.equal(got["model"][k], v), k
    for p in (0, 1):
        assert torch.equal(got["optim"]["state"][p]["momentum_buffer"],
                           want["optim"]["state"][p]["momentum_buffer"])
    assert got["epoch"] == want["epoch"]


def test_items_are_packed_into_files_of_about_file_size(tmp_path):
    """Six 256 KiB tensors with file_size=600 KiB: three files of two tensors each, every one
    below the part size (one PUT each), and the checkpoint loads with ours and with torch's
    FileSystemReader."""
    torch.manual_seed(0)
    state = {f"t{i}": torch.randn(64 << 10) for i in range(6)}
    url = tmp_path / "step_1"
    dcp.save(state, storage_writer=StorageWriter(url, file_size=600 << 10, part_size=1 * MIB), no_dist=True)
    files = sorted(url.glob("attempt-*/__0_*.distcp"))
    assert len(files) == 3, files
    assert all(f.stat().st_size <= 600 << 10 for f in files)
    for reader in (StorageReader(url), FileSystemReader(url)):
        loaded = {k: torch.zeros_like(v) for k, v in state.items()}
        dcp.load(loaded, storage_reader=reader, no_dist=True)
        assert all(torch.equal(loaded[k], v) for k, v in state.items())
    assert verify(url)["failures"] == []


def test_part_sized_tensor_goes_up_in_one_put(tmp_path):
    """A tensor of exactly one part is a little more than a part with its torch.save framing:
    its file is still one PUT (no parts in its record), not a two-part multipart upload."""
    from shardstream._native import CheckpointStore

    import json

    state = {"w": torch.randn(MIB // 4)}  # 1 MiB of data
    url = tmp_path / "step_1"
    dcp.save(state, storage_writer=StorageWriter(url, part_size=MIB), no_dist=True)
    files = json.loads(CheckpointStore(str(tmp_path)).open("step_1").manifest_json())["files"]
    [data] = [f for f in files if f["path"].endswith(".distcp")]
    assert data["size"] > MIB and "parts" not in data, data
    loaded = {"w": torch.zeros_like(state["w"])}
    dcp.load(loaded, storage_reader=StorageReader(url), no_dist=True)
    assert torch.equal(loaded["w"], state["w"])


@pytest.mark.parametrize("mib,parts", [(2, 0), (4, 5)])
def test_a_file_is_one_put_up_to_single_put_max_and_even_parts_beyond(tmp_path, mib, parts):
    """1 MiB parts, single_put_max 3 MiB: a 2 MiB tensor's file (framing included) is one PUT;
    a 4 MiB one is five even parts, not four of 1 MiB and a tiny one of framing."""
    from shardstream._native import CheckpointStore

    import json

    state = {"w": torch.randn(mib * MIB // 4)}
    url = tmp_path / "step_1"
    writer = StorageWriter(url, part_size=MIB, single_put_max=3 * MIB)
    dcp.save(state, storage_writer=writer, no_dist=True)
    files = json.loads(CheckpointStore(str(tmp_path)).open("step_1").manifest_json())["files"]
    [data] = [f for f in files if f["path"].endswith(".distcp")]
    assert len(data.get("parts", [])) == parts, data
    if parts:
        assert data["part_size"] * (parts - 1) < data["size"] <= data["part_size"] * parts, data
        assert data["size"] - data["part_size"] * (parts - 1) > data["part_size"] // 2, data
    loaded = {"w": torch.zeros_like(state["w"])}
    dcp.load(loaded, storage_reader=StorageReader(url), no_dist=True)
    assert torch.equal(loaded["w"], state["w"])
    assert verify(url)["failures"] == []


def test_ours_loads_with_torch_filesystem_reader(tmp_path):
    state = _small_state()
    dcp.save(state, storage_writer=StorageWriter(tmp_path / "step_3"), no_dist=True)
    loaded = _empty_like(state)
    dcp.load(loaded, storage_reader=FileSystemReader(tmp_path / "step_3"), no_dist=True)
    _assert_equal(loaded, state)


def test_torch_filesystem_writer_loads_with_ours(tmp_path):
    state = _small_state()
    dcp.save(state, storage_writer=FileSystemWriter(tmp_path / "torch_3"), no_dist=True)
    loaded = _empty_like(state)
    dcp.load(loaded, storage_reader=StorageReader(tmp_path / "torch_3"), no_dist=True)
    _assert_equal(loaded, state)


def test_checkpoint_id_argument_selects_the_location(tmp_path):
    state = _small_state()
    dcp.save(state, checkpoint_id=str(tmp_path / "step_9"), storage_writer=StorageWriter(), no_dist=True)
    assert latest(tmp_path) == f"{tmp_path}/step_9"
    loaded = _empty_like(state)
    dcp.load(loaded, checkpoint_id=str(tmp_path / "step_9"), storage_reader=StorageReader(), no_dist=True)
    _assert_equal(loaded, state)


def test_flipped_byte_fails_the_load_naming_the_object(tmp_path):
    state = _small_state()
    dcp.save(state, storage_writer=StorageWriter(tmp_path / "step_4"), no_dist=True)
    # Flip a byte in the middle of the item that holds model.weight.
    md = StorageReader(tmp_path / "step_4").read_metadata()
    [info] = [v for k, v in md.storage_data.items() if k.fqn == "model.weight"]
    data = tmp_path / "step_4" / info.relative_path
    raw = bytearray(data.read_bytes())
    raw[info.offset + info.length // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    obj = re.compile(r"step_4/attempt-[0-9a-f-]+/__0_0\.distcp")

    # A full load reads the whole file in one span: the file's own CRC catches it.
    err = dcp_root_error(
        lambda: dcp.load(_empty_like(state), storage_reader=StorageReader(tmp_path / "step_4"), no_dist=True)
    )
    assert isinstance(err, shardstream.HashMismatchError) and obj.search(str(err)), err

    # Loads of one tensor each fetch only that item: the per-item CRC catches the one that
    # holds the flipped byte, naming the object and the byte range; the others load.
    failures = []
    for key, value in state["model"].items():
        one = {"model": {key: torch.zeros_like(value)}}
        try:
            dcp.load(one, storage_reader=StorageReader(tmp_path / "step_4"), no_dist=True)
            assert torch.equal(one["model"][key], value)
        except BaseException:
            err = dcp_root_error(lambda: dcp.load(one, storage_reader=StorageReader(tmp_path / "step_4"), no_dist=True))
            assert isinstance(err, shardstream.HashMismatchError), err
            assert re.search(obj.pattern + r" bytes \d+\.\.\d+", str(err)), err
            failures.append(key)
    assert failures == ["weight"], failures
    assert any("__0_0.distcp" in f for f in verify(tmp_path / "step_4")["failures"])


def test_uncommitted_directory_is_not_loadable(tmp_path):
    # A save whose manifest never came: files only, no manifest and no .metadata alias.
    (tmp_path / "step_5" / "attempt-1-00").mkdir(parents=True)
    (tmp_path / "step_5" / "attempt-1-00" / "__0_0.distcp").write_bytes(b"partial")
    err = dcp_root_error(
        lambda: dcp.load({"x": torch.zeros(1)}, storage_reader=StorageReader(tmp_path / "step_5"), no_dist=True)
    )
    assert "not committed" in str(err), err
    assert latest(tmp_path) is None


def test_ctrl_c_interrupts_a_call_blocked_on_storage(monkeypatch, ctrl_c):
    """A native call waiting on a server that does not answer returns KeyboardInterrupt on
    Ctrl-C instead of hanging until the request times out."""
    import signal
    import threading
    import time

    from conftest import MotoServer

    server = MotoServer()
    try:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        root = server.create_bucket(f"ctrlc-{uuid.uuid4().hex[:8]}") + "/run"
        assert latest(root) is None  # the server answers
        os.kill(server.proc.pid, signal.SIGSTOP)  # now it never does
        timer = threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT))
        started = time.monotonic()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            latest(root)
        assert time.monotonic() - started < 5
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        server.stop()



def _wrapping_file_writers(real_store, wrap):
    """A replacement for `shardstream.checkpoint._store` whose rank writers hand out the native
    file writers wrapped in `wrap` (to act on each `write`); everything else is the real store."""

    class RankWriter:
        def __init__(self, writer) -> None:
            self.writer = writer

        def create(self, *args, **kwargs):
            return wrap(self.writer.create(*args, **kwargs))

        def __getattr__(self, name):
            return getattr(self.writer, name)

    class Store:
        def __init__(self, store) -> None:
            self.store = store

        def rank_writer(self, *args, **kwargs):
            return RankWriter(self.store.rank_writer(*args, **kwargs))

        def __getattr__(self, name):
            return getattr(self.store, name)

    return lambda root, *args: Store(real_store(root, *args))


def test_ctrl_c_during_save_stops_it_and_leaves_no_checkpoint(monkeypatch, ctrl_c):
    """Ctrl-C while `RankFileWriter.write` waits on a stalled server raises KeyboardInterrupt
    within a signal poll instead of hanging, aborts the upload, and the interrupted
    checkpoint never becomes `latest` (its manifest was never written)."""
    import signal
    import threading
    import time

    import shardstream.checkpoint as ckpt
    from conftest import MotoServer
    from torch.distributed.checkpoint.api import CheckpointException

    server = MotoServer()
    stopped = threading.Event()
    real_store = ckpt._store

    class StallOnFirstWrite:
        """A native file writer whose first write stops the server and schedules a Ctrl-C."""

        def __init__(self, f) -> None:
            self.f = f

        def write(self, data):
            if not stopped.is_set():
                stopped.set()
                os.kill(server.proc.pid, signal.SIGSTOP)
                threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

    try:
        for k, v in server.env.items():
            monkeypatch.setenv(k, v)
        root = server.create_bucket(f"ctrlc-save-{uuid.uuid4().hex[:8]}") + "/run"
        dcp.save(_small_state(), storage_writer=StorageWriter(f"{root}/step_1"), no_dist=True)
        monkeypatch.setattr(ckpt, "_store", _wrapping_file_writers(real_store, StallOnFirstWrite))
        # 64 MiB through a 10 MiB budget of 5 MiB parts: writes block once two parts wait on
        # the stopped server.
        big = {"w": torch.randn(16 << 20)}
        writer = StorageWriter(f"{root}/step_2", part_size=5 * MIB, memory_budget=10 * MIB)
        started = time.monotonic()
        with pytest.raises((KeyboardInterrupt, CheckpointException)) as info:
            dcp.save(big, storage_writer=writer, no_dist=True)
        elapsed = time.monotonic() - started
        err = info.value
        if isinstance(err, CheckpointException):  # DCP wraps what a rank raised
            [wrapped] = list(err.failures.values())
            err = wrapped[0] if isinstance(wrapped, tuple) else wrapped.exception
        assert isinstance(err, KeyboardInterrupt), repr(err)
        assert stopped.is_set()
        assert elapsed < 10, elapsed
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    try:
        monkeypatch.setattr(ckpt, "_store", real_store)
        assert latest(root) == f"{root}/step_1"
        assert [c["id"] for c in list_checkpoints(root)] == ["step_1"]
    finally:
        server.stop()


def test_a_buffer_mutated_while_it_uploads_is_saved_consistently(tmp_path, monkeypatch):
    """Issue 40, row 14: `RankFileWriter.write` read the caller's buffer with the GIL released,
    while another thread may write it (a training step on the tensor being saved): the CRC it
    recorded and the bytes it uploaded could disagree, and the checkpoint failed its checks on
    load. The writer now copies the buffer while no Python thread can change it, so what it
    checksums is what it uploads: the save loads and verifies, whatever the other thread did."""
    import threading

    import shardstream.checkpoint as ckpt
    from torch.distributed.checkpoint.api import CheckpointException

    real_store = ckpt._store
    stop = threading.Event()

    class MutatedWhileWritten:
        def __init__(self, f) -> None:
            self.f = f

        def write(self, data):
            buf = bytearray(data)
            view = memoryview(buf)

            def scribble():
                i = 0
                while not stop.is_set():
                    buf[i % len(buf)] ^= 0xFF
                    i += 4099

            mutator = threading.Thread(target=scribble)
            mutator.start()
            try:
                return self.f.write(view)
            finally:
                stop.set()
                mutator.join()
                stop.clear()

        def __getattr__(self, name):
            return getattr(self.f, name)

    monkeypatch.setattr(ckpt, "_store", _wrapping_file_writers(real_store, MutatedWhileWritten))
    root = tmp_path / "ckpts"
    state = {"w": torch.randn(4 << 20), "b": torch.randn(1 << 20)}
    dcp.save(state, storage_writer=StorageWriter(f"{root}/step_1"), no_dist=True)
    monkeypatch.setattr(ckpt, "_store", real_store)
    report = verify(f"{root}/step_1")
    assert report["failures"] == [], report
    # Every item is read back through its recorded CRC32C before torch parses it: the bytes
    # uploaded are the bytes checksummed. (What torch then makes of bytes scribbled on while
    # it saved is torch's business: a zip it may refuse, which is not a checksum mismatch.)
    loaded = {"w": torch.empty(4 << 20), "b": torch.empty(1 << 20)}
    try:
        dcp.load(loaded, storage_reader=StorageReader(f"{root}/step_1"), no_dist=True)
    except (Exception, CheckpointException) as e:  # noqa: BLE001 - the assertion says which are ours
        text = f"{e!r} {getattr(e, 'failures', '')}"
        assert "checksum mismatch" not in text, text
