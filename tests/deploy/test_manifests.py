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
    "mpijob",
    "statefulset-mpi",
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
        "kubeflow.org/v2beta1/MPIJob",
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
        ("mpijob", "MPIJob", ["spec"], "slotPerWorker", 1, "slotPerWorker"),
        ("mpijob", "MPIJob", ["spec"], "mpiImplementation", "MVAPICH", "is not one of"),
        ("mpijob", "MPIJob", ["spec", "mpiReplicaSpecs", "Worker"], "replica", 2, "replica"),
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
    sidecar = next(c for c in job["spec"]["template"]["spec"]["initContainers"] if c["name"] == "shardstream-mount")
    sidecar["securityContext"]["privileged"] = False
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
    text = (dc.DEPLOY / "Dockerfile").read_text() + (dc.DEPLOY / "image/install.sh").read_text()
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
    # The sidecar's --allow-other, and an init as PID 1 (the manifests name it in `command:`).
    assert "user_allow_other" in text and "/etc/fuse.conf" in text
    assert 'ENTRYPOINT ["/usr/bin/tini", "--"]' in text and " tini " in text
    # Both targets, the trainer on a configurable base with torch, both through install.sh.
    docker = (dc.DEPLOY / "Dockerfile").read_text()
    assert "ARG BASE=" in docker and "FROM ${BASE} AS trainer" in docker and "AS runtime" in docker
    assert docker.count("source=deploy/image/install.sh") == 2
    assert 'python -c "import torch"' in docker


def test_build_image_script_uses_the_dockerfiles_install_step():
    # scripts/build-image.sh proves the image with the same install step as the Dockerfile.
    script = (dc.DEPLOY.parent / "scripts/build-image.sh").read_text()
    assert "deploy/image/install.sh" in script and "--isolation chroot" in script
    assert "shardstream --version" in script and "import shardstream, torch" in script
    assert "deploy/base/train.py" in script  # the overlays' training script, run in the image


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


# --- images, Pod Security, the cache folder's owner -------------------------------------------


@pytest.mark.parametrize("overlay", sorted(EXPECTED_OVERLAYS))
def test_every_container_names_a_configured_image(rendered, overlay):
    configured = dc.configured_images(dc.OVERLAYS_DIR / overlay)
    assert dc.image_errors(rendered[overlay], configured) == []
    for pt in dc.pod_templates(rendered[overlay]):
        for c in dc.all_containers(pt.template["spec"]):
            # A registry and a tag: never the bare placeholder name.
            assert "/" in c["image"] and ":" in c["image"], (pt.where, c["name"], c["image"])


def test_image_check_catches_a_patch_that_escapes_the_rewrite(tmp_path):
    # The fuse-sidecar bug: an overlay whose patch adds a container on top of ../indexed-job,
    # without an `images:` of its own, renders `image: shardstream` for it.
    for f in ("kustomization.yaml", "mount-sidecar.yaml"):
        (tmp_path / f).write_text((dc.OVERLAYS_DIR / "fuse-sidecar" / f).read_text())
    kust = yaml.safe_load((tmp_path / "kustomization.yaml").read_text())
    kust["resources"] = [os.path.relpath(dc.OVERLAYS_DIR / "indexed-job", tmp_path)]
    del kust["images"]
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump(kust))
    errors = dc.image_errors(dc.render(tmp_path), dc.configured_images(tmp_path))
    assert len(errors) == 1 and "shardstream-mount: image 'shardstream' is not one of" in errors[0], errors


def test_training_runs_in_the_trainer_image_with_its_script(rendered):
    for overlay in ("indexed-job", "jobset", "pytorchjob", "pytorchjob-elastic", "trainjob", "fuse-sidecar"):
        for pt in dc.pod_templates(rendered[overlay]):
            spec = pt.template["spec"]
            for c in spec["containers"]:
                if "/workspace/train.py" in dc.argv(c):
                    assert dc.image_name(c["image"]) == "shardstream-trainer", pt.where
                    mount = next(m for m in c["volumeMounts"] if m["mountPath"] == "/workspace/train.py")
                    vol = next(v for v in spec["volumes"] if v["name"] == mount["name"])
                    assert vol["configMap"]["name"] == "shardstream-train"
    # The ConfigMap exists with the base's script in it.
    cm = next(o for o in rendered["indexed-job"] if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "shardstream-train")
    assert cm["data"]["train.py"] == (dc.DEPLOY / "base/train.py").read_text()
    # And the lint refuses torchrun in the runtime image.
    objs = copy.deepcopy(rendered["indexed-job"])
    trainer(next(o for o in objs if o["kind"] == "Job"))["image"] = "registry.example.com/ml/shardstream:0.1.0"
    assert "which has no torch: use the shardstream-trainer image" in lint_errors(objs)


def test_lint_run_needs_the_init(rendered):
    objs = copy.deepcopy(rendered["indexed-job"])
    c = trainer(next(o for o in objs if o["kind"] == "Job"))
    c["command"] = c["command"][2:]
    assert "must run under the image's init" in lint_errors(objs)


