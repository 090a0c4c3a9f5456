//! One row per launcher shape, with the environment that launcher really produces (from the
//! operators' sources, see docs/deploy.md), including the traps: torchrun's `"none"` run id,
//! a PyTorchJob's node-index `RANK`, a JobSet's child-Job name, elastic rank reassignment.

use super::*;

enum Expect {
    Ok {
        run_id: &'static str,
        run_id_from: Source,
        node_rank: u32,
        node_rank_from: Source,
        process: Option<(u32, u32, u32, u32)>,
    },
    Err(fn(&IdentityError) -> bool),
}

struct Case {
    name: &'static str,
    env: &'static [(&'static str, &'static str)],
    overrides: Overrides,
    expect: Expect,
}

fn case(name: &'static str, env: &'static [(&'static str, &'static str)], expect: Expect) -> Case {
    Case {
        name,
        env,
        overrides: Overrides::default(),
        expect,
    }
}

fn ok(
    run_id: &'static str,
    run_id_from: &'static str,
    node_rank: u32,
    node_rank_from: &'static str,
) -> Expect {
    Expect::Ok {
        run_id,
        run_id_from: Source::Env(run_id_from),
        node_rank,
        node_rank_from: Source::Env(node_rank_from),
        process: None,
    }
}

const UUID: &str = "4f0f1c9e-2b7a-4d59-9a43-0c1de1b0a7e2";

