//! The `hugepage-agent` binary: parse and validate the command line, set up telemetry, run the
//! command, and map its outcome to an exit code (0 done, 1 failed, 2 bad input).

use std::process::ExitCode;

use clap::Parser;
use hugepage_agent::{
    check,
    config::{Cli, Command, Config},
    doctor, footprint, holders, run, status, telemetry, webhook, whatif,
};

fn main() -> ExitCode {
    if let Err(err) = footprint::disable_transparent_huge_pages() {
        eprintln!("hugepage-agent: cannot turn transparent huge pages off for itself: {err}");
    }
    if !footprint::one_malloc_arena() {
        eprintln!("hugepage-agent: glibc refused M_ARENA_MAX 1: each thread may take an arena");
    }
    let config = match Config::try_from(Cli::parse()) {
        Ok(config) => config,
        Err(err) => {
            eprintln!("hugepage-agent: {err}");
            return ExitCode::from(2);
        }
    };
    let telemetry = match telemetry::init(config.log_format, &config.traces) {
        Ok(telemetry) => telemetry,
        Err(err) => {
            eprintln!("hugepage-agent: {err}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = match config.command {
        Command::Run(ref run) => run::run(run, telemetry.export_stats.clone()).map_err(|e| {
            // The agent's log is where an operator looks first; stderr below is for the shell.
            tracing::error!("{e}");
            e.to_string()
        }),
        Command::Status {
            ref host,
            json,
            ref from,
        } => status::print(host, from.as_ref(), json).map_err(|e| e.to_string()),
        Command::Holders {
            ref host,
            json,
            ref from,
        } => holders::view::print(host, from.as_ref(), json).map_err(|e| e.to_string()),
        Command::Check(ref check) => return check::run(check),
        Command::Hints {
            ref state,
            ref pod,
            ref container,
            scope,
            gates,
        } => {
            return match whatif::hints(state, pod, container.as_deref(), scope, gates) {
                Ok(answer) => {
                    if let Some(note) = answer.note {
                        eprintln!("hugepage-agent: {note}");
                    }
                    println!("{}", whatif::hints_json(&answer.hints));
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("hugepage-agent: {err}");
                    ExitCode::from(2)
                }
            };
        }
        Command::Webhook(ref settings) => webhook::run(settings, telemetry.export_stats.clone())
            .map_err(|e| {
                tracing::error!("{e}");
                e.to_string()
            }),
        Command::Doctor(ref settings) => {
            return match doctor::run(settings) {
                Ok(findings) => {
                    if settings.json {
                        println!("{}", doctor::finding::json(&findings));
                    } else {
                        print!("{}", doctor::finding::lines(&findings));
                    }
                    if doctor::finding::any_wrong(&findings) {
                        ExitCode::FAILURE
                    } else {
                        ExitCode::SUCCESS
                    }
                }
                Err(err) => {
                    eprintln!("hugepage-agent: {err}");
                    ExitCode::FAILURE
                }
            };
        }
        Command::Merge { ref input } => {
            return match whatif::merge_file(input) {
                Ok(line) => {
                    println!("{line}");
                    ExitCode::SUCCESS
                }
                Err(err) => {
                    eprintln!("hugepage-agent: {err}");
                    ExitCode::from(2)
                }
            };
        }
    };
    // After the API has drained: the spans of the last requests are queued by now.
    telemetry.shutdown();
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("hugepage-agent: {err}");
            ExitCode::FAILURE
        }
    }
}
