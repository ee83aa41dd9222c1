//! The `OTEL_*` variables (`telemetry/traces.rs`, `telemetry/export.rs`). Each input line sets
//! one variable, picked by its first byte, to the rest (empty values are unset, as
//! `TraceConfig::from_env` does). Settings that are accepted are usable (sizes and delays above
//! 0, a batch no larger than the queue); a refusal names the variable and its value.
#![no_main]

use std::collections::BTreeMap;

use hugepage_agent::telemetry::traces::TraceConfig;
use libfuzzer_sys::fuzz_target;

const VARS: [&str; 12] = [
    "OTEL_SDK_DISABLED",
    "OTEL_TRACES_EXPORTER",
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_PROTOCOL",
    "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
    "OTEL_SERVICE_NAME",
    "OTEL_BSP_MAX_QUEUE_SIZE",
    "OTEL_BSP_SCHEDULE_DELAY",
    "OTEL_BSP_MAX_EXPORT_BATCH_SIZE",
    "OTEL_BSP_EXPORT_TIMEOUT",
    "NODE_NAME",
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let mut env = BTreeMap::new();
    for line in text.split('\n') {
        let mut chars = line.chars();
        let Some(first) = chars.next() else {
            continue;
        };
        let value = chars.as_str();
        let var = VARS[first as usize % VARS.len()];
        if value.trim().is_empty() {
            env.remove(var);
        } else {
            env.insert(var, value.to_owned());
        }
    }
    match TraceConfig::from_vars(|var| env.get(var).cloned()) {
        Ok(config) => {
            let q = config.queue;
            assert!(
                q.max_queue > 0 && q.max_batch > 0 && q.max_batch <= q.max_queue,
                "{q:?}"
            );
            assert!(!q.delay.is_zero() && !q.timeout.is_zero(), "{q:?}");
            assert!(!config.service_name.is_empty());
        }
        Err(e) => {
            let message = e.to_string();
            let named = env.iter().any(|(var, value)| {
                message.contains(var) && message.contains(&format!("{value:?}"))
            });
            assert!(
                named,
                "{message:?} names no variable set with its value: {env:?}"
            );
        }
    }
});
