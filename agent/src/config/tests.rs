use std::time::Duration;

use clap::CommandFactory;

use super::*;
use crate::{
    admission::verify::Gate,
    api::server::{AGENT_BODY_BUDGET, MAX_ABUSE_BACKOFF},
    kubeletconfig::settings::{Source, VERIFICATION_GATE},
    probes::flags::EbpfMode,
    tls::TlsFiles,
    webhook::FailurePolicy,
};

fn cli(args: &[&str]) -> Cli {
    Cli::try_parse_from(std::iter::once("hugepage-agent").chain(args.iter().copied()))
        .expect("parse")
}

/// `run` with `args`.
fn run(args: &[&str]) -> Result<RunConfig, ConfigError> {
    let config = Config::try_from(cli(&[&["run"][..], args].concat()))?;
    match config.command {
        Command::Run(run) => Ok(*run),
        other => panic!("not run: {other:?}"),
    }
}

/// The webhook's required flags, and `more`.
fn webhook(more: &[&str]) -> Result<webhook::Settings, ConfigError> {
    let args = [
        &[
            "webhook",
            "--tls-cert-file",
            "c.pem",
            "--tls-private-key-file",
            "k.pem",
        ][..],
        &[
            "--agent-ca-file",
            "ca.pem",
            "--agent-client-cert-file",
            "client.pem",
        ],
        &["--agent-client-key-file", "client-key.pem"],
        more,
    ]
    .concat();
    match Config::try_from(cli(&args))?.command {
        Command::Webhook(settings) => Ok(*settings),
        other => panic!("not the webhook: {other:?}"),
    }
}

/// The long flags a subcommand takes.
fn flags_of(subcommand: &str) -> Vec<String> {
    let command = Cli::command();
    let sub = command
        .find_subcommand(subcommand)
        .unwrap_or_else(|| panic!("no subcommand {subcommand}"));
    sub.get_arguments()
        .filter_map(|a| a.get_long().map(str::to_owned))
        .collect()
}

#[test]
fn no_subcommand_means_run_with_its_defaults_and_a_flag_follows_its_subcommand() {
    let config = Config::try_from(cli(&[])).expect("valid");
    let Command::Run(run) = config.command else {
        panic!("not run");
    };
    assert_eq!(run.ebpf, EbpfMode::Auto);
    let config = Config::try_from(cli(&["status", "--json", "--host-root", "/"])).expect("valid");
    assert_eq!(
        config.command,
        Command::Status {
            host: HostFs::new("/"),
            json: true,
            from: None
        }
    );
    assert!(
        Cli::try_parse_from(["hugepage-agent", "--ebpf", "off", "run"]).is_err(),
        "flags belong to their subcommand"
    );
}

/// Bug (#34): every subcommand's `--help` listed the running agent's options (`merge --help`
/// showed 38 flags, `webhook --help` 44), because they were global.
#[test]
fn each_subcommand_takes_only_the_flags_it_uses() {
    assert_eq!(flags_of("merge"), ["input"]);
    assert_eq!(
        flags_of("hints"),
        ["state", "pod", "container", "scope", "feature-gates"]
    );
    assert_eq!(flags_of("status"), ["json", "from", "host-root"]);
    let check = flags_of("check");
    for absent in [
        "listen",
        "api-threads",
        "ebpf",
        "fault-scope",
        "psi-interval",
    ] {
        assert!(!check.iter().any(|f| f == absent), "check takes --{absent}");
    }
    let webhook = flags_of("webhook");
    for absent in [
        "host-root",
        "ebpf",
        "fault-scope",
        "psi-memory-threshold",
        "api-threads",
        "admit-client-names",
        "topology-policy",
    ] {
        assert!(
            !webhook.iter().any(|f| f == absent),
            "webhook takes --{absent}"
        );
    }
    let run = flags_of("run");
    for absent in [
        "agent-port",
        "http2-max-concurrent-streams",
        "abuse-backoff",
        "http2-idle-timeout",
        "client-names",
    ] {
        assert!(!run.iter().any(|f| f == absent), "run takes --{absent}");
    }
    assert!(run.len() > 30, "{run:?}");
}

