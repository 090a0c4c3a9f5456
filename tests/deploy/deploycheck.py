"""Offline checks of deploy/: render every overlay, validate every object against the
Kubernetes schemas of several versions (kubernetes-validate's bundled, strict) or, for custom
resources, against the schemas vendored in deploy/schemas/, and lint what schemas cannot see.

Used by tests/deploy/test_manifests.py and, as a command, by scripts/validate-deploy.sh:

    .venv/bin/python tests/deploy/deploycheck.py      # prints one line per check, then N passed, N failed

No cluster, no network. `kubectl kustomize` renders the overlays where kubectl is installed;
without it the overlays' resource files are loaded as written (patches and image overrides not
applied), and a message says so.
"""

from __future__ import annotations

import copy
import functools
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import jsonschema
import kubernetes_validate
import yaml
from referencing import Registry, Resource

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
OVERLAYS_DIR = DEPLOY / "overlays"
SCHEMAS_DIR = DEPLOY / "schemas"

# The oldest supported release (native sidecars, the Job labels we read) and a recent one.
K8S_VERSIONS = ("1.29", "1.33")
MIN_NATIVE_SIDECAR = (1, 29)

K8S_DEFS_ID = "https://kubernetes.io/api/_definitions.json"

# The label naming each launcher's top-level object: where the run id comes from.
OWNER_LABEL = {
    ("batch/v1", "Job"): "batch.kubernetes.io/job-name",
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.sigs.k8s.io/jobset-name",
    # A TrainJob's pods belong to the JobSet the Trainer makes, named after the TrainJob.
    ("trainer.kubeflow.org/v1alpha1", "TrainingRuntime"): "jobset.sigs.k8s.io/jobset-name",
    ("kubeflow.org/v1", "PyTorchJob"): "training.kubeflow.org/job-name",
    ("kubeflow.org/v2beta1", "MPIJob"): "training.kubeflow.org/job-name",
}

# Metric names the dashboard may use: docs/streaming.md (metrics) and the counters the crates export
# (streamer cache/metrics.rs, checkpoint metrics.rs), plus DCGM's for the GPU overlay.
KNOWN_METRICS = {
    "shardstream_fetch_bytes_total",
    "shardstream_cache_hits_total",
    "shardstream_cache_misses_total",
    "shardstream_cache_bytes",
    "shardstream_cache_evictions_total",
    "shardstream_consumer_stall_seconds_total",
    "shardstream_checkpoint_bytes_total",
    "shardstream_checkpoint_read_bytes_total",
    "shardstream_checkpoint_commit_conflicts_total",
}


# ---------------------------------------------------------------------------------------------
# Rendering


def kubectl() -> str | None:
    return shutil.which("kubectl")


def overlays() -> list[str]:
    return sorted(p.name for p in OVERLAYS_DIR.iterdir() if (p / "kustomization.yaml").exists())


