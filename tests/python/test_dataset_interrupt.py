"""Ctrl-C interrupts an iteration blocked on the network: with the S3 server frozen (SIGSTOP),
`next(iter(ds))` waits with the GIL released, and SIGINT raises KeyboardInterrupt in the Python
thread within a second or two instead of hanging until the fetch gives up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import boto3

from conftest import MotoServer, write_ids

SCRIPT = textwrap.dedent(
    """
    import faulthandler, signal, sys
    faulthandler.dump_traceback_later(120, exit=True)  # a hang shows where it is
    # A test run started in the background inherits SIGINT ignored; Ctrl-C is what is tested.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import shardstream
    from shardstream._world import placement
    # No prefetch at construction: its download could complete before the test freezes the
    # server, and the iteration would then not block at all.
    ds = shardstream.StreamingDataset(remote=sys.argv[1], prefetch_on_init=False)
    placement()  # imports torch.distributed now: a SIGINT must land in the wait, not an import
    print("open", flush=True)
    sys.stdin.readline()
    faulthandler.dump_traceback_later(12, exit=True)  # from here: the imports may have been slow
    try:
        print("iterating", flush=True)  # inside the try: a SIGINT from now on is the test's
        next(iter(ds))
        print("got a sample", flush=True)
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        raise
    """
)


def test_ctrl_c_interrupts_blocked_iteration(tmp_path, stream_env):
    server = MotoServer()  # its own server: this test freezes it
    try:
        write_ids(tmp_path / "mds", 50)
        bucket = server.create_bucket("frozen")
        s3 = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id="testing",
                          aws_secret_access_key="testing", region_name="us-east-1")
        for f in (tmp_path / "mds").iterdir():
            s3.upload_file(str(f), "frozen", f"ds/{f.name}")
        script = tmp_path / "blocked.py"
        script.write_text(SCRIPT)
        env = dict(os.environ, **server.env)
        proc = subprocess.Popen([sys.executable, str(script), f"{bucket}/ds"], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "open"
        os.kill(server.proc.pid, signal.SIGSTOP)
        try:
            proc.stdin.write("go\n")
            proc.stdin.flush()
            assert proc.stdout.readline().strip() == "iterating"
            time.sleep(1.5)  # it reaches the wait on the frozen server
            assert proc.poll() is None, "the iteration did not block on the frozen server"
            sent = time.monotonic()
            proc.send_signal(signal.SIGINT)
            out, err = proc.communicate(timeout=15)
            took = time.monotonic() - sent
        finally:
            os.kill(server.proc.pid, signal.SIGCONT)
        assert "interrupted" in out and "got a sample" not in out, (out, err[-2000:])
        assert "KeyboardInterrupt" in err, err[-2000:]
        assert proc.returncode != 0
        print(f"interrupt took {took:.2f} s")
        assert took < 5, f"KeyboardInterrupt took {took:.1f} s"
    finally:
        server.stop()
