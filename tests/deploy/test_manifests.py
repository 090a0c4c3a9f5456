"""deploy/ checked offline: every overlay renders and validates (strict Kubernetes schemas for
two versions, vendored CRD schemas for custom resources) and passes the lint; and each check is
shown to catch the mistake it exists for, on a broken copy of a real overlay."""

from __future__ import annotations

import ast
import copy
import json
import os
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import deploycheck as dc  # noqa: E402

EXPECTED_OVERLAYS = {
    "indexed-job",
    "jobset",
    "pytorchjob",
    "pytorchjob-elastic",
    "trainjob",
    "shard-job",
    "kueue",
    "fuse-sidecar",
    "fuse-device-plugin",
    "monitoring",
    "cache-gc",
}


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[dict]]:
    if dc.kubectl() is None:
        print("kubectl not found: checking the overlays as written, without kustomize rendering")
    return {name: dc.render(dc.OVERLAYS_DIR / name) for name in dc.overlays()}


def one(objs: list[dict], kind: str) -> dict:
    [obj] = [o for o in objs if o["kind"] == kind]
    return copy.deepcopy(obj)


def trainer(job: dict) -> dict:
    return job["spec"]["template"]["spec"]["containers"][0]


# --- every overlay is valid ------------------------------------------------------------------


def test_every_launcher_has_an_overlay():
    assert set(dc.overlays()) == EXPECTED_OVERLAYS


@pytest.mark.parametrize("overlay", sorted(EXPECTED_OVERLAYS))
@pytest.mark.parametrize("version", dc.K8S_VERSIONS)
def test_overlay_validates_strictly(rendered, overlay, version):
    objs = rendered[overlay]
    assert objs, f"{overlay} renders to nothing"
    errors = [e for o in objs for e in dc.schema_errors(o, version)]
    assert errors == []


@pytest.mark.parametrize("overlay", sorted(EXPECTED_OVERLAYS))
def test_overlay_passes_lint(rendered, overlay):
    assert dc.lint(rendered[overlay]) == []


def test_overlays_load_without_kubectl_too():
    # The fallback path used where kubectl is missing: every resource file parses and validates.
    for name in dc.overlays():
        objs = dc.load_unrendered(dc.OVERLAYS_DIR / name)
        assert objs, name
        for o in objs:
            assert dc.schema_errors(o, dc.K8S_VERSIONS[0]) == [], (name, o["kind"])


def test_every_custom_resource_has_a_vendored_schema_with_a_source():
    kinds = dc.crd_schemas()
    for key in (
        "jobset.x-k8s.io/v1alpha2/JobSet",
        "kubeflow.org/v1/PyTorchJob",
        "trainer.kubeflow.org/v1alpha1/TrainJob",
        "trainer.kubeflow.org/v1alpha1/TrainingRuntime",
        "kueue.x-k8s.io/v1beta1/LocalQueue",
        "monitoring.coreos.com/v1/PodMonitor",
    ):
        assert key in kinds
    readme = (dc.SCHEMAS_DIR / "README.md").read_text()
    for path in dc.SCHEMAS_DIR.glob("*.json"):
        assert json.loads(path.read_text())["x-source"]
        assert path.name in readme, f"{path.name} is not described in deploy/schemas/README.md"


# --- the schema checks catch what they should -------------------------------------------------


def test_strict_schema_catches_a_typo_in_a_job(rendered):
    job = one(rendered["indexed-job"], "Job")
    trainer(job)["volumeMounts"][0]["mountPropogation"] = "None"
    for version in dc.K8S_VERSIONS:
        [err] = dc.schema_errors(job, version)
        assert "mountPropogation" in err


def test_versions_differ_where_the_api_does(rendered):
    # Pod-level resources exist from 1.32: fine for the newer version, refused for 1.29.
    job = one(rendered["indexed-job"], "Job")
    job["spec"]["template"]["spec"]["resources"] = {"limits": {"cpu": "1"}}
    assert dc.schema_errors(job, "1.33") == []
    assert any("resources" in e for e in dc.schema_errors(job, "1.29"))