def test_lint_cache_folder_is_made_by_an_init_container(rendered):
    objs = copy.deepcopy(rendered["indexed-job"])
    spec = next(o for o in objs if o["kind"] == "Job")["spec"]["template"]["spec"]
    spec["initContainers"] = [c for c in spec["initContainers"] if c["name"] != "prepare-cache"]
    assert "no init container before it creates the cache folder" in lint_errors(objs)
    # In the FUSE overlay it must come before the sidecar, which mounts the folder too.
    objs = copy.deepcopy(rendered["fuse-sidecar"])
    spec = next(o for o in objs if o["kind"] == "Job")["spec"]["template"]["spec"]
    assert [c["name"] for c in spec["initContainers"]] == ["prepare-cache", "shardstream-mount"]
    spec["initContainers"].reverse()
    assert "Job/train/shardstream-mount: no init container before it" in lint_errors(objs)


@pytest.mark.parametrize("overlay", sorted(EXPECTED_OVERLAYS))
def test_every_container_meets_restricted_pod_security(rendered, overlay):
    assert dc.restricted_errors(rendered[overlay], overlay) == []


def test_restricted_exceptions_are_the_documented_ones(rendered):
    doc = (dc.DEPLOY.parent / "docs/deploy.md").read_text()
    for (overlay, container), _why in dc.RESTRICTED_EXCEPTIONS.items():
        assert f"`{container}` in `{overlay}`" in doc, (overlay, container)
        # And each exception is real: without it the check fails.
        assert dc.restricted_errors(rendered[overlay], None), overlay


