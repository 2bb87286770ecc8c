//! Commands that read the store: `nodes list`, `status`, `events`.

use std::collections::BTreeMap;

use anyhow::Result;
use clap::Args;
use nodeipam_host::config::Config;
use nodeipam_host::store::{NodeRecord, NodeState, SCHEMA_VERSION};
use serde_json::json;

use super::{Output, open_store, table};

#[derive(Debug, Args)]
pub struct OutputArgs {
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t)]
    output: Output,
}

#[derive(Debug, Args)]
pub struct EventsArgs {
    /// Only this node's events.
    #[arg(long)]
    node: Option<String>,
    /// The newest N events (0: all).
    #[arg(long, default_value_t = 50)]
    limit: usize,
    #[command(flatten)]
    output: OutputArgs,
}

pub fn list(config: &Config, args: &OutputArgs) -> Result<()> {
    let store = open_store(config)?;
    let records = store.records()?;
    match args.output {
        Output::Json => {
            let items: Vec<_> = records.iter().map(record_json).collect();
            println!("{}", serde_json::to_string_pretty(&items)?);
        }
        Output::Table => {
            let rows: Vec<Vec<String>> = records
                .iter()
                .map(|r| {
                    vec![
                        r.node.name.clone(),
                        dash(&r.node.pod_cidrs.join(",")),
                        dash(&r.alias.join(",")),
                        if r.network_unavailable { "no" } else { "yes" }.to_owned(),
                        r.state().label().to_owned(),
                        dash(r.node.provider_id.as_deref().unwrap_or_default()),
                    ]
                })
                .collect();
            table::print(
                &[
                    "NAME",
                    "POD CIDRS",
                    "ALIAS",
                    "NETWORK",
                    "STATE",
                    "PROVIDER ID",
                ],
                &rows,
            );
        }
    }
    Ok(())
}

pub fn status(config: &Config, args: &OutputArgs) -> Result<()> {
    let store = open_store(config)?;
    let records = store.records()?;
    let events = store.event_count()?;
    let mut states: BTreeMap<NodeState, usize> = BTreeMap::new();
    for r in &records {
        *states.entry(r.state()).or_default() += 1;
    }
    let usage = config.usage(records.iter().map(|r| &r.node));
    let orphans = config.orphans(records.iter().map(|r| &r.node));
    match args.output {
        Output::Json => {
            let states: BTreeMap<_, _> = states.iter().map(|(s, n)| (s.label(), n)).collect();
            let usage: Vec<_> = usage
                .iter()
                .map(|(c, used, max)| {
                    json!({"cidr": c.cidr.to_string(), "nodeMaskSize": c.node_mask_size, "used": used, "max": max})
                })
                .collect();
            let value = json!({
                "store": store.path(),
                "schemaVersion": SCHEMA_VERSION,
                "mode": config.mode.to_string(),
                "nodes": records.len(),
                "states": states,
                "clusterCIDRs": usage,
                "rangesOutsideClusterCIDRs": orphans.len(),
                "events": events,
            });
            println!("{}", serde_json::to_string_pretty(&value)?);
        }
        Output::Table => {
            println!(
                "store:  {} (schema {SCHEMA_VERSION})",
                store.path().display()
            );
            println!("config: {}, mode {}", config.origin(), config.mode);
            println!("nodes:  {}", records.len());
            for (state, n) in &states {
                println!("  {:<20} {n}", format!("{}:", state.label()));
            }
            if !orphans.is_empty() {
                println!("  {:<20} {}", "outside cluster CIDRs:", orphans.len());
            }
            println!("events: {events}");
            println!();
            let rows: Vec<Vec<String>> = usage
                .iter()
                .map(|(c, used, max)| {
                    vec![
                        c.cidr.to_string(),
                        format!("/{}", c.node_mask_size),
                        used.to_string(),
                        max.to_string(),
                        percent(*used, *max),
                    ]
                })
                .collect();
            table::print(
                &["CLUSTER CIDR", "NODE MASK", "USED", "MAX", "USAGE"],
                &rows,
            );
        }
    }
    Ok(())
}

pub fn events(config: &Config, args: &EventsArgs) -> Result<()> {
    let store = open_store(config)?;
    let events = store.events(args.node.as_deref(), args.limit)?;
    match args.output.output {
        Output::Json => println!("{}", serde_json::to_string_pretty(&events)?),
        Output::Table => {
            let rows: Vec<Vec<String>> = events
                .iter()
                .map(|e| {
                    vec![
                        format_time(e.time_ms),
                        e.node.clone(),
                        e.reason.clone(),
                        e.message.clone(),
                    ]
                })
                .collect();
            table::print(&["TIME (UTC)", "NODE", "REASON", "MESSAGE"], &rows);
        }
    }
    Ok(())
}

fn record_json(r: &NodeRecord) -> serde_json::Value {
    json!({
        "name": r.node.name,
        "providerID": r.node.provider_id,
        "podCIDRs": r.node.pod_cidrs,
        "alias": r.alias,
        "networkUnavailable": r.network_unavailable,
        "state": r.state().label(),
    })
}

fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".to_owned()
    } else {
        s.to_owned()
    }
}

/// `used / max` as a percentage with one decimal.
pub fn percent(used: u64, max: u64) -> String {
    if max == 0 {
        return "-".into();
    }
    let p = used as f64 * 100.0 / max as f64;
    format!("{p:.1}%")
}

/// `YYYY-MM-DD HH:MM:SS` (UTC) of a Unix time in ms.
fn format_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_utc_times() {
        assert_eq!(format_time(0), "1970-01-01 00:00:00");
        assert_eq!(format_time(1_709_210_096_000), "2024-02-29 12:34:56");
    }

    #[test]
    fn percent_has_one_decimal() {
        assert_eq!(percent(1, 3), "33.3%");
        assert_eq!(percent(0, 0), "-");
    }
}