@pytest.mark.parametrize(
    "overlay,kind,path,key,value,expect",
    [
        ("pytorchjob-elastic", "PyTorchJob", ["spec", "elasticPolicy"], "rdzvBackand", "c10d", "rdzvBackand"),
        ("trainjob", "TrainJob", ["spec", "trainer"], "numNode", 2, "numNode"),
        ("trainjob", "TrainJob", ["spec", "trainer"], "numNodes", "two", "not of type 'integer'"),
        ("jobset", "JobSet", ["spec"], "replicatedJob", [], "replicatedJob"),
        ("monitoring", "PodMonitor", ["spec"], "podMetricEndpoints", [], "podMetricEndpoints"),
        ("kueue", "LocalQueue", ["spec"], "stopPolicy", "Pause", "is not one of"),
    ],
)
def test_crd_schema_catches_mistakes(rendered, overlay, kind, path, key, value, expect):
    obj = one(rendered[overlay], kind)
    node = obj
    for p in path:
        node = node[p]
    node[key] = value
    errors = dc.schema_errors(obj, dc.K8S_VERSIONS[0])
    assert any(expect in e for e in errors), errors


def test_pod_templates_inside_custom_resources_get_the_kubernetes_schema(rendered):
    js = one(rendered["jobset"], "JobSet")
    c = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    c["volumeMount"] = []
    assert any("volumeMount" in e for e in dc.schema_errors(js, dc.K8S_VERSIONS[0]))
    rt = one(rendered["trainjob"], "TrainingRuntime")
    spec = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    spec["volumes"][1]["emptyDir"]["medium"] = 5
    assert dc.schema_errors(rt, dc.K8S_VERSIONS[0])


# --- the lint catches what schemas pass -------------------------------------------------------


def lint_errors(objs: list[dict]) -> str:
    return "\n".join(dc.lint(objs))


def test_lint_bidirectional_needs_privileged(rendered):
    objs = copy.deepcopy(rendered["fuse-sidecar"])
    job = next(o for o in objs if o["kind"] == "Job")
    job["spec"]["template"]["spec"]["initContainers"][0]["securityContext"]["privileged"] = False
    assert "needs privileged: true" in lint_errors(objs)


def test_lint_catches_the_kustomize_name_prefix_trap(rendered, tmp_path):
    # namePrefix renames the Job and Service but not subdomain, selector or --master-addr.
    if dc.kubectl():
        rel = os.path.relpath(dc.OVERLAYS_DIR / "indexed-job", tmp_path)
        (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({"resources": [rel], "namePrefix": "prod-"}))
        objs = dc.render(tmp_path)
    else:
        objs = copy.deepcopy(rendered["indexed-job"])
        for o in objs:
            if o["kind"] in ("Job", "Service"):
                o["metadata"]["name"] = "prod-" + o["metadata"]["name"]
    errors = lint_errors(objs)
    assert "is not pod 0 of this Job (prod-train-0.train)" in errors  # the c10d endpoint
    assert "subdomain train has no headless Service" in errors


def test_lint_service_selector_and_master_addr(rendered):
    objs = copy.deepcopy(rendered["indexed-job"])
    svc = next(o for o in objs if o["kind"] == "Service")
    svc["spec"]["selector"] = {"batch.kubernetes.io/job-name": "other"}
    assert "does not select the pods of Job/train" in lint_errors(objs)
    objs = copy.deepcopy(rendered["indexed-job"])
    job = next(o for o in objs if o["kind"] == "Job")
    args = trainer(job)["args"]
    args[args.index("--nnodes=2")] = "--nnodes=3"
    assert "--nnodes=3, completions and parallelism must agree" in lint_errors(objs)