#[test]
fn bad_values_name_the_flag() {
    let err = run(&["--host-root", "/no/such/dir"]).unwrap_err();
    assert_eq!(err.to_string(), "--host-root /no/such/dir: not a directory");
    let err = run(&["--reconcile-interval", "0s"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--reconcile-interval \"0s\": must be above zero"
    );
    assert!(Cli::try_parse_from(["hugepage-agent", "run", "--ebpf", "maybe"]).is_err());
    let err = Config::try_from(cli(&["status", "--from", "node-1:9820"])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--from \"node-1:9820\": expected an http:// URL such as http://127.0.0.1:9820"
    );
    let err = run(&["--psi-memory-threshold", "0"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--psi-memory-threshold 0: expected a percentage above 0 and at most 100"
    );
    let err = run(&["--psi-io-threshold", "101"]).unwrap_err();
    assert!(
        err.to_string().starts_with("--psi-io-threshold 101"),
        "{err}"
    );
    let err = run(&["--psi-interval", "10ms"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--psi-interval \"10ms\": must be at least 100ms"
    );
    let err = run(&["--listen", "localhost"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--listen \"localhost\": expected an address and port such as 127.0.0.1:9820 or [::]:9820"
    );
    for threads in ["0", "65", "two"] {
        let err = Cli::try_parse_from(["hugepage-agent", "run", "--api-threads", threads])
            .expect_err("out of range");
        assert!(
            err.to_string().contains("'--api-threads <API_THREADS>'"),
            "{err}"
        );
    }
}

#[test]
fn the_kubelet_setting_flags_are_overrides_with_no_default_of_their_own() {
    let config = run(&[]).expect("valid");
    assert_eq!(config.kubelet.layer, Layer::default());
    assert_eq!(config.verification.gate, Gate::On);
    let config = run(&[
        "--topology-policy",
        "best-effort",
        "--memory-manager-policy",
        "Static",
        "--feature-gates",
        "PodLevelResources=true,MemoryManagerHugepagesVerification=true",
        "--verification",
        "off",
        "--reserved-memory",
        "0:memory=1Gi",
        "--kubelet-config",
        "/etc/kubernetes/kubelet/config.json",
    ])
    .expect("valid");
    let flags = &config.kubelet.layer;
    let policy = flags.policy.as_ref().expect("policy");
    assert_eq!(
        (policy.value, &policy.source),
        (Policy::BestEffort, &Source::Flag("--topology-policy"))
    );
    assert!(flags.scope.is_none() && flags.options.is_none());
    let gate = &flags.gates[VERIFICATION_GATE];
    assert_eq!(
        (gate.value, &gate.source),
        (false, &Source::Flag("--verification")),
        "--verification wins over --feature-gates"
    );
    assert!(flags.gates["PodLevelResources"].value);
    assert_eq!(
        flags
            .reserved_memory
            .as_ref()
            .map(|r| r.value[&0]["memory"]),
        Some(1 << 30)
    );
    assert_eq!(
        config.kubelet.config.as_deref(),
        Some(std::path::Path::new("/etc/kubernetes/kubelet/config.json"))
    );
    for (args, expected) in [
        (
            ["--feature-gates", "CPUManager=true"],
            "--feature-gates: unrecognized feature gate \"CPUManager\"",
        ),
        (
            ["--memory-manager-policy", "static"],
            "--memory-manager-policy: \"static\" is not None or Static",
        ),
        (
            ["--topology-policy-options", "closest=true"],
            "--topology-policy-options: unknown topology policy option \"closest\"",
        ),
        (
            ["--reserved-memory", "memory=1Gi"],
            "--reserved-memory: \"memory=1Gi\": expected <numa node>:<type>=<quantity>",
        ),
    ] {
        let err = run(&args).unwrap_err().to_string();
        assert!(err.starts_with(expected), "{err}");
    }
    let hints = Config::try_from(cli(&[
        "hints",
        "--state",
        "s.json",
        "--pod",
        "p.json",
        "--feature-gates",
        "PodLevelResources=true",
    ]))
    .expect("valid");
    let Command::Hints { gates, scope, .. } = hints.command else {
        panic!("not hints");
    };
    assert!(gates.pod_level_resources && scope == Scope::Container);
}

#[test]
fn one_api_thread_unless_told() {
    assert_eq!(run(&[]).expect("valid").api_threads, 1);
    assert_eq!(run(&["--api-threads", "4"]).expect("valid").api_threads, 4);
}

#[test]
fn the_api_beyond_loopback_needs_client_certificates_or_the_opt_out() {
    let err = run(&["--listen", "0.0.0.0:9820"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--listen 0.0.0.0:9820 is not a loopback address and no --client-ca-file is given: anyone who reaches it could reserve hugepages; give --client-ca-file with --tls-cert-file and --tls-private-key-file, listen on 127.0.0.1, or add --allow-unauthenticated-clients if that is meant"
    );
    let tls = [
        "--tls-cert-file",
        "c.pem",
        "--tls-private-key-file",
        "k.pem",
    ];
    let without_ca = run(&[&["--listen", "[::]:9820"][..], &tls].concat());
    assert_eq!(
        without_ca.unwrap_err(),
        ConfigError::Api(ApiFlagError::Unauthenticated(
            "[::]:9820".parse().expect("address")
        )),
        "TLS without client certificates lets anyone in as well"
    );
    for listen in [
        "127.0.0.1:9820",
        "127.1.2.3:9820",
        "[::1]:9820",
        "[::ffff:127.0.0.1]:9820",
    ] {
        run(&["--listen", listen]).expect("loopback needs no client CA");
    }
    let config = run(&[
        &["--listen", "0.0.0.0:9820"][..],
        &tls,
        &["--client-ca-file", "ca.pem"],
    ]
    .concat())
    .expect("client certificates required");
    assert_eq!(
        config.tls,
        Some(TlsFiles {
            cert: "c.pem".into(),
            key: "k.pem".into(),
            client_ca: Some("ca.pem".into()),
        })
    );
    let config = run(&[
        "--listen",
        "10.0.0.5:9820",
        "--allow-unauthenticated-clients",
    ])
    .expect("the operator means it");
    assert!(config.allow_unauthenticated_clients && config.tls.is_none());
}

#[test]
fn tls_flags_go_together() {
    let err = run(&["--tls-cert-file", "c.pem"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--tls-cert-file needs --tls-private-key-file: a certificate and its private key go together"
    );
    let err = run(&["--tls-private-key-file", "k.pem"]).unwrap_err();
    assert!(
        err.to_string()
            .starts_with("--tls-private-key-file needs --tls-cert-file"),
        "{err}"
    );
    let err = run(&["--client-ca-file", "ca.pem"]).unwrap_err();
    assert_eq!(err, ConfigError::Tls(TlsFlagError::ClientCaWithoutTls));
    let config = run(&[]).expect("valid");
    assert_eq!((config.tls, config.metrics_listen), (None, None));
}

#[test]
fn the_metrics_listener_has_an_address_of_its_own() {
    let config = run(&["--metrics-listen", "0.0.0.0:9821"]).expect("valid");
    assert_eq!(
        config.metrics_listen,
        Some("0.0.0.0:9821".parse().expect("address"))
    );
    let err = run(&["--metrics-listen", ":9821"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--metrics-listen \":9821\": expected an address and port such as 0.0.0.0:9821"
    );
    let err = run(&["--metrics-listen", "127.0.0.1:9820"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--metrics-listen 127.0.0.1:9820: the address of --listen; give it a port of its own"
    );
}

#[test]
fn the_webhook_needs_its_certificate_and_the_agents_files() {
    let settings = webhook(&["--listen", "0.0.0.0:8443"]).expect("valid");
    assert_eq!(
        (
            settings.agent_port,
            settings.failure_policy,
            settings.agent_timeout
        ),
        (9820, FailurePolicy::Ignore, Duration::from_secs(2)),
        "the defaults"
    );
    assert_eq!(settings.agent_tls.cert, PathBuf::from("client.pem"));
    assert_eq!(settings.tls.cert, PathBuf::from("c.pem"));
    assert_eq!(settings.listen, "0.0.0.0:8443".parse().expect("address"));
    assert_eq!(
        (settings.extender_body_limit, settings.limits),
        (8 << 20, Limits::WEBHOOK),
        "the webhook's own defaults"
    );
    let agents = [
        "webhook",
        "--agent-ca-file",
        "a",
        "--agent-client-cert-file",
        "b",
        "--agent-client-key-file",
        "c",
    ];
    let err = Config::try_from(cli(&agents)).unwrap_err();
    assert_eq!(err, ConfigError::WebhookWithoutTls);
    let err = webhook(&["--agent-timeout", "0s"]).unwrap_err();
    assert_eq!(
        err.to_string(),
        "--agent-timeout \"0s\": must be above zero"
    );
    let settings = webhook(&["--failure-policy", "fail", "--agent-port", "10250"]).expect("valid");
    assert_eq!(
        (settings.agent_port, settings.failure_policy),
        (10250, FailurePolicy::Fail)
    );
    for bad in [["--failure-policy", "open"], ["--agent-port", "0"]] {
        let args = agents.iter().chain(&bad).copied();
        assert!(Cli::try_parse_from(std::iter::once("hugepage-agent").chain(args)).is_err());
    }
    assert!(
        Cli::try_parse_from(["hugepage-agent", "webhook"]).is_err(),
        "the agents' files are required"
    );
}

/// Bug (#38): nothing bounded the bytes of all request bodies together.
#[test]
fn the_body_budget_is_a_quantity_no_smaller_than_the_largest_body_it_must_hold() {
    let budget = |args: &[&str]| run(args).map(|c| c.limits.body_budget);
    assert_eq!(budget(&[]), Ok(AGENT_BODY_BUDGET));
    assert_eq!(budget(&["--body-budget", "32Mi"]), Ok(32 << 20));
    assert_eq!(
        budget(&["--body-budget", "512Ki"]).map_err(|e| e.to_string()),
        Err("--body-budget 524288 is smaller than the body limit of /v1 1048576: a body at that limit could never be read".to_owned())
    );
    for bad in ["0", "-1Mi", "lots", "5Gi"] {
        let err = budget(&[&format!("--body-budget={bad}")])
            .expect_err(bad)
            .to_string();
        assert!(
            err.starts_with(&format!("--body-budget {bad:?}: ")),
            "{err}"
        );
    }
    let budget = |more: &[&str]| webhook(more).map(|s| s.limits.body_budget);
    assert_eq!(budget(&[]), Ok(64 << 20));
    let err = budget(&["--extender-body-limit", "100Mi"]).expect_err("over the budget");
    assert_eq!(
        err,
        ConfigError::BudgetBelowLimit {
            budget: 64 << 20,
            flag: "--extender-body-limit",
            limit: 100 << 20
        }
    );
    assert_eq!(
        budget(&["--extender-body-limit", "100Mi", "--body-budget", "400Mi"]),
        Ok(400 << 20)
    );
}

#[test]
fn the_listeners_limits_have_their_defaults_unless_told() {
    assert_eq!(run(&[]).expect("valid").limits, Limits::DEFAULT);
    let told = run(&[
        "--max-connections",
        "8",
        "--header-read-timeout",
        "500ms",
        "--body-read-timeout",
        "2s",
    ])
    .expect("valid");
    assert_eq!(
        told.limits,
        Limits {
            max_connections: 8,
            header_read_timeout: Duration::from_millis(500),
            body_read_timeout: Duration::from_secs(2),
            ..Limits::DEFAULT
        }
    );
    let told = webhook(&[
        "--http2-max-concurrent-streams",
        "4",
        "--http2-max-pending-reset-streams",
        "5",
        "--http2-max-local-reset-streams",
        "6",
        "--abuse-backoff",
        "250ms",
    ])
    .expect("valid");
    assert_eq!(
        told.limits,
        Limits {
            http2_max_concurrent_streams: 4,
            http2_max_pending_reset_streams: 5,
            http2_max_local_reset_streams: 6,
            abuse_backoff: Duration::from_millis(250),
            ..Limits::WEBHOOK
        }
    );
    let backoff =
        |value: &str| webhook(&["--abuse-backoff", value]).map(|s| s.limits.abuse_backoff);
    assert_eq!(backoff("0s"), Ok(Duration::ZERO));
    assert_eq!(backoff("1h"), Ok(MAX_ABUSE_BACKOFF));
    assert_eq!(
        backoff("61m").map_err(|e| e.to_string()),
        Err("--abuse-backoff \"61m\": must be at most 1h".to_owned()),
        "the flag, its value and the most"
    );
    let err = run(&["--body-read-timeout", "0s"]).expect_err("zero");
    assert!(err.to_string().starts_with("--body-read-timeout "), "{err}");
    let none = ["hugepage-agent", "run", "--max-connections", "0"];
    assert!(Cli::try_parse_from(none).is_err(), "no connections at all");
}

#[test]
fn a_pod_may_have_256_containers_unless_told() {
    assert_eq!(run(&[]).expect("valid").max_containers, 256);
    let config = run(&["--max-containers", "4000"]).expect("valid");
    assert_eq!(config.max_containers, 4000);
    for max in ["0", "1.5", "many", "10001"] {
        let err = Cli::try_parse_from(["hugepage-agent", "run", "--max-containers", max])
            .expect_err("not a count");
        assert!(
            err.to_string()
                .contains("'--max-containers <MAX_CONTAINERS>'"),
            "{err}"
        );
    }
}

#[test]
fn the_limits_before_authentication_and_the_callers_names_are_read() {
    let told = run(&[
        "--max-handshakes",
        "3",
        "--handshake-timeout",
        "1s",
        "--max-connections-per-peer",
        "2",
    ])
    .expect("valid");
    assert_eq!(
        told.limits,
        Limits {
            max_handshakes: 3,
            handshake_timeout: Duration::from_secs(1),
            max_connections_per_peer: 2,
            ..Limits::DEFAULT
        }
    );
    assert_eq!(told.admit_client_names, ["hugepage-agent-webhook"]);
    let names = run(&["--admit-client-names", "a, b,"]).expect("valid");
    assert_eq!(names.admit_client_names, ["a", "b"]);
    let none = run(&["--admit-client-names", ","]).expect_err("no name");
    assert!(none.to_string().contains("--admit-client-names"), "{none}");

    let hook = webhook(&[
        "--http2-idle-timeout",
        "10s",
        "--client-ca-file",
        "callers.pem",
        "--client-names",
        "kube-apiserver,kube-scheduler",
        "--metrics-listen",
        "127.0.0.1:9821",
    ])
    .expect("valid");
    assert_eq!(hook.limits.http2_idle_timeout, Duration::from_secs(10));
    assert_eq!(hook.limits.max_connections_per_peer, 64);
    assert_eq!(hook.tls.client_ca, Some("callers.pem".into()));
    assert_eq!(
        hook.client_names,
        Some(vec![
            "kube-apiserver".to_owned(),
            "kube-scheduler".to_owned()
        ])
    );
    assert_eq!(hook.metrics_listen, Some(([127, 0, 0, 1], 9821).into()));
}
