//! The running kubelet's command line (`kubeletconfig/cmdline.rs`), as `/proc/<pid>/cmdline`
//! holds it after argv[0]: any bytes, split at NUL into arguments, empty ones dropped (as
//! `discovery.rs` reads them). A line that parses gives settings that resolve, each from the
//! command line, and that printed as the agent shows them and read back as flags are the same;
//! a refusal names the pid and a flag that was given (`has no value`: the last argument).
#![no_main]

#[path = "common/kubelet_settings.rs"]
mod kubelet_settings;

use hugepage_agent::kubeletconfig::{
    cmdline::{self, CmdlineError},
    settings::{KubeletSettings, Source},
};
use libfuzzer_sys::fuzz_target;

const PID: u32 = 4242;

fuzz_target!(|data: &[u8]| {
    let args: Vec<String> = data
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let prefix = format!("the kubelet (pid {PID}) command line: ");
    match cmdline::parse(PID, &args) {
        Ok(line) => {
            let settings = KubeletSettings::resolve(&[&line.layer]);
            let ours = Source::KubeletCmdline { pid: PID };
            let rows_from_line = [
                line.layer.policy.as_ref().map(|s| &s.source),
                line.layer.scope.as_ref().map(|s| &s.source),
                line.layer.options.as_ref().map(|s| &s.source),
                line.layer.memory_manager_policy.as_ref().map(|s| &s.source),
                line.layer.reserved_memory.as_ref().map(|s| &s.source),
                line.layer.system_reserved.as_ref().map(|s| &s.source),
                line.layer.kube_reserved.as_ref().map(|s| &s.source),
            ];
            for source in rows_from_line.into_iter().flatten() {
                assert_eq!(source, &ours);
            }
            for gate in line.layer.gates.values() {
                assert_eq!(gate.source, ours);
            }
            kubelet_settings::round_trip(&settings);
        }
        Err(e) => {
            let message = e.to_string();
            let (flag, expected) = match &e {
                CmdlineError::NoValue { flag, .. } => {
                    assert_eq!(
                        args.last().map(String::as_str),
                        Some(*flag),
                        "{message}: not the last argument"
                    );
                    (*flag, format!("{prefix}{flag} has no value"))
                }
                CmdlineError::Value { source, .. } => {
                    let flag = source.field.as_str();
                    (flag, format!("{prefix}{flag}: {}", source.detail))
                }
            };
            assert_eq!(message, expected, "the message");
            // (Not only before a `--`: a flag's value may be `--` itself, as pflag reads it.)
            let given = args
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")));
            assert!(given, "{message}: {flag} was not given");
        }
    }
});