def test_lint_requires_shm(rendered):
    objs = copy.deepcopy(rendered["indexed-job"])
    c = trainer(next(o for o in objs if o["kind"] == "Job"))
    c["volumeMounts"] = [m for m in c["volumeMounts"] if m["mountPath"] != "/dev/shm"]
    assert "no /dev/shm mount" in lint_errors(objs)
    objs = copy.deepcopy(rendered["indexed-job"])
    job = next(o for o in objs if o["kind"] == "Job")
    shm = next(v for v in job["spec"]["template"]["spec"]["volumes"] if v["name"] == "dshm")
    shm["emptyDir"]["sizeLimit"] = "300Gi"
    assert "exceeds the memory limit 200Gi" in lint_errors(objs)
    # For a TrainJob the limit comes from the TrainJob's resourcesPerNode.
    objs = copy.deepcopy(rendered["trainjob"])
    rt = next(o for o in objs if o["kind"] == "TrainingRuntime")
    pod = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    next(v for v in pod["volumes"] if v["name"] == "dshm")["emptyDir"]["sizeLimit"] = "1Ti"
    assert "exceeds the memory limit" in lint_errors(objs)


@pytest.mark.parametrize(
    "overlay,kind,wrong_label",
    [
        ("indexed-job", "Job", "job-name"),
        # In a JobSet, batch.kubernetes.io/job-name names the child Job, not the run.
        ("jobset", "JobSet", "batch.kubernetes.io/job-name"),
        ("pytorchjob-elastic", "PyTorchJob", "batch.kubernetes.io/job-name"),
        ("trainjob", "TrainingRuntime", "trainer.kubeflow.org/trainjob-ancestor-step"),
    ],
)
def test_lint_run_id_comes_from_the_owner_label(rendered, overlay, kind, wrong_label):
    objs = copy.deepcopy(rendered[overlay])
    owner = next(o for o in objs if o["kind"] == kind)
    [pt] = [p for p in dc.pod_templates([owner])][:1]
    c = next(c for c in dc.all_containers(pt.template["spec"]) if dc.runs(c, "run"))
    env = dc.env_of(c)["SHARDSTREAM_RUN_ID"]
    env["valueFrom"]["fieldRef"]["fieldPath"] = f"metadata.labels['{wrong_label}']"
    assert "SHARDSTREAM_RUN_ID must come from" in lint_errors(objs)


def test_lint_cache_dir_must_be_keyed_by_run_and_node(rendered):
    objs = copy.deepcopy(rendered["indexed-job"])
    c = trainer(next(o for o in objs if o["kind"] == "Job"))
    cache = next(m for m in c["volumeMounts"] if m["name"] == "cache")
    cache["subPathExpr"] = "$(POD_NAME)"  # the k8s docs' example: a retried pod gets a cold folder
    errors = lint_errors(objs)
    assert "must use subPathExpr $(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)" in errors
    assert "uses $(POD_NAME), which the container does not define" in errors


