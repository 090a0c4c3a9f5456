"""Run by test_airflow_dag.py with the Airflow venv's python (not the main venv's): imports
deploy/examples/airflow_dag.py with the real Airflow and cncf.kubernetes provider, checks its
clean-up logic against a fake Kubernetes API, and prints the Job the operator would create
(templates rendered for a run id) and the Service, as JSON for the main test to validate
(into OUT: Airflow logs on stdout).

    python airflow_render.py DAG_FILE RUN_ID OUT
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import tempfile
from unittest import mock


def fake_kubeconfig() -> None:
    # The provider reads a kube config while it builds a pod; nothing is contacted.
    path = os.path.join(tempfile.mkdtemp(), "config")
    with open(path, "w") as f:
        f.write(
            "apiVersion: v1\nkind: Config\n"
            "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u, namespace: ml}}]\n"
            "current-context: x\n"
        )
    os.environ["KUBECONFIG"] = path


class FakeBatch:
    """A Job that exists until deleted, then for `reads_left` more reads."""

    def __init__(self, ApiException, exists: bool, reads_left: int = 2):
        self.E, self.exists, self.reads_left, self.calls = ApiException, exists, reads_left, []

    def delete_namespaced_job(self, name, namespace, propagation_policy):
        self.calls.append(("delete", name, propagation_policy))
        if not self.exists:
            raise self.E(status=404)

    def read_namespaced_job(self, name, namespace):
        self.calls.append(("read", name))
        if self.reads_left == 0:
            raise self.E(status=404)
        self.reads_left -= 1
        return object()


class FakeCore:
    def __init__(self, ApiException, service_exists: bool):
        self.E, self.exists, self.calls = ApiException, service_exists, []

    def create_namespaced_service(self, namespace, body):
        self.calls.append(("create", body.metadata.name))
        if self.exists:
            raise self.E(status=409)
        self.exists = True

    def delete_namespaced_service(self, name, namespace):
        self.calls.append(("delete", name))
        if not self.exists:
            raise self.E(status=404)
        self.exists = False


def main(dag_file: str, run_id: str, out: str) -> None:
    fake_kubeconfig()
    spec = importlib.util.spec_from_file_location("airflow_dag", dag_file)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    dag = m.dag
    train = dag.get_task("train")
    report = {
        "tasks": sorted(t.task_id for t in dag.tasks),
        "downstream_of_train": sorted(train.downstream_task_ids),
        "delete_service_trigger_rule": str(dag.get_task("delete_service").trigger_rule),
        "pre_execute_is_replace_stale_job": train._pre_execute_hook is m.replace_stale_job,
        "retries": train.retries,
        "max_active_runs": dag.max_active_runs,
    }

    # Clean-up logic against a fake API: a stale Job is deleted (Foreground) and waited for;
    # no Job is fine; an existing Service is kept; a missing one is not an error to delete.
    m.time.sleep = lambda s: None
    batch = FakeBatch(ApiException, exists=True, reads_left=2)
    report["stale_job_deleted"] = m.delete_job_and_wait(batch)
    report["stale_job_calls"] = batch.calls
    report["no_job"] = m.delete_job_and_wait(FakeBatch(ApiException, exists=False))
    core = FakeCore(ApiException, service_exists=True)
    m.ensure_service(core)
    m.delete_service(core)
    m.delete_service(core)  # already gone: no error
    report["service_calls"] = core.calls
    with mock.patch.object(m, "KubernetesHook") as hook:
        hook.return_value.batch_v1_client = FakeBatch(ApiException, exists=True, reads_left=0)
        hook.return_value.core_v1_client = FakeCore(ApiException, service_exists=False)
        m.replace_stale_job({})
        report["pre_execute_calls"] = hook.return_value.batch_v1_client.calls + hook.return_value.core_v1_client.calls

    # The Job the operator builds, with its templates rendered for this run id.
    ti = mock.MagicMock(dag_id=dag.dag_id, task_id="train", run_id=run_id, map_index=-1, try_number=2)
    context = {"run_id": run_id, "ti": ti, "task_instance": ti, "dag": dag}
    train.render_template_fields(context)
    job = train.build_job_request_obj(context)
    api = client.ApiClient()
    report["job"] = api.sanitize_for_serialization(job)
    svc = api.sanitize_for_serialization(m.headless_service())
    svc.update(apiVersion="v1", kind="Service")
    report["service"] = svc
    with open(out, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(*sys.argv[1:4])