fn cases() -> Vec<Case> {
    vec![
        // The reference pattern: deploy/overlays/indexed-job wires the Job name label into
        // SHARDSTREAM_RUN_ID; the control plane sets JOB_COMPLETION_INDEX.
        case(
            "indexed job",
            &[
                ("SHARDSTREAM_RUN_ID", "train"),
                ("JOB_COMPLETION_INDEX", "1"),
                ("MASTER_ADDR", "train-0.train-svc"),
            ],
            ok("train", "SHARDSTREAM_RUN_ID", 1, "JOB_COMPLETION_INDEX"),
        ),
        // A generic template that passes every owner label: under a plain Job only the Job
        // label is non-empty (the downward API gives "" for a missing label).
        case(
            "indexed job, generic template",
            &[
                ("SHARDSTREAM_RUN_ID", ""),
                ("SHARDSTREAM_JOBSET_NAME", ""),
                ("SHARDSTREAM_PYTORCHJOB_NAME", ""),
                ("SHARDSTREAM_JOB_NAME", "train"),
                ("JOB_COMPLETION_INDEX", "0"),
            ],
            ok("train", "SHARDSTREAM_JOB_NAME", 0, "JOB_COMPLETION_INDEX"),
        ),
        // JobSet: the job-name label is the child Job (`<jobset>-<replicatedJob>-<index>`);
        // the run is the JobSet.
        case(
            "jobset: the jobset name beats the child job name",
            &[
                ("SHARDSTREAM_JOBSET_NAME", "pretrain"),
                ("SHARDSTREAM_JOB_NAME", "pretrain-workers-0"),
                ("JOB_COMPLETION_INDEX", "3"),
            ],
            ok(
                "pretrain",
                "SHARDSTREAM_JOBSET_NAME",
                3,
                "JOB_COMPLETION_INDEX",
            ),
        ),
        // Kubeflow Trainer v2: PET_NODE_RANK comes from the completion-index annotation, the
        // run id from the jobset-name label the TrainJob's JobSet carries.
        case(
            "trainer v2 trainjob",
            &[
                ("SHARDSTREAM_RUN_ID", "llama-ft"),
                ("JOB_COMPLETION_INDEX", "1"),
                ("PET_NODE_RANK", "1"),
                ("PET_NNODES", "2"),
                ("PET_NPROC_PER_NODE", "8"),
                ("PET_MASTER_ADDR", "llama-ft-node-0-0.llama-ft"),
            ],
            ok("llama-ft", "SHARDSTREAM_RUN_ID", 1, "JOB_COMPLETION_INDEX"),
        ),
        // PyTorchJob v1 static, worker 1 (node 2): RANK is the node index and WORLD_SIZE is
        // nodes x nproc. Neither is a process rank yet, and RANK keys nothing.
        case(
            "pytorchjob static: RANK is the node index, not a process rank",
            &[
                ("SHARDSTREAM_RUN_ID", "bert"),
                ("MASTER_ADDR", "bert-master-0"),
                ("RANK", "2"),
                ("WORLD_SIZE", "24"),
                ("PET_NODE_RANK", "2"),
                ("PET_NNODES", "3"),
                ("PET_NPROC_PER_NODE", "8"),
            ],
            ok("bert", "SHARDSTREAM_RUN_ID", 2, "PET_NODE_RANK"),
        ),
        // Older operators set only RANK (no PET_NODE_RANK): refusing beats guessing.
        case(
            "pytorchjob without PET_NODE_RANK: RANK alone is refused",
            &[
                ("SHARDSTREAM_RUN_ID", "bert"),
                ("MASTER_ADDR", "bert-master-0"),
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
            ],
            Expect::Err(
                |e| matches!(e, IdentityError::MissingNodeRank { hint } if hint.contains("RANK=1")),
            ),
        ),
        // Elastic PyTorchJob: no Master, no RANK, no PET_NODE_RANK; rendezvous assigns ranks.
        case(
            "pytorchjob elastic without a node rank is refused",
            &[
                ("SHARDSTREAM_PYTORCHJOB_NAME", "bert-elastic"),
                ("PET_RDZV_BACKEND", "c10d"),
                ("PET_RDZV_ENDPOINT", "bert-elastic-worker-0:23456"),
                ("PET_NNODES", "2:4"),
            ],
            Expect::Err(
                |e| matches!(e, IdentityError::MissingNodeRank { hint } if hint.contains("2:4")),
            ),
        ),
        // ... and accepted with the replica-index label wired into SHARDSTREAM_NODE_RANK, as
        // deploy/overlays/pytorchjob-elastic does.
        case(
            "pytorchjob elastic with replica-index wired",
            &[
                ("SHARDSTREAM_PYTORCHJOB_NAME", "bert-elastic"),
                ("SHARDSTREAM_NODE_RANK", "3"),
                ("PET_RDZV_BACKEND", "c10d"),
                ("PET_NNODES", "2:4"),
            ],
            ok(
                "bert-elastic",
                "SHARDSTREAM_PYTORCHJOB_NAME",
                3,
                "SHARDSTREAM_NODE_RANK",
            ),
        ),
        // Inside a worker of an elastic job started by `shardstream run`: after a membership
        // change GROUP_RANK and RANK are new, the exported node rank is not.
        case(
            "worker under shardstream run keeps its node rank across rank reassignment",
            &[
                ("SHARDSTREAM_RUN_ID", "bert-elastic"),
                ("SHARDSTREAM_NODE_RANK", "3"),
                ("TORCHELASTIC_RUN_ID", "bert-elastic"),
                ("GROUP_RANK", "1"),
                ("RANK", "9"),
                ("WORLD_SIZE", "16"),
                ("LOCAL_RANK", "1"),
                ("LOCAL_WORLD_SIZE", "8"),
            ],
            Expect::Ok {
                run_id: "bert-elastic",
                run_id_from: Source::Env("SHARDSTREAM_RUN_ID"),
                node_rank: 3,
                node_rank_from: Source::Env("SHARDSTREAM_NODE_RANK"),
                process: Some((9, 16, 1, 8)),
            },
        ),
        // A bare `torchrun --standalone` worker: the run id is torchrun's uuid (accepted, with a
        // warning), the node is GROUP_RANK.
        case(
            "torchrun standalone worker",
            &[
                ("TORCHELASTIC_RUN_ID", UUID),
                ("GROUP_RANK", "0"),
                ("RANK", "3"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "3"),
                ("LOCAL_WORLD_SIZE", "4"),
            ],
            Expect::Ok {
                run_id: UUID,
                run_id_from: Source::Env("TORCHELASTIC_RUN_ID"),
                node_rank: 0,
                node_rank_from: Source::Env("GROUP_RANK"),
                process: Some((3, 4, 3, 4)),
            },
        ),
        // TorchElastic without --rdzv-id: every such run is called "none".
        case(
            "torchelastic run id 'none' is not a run id",
            &[
                ("TORCHELASTIC_RUN_ID", "none"),
                ("GROUP_RANK", "1"),
                ("RANK", "5"),
                ("WORLD_SIZE", "8"),
                ("LOCAL_RANK", "1"),
                ("LOCAL_WORLD_SIZE", "4"),
            ],
            Expect::Err(
                |e| matches!(e, IdentityError::MissingRunId { torchelastic } if torchelastic == "none"),
            ),
        ),
        // The legacy ElasticJob controller passes the job name as --rdzv_id.
        case(
            "torchelastic elasticjob: rdzv id is the job name",
            &[
                ("TORCHELASTIC_RUN_ID", "imagenet"),
                ("GROUP_RANK", "2"),
                ("RANK", "2"),
                ("WORLD_SIZE", "3"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "1"),
            ],
            Expect::Ok {
                run_id: "imagenet",
                run_id_from: Source::Env("TORCHELASTIC_RUN_ID"),
                node_rank: 2,
                node_rank_from: Source::Env("GROUP_RANK"),
                process: Some((2, 3, 0, 1)),
            },
        ),
        // Airflow's templated {{ run_id }} has ':' and '+': fine in a folder name.
        case(
            "airflow run id",
            &[
                ("SHARDSTREAM_RUN_ID", "scheduled__2024-05-01T00:00:00+00:00"),
                ("JOB_COMPLETION_INDEX", "0"),
            ],
            ok(
                "scheduled__2024-05-01T00:00:00+00:00",
                "SHARDSTREAM_RUN_ID",
                0,
                "JOB_COMPLETION_INDEX",
            ),
        ),
        case(
            "nothing set: no random run id",
            &[],
            Expect::Err(
                |e| matches!(e, IdentityError::MissingRunId { torchelastic } if torchelastic == "unset"),
            ),
        ),
        case(
            "single node: node rank defaults to 0",
            &[("SHARDSTREAM_RUN_ID", "laptop")],
            Expect::Ok {
                run_id: "laptop",
                run_id_from: Source::Env("SHARDSTREAM_RUN_ID"),
                node_rank: 0,
                node_rank_from: Source::Default,
                process: None,
            },
        ),
        case(
            "several nodes and no node rank",
            &[("SHARDSTREAM_RUN_ID", "x"), ("PET_NNODES", "4")],
            Expect::Err(|e| matches!(e, IdentityError::MissingNodeRank { .. })),
        ),
        case(
            "run id escaping the cache root",
            &[
                ("SHARDSTREAM_RUN_ID", "../etc"),
                ("JOB_COMPLETION_INDEX", "0"),
            ],
            Expect::Err(|e| {
                matches!(
                    e,
                    IdentityError::InvalidRunId {
                        var: "SHARDSTREAM_RUN_ID",
                        ..
                    }
                )
            }),
        ),
        case(
            "run id with a slash",
            &[("SHARDSTREAM_JOB_NAME", "a/b")],
            Expect::Err(|e| matches!(e, IdentityError::InvalidRunId { .. })),
        ),
        case(
            "node rank not an integer",
            &[("SHARDSTREAM_RUN_ID", "x"), ("JOB_COMPLETION_INDEX", "one")],
            Expect::Err(|e| {
                matches!(
                    e,
                    IdentityError::InvalidInteger {
                        var: "JOB_COMPLETION_INDEX",
                        ..
                    }
                )
            }),
        ),
        case(
            "negative node rank",
            &[("SHARDSTREAM_RUN_ID", "x"), ("SHARDSTREAM_NODE_RANK", "-1")],
            Expect::Err(|e| matches!(e, IdentityError::InvalidInteger { .. })),
        ),
        case(
            "rank outside the world",
            &[
                ("SHARDSTREAM_RUN_ID", "x"),
                ("RANK", "4"),
                ("WORLD_SIZE", "4"),
                ("LOCAL_RANK", "0"),
                ("LOCAL_WORLD_SIZE", "4"),
            ],
            Expect::Err(|e| matches!(e, IdentityError::InconsistentRanks { .. })),
        ),
        Case {
            name: "flags beat the environment",
            env: &[
                ("SHARDSTREAM_RUN_ID", "from-env"),
                ("JOB_COMPLETION_INDEX", "1"),
            ],
            overrides: Overrides {
                run_id: Some("from-flag".into()),
                node_rank: Some(7),
                fallback_run_id: Some("auto-0".into()),
            },
            expect: Expect::Ok {
                run_id: "from-flag",
                run_id_from: Source::Flag,
                node_rank: 7,
                node_rank_from: Source::Flag,
                process: None,
            },
        },
        Case {
            name: "a bad flag is refused too",
            env: &[],
            overrides: Overrides {
                run_id: Some("..".into()),
                ..Overrides::default()
            },
            expect: Expect::Err(|e| {
                matches!(
                    e,
                    IdentityError::InvalidRunId {
                        var: "--run-id",
                        ..
                    }
                )
            }),
        },
    ]
}

