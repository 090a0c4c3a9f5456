"""Multi-node training from Airflow: a headless Service, then an Indexed Job of N pods running
`shardstream run -- torchrun`, then the Service's removal.

Needs apache-airflow-providers-cncf-kubernetes (KubernetesJobOperator, completion_mode="Indexed").
The run id is Airflow's own `{{ run_id }}` (stable across task retries, unlike try_number), so a
retried task finds its nodes' cache folders warm; `max_active_runs=1` keeps two runs of this DAG
from sharing the Job name the pods' DNS names are built from.

The Job operator names the Job "job-<name>" (random suffix off below), so pod i is reachable as
job-shardstream-train-<i>.shardstream-train.
"""

from __future__ import annotations

import pendulum
from airflow import DAG
from airflow.decorators import task
from airflow.providers.cncf.kubernetes.hooks.kubernetes import KubernetesHook
from airflow.providers.cncf.kubernetes.operators.job import KubernetesJobOperator
from kubernetes.client import models as k8s

NAMESPACE = "ml"
NODES = 2
GPUS_PER_NODE = 8
JOB_NAME = "shardstream-train"  # the operator prefixes "job-"
SERVICE = "shardstream-train"
IMAGE = "registry.example.com/ml/shardstream:0.1.0"


def headless_service() -> k8s.V1Service:
    return k8s.V1Service(
        metadata=k8s.V1ObjectMeta(name=SERVICE),
        spec=k8s.V1ServiceSpec(
            cluster_ip="None",
            publish_not_ready_addresses=True,
            selector={"batch.kubernetes.io/job-name": f"job-{JOB_NAME}"},
            ports=[k8s.V1ServicePort(name="c10d", port=29500, target_port=29500)],
        ),
    )


with DAG(
    dag_id="shardstream_train",
    start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
    schedule=None,
    catchup=False,
    max_active_runs=1,
) as dag:

    @task
    def create_service() -> None:
        core = KubernetesHook().core_v1_client
        core.create_namespaced_service(namespace=NAMESPACE, body=headless_service())

    @task(trigger_rule="all_done")
    def delete_service() -> None:
        core = KubernetesHook().core_v1_client
        core.delete_namespaced_service(name=SERVICE, namespace=NAMESPACE)

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
        wait_until_job_complete=True,
        cmds=["shardstream", "run", "--", "torchrun"],
        arguments=[
            f"--nnodes={NODES}",
            f"--nproc-per-node={GPUS_PER_NODE}",
            "--node-rank=$(JOB_COMPLETION_INDEX)",
            f"--master-addr=job-{JOB_NAME}-0.{SERVICE}",
            "--master-port=29500",
            "/workspace/train.py",
        ],
        env_vars=[
            # Templated: Airflow's run id, the same for every pod and every retry of this run.
            k8s.V1EnvVar(name="SHARDSTREAM_RUN_ID", value="{{ run_id }}"),
            k8s.V1EnvVar(
                name="SHARDSTREAM_NODE_RANK",
                value_from=k8s.V1EnvVarSource(
                    field_ref=k8s.V1ObjectFieldSelector(
                        field_path="metadata.annotations['batch.kubernetes.io/job-completion-index']"
                    )
                ),
            ),
            k8s.V1EnvVar(name="SHARDSTREAM_CACHE_DIR", value="/var/cache/shardstream/node"),
        ],
        env_from=[k8s.V1EnvFromSource(config_map_ref=k8s.V1ConfigMapEnvSource(name="shardstream-env"))],
        container_resources=k8s.V1ResourceRequirements(
            requests={"cpu": "32", "memory": "200Gi", "nvidia.com/gpu": str(GPUS_PER_NODE)},
            limits={"memory": "200Gi", "nvidia.com/gpu": str(GPUS_PER_NODE)},
        ),
        volumes=[
            k8s.V1Volume(
                name="cache",
                persistent_volume_claim=k8s.V1PersistentVolumeClaimVolumeSource(claim_name="shardstream-cache"),
            ),
            k8s.V1Volume(name="dshm", empty_dir=k8s.V1EmptyDirVolumeSource(medium="Memory", size_limit="32Gi")),
        ],
        volume_mounts=[
            k8s.V1VolumeMount(
                name="cache",
                mount_path="/var/cache/shardstream/node",
                sub_path_expr="$(SHARDSTREAM_RUN_ID)/$(SHARDSTREAM_NODE_RANK)",
            ),
            k8s.V1VolumeMount(name="dshm", mount_path="/dev/shm"),
        ],
        # The Service's name as the pods' subdomain gives them DNS names.
        full_pod_spec=k8s.V1Pod(spec=k8s.V1PodSpec(subdomain=SERVICE, containers=[])),
        termination_grace_period=45,
    )

    create_service() >> train >> delete_service()
