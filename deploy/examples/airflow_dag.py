"""Multi-node training from Airflow: a headless Service, then an Indexed Job of N pods running
`shardstream run -- torchrun`, then the Service's removal.

Needs apache-airflow-providers-cncf-kubernetes (KubernetesJobOperator, completion_mode="Indexed").
The run id is Airflow's own `{{ run_id }}` (stable across task retries, unlike try_number), so a
retried task finds its nodes' cache folders warm; `max_active_runs=1` keeps two runs of this DAG
from sharing the Job name the pods' DNS names are built from.

Idempotent: the Job has a fixed name (its pods' DNS names are built from it), so every attempt
of the `train` task first deletes a Job of that name left by an earlier attempt or DAG run (and
waits until it and its pods are gone) before creating its own; the Service is created or kept;
finished Jobs are deleted by Kubernetes after `ttl_seconds_after_finished` (kept an hour for
their logs), and the last task removes the Service whatever happened. A retry of `train` in the
same DAG run keeps `{{ run_id }}` and the completion indexes, so each node mounts its warm
`<run-id>/<node-rank>/` cache folder again.

The Job operator names the Job "job-<name>" (random suffix off below), so pod i is reachable as
job-shardstream-train-<i>.shardstream-train.
"""

from __future__ import annotations

import time

import pendulum
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from kubernetes.client import models as k8s
from kubernetes.client.exceptions import ApiException

try:  # Airflow 3
    from airflow.sdk import DAG, task
except ImportError:  # Airflow 2
    from airflow import DAG
    from airflow.decorators import task

NAMESPACE = "ml"
NODES = 2
GPUS_PER_NODE = 8
JOB_NAME = "shardstream-train"  # the operator prefixes "job-"
K8S_JOB = f"job-{JOB_NAME}"
SERVICE = "shardstream-train"
# The trainer variant (deploy/Dockerfile --target trainer): torch, tini, /workspace.
IMAGE = "registry.example.com/ml/shardstream-trainer:0.1.0"
RUNTIME_IMAGE = "registry.example.com/ml/shardstream:0.1.0"
CACHE = "/var/cache/shardstream"
DELETE_TIMEOUT_S = 300


def headless_service() -> k8s.V1Service:
    return k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name=SERVICE),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={"batch.kubernetes.io/job-name": K8S_JOB},
            ports=[k8s.V1ServicePort(name="c10d", port=29500, target_port=29500)],
        ),
    )


def ensure_service(core) -> None:
    """Creates the headless Service, or keeps the one an earlier attempt left (same spec)."""
    try:
        core.create_namespaced_service(namespace=NAMESPACE, body=headless_service())
    except ApiException as e:
        if e.status != 409:
            raise


def delete_service(core) -> None:
    try:
        core.delete_namespaced_service(name=SERVICE, namespace=NAMESPACE)
    except ApiException as e:
        if e.status != 404:
            raise


def delete_job_and_wait(batch, timeout_s: float = DELETE_TIMEOUT_S, poll_s: float = 2.0) -> bool:
    """Deletes the Job of our fixed name if it exists (Foreground: its pods go first, so no old
    pod holds a node's cache folder or DNS name when the new ones start) and waits until it is
    gone. Returns whether there was one."""
    try:
        batch.delete_namespaced_job(name=K8S_JOB, namespace=NAMESPACE, propagation_policy="Foreground")
    except ApiException as e:
        if e.status == 404:
            return False
        raise
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            batch.read_namespaced_job(name=K8S_JOB, namespace=NAMESPACE)
        except ApiException as e:
            if e.status == 404:
                return True
            raise
        time.sleep(poll_s)
    raise TimeoutError(f"Job {K8S_JOB} still exists {timeout_s}s after its deletion")


def replace_stale_job(context) -> None:
    """`pre_execute` of the train task: runs before every attempt, retries included."""
    hook = KubernetesHook()
    delete_job_and_wait(hook.batch_v1_client)
    ensure_service(hook.core_v1_client)


# Airflow's run id reaches the pod as an annotation (`annotations` is a templated field) that
# the trainer and the init container both read: one value, rendered once, for every container.
RUN_ID_ANNOTATION = "shardstream.dev/run-id"
RUN_ID_ENV = k8s.V1EnvVar(
    name="SHARDSTREAM_RUN_ID",
    value_from=k8s.V1EnvVarSource(field_ref=k8s.V1ObjectFieldSelector(field_path=f"metadata.annotations['{RUN_ID_ANNOTATION}']")),
)
NODE_RANK_ENV = k8s.V1EnvVar(
    name="SHARDSTREAM_NODE_RANK",
    value_from=k8s.V1EnvVarSource(
        field_ref=k8s.V1ObjectFieldSelector(field_path="metadata.annotations['batch.kubernetes.io/job-completion-index']")
    ),
)
RESTRICTED = k8s.V1SecurityContext(allow_privilege_escalation=False, capabilities=k8s.V1Capabilities(drop=["ALL"]))