def test_lint_kueue_label_only_on_the_top_level_object(rendered):
    objs = copy.deepcopy(rendered["kueue"])
    job = next(o for o in objs if o["kind"] == "Job")
    job["spec"]["template"]["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = "shardstream"
    assert "belongs on the top-level object" in lint_errors(objs)


def test_lint_part_matches_completions(rendered):
    objs = copy.deepcopy(rendered["shard-job"])
    job = next(o for o in objs if o["kind"] == "Job" and o["metadata"]["name"] == "shard")
    job["spec"]["completions"] = 4
    assert "needs an Indexed Job with completions: 8" in lint_errors(objs)


def test_lint_extended_resources_requests_equal_limits(rendered):
    objs = copy.deepcopy(rendered["fuse-device-plugin"])
    trainer(next(o for o in objs if o["kind"] == "Job"))["resources"]["requests"]["squat.ai/fuse"] = "2"
    assert "squat.ai/fuse needs requests == limits" in lint_errors(objs)


def test_lint_jobset_master_addr(rendered):
    objs = copy.deepcopy(rendered["jobset"])
    js = next(o for o in objs if o["kind"] == "JobSet")
    c = js["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    c["args"] = [a.replace("pretrain-workers-0-0.pretrain", "pretrain-workers-0.pretrain") for a in c["args"]]
    assert "is not pod 0-0 of a replicated job" in lint_errors(objs)
    js["spec"]["replicatedJobs"][0]["replicas"] = 2
    assert "the completion index repeats" in lint_errors(objs)


def test_lint_native_sidecar_needs_129(rendered):
    errors = dc.lint(rendered["fuse-sidecar"], versions=("1.28", "1.33"))
    assert any("native sidecar needs Kubernetes >= 1.29" in e for e in errors)


# --- metrics, examples, image ----------------------------------------------------------------


def test_dashboard_uses_only_known_metrics():
    used = dc.dashboard_metrics(dc.OVERLAYS_DIR / "monitoring/dashboards/shardstream.json")
    assert used, "the dashboard graphs no shardstream metric"
    assert used <= dc.KNOWN_METRICS, used - dc.KNOWN_METRICS
    assert {"shardstream_fetch_bytes_total", "shardstream_cache_hits_total", "shardstream_consumer_stall_seconds_total"} <= used


def test_podmonitor_scrapes_the_port_the_pods_expose(rendered):
    pm = one(rendered["monitoring"], "PodMonitor")
    [endpoint] = pm["spec"]["podMetricsEndpoints"]
    selector = pm["spec"]["selector"]["matchLabels"]
    for overlay in ("indexed-job", "jobset", "pytorchjob", "pytorchjob-elastic", "trainjob"):
        for pt in dc.pod_templates(rendered[overlay]):
            labels = pt.template["metadata"]["labels"]
            assert selector.items() <= labels.items(), pt.where
            ports = {p["name"] for c in pt.template["spec"]["containers"] for p in c.get("ports", [])}
            assert endpoint["port"] in ports, pt.where


def test_airflow_example_is_indexed_and_wires_the_run_id():
    src = (dc.DEPLOY / "examples/airflow_dag.py").read_text()
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "KubernetesJobOperator"]
    [call] = calls
    kw = {k.arg: k.value for k in call.keywords}
    assert ast.literal_eval(kw["completion_mode"]) == "Indexed"
    assert '"{{ run_id }}"' in src and "SHARDSTREAM_RUN_ID" in src
    assert "sub_path_expr=\"$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)\"" in src


def test_dockerfile_installs_what_the_manifests_run():
    text = (dc.DEPLOY / "Dockerfile").read_text()
    # The shipped profile (Cargo.toml's `dist`: release code, no debug information).
    assert "cargo build --profile dist --locked -p shardstream-cli" in text
    assert "install -D target/dist/shardstream /out/bin/shardstream" in text
    assert "maturin build --profile dist --locked" in text
    cargo = tomllib.loads((dc.DEPLOY.parent / "Cargo.toml").read_text())
    dist = cargo["profile"]["dist"]
    assert dist["inherits"] == "release" and dist["debug"] is False, dist
    pyproject = tomllib.loads((dc.DEPLOY.parent / "pyo3-bindings/pyproject.toml").read_text())
    assert pyproject["tool"]["maturin"]["profile"] == "dist"
    assert "/usr/local/bin/shardstream" in text
    assert "fuse3" in text and "util-linux" in text  # fusermount3, and `mountpoint` for the probe


def test_the_alert_rules_are_valid_promql(rendered, tmp_path):
    """The PrometheusRule's groups, checked by Prometheus' own `promtool check rules` (Debian's
    prometheus package, installed by scripts/setup-system.sh): a query that does not parse would
    otherwise only fail inside the cluster's Prometheus."""
    import shutil
    import subprocess

    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (scripts/setup-system.sh installs prometheus)"
    rule = next(o for o in rendered["monitoring"] if o["kind"] == "PrometheusRule")
    names = {r["alert"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert {"ShardstreamMetricsDown", "ShardstreamConsumerStalling"} <= names
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    # And a broken query is caught.
    broken = copy.deepcopy(rule["spec"]["groups"])
    broken[0]["rules"][0]["expr"] = "rate(shardstream_fetch_bytes_total[10m]"
    path.write_text(yaml.safe_dump({"groups": broken}))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode != 0