def render(path: Path) -> list[dict]:
    """The objects a kustomization produces."""
    exe = kubectl()
    if exe:
        out = subprocess.run([exe, "kustomize", str(path)], capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise RuntimeError(f"kubectl kustomize {path}: {out.stderr.strip()}")
        return [d for d in yaml.safe_load_all(out.stdout) if d]
    return load_unrendered(path)


def load_unrendered(path: Path) -> list[dict]:
    """Without kubectl: the resources a kustomization lists, with its strategic-merge patches
    applied by a small merge that knows the list keys used here (no image overrides)."""
    kust = yaml.safe_load((path / "kustomization.yaml").read_text())
    objs: list[dict] = []
    for res in kust.get("resources", []):
        target = (path / res).resolve()
        if target.is_dir():
            objs.extend(load_unrendered(target))
        else:
            objs.extend(d for d in yaml.safe_load_all(target.read_text()) if d)
    for p in kust.get("patches", []):
        patch = yaml.safe_load((path / p["path"]).read_text() if "path" in p else p["patch"])
        for o in objs:
            if (o["kind"], o["metadata"]["name"]) == (patch["kind"], patch["metadata"]["name"]):
                _merge(o, patch)
    # `images:` applies to this kustomization's objects as they stand here, as in kustomize.
    rewrite = {i["name"]: f"{i.get('newName', i['name'])}:{i['newTag']}" for i in kust.get("images", [])}
    for pt in pod_templates(objs):
        for c in all_containers(pt.template.get("spec", {})):
            if c.get("image") in rewrite:
                c["image"] = rewrite[c["image"]]
    return objs


# The merge keys of the lists the patches in deploy/ touch (as in Kubernetes' strategic merge).
_MERGE_KEYS = {"containers": "name", "initContainers": "name", "volumes": "name", "env": "name", "volumeMounts": "mountPath"}


def _merge(base: dict, patch: dict) -> None:
    for key, value in patch.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(base.get(key), list):
            mk = _MERGE_KEYS[key]
            for item in value:
                match = next((b for b in base[key] if b.get(mk) == item.get(mk)), None)
                if match is None:
                    base[key].append(copy.deepcopy(item))
                else:
                    _merge(match, item)
        else:
            base[key] = copy.deepcopy(value)


# ---------------------------------------------------------------------------------------------
# Schemas


def _schema_root(version: str) -> Path:
    root = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    return root / f"v{version}.0-local-strict"


@functools.lru_cache(maxsize=None)
def _k8s_defs(version: str) -> Resource:
    data = json.loads((_schema_root(version) / "_definitions.json").read_text())
    return Resource.from_contents(data)


@functools.lru_cache(maxsize=None)
def _registry(version: str) -> Registry:
    return Registry().with_resource(K8S_DEFS_ID, _k8s_defs(version))


def _strict(node: Any) -> Any:
    """kubeconform-style strictness for the vendored schemas: objects that list their
    properties accept no others (CRDs mark open objects with x-kubernetes-preserve-unknown-fields)."""
    if isinstance(node, dict):
        out = {k: _strict(v) for k, v in node.items()}
        if "properties" in out and "additionalProperties" not in out and not out.get(
            "x-kubernetes-preserve-unknown-fields"
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [_strict(v) for v in node]
    return node


@functools.lru_cache(maxsize=None)
def crd_schemas() -> dict[str, dict]:
    """'group/version/Kind' -> a standalone strict schema for that kind."""
    out: dict[str, dict] = {}
    for path in sorted(SCHEMAS_DIR.glob("*.json")):
        doc = json.loads(path.read_text())
        defs = _strict(doc["$defs"])
        for key, entry in doc["kinds"].items():
            out[key] = {
                "$schema": "https://json-schema.org/draft/2020-12/schema",
                "$ref": entry["$ref"],
                "$defs": defs,
            }
    return out


@functools.lru_cache(maxsize=None)
def _validator(version: str, api_version: str, kind: str) -> jsonschema.protocols.Validator | None:
    key = f"{api_version}/{kind}"
    schema = crd_schemas().get(key)
    if schema is None:
        # kubernetes-validate's file naming: apps/v1 Deployment -> deployment-apps-v1.json
        group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", api_version)
        path = _schema_root(version) / f"{kind.lower()}-{group}.json"
        if not path.exists():
            return None
        schema = json.loads(path.read_text())
    return jsonschema.Draft202012Validator(schema, registry=_registry(version))


def schema_errors(obj: dict, version: str) -> list[str]:
    """Strict schema errors of one object for one Kubernetes version."""
    name = f"{obj.get('kind')}/{obj.get('metadata', {}).get('name')}"
    validator = _validator(version, obj.get("apiVersion", ""), obj.get("kind", ""))
    if validator is None:
        return [f"{name}: no schema for {obj.get('apiVersion')} {obj.get('kind')} (vendor it under deploy/schemas/)"]
    errors = []
    for e in sorted(validator.iter_errors(obj), key=lambda e: list(e.absolute_path)):
        # Inside anyOf/oneOf, report the branch error that went deepest.
        e = jsonschema.exceptions.best_match([e])
        path = "/".join(str(p) for p in e.absolute_path)
        errors.append(f"{name} (k8s {version}): {path}: {e.message[:300]}")
    return errors


# ---------------------------------------------------------------------------------------------
# Walking pod templates


@dataclass
class PodTemplate:
    owner: dict  # the top-level object
    where: str  # a readable path to the template
    template: dict  # {metadata, spec}
    resources_hint: dict | None = None  # TrainJob resourcesPerNode, where the container has none


def pod_templates(objs: list[dict]) -> Iterator[PodTemplate]:
    train_resources = None
    for o in objs:
        if o.get("kind") == "TrainJob":
            train_resources = (o.get("spec", {}).get("trainer") or {}).get("resourcesPerNode")
    for o in objs:
        kind, spec = o.get("kind"), o.get("spec", {})
        name = o.get("metadata", {}).get("name")
        if kind == "Job":
            yield PodTemplate(o, f"Job/{name}", spec.get("template", {}))
        elif kind == "CronJob":
            yield PodTemplate(o, f"CronJob/{name}", spec.get("jobTemplate", {}).get("spec", {}).get("template", {}))
        elif kind == "JobSet":
            for rj in spec.get("replicatedJobs", []):
                yield PodTemplate(o, f"JobSet/{name}/{rj.get('name')}", rj["template"]["spec"]["template"])
        elif kind == "TrainingRuntime":
            for rj in spec.get("template", {}).get("spec", {}).get("replicatedJobs", []):
                yield PodTemplate(
                    o, f"TrainingRuntime/{name}/{rj.get('name')}", rj["template"]["spec"]["template"], train_resources
                )
        elif kind == "PyTorchJob":
            for rtype, rs in spec.get("pytorchReplicaSpecs", {}).items():
                yield PodTemplate(o, f"PyTorchJob/{name}/{rtype}", rs.get("template", {}))
        elif kind == "MPIJob":
            for rtype, rs in spec.get("mpiReplicaSpecs", {}).items():
                yield PodTemplate(o, f"MPIJob/{name}/{rtype}", rs.get("template", {}))
        elif kind in ("StatefulSet", "Deployment", "DaemonSet"):
            yield PodTemplate(o, f"{kind}/{name}", spec.get("template", {}))


def all_containers(pod_spec: dict) -> list[dict]:
    return list(pod_spec.get("initContainers", [])) + list(pod_spec.get("containers", []))


def argv(c: dict) -> list[str]:
    return list(c.get("command", [])) + list(c.get("args", []))


def has_init(c: dict) -> bool:
    """Whether the container's command starts with the image's init (`tini --`)."""
    a = argv(c)
    return len(a) >= 2 and a[0].endswith("tini") and a[1] == "--"


def runs(c: dict, sub: str) -> bool:
    """Whether the container runs `shardstream <sub>` (under `tini --` or not)."""
    a = argv(c)[2:] if has_init(c) else argv(c)
    return len(a) >= 2 and a[0].endswith("shardstream") and a[1] == sub


def env_of(c: dict) -> dict[str, dict]:
    return {e["name"]: e for e in c.get("env", [])}


def flag(args: list[str], name: str) -> str | None:
    for i, a in enumerate(args):
        if a.startswith(f"{name}="):
            return a.split("=", 1)[1]
        if a == name and i + 1 < len(args):
            return args[i + 1]
    return None


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def quantity(q: str | int) -> float:
    m = re.fullmatch(r"([0-9.]+)([A-Za-z]*)", str(q))
    if not m or (m.group(2) and m.group(2) not in _UNITS):
        raise ValueError(f"unsupported quantity {q!r}")
    return float(m.group(1)) * _UNITS.get(m.group(2), 1)


# ---------------------------------------------------------------------------------------------
# Lint


def lint(objs: list[dict], versions: tuple[str, ...] = K8S_VERSIONS) -> list[str]:
    """What the API server or the runtime would reject or get wrong, that schemas pass."""
    errors: list[str] = []
    services = {o["metadata"]["name"]: o for o in objs if o.get("kind") == "Service"}
    for pt in pod_templates(objs):
        spec = pt.template.get("spec", {})
        labels = pt.template.get("metadata", {}).get("labels", {}) or {}
        if "kueue.x-k8s.io/queue-name" in labels:
            errors.append(f"{pt.where}: kueue.x-k8s.io/queue-name belongs on the top-level object, not the pod template")
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for c in all_containers(spec):
            where = f"{pt.where}/{c.get('name')}"
            errors += _lint_propagation(where, c)
            errors += _lint_extended_resources(where, c)
            errors += _lint_subpath_vars(where, c, pt.owner)
            if c.get("restartPolicy") == "Always" and min(tuple(map(int, v.split("."))) for v in versions) < MIN_NATIVE_SIDECAR:
                errors.append(f"{where}: native sidecar needs Kubernetes >= 1.29 in the validated versions")
            if runs(c, "run") or runs(c, "mount"):
                errors += _lint_run_id(where, c, pt.owner)
                errors += _lint_cache_mount(where, c, volumes)
                errors += _lint_cache_prepared(where, c, spec)
            if runs(c, "run"):
                errors += _lint_shm(where, c, volumes, pt.resources_hint)
                if not has_init(c):
                    errors.append(f"{where}: `shardstream run` must run under the image's init (command: [tini, --, shardstream, run, ...]): a pod's command replaces the ENTRYPOINT")
            errors += _lint_trainer_image(where, c)
        if pt.owner.get("kind") == "Job":
            errors += _lint_job_network(pt, services)
            errors += _lint_part(pt)
        if pt.owner.get("kind") == "JobSet":
            errors += _lint_jobset_network(pt)
    for svc_name, svc in services.items():
        if svc.get("spec", {}).get("clusterIP") == "None" and not any(
            pt.template.get("spec", {}).get("subdomain") == svc_name
            or (pt.owner.get("kind") == "StatefulSet" and pt.owner["spec"].get("serviceName") == svc_name)
            for pt in pod_templates(objs)
        ):
            errors.append(f"Service/{svc_name}: headless Service that no pod template uses as its subdomain (or StatefulSet serviceName)")
    return errors


def _lint_propagation(where: str, c: dict) -> list[str]:
    privileged = bool((c.get("securityContext") or {}).get("privileged"))
    return [
        f"{where}: mountPropagation Bidirectional on {m.get('mountPath')} needs privileged: true (the API server rejects it otherwise)"
        for m in c.get("volumeMounts", [])
        if m.get("mountPropagation") == "Bidirectional" and not privileged
    ]


def _lint_extended_resources(where: str, c: dict) -> list[str]:
    res = c.get("resources") or {}
    req, lim = res.get("requests") or {}, res.get("limits") or {}
    out = []
    for key in set(req) | set(lim):
        if "/" in key and not key.startswith(("kubernetes.io/", "requests.")) and str(req.get(key, lim.get(key))) != str(lim.get(key)):
            out.append(f"{where}: extended resource {key} needs requests == limits")
    return out


def _lint_subpath_vars(where: str, c: dict, owner: dict) -> list[str]:
    env = env_of(c)
    injected = {"JOB_COMPLETION_INDEX"} if owner.get("kind") in ("Job", "JobSet", "TrainingRuntime") else set()
    out = []
    for m in c.get("volumeMounts", []):
        for var in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", m.get("subPathExpr", "")):
            if var not in env and var not in injected:
                out.append(f"{where}: subPathExpr of {m.get('mountPath')} uses $({var}), which the container does not define")
    return out


def _lint_run_id(where: str, c: dict, owner: dict) -> list[str]:
    want = OWNER_LABEL.get((owner.get("apiVersion"), owner.get("kind")))
    run_id = env_of(c).get("SHARDSTREAM_RUN_ID")
    if want is None:
        return []
    if run_id is None:
        return [f"{where}: SHARDSTREAM_RUN_ID is not set; wire it from the label {want}"]
    path = ((run_id.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
    if path != f"metadata.labels['{want}']":
        return [f"{where}: SHARDSTREAM_RUN_ID must come from metadata.labels['{want}'] (the owner's name), not {path or run_id.get('value')!r}"]
    return []


def _lint_cache_mount(where: str, c: dict, volumes: dict) -> list[str]:
    env = env_of(c)
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    if "SHARDSTREAM_CACHE_DIR" in env:
        path = env["SHARDSTREAM_CACHE_DIR"].get("value")
        m = mounts.get(path)
        if m is None:
            return [f"{where}: SHARDSTREAM_CACHE_DIR={path} is not a volume mount"]
        if m.get("subPathExpr") != "$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)":
            return [f"{where}: the cache mount at {path} must use subPathExpr $(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)"]
        if "SHARDSTREAM_NODE_RANK" not in env:
            return [f"{where}: SHARDSTREAM_NODE_RANK must be set for the cache's subPathExpr"]
        return _pvc_check(where, volumes.get(m["name"]))
    if "SHARDSTREAM_CACHE_ROOT" in env:
        path = env["SHARDSTREAM_CACHE_ROOT"].get("value")
        m = mounts.get(path)
        if m is None or m.get("subPath") or m.get("subPathExpr"):
            return [f"{where}: SHARDSTREAM_CACHE_ROOT={path} must be the whole cache volume's mount"]
        return _pvc_check(where, volumes.get(m["name"]))
    return [f"{where}: neither SHARDSTREAM_CACHE_DIR nor SHARDSTREAM_CACHE_ROOT is set: the cache would land in the container's filesystem"]


def _lint_cache_prepared(where: str, c: dict, spec: dict) -> list[str]:
    """A cache folder mounted with subPathExpr exists, owned by uid 1000, before kubelet would
    make it as root: an earlier init container creates it through the whole volume."""
    cache = next((m for m in c.get("volumeMounts", []) if m.get("subPathExpr")), None)
    if cache is None:
        return []
    before = all_containers(spec)
    before = before[: next(i for i, x in enumerate(before) if x is c)]
    key = "$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)"
    for init in before:
        if init in spec.get("initContainers", []) and init.get("restartPolicy") != "Always":
            a = " ".join(argv(init))
            if "mkdir" in a and key in a and any(
                m["name"] == cache["name"] and not m.get("subPath") and not m.get("subPathExpr")
                for m in init.get("volumeMounts", [])
            ):
                return []
    return [f"{where}: no init container before it creates the cache folder {key} (kubelet would create it as root: unwritable on NFS/EFS with root_squash)"]


TRAINER_IMAGE = "shardstream-trainer"
# Images built FROM the trainer (deploy/Dockerfile): torch and /workspace too.
TRAINER_IMAGES = {TRAINER_IMAGE, "shardstream-mpi"}


def image_name(image: str) -> str:
    """registry.example.com/ml/shardstream-trainer:0.1.0 -> shardstream-trainer"""
    return image.split("@")[0].rsplit("/", 1)[-1].split(":")[0]


def _lint_trainer_image(where: str, c: dict) -> list[str]:
    """torchrun, deepspeed and train.py need the trainer image (torch, /workspace)."""
    a = argv(c)
    trains = any(x in ("torchrun", "deepspeed") or x.endswith("/train.py") for x in a) or "torchrun" in " ".join(a)
    if trains and image_name(c.get("image", "")) not in TRAINER_IMAGES:
        return [f"{where}: runs training in {c.get('image')!r}, which has no torch: use the {TRAINER_IMAGE} image"]
    return []


def _pvc_check(where: str, vol: dict | None) -> list[str]:
    if not vol or "persistentVolumeClaim" not in vol:
        return [f"{where}: the cache volume should be the shared claim (persistentVolumeClaim)"]
    return []


def _lint_shm(where: str, c: dict, volumes: dict, resources_hint: dict | None) -> list[str]:
    m = next((m for m in c.get("volumeMounts", []) if m.get("mountPath") == "/dev/shm"), None)
    if m is None:
        return [f"{where}: no /dev/shm mount: the container default is 64 MiB, too small for DataLoader workers and NCCL"]
    vol = volumes.get(m["name"], {})
    empty = vol.get("emptyDir")
    if not empty or empty.get("medium") != "Memory":
        return [f"{where}: /dev/shm must be an emptyDir with medium: Memory"]
    limit = ((c.get("resources") or resources_hint or {}).get("limits") or {}).get("memory")
    if "sizeLimit" not in empty:
        return [f"{where}: /dev/shm emptyDir needs a sizeLimit"]
    if limit and quantity(empty["sizeLimit"]) > quantity(limit):
        return [f"{where}: /dev/shm sizeLimit {empty['sizeLimit']} exceeds the memory limit {limit} it counts against"]
    return []


def _lint_job_network(pt: PodTemplate, services: dict) -> list[str]:
    job = pt.owner
    name = job["metadata"]["name"]
    spec = pt.template.get("spec", {})
    sub = spec.get("subdomain")
    out = []
    for c in spec.get("containers", []):
        # Where every node meets: a static --master-addr, or the host of a c10d --rdzv-endpoint.
        endpoint = flag(argv(c), "--rdzv-endpoint")
        master = (flag(argv(c), "--master-addr") or (env_of(c).get("MASTER_ADDR") or {}).get("value")
                  or (endpoint.rsplit(":", 1)[0] if endpoint else None))
        what = "--master-addr" if endpoint is None else "--rdzv-endpoint"
        nnodes = flag(argv(c), "--nnodes")
        if master is None:
            continue
        if sub is None:
            out.append(f"{pt.where}: {what} {master} but no subdomain: pods have no DNS names")
            continue
        if master != f"{name}-0.{sub}":
            out.append(f"{pt.where}: {what} {master} is not pod 0 of this Job ({name}-0.{sub})")
        if job["spec"].get("completionMode") != "Indexed":
            out.append(f"{pt.where}: a multi-node Job must be Indexed (stable hostnames and node ranks)")
        if nnodes is not None and not (str(job["spec"].get("completions")) == str(job["spec"].get("parallelism")) == nnodes):
            out.append(f"{pt.where}: --nnodes={nnodes}, completions and parallelism must agree")
    if sub is not None:
        svc = services.get(sub)
        if svc is None:
            out.append(f"{pt.where}: subdomain {sub} has no headless Service of that name")
        else:
            s = svc.get("spec", {})
            if s.get("clusterIP") != "None":
                out.append(f"Service/{sub}: must be headless (clusterIP: None)")
            sel = s.get("selector") or {}
            if sel.get("batch.kubernetes.io/job-name", sel.get("job-name")) != name:
                out.append(f"Service/{sub}: selector {sel} does not select the pods of Job/{name}")
    return out


def _lint_jobset_network(pt: PodTemplate) -> list[str]:
    js = pt.owner
    name = js["metadata"]["name"]
    sub = (js["spec"].get("network") or {}).get("subdomain") or name
    rjs = {rj["name"]: rj for rj in js["spec"].get("replicatedJobs", [])}
    out = []
    for c in pt.template.get("spec", {}).get("containers", []):
        master = flag(argv(c), "--master-addr")
        if master is None:
            continue
        m = re.fullmatch(rf"{re.escape(name)}-(.+)-0-0\.{re.escape(sub)}", master)
        if not m or m.group(1) not in rjs:
            out.append(f"{pt.where}: --master-addr {master} is not pod 0-0 of a replicated job of JobSet/{name} ({name}-<job>-0-0.{sub})")
        nnodes = flag(argv(c), "--nnodes")
        if nnodes is not None:
            total = sum(int(rj.get("replicas", 1)) * int(rj["template"]["spec"].get("parallelism", 1)) for rj in rjs.values() if rj["template"]["spec"]["template"] is pt.template)
            if str(total) != nnodes:
                out.append(f"{pt.where}: --nnodes={nnodes} but the replicated job runs {total} pods")
        if any(int(rj.get("replicas", 1)) > 1 for rj in rjs.values()) and "SHARDSTREAM_NODE_RANK" in env_of(c):
            rank = env_of(c)["SHARDSTREAM_NODE_RANK"]
            if "job-completion-index" in json.dumps(rank):
                out.append(f"{pt.where}: with replicas > 1 the completion index repeats in every child Job; it cannot be the node rank")
    return out


def _lint_part(pt: PodTemplate) -> list[str]:
    out = []
    for c in pt.template.get("spec", {}).get("containers", []):
        part = flag(argv(c), "--part")
        if part is None:
            continue
        m = re.fullmatch(r"\$\(JOB_COMPLETION_INDEX\)/(\d+)", part)
        spec = pt.owner["spec"]
        if not m:
            out.append(f"{pt.where}: --part={part} should be $(JOB_COMPLETION_INDEX)/N")
        elif spec.get("completionMode") != "Indexed" or str(spec.get("completions")) != m.group(1):
            out.append(f"{pt.where}: --part={part} needs an Indexed Job with completions: {m.group(1)}")
    return out


# ---------------------------------------------------------------------------------------------
# Images


def configured_images(path: Path) -> set[str]:
    """The images an overlay configures: `images:` entries of its kustomization and of the
    kustomizations it builds on, as name:tag."""
    kust = yaml.safe_load((path / "kustomization.yaml").read_text())
    out = {f"{i.get('newName', i['name'])}:{i['newTag']}" for i in kust.get("images", [])}
    for res in kust.get("resources", []):
        target = (path / res).resolve()
        if target.is_dir():
            out |= configured_images(target)
    return out


def image_errors(objs: list[dict], configured: set[str]) -> list[str]:
    """Every container and init container names one of the configured images: a bare
    `shardstream` left over (a patch that escaped the `images:` rewrite) cannot be pulled."""
    out = []
    for pt in pod_templates(objs):
        for c in all_containers(pt.template.get("spec", {})):
            if c.get("image") not in configured:
                out.append(f"{pt.where}/{c.get('name')}: image {c.get('image')!r} is not one of the configured images {sorted(configured)}")
    return out


# ---------------------------------------------------------------------------------------------
# Pod Security `restricted`

# Containers that cannot meet `restricted`, and why (docs/deploy.md, "Pod Security").
RESTRICTED_EXCEPTIONS = {
    ("fuse-sidecar", "shardstream-mount"): "privileged: Bidirectional mount propagation",
    ("fuse-device-plugin", "trainer"): "CAP_SYS_ADMIN and an unconfined AppArmor profile: mount(2) in the container",
}

_RESTRICTED_VOLUMES = {"configMap", "csi", "downwardAPI", "emptyDir", "ephemeral", "persistentVolumeClaim", "projected", "secret"}


def restricted_errors(objs: list[dict], overlay: str | None = None) -> list[str]:
    """What the `restricted` Pod Security level refuses, container by container (the
    documented exceptions aside), and at the pod level."""
    out = []
    for pt in pod_templates(objs):
        spec = pt.template.get("spec", {})
        psc = spec.get("securityContext") or {}
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if spec.get(key):
                out.append(f"{pt.where}: {key}")
        for v in spec.get("volumes", []):
            kind = next((k for k in v if k != "name"), None)
            if kind not in _RESTRICTED_VOLUMES:
                out.append(f"{pt.where}: volume {v['name']} of type {kind} is not allowed by restricted")
        for c in all_containers(spec):
            if (overlay, c.get("name")) in RESTRICTED_EXCEPTIONS:
                continue
            where = f"{pt.where}/{c.get('name')}"
            csc = c.get("securityContext") or {}
            if csc.get("privileged"):
                out.append(f"{where}: privileged")
            if csc.get("allowPrivilegeEscalation") is not False:
                out.append(f"{where}: allowPrivilegeEscalation must be false")
            caps = csc.get("capabilities") or {}
            if "ALL" not in (caps.get("drop") or []):
                out.append(f"{where}: capabilities must drop ALL")
            if set(caps.get("add") or []) - {"NET_BIND_SERVICE"}:
                out.append(f"{where}: adds capabilities {caps.get('add')}")
            if not csc.get("runAsNonRoot", psc.get("runAsNonRoot")):
                out.append(f"{where}: runAsNonRoot must be true (container or pod)")
            if csc.get("runAsUser", psc.get("runAsUser")) == 0:
                out.append(f"{where}: runAsUser 0")
            seccomp = (csc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
            if seccomp not in ("RuntimeDefault", "Localhost"):
                out.append(f"{where}: seccompProfile must be RuntimeDefault or Localhost (container or pod), not {seccomp}")
            if any(p.get("hostPort") for p in c.get("ports", [])):
                out.append(f"{where}: hostPort")
    return out


def dashboard_metrics(path: Path) -> set[str]:
    text = path.read_text()
    json.loads(text)  # must parse
    return set(re.findall(r"\bshardstream_[a-z0-9_]+", text))


# ---------------------------------------------------------------------------------------------
# Command line


def check_overlay(name: str) -> list[str]:
    objs = render(OVERLAYS_DIR / name)
    errors = []
    for version in K8S_VERSIONS:
        for o in objs:
            errors += schema_errors(o, version)
    errors += lint(objs)
    errors += image_errors(objs, configured_images(OVERLAYS_DIR / name))
    errors += restricted_errors(objs, name)
    return errors


def main() -> int:
    if kubectl() is None:
        print("kubectl not found: overlays are checked as written, without kustomize rendering")
    passed = failed = 0
    for name in overlays():
        errors = check_overlay(name)
        status = "ok" if not errors else "FAILED"
        print(f"{status:6} overlay {name} (k8s {', '.join(K8S_VERSIONS)})")
        for e in errors:
            print(f"         {e}")
        passed, failed = (passed + 1, failed) if not errors else (passed, failed + 1)
    unknown = dashboard_metrics(OVERLAYS_DIR / "monitoring/dashboards/shardstream.json") - KNOWN_METRICS
    print(f"{'ok' if not unknown else 'FAILED':6} dashboard metric names")
    for m in sorted(unknown):
        print(f"         unknown metric {m}")
    passed, failed = (passed + 1, failed) if not unknown else (passed, failed + 1)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
