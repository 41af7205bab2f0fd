//! `pasa-bench`: reproducible PASA scale scenarios. Each mode prints human-readable lines, then
//! one JSON summary as its last line.

#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

mod agent;
mod clusters;
mod embedded;
mod fake_tikv;
mod fixture;
mod kube_sync;
mod matching;
mod seed;
mod stats;
mod status;
mod translate;
mod write;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "pasa-bench",
    version,
    about = "Reproducible PASA scale scenarios"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Event fan-out: subscribers of an object by the rule index versus brute force.
    Match(matching::MatchArgs),
    /// Durable write throughput of the store on sled.
    Write(write::WriteArgs),
    /// The agent's translation of one proxy's scope: full, then one change at a time.
    Translate(translate::TranslateArgs),
    /// The store's proxy-status table: agents' reports and `proxy-status` listings.
    Status(status::StatusArgs),
    /// What the agent costs beside a real Envoy it runs: memory and CPU, idle and under changes.
    Agent(agent::AgentArgs),
    /// The seed's scenario: a whole mesh of services and pods on the store, every pod
    /// subscribed, then a batch of DestinationRule updates.
    Seed(seed::SeedArgs),
    /// The Kubernetes syncer at mesh scale: a fake API server's cluster into the real store.
    KubeSync(kube_sync::KubeSyncArgs),
    /// A fake of PD and TiKV, in memory, for trying store replicas by hand (prints its PD
    /// address; stops on Ctrl-C).
    FakeTikv(fake_tikv::FakeTikvArgs),
    /// One agent's translations timed in a process of its own (what `seed` runs for A1).
    #[command(hide = true)]
    TranslateScope(seed::single::ScopeArgs),
    /// The application `seed`'s O1 runs beside an Envoy: calls each service it is given.
    #[command(hide = true)]
    ProbeCalls(seed::on_demand::ProbeArgs),
}

fn main() -> anyhow::Result<()> {
    let summary = match Cli::parse().command {
        Command::Match(args) => matching::run(&args)?,
        Command::Write(args) => write::run(&args)?,
        Command::Translate(args) => translate::run(&args)?,
        Command::Status(args) => status::run(&args)?,
        Command::Agent(args) => agent::run(&args)?,
        Command::Seed(args) => seed::run(&args)?,
        Command::KubeSync(args) => kube_sync::run(&args)?,
        Command::FakeTikv(args) => fake_tikv::run(&args)?,
        Command::TranslateScope(args) => seed::single::translate_scope(&args)?,
        Command::ProbeCalls(args) => seed::on_demand::probe_calls(&args)?,
    };
    println!("{summary}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        super::Cli::command().debug_assert();
    }

    #[test]
    fn defaults() {
        use clap::Parser;
        let cli = super::Cli::try_parse_from([
            "pasa-bench",
            "match",
            "--subscriptions",
            "10",
            "--objects",
            "5",
        ])
        .unwrap();
        let super::Command::Match(args) = cli.command else {
            panic!("not match")
        };
        assert_eq!((args.samples, args.namespaces, args.seed), (2000, None, 42));
        let cli = super::Cli::try_parse_from(["pasa-bench", "write"]).unwrap();
        let super::Command::Write(args) = cli.command else {
            panic!("not write")
        };
        assert_eq!(
            (args.resources, args.batch, args.concurrency),
            (100_000, 100, 1)
        );
        assert!(args.data_dir.is_none());
    }
}
