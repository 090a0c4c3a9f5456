"""deploy/examples/airflow_dag.py imported with the real Airflow and its cncf.kubernetes provider
(a venv of their own: setup-airflow-venv.sh; skipped where it does not exist), its clean-up logic
run against a fake Kubernetes API, and the Job the real operator builds for a run validated like
the overlays: strict schemas, lint, restricted Pod Security, images."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deploycheck as dc  # noqa: E402

HERE = Path(__file__).resolve().parent
VENV = Path(os.environ.get("AIRFLOW_TEST_VENV", Path.home() / ".cache/shardstream/airflow-venv"))
PYTHON = VENV / "bin/python"
RUN_ID = "scheduled__2024-05-01T00:00:00+00:00"


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    if not PYTHON.exists():
        # CI makes the venv (scripts/test.sh, in the background while Rust builds): there a
        # missing venv is a failure, never a silent skip.
        if os.environ.get("CI") == "true":
            pytest.fail(f"no Airflow venv at {VENV}: tests/deploy/setup-airflow-venv.sh did not run or failed")
        pytest.skip(f"no Airflow venv at {VENV} (tests/deploy/setup-airflow-venv.sh makes it)")
    out = tmp_path_factory.mktemp("airflow") / "report.json"
    env = dict(os.environ, AIRFLOW_HOME=str(out.parent / "home"), PYTHONWARNINGS="ignore")
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.run(
        [str(PYTHON), str(HERE / "airflow_render.py"), str(dc.DEPLOY / "examples/airflow_dag.py"), RUN_ID, str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=out.parent,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def test_dag_imports_with_real_airflow(report):
    assert report["tasks"] == ["create_service", "delete_service", "train"]
    assert report["downstream_of_train"] == ["delete_service"]
    assert report["delete_service_trigger_rule"].lower().endswith("all_done")
    assert report["max_active_runs"] == 1


def test_every_attempt_replaces_a_stale_job_and_keeps_the_service(report):
    # pre_execute runs before every attempt of `train`, retries included: a Job of the same
    # name left by an earlier attempt or run is deleted (pods first) and waited for, instead of
    # a 409 AlreadyExists; the Service is created or kept; deleting a missing one is no error.
    assert report["pre_execute_is_replace_stale_job"] and report["retries"] >= 1
    assert report["stale_job_deleted"] is True and report["no_job"] is False
    assert report["stale_job_calls"][0] == ["delete", "job-shardstream-train", "Foreground"]
    assert report["stale_job_calls"][1:] == [["read", "job-shardstream-train"]] * 3
    assert report["pre_execute_calls"] == [
        ["delete", "job-shardstream-train", "Foreground"], ["read", "job-shardstream-train"], ["create", "shardstream-train"],
    ]
    assert report["service_calls"] == [["create", "shardstream-train"], ["delete", "shardstream-train"], ["delete", "shardstream-train"]]


def test_the_job_reuses_the_run_id_and_is_cleaned_up(report):
    job = report["job"]
    assert job["metadata"]["name"] == "job-shardstream-train"
    assert job["spec"]["ttlSecondsAfterFinished"] > 0
    pod = job["spec"]["template"]
    # Airflow's run id, rendered once into the annotation every container reads: the same for
    # every pod and every retry of the run (try_number is only a label), so a retried task
    # mounts each node's warm <run-id>/<node-rank>/ folder.
    assert pod["metadata"]["annotations"]["shardstream.dev/run-id"] == RUN_ID
    for c in dc.all_containers(pod["spec"]):
        src = dc.env_of(c)["SHARDSTREAM_RUN_ID"]["valueFrom"]["fieldRef"]["fieldPath"]
        assert src == "metadata.annotations['shardstream.dev/run-id']", c["name"]


@pytest.mark.parametrize("version", dc.K8S_VERSIONS)
def test_the_jobs_objects_validate_strictly(report, version):
    assert dc.schema_errors(report["job"], version) == []
    assert dc.schema_errors(report["service"], version) == []


def test_the_job_passes_the_overlays_checks(report):
    objs = [report["job"], report["service"]]
    # The run id is Airflow's, not the Job name label the overlays' lint expects.
    errors = [e for e in dc.lint(objs) if "SHARDSTREAM_RUN_ID must come from" not in e]
    assert errors == []
    assert dc.restricted_errors(objs) == []
    configured = {"registry.example.com/ml/shardstream-trainer:0.1.0", "registry.example.com/ml/shardstream:0.1.0"}
    assert dc.image_errors(objs, configured) == []