with DAG(
    dag_id="shardstream_train",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    max_active_runs=1,
) as dag:

    @task
    def create_service() -> None:
        ensure_service(KubernetesHook().core_v1_client)

    @task(task_id="delete_service", trigger_rule="all_done")
    def remove_service() -> None:
        delete_service(KubernetesHook().core_v1_client)

    train = KubernetesJobOperator(
        task_id="train",
        namespace=NAMESPACE,
        name=JOB_NAME,
        random_name_suffix=False,
        image=IMAGE,
        completion_mode="Indexed",
        completions=NODES,
        parallelism=NODES,
        backoff_limit=3,
        # Kubernetes deletes the finished Job (and its pods) after an hour; an attempt that
        # comes sooner deletes it itself first (pre_execute).
        ttl_seconds_after_finished=3600,
        pre_execute=replace_stale_job,
        retries=2,
        wait_until_job_complete=True,
        # tini as PID 1 (a pod's command replaces the image's ENTRYPOINT).
        cmds=["tini", "--", "shardstream", "run", "--", "torchrun"],
        arguments=[
            f"--nnodes={NODES}",
            f"--nproc-per-node={GPUS_PER_NODE}",
            "--node-rank=$(JOB_COMPLETION_INDEX)",
            f"--master-addr={K8S_JOB}-0.{SERVICE}",
            "--master-port=29500",
            "/workspace/train.py",
        ],
        # Templated: Airflow's run id, the same for every pod and every retry of this run.
        annotations={RUN_ID_ANNOTATION: "{{ run_id }}"},
        env_vars=[
            RUN_ID_ENV,
            NODE_RANK_ENV,
            k8s.V1EnvVar(name="SHARDSTREAM_CACHE_DIR", value=f"{CACHE}/node"),
        ],
        env_from=[k8s.V1EnvFromSource(config_map_ref=k8s.V1ConfigMapEnvSource(name="shardstream-env"))],
        container_resources=k8s.V1ResourceRequirements(
            requests={"cpu": "32", "memory": "200Gi", "nvidia.com/gpu": str(GPUS_PER_NODE)},
            limits={"memory": "200Gi", "nvidia.com/gpu": str(GPUS_PER_NODE)},
        ),
        # The node's cache folder, made by uid 1000 before the trainer mounts it (docs/deploy.md,
        # "The cache volume").
        init_containers=[
            k8s.V1Container(
                name="prepare-cache",
                image=RUNTIME_IMAGE,
                command=["mkdir", "-p", f"{CACHE}/$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)"],
                env=[RUN_ID_ENV, NODE_RANK_ENV],
                security_context=RESTRICTED,
                volume_mounts=[k8s.V1VolumeMount(name="cache", mount_path=CACHE)],
            )
        ],
        # Pod Security `restricted`.
        security_context=k8s.V1PodSecurityContext(
            run_as_non_root=True,
            run_as_user=1000,
            run_as_group=1000,
            seccomp_profile=k8s.V1SeccompProfile(type="RuntimeDefault"),
            fs_group=1000,
            fs_group_change_policy="OnRootMismatch",
        ),
        container_security_context=RESTRICTED,
        volumes=[
            k8s.V1Volume(
                name="cache",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name="shardstream-cache"),
            ),
            k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit="32Gi")),
            k8s.V1Volume(name="train-script", config_map=k8s.V1ConfigMapVolumeSource(name="shardstream-train")),
        ],
        volume_mounts=[
            k8s.V1VolumeMount(
                name="cache",
                mount_path=f"{CACHE}/node",
                sub_path_expr="$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)",
            ),
            k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
            k8s.V1VolumeMount(name="train-script", mount_path="/workspace/train.py", sub_path="train.py", read_only=True),
        ],
        # The Service's name as the pods' subdomain gives them DNS names.
        full_pod_spec=k8s.V1Pod(spec=k8s.V1PodSpec(subdomain=SERVICE, containers=[])),
        # The cloud identity (docs/deploy.md, "Credentials").
        service_account_name="shardstream",
        termination_grace_period=45,
    )

    create_service() >> train >> remove_service()