#[test]
fn every_launcher_resolves_as_designed() {
    let mut failures = Vec::new();
    for c in cases() {
        let env = |name: &str| {
            c.env
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        };
        let got = resolve_with(&c.overrides, &env);
        let fine = match (&c.expect, &got) {
            (
                Expect::Ok {
                    run_id,
                    run_id_from,
                    node_rank,
                    node_rank_from,
                    process,
                },
                Ok(r),
            ) => {
                r.run_id == *run_id
                    && r.run_id_from == *run_id_from
                    && r.node_rank == *node_rank
                    && r.node_rank_from == *node_rank_from
                    && r.process
                        .map(|p| (p.rank, p.world_size, p.local_rank, p.local_world_size))
                        == *process
            }
            (Expect::Err(matches), Err(e)) => matches(e),
            _ => false,
        };
        if !fine {
            failures.push(format!("{}: got {got:?}", c.name));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn run_id_rules() {
    for good in ["train", "a.b", "run-2024_05", "x:y+z", "ü"] {
        assert_eq!(validate_run_id(good), Ok(()), "{good}");
    }
    for bad in [
        "", ".", "..", ".hidden", "a..b", "a/b", "a\\b", "a b", "a\nb", "a\0b",
    ] {
        assert!(validate_run_id(bad).is_err(), "{bad:?}");
    }
    assert!(validate_run_id(&"x".repeat(256)).is_err());
    assert!(validate_run_id(&"x".repeat(255)).is_ok());
}

#[test]
fn exports_name_the_three_variables() {
    let r = resolve(&|name: &str| match name {
        "SHARDSTREAM_RUN_ID" => Some("r".into()),
        "JOB_COMPLETION_INDEX" => Some("2".into()),
        _ => None,
    })
    .unwrap();
    let exports = r.exports(Path::new("/cache/r/2"));
    assert_eq!(
        exports,
        vec![
            ("SHARDSTREAM_RUN_ID", OsString::from("r")),
            ("SHARDSTREAM_NODE_RANK", OsString::from("2")),
            ("SHARDSTREAM_CACHE_DIR", OsString::from("/cache/r/2")),
        ]
    );
}

#[test]
fn uuid_shape() {
    assert!(looks_like_uuid(UUID));
    assert!(!looks_like_uuid("train"));
    assert!(!looks_like_uuid("4f0f1c9e-2b7a-4d59-9a43-0c1de1b0a7eZ"));
}

#[test]
fn a_derived_run_id_names_runs_no_launcher_names() {
    let derived = Overrides {
        fallback_run_id: Some("auto-1".into()),
        ..Overrides::default()
    };
    let none = |_: &str| None;
    let r = resolve_with(&derived, &none).unwrap();
    assert_eq!(
        (r.run_id.as_str(), r.run_id_from),
        ("auto-1", Source::Derived)
    );
    assert_eq!((r.node_rank, r.node_rank_from), (0, Source::Default));
    // torchrun --standalone: a uuid made for this launch alone gives way to the derived id.
    let standalone = |name: &str| (name == "TORCHELASTIC_RUN_ID").then(|| UUID.to_string());
    assert_eq!(
        resolve_with(&derived, &standalone).unwrap().run_id,
        "auto-1"
    );
    // A run id set on purpose (or by a launcher) still wins.
    let named = |name: &str| (name == "SHARDSTREAM_RUN_ID").then(|| "train".to_string());
    assert_eq!(resolve_with(&derived, &named).unwrap().run_id, "train");
    let chosen = |name: &str| (name == "TORCHELASTIC_RUN_ID").then(|| "job-7".to_string());
    assert_eq!(resolve_with(&derived, &chosen).unwrap().run_id, "job-7");
    // Without one, the pod contract holds: no run id is an error.
    assert_eq!(
        resolve_with(&Overrides::default(), &standalone)
            .unwrap()
            .run_id,
        UUID
    );
    assert!(matches!(
        resolve_with(&Overrides::default(), &none),
        Err(IdentityError::MissingRunId { .. })
    ));
}

#[test]
fn derived_run_ids_are_stable_per_dataset_and_user() {
    let alice = |name: &str| (name == "USER").then(|| "alice".to_string());
    let bob = |name: &str| (name == "USER").then(|| "bob".to_string());
    let a = derived_run_id("s3://bkt/ds", &alice);
    assert_eq!(a, derived_run_id("s3://bkt/ds", &alice));
    assert_ne!(a, derived_run_id("s3://bkt/other", &alice));
    assert_ne!(a, derived_run_id("s3://bkt/ds", &bob));
    assert!(a.starts_with("auto-") && a.len() == 21, "{a}");
    assert_eq!(validate_run_id(&a), Ok(()));
}