@pytest.mark.parametrize(
    "change,expect",
    [
        (lambda c, s: c["securityContext"].pop("allowPrivilegeEscalation"), "allowPrivilegeEscalation must be false"),
        (lambda c, s: c["securityContext"]["capabilities"].update(drop=["NET_RAW"]), "capabilities must drop ALL"),
        (lambda c, s: c["securityContext"]["capabilities"].update(add=["SYS_PTRACE"]), "adds capabilities"),
        (lambda c, s: s["securityContext"].pop("runAsNonRoot"), "runAsNonRoot must be true"),
        (lambda c, s: c["securityContext"].update(runAsUser=0), "runAsUser 0"),
        (lambda c, s: s["securityContext"].pop("seccompProfile"), "seccompProfile must be RuntimeDefault"),
        (lambda c, s: s["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "type hostPath is not allowed"),
    ],
)
def test_restricted_check_catches(rendered, change, expect):
    objs = copy.deepcopy(rendered["indexed-job"])
    job = next(o for o in objs if o["kind"] == "Job")
    change(trainer(job), job["spec"]["template"]["spec"])
    assert any(expect in e for e in dc.restricted_errors(objs, "indexed-job")), dc.restricted_errors(objs, "indexed-job")


def test_fuse_sidecar_serves_other_uids_and_is_probed(rendered):
    job = one(rendered["fuse-sidecar"], "Job")
    spec = job["spec"]["template"]["spec"]
    sidecar = next(c for c in spec["initContainers"] if c["name"] == "shardstream-mount")
    assert "--allow-other" in sidecar["command"]
    assert sidecar["restartPolicy"] == "Always"
    probe = " ".join(sidecar["livenessProbe"]["exec"]["command"])
    assert "/mnt/dataset" in probe and sidecar["livenessProbe"]["timeoutSeconds"] >= 1
    # statfs through the FUSE server, not a stat the kernel may answer from its cache.
    assert probe.startswith("shardstream mount-check /mnt/dataset"), probe
    [mount] = [m for m in sidecar["volumeMounts"] if m["mountPath"] == "/mnt/dataset"]
    assert mount["mountPropagation"] == "Bidirectional" and sidecar["securityContext"]["privileged"]
    [tmount] = [m for m in trainer(job)["volumeMounts"] if m["mountPath"] == "/mnt/dataset"]
    assert tmount["mountPropagation"] == "HostToContainer"


# --- MPI / SSH launchers ----------------------------------------------------------------------


def _mpi_parts(objs: list[dict]) -> tuple[dict, dict, str, int]:
    """(launcher container, worker pod template, the launcher's shell text, worker count)."""
    pts = list(dc.pod_templates(objs))
    mpijob = next((o for o in objs if o["kind"] == "MPIJob"), None)
    if mpijob:
        launcher = next(p for p in pts if p.where.endswith("/Launcher")).template["spec"]["containers"][0]
        worker = next(p for p in pts if p.where.endswith("/Worker")).template
        count = mpijob["spec"]["mpiReplicaSpecs"]["Worker"]["replicas"]
    else:
        launcher = next(p for p in pts if p.owner["kind"] == "Job").template["spec"]["containers"][0]
        sts = next(p for p in pts if p.owner["kind"] == "StatefulSet")
        worker, count = sts.template, sts.owner["spec"]["replicas"]
    return launcher, worker, " ".join(dc.argv(launcher)), count


@pytest.mark.parametrize("overlay,worker0", [("mpijob", "mpi-train-worker-0.mpi-train"), ("statefulset-mpi", "ds-worker-0.ds-worker")])
def test_mpi_launchers_give_each_node_its_run_id_and_rank(rendered, overlay, worker0):
    launcher, worker, text, count = _mpi_parts(rendered[overlay])
    # SSH sessions get no pod environment: the run id travels with mpirun -x, the node rank is
    # the worker's ordinal from its host name, and `shardstream run` wraps each node's torchrun.
    assert "-x SHARDSTREAM_RUN_ID" in text and "SHARDSTREAM_CACHE_DIR=/var/cache/shardstream/node" in text
    assert 'rank=${rank##*-}' in text and 'shardstream run --node-rank "$rank" -- torchrun' in text
    assert f"--nnodes={count}" in text and f"--master-addr={worker0}" in text
    assert ("-np \"$n\"" in text and f"n={count}" in text) or f"-np {count}" in text
    assert "--map-by ppr:1:node" in text
    # The run id on the launcher and the workers comes from the same place.
    wc = worker["spec"]["containers"][0]
    assert dc.env_of(launcher)["SHARDSTREAM_RUN_ID"]["valueFrom"] == dc.env_of(wc)["SHARDSTREAM_RUN_ID"]["valueFrom"]
    # The worker's cache folder is keyed by the same node rank as the host name's ordinal.
    rank = dc.env_of(wc)["SHARDSTREAM_NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert rank in ("metadata.labels['training.kubeflow.org/replica-index']", "metadata.labels['apps.kubernetes.io/pod-index']")
    cache = next(m for m in wc["volumeMounts"] if m["name"] == "cache")
    assert cache["subPathExpr"] == "$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)"
    assert worker["spec"]["initContainers"][0]["name"] == "prepare-cache"
    assert worker["metadata"]["labels"]["app.kubernetes.io/name"] == "shardstream"  # scraped
    assert any(p["name"] == "metrics" for p in wc["ports"])


def test_statefulset_serves_dns_names_through_its_headless_service(rendered):
    objs = rendered["statefulset-mpi"]
    sts = one(objs, "StatefulSet")
    svc = next(o for o in objs if o["kind"] == "Service" and o["metadata"]["name"] == sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None" and svc["spec"]["publishNotReadyAddresses"]
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    objs = copy.deepcopy(objs)
    one_sts = next(o for o in objs if o["kind"] == "StatefulSet")
    one_sts["spec"]["serviceName"] = "other"
    assert "headless Service that no pod template uses" in lint_errors(objs)


def test_dashboard_queries_are_valid_promql_and_gpu_panel_joins_on_the_pod(tmp_path):
    import shutil
    import subprocess

    dash = json.loads((dc.OVERLAYS_DIR / "monitoring/dashboards/shardstream.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    # The GPU series are the ones of the shardstream pods only, joined on the pod's labels.
    [gpu] = [e for e in exprs if "DCGM_" in e]
    assert "on (namespace, pod) group_left (run_id, node_rank)" in gpu and 'run_id=~"$run_id"' in gpu
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (scripts/setup-system.sh installs prometheus)"
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"dashboard:query{i}", "expr": e.replace("$run_id", ".*")} for i, e in enumerate(exprs)
    ]}]}
    path = tmp_path / "dashboard-rules.yaml"
    path.write_text(yaml.safe_dump(rules))
    out = subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


# --- credentials ------------------------------------------------------------------------------


@pytest.mark.parametrize("overlay", sorted(EXPECTED_OVERLAYS - {"monitoring"}))
def test_every_pod_runs_as_the_shardstream_service_account(rendered, overlay):
    # One ServiceAccount to bind to the cloud role (IRSA, EKS Pod Identity, GKE and Azure
    # Workload Identity): no keys in Secrets, no Kubernetes API token mounted.
    sa = one(rendered[overlay], "ServiceAccount")
    assert sa["metadata"]["name"] == "shardstream" and sa["automountServiceAccountToken"] is False
    for pt in dc.pod_templates(rendered[overlay]):
        assert pt.template["spec"]["serviceAccountName"] == "shardstream", pt.where


def test_credential_wiring_is_documented_for_each_cloud():
    doc = (dc.DEPLOY.parent / "docs/deploy.md").read_text()
    sa = (dc.DEPLOY / "base/serviceaccount.yaml").read_text()
    for key in ("eks.amazonaws.com/role-arn", "iam.gke.io/gcp-service-account", "azure.workload.identity/client-id"):
        assert key in doc and key in sa, key
    for words in ("azure.workload.identity/use", "create-pod-identity-association", "roles/iam.workloadIdentityUser",
                  "principal://iam.googleapis.com/", "az identity federated-credential create",
                  "system:serviceaccount:NAMESPACE:shardstream"):
        assert words in doc, words
