//! `crescent events tail`: follows a master's KV event stream (`crescent master --kv-events`) and prints one line
//! per event, for a person watching what the cache stores and drops (or, with `--json`, one JSON object per
//! event for a script).

use anyhow::{Context, Result, bail};
use rmpv::Value;
use std::io::Write;
use zeromq::{Socket, SocketRecv};

/// `crescent events ...`.
#[derive(clap::Subcommand, Debug)]
pub enum EventsCommand {
    /// Print the KV event stream as it comes (stops after --count events, or on Ctrl-C). Until the publisher is
    /// up it waits, as a ZMQ subscriber does (it connects whenever the endpoint answers).
    Tail(TailArgs),
}

/// `crescent events tail`.
#[derive(clap::Args, Debug)]
pub struct TailArgs {
    /// The stream's endpoint (the master's --kv-events; `/kv_events/status` shows the one it bound).
    #[arg(long, value_name = "tcp://HOST:PORT", default_value = "tcp://127.0.0.1:5557")]
    endpoint: String,
    /// Stop after this many events (default: follow until interrupted).
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// One JSON object per event (its fields, with the message sequence as `seq`).
    #[arg(long)]
    json: bool,
    /// Count instead of printing: one line a second with events and messages received and messages missed
    /// (events are not decoded: the cheapest subscriber, for measuring the stream).
    #[arg(long, conflicts_with = "json")]
    stats: bool,
}

/// Runs `crescent events`.
pub async fn run(cmd: EventsCommand) -> Result<()> {
    match cmd {
        EventsCommand::Tail(a) => tail(a).await,
    }
}

async fn tail(a: TailArgs) -> Result<()> {
    check_endpoint(&a.endpoint)?;
    let mut sub = zeromq::SubSocket::new();
    sub.connect(&a.endpoint).await.with_context(|| format!("cannot connect to {}", a.endpoint))?;
    sub.subscribe("").await.context("cannot subscribe")?;
    if a.stats {
        return stats(&mut sub, a.count).await;
    }
    let mut out = std::io::stdout().lock();
    let mut seen = 0u64;
    let mut last: Option<u64> = None;
    while a.count.is_none_or(|n| seen < n) {
        let frames = sub.recv().await.context("the stream ended")?.into_vec();
        let Some((seq, events)) = decode(&frames) else {
            eprintln!("crescent events: a message not in the KV event format was skipped");
            continue;
        };
        if let Some(prev) = last
            && seq > prev + 1
        {
            eprintln!("crescent events: {} message(s) missed (sequence {} after {prev})", seq - prev - 1, seq);
        }
        last = Some(seq);
        for e in &events {
            let line = if a.json { json_line(seq, e) } else { human_line(seq, e) };
            writeln!(out, "{line}")?;
            seen += 1;
            if a.count.is_some_and(|n| seen >= n) {
                break;
            }
        }
        out.flush()?;
    }
    Ok(())
}

/// `--stats`: counts events (read off each payload's array header only), messages and gaps, a line a second.
async fn stats(sub: &mut zeromq::SubSocket, count: Option<u64>) -> Result<()> {
    let (mut events, mut messages, mut missed) = (0u64, 0u64, 0u64);
    let mut last: Option<u64> = None;
    let mut tick = tokio::time::interval(std::time::Duration::from_secs(1));
    tick.tick().await;
    let mut out = std::io::stdout().lock();
    while count.is_none_or(|n| events < n) {
        tokio::select! {
            m = sub.recv() => {
                let frames = m.context("the stream ended")?.into_vec();
                let Some((seq, n)) = header(&frames) else { continue };
                if let Some(prev) = last && seq > prev + 1 {
                    missed += seq - prev - 1;
                }
                last = Some(seq);
                messages += 1;
                events += n;
            }
            _ = tick.tick() => {
                writeln!(out, "events {events} messages {messages} missed {missed}")?;
                out.flush()?;
            }
        }
    }
    writeln!(out, "events {events} messages {messages} missed {missed}")?;
    Ok(())
}

/// A message's sequence and event count, read off the payload's array headers.
fn header(frames: &[bytes::Bytes]) -> Option<(u64, u64)> {
    let [_, seq, payload] = frames else { return None };
    let seq = u64::from_be_bytes(seq.as_ref().try_into().ok()?);
    let mut rd = payload.as_ref();
    if rmp::decode::read_array_len(&mut rd).ok()? != 3 {
        return None;
    }
    let _timestamp: i64 = rmp::decode::read_int(&mut rd).ok()?;
    Some((seq, u64::from(rmp::decode::read_array_len(&mut rd).ok()?)))
}

/// The sequence and events of one message (`[topic, sequence, payload]`), or `None` if it is not one.
fn decode(frames: &[bytes::Bytes]) -> Option<(u64, Vec<Value>)> {
    let [_, seq, payload] = frames else { return None };
    let seq = u64::from_be_bytes(seq.as_ref().try_into().ok()?);
    let root = rmpv::decode::read_value(&mut payload.as_ref()).ok()?;
    let events = root.as_array()?.get(1)?.as_array()?.clone();
    Some((seq, events))
}

fn field<'a>(e: &'a Value, name: &str) -> Option<&'a Value> {
    e.as_map()?.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v)
}

fn text<'a>(e: &'a Value, name: &str) -> &'a str {
    field(e, name).and_then(Value::as_str).unwrap_or("")
}

/// `#SEQ id=ID stored KEY tenant=T size=N on=SEG(tier),...` or `#SEQ id=ID removed KEY tenant=T cause=C`.
fn human_line(seq: u64, e: &Value) -> String {
    let id = field(e, "event_id").and_then(Value::as_u64).unwrap_or(0);
    let kind = text(e, "event_type");
    let mut line = format!("#{seq} id={id} {kind} {} tenant={}", text(e, "object_key"), text(e, "tenant_id"));
    if kind == "stored" {
        let size = field(e, "size").and_then(Value::as_u64).unwrap_or(0);
        let on: Vec<String> = field(e, "replicas")
            .and_then(Value::as_array)
            .map(|rs| rs.iter().map(|r| format!("{}({})", text(r, "segment"), text(r, "tier"))).collect())
            .unwrap_or_default();
        line.push_str(&format!(" size={size} on={}", on.join(",")));
    } else {
        line.push_str(&format!(" cause={} medium={}", text(e, "cause"), text(e, "medium")));
    }
    if let Some(g) = field(e, "group_id").and_then(Value::as_str) {
        line.push_str(&format!(" group={g}"));
    }
    line
}

fn json_line(seq: u64, e: &Value) -> String {
    let mut obj = to_json(e);
    if let serde_json::Value::Object(m) = &mut obj {
        m.insert("seq".into(), seq.into());
    }
    obj.to_string()
}

fn to_json(v: &Value) -> serde_json::Value {
    match v {
        Value::Nil => serde_json::Value::Null,
        Value::Boolean(b) => (*b).into(),
        Value::Integer(i) => {
            i.as_u64().map_or_else(|| i.as_i64().map_or(serde_json::Value::Null, Into::into), Into::into)
        }
        Value::F32(f) => serde_json::Value::from(f64::from(*f)),
        Value::F64(f) => serde_json::Value::from(*f),
        Value::String(s) => s.as_str().map_or(serde_json::Value::Null, Into::into),
        Value::Binary(b) => b.iter().map(|x| serde_json::Value::from(*x)).collect(),
        Value::Array(a) => a.iter().map(to_json).collect(),
        Value::Map(m) => serde_json::Value::Object(
            m.iter().filter_map(|(k, v)| Some((k.as_str()?.to_owned(), to_json(v)))).collect(),
        ),
        Value::Ext(..) => serde_json::Value::Null,
    }
}

/// Refuses an endpoint the stream cannot be read from before connecting.
pub fn check_endpoint(endpoint: &str) -> Result<()> {
    if !endpoint.starts_with("tcp://") {
        bail!("--endpoint {endpoint:?}: only tcp:// endpoints are served");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(kind: &str) -> Value {
        let mut m = vec![
            (Value::from("event_id"), Value::from(7u64)),
            (Value::from("event_type"), Value::from(kind)),
            (Value::from("object_key"), Value::from("0x2a")),
            (Value::from("tenant_id"), Value::from("default")),
            (Value::from("group_id"), Value::Nil),
            (Value::from("medium"), Value::from("cpu")),
        ];
        if kind == "stored" {
            m.push((Value::from("size"), Value::from(10u64)));
            let r = Value::Map(vec![
                (Value::from("segment"), Value::from("n1")),
                (Value::from("tier"), Value::from("memory")),
            ]);
            m.push((Value::from("replicas"), Value::Array(vec![r])));
        } else {
            m.push((Value::from("cause"), Value::from("evicted")));
        }
        Value::Map(m)
    }

    #[test]
    fn events_print_as_one_line_each() {
        assert_eq!(human_line(3, &event("stored")), "#3 id=7 stored 0x2a tenant=default size=10 on=n1(memory)");
        assert_eq!(human_line(4, &event("removed")), "#4 id=7 removed 0x2a tenant=default cause=evicted medium=cpu");
        let j: serde_json::Value = serde_json::from_str(&json_line(4, &event("removed"))).unwrap_or_default();
        assert_eq!((j["seq"].as_u64(), j["cause"].as_str(), j["group_id"].is_null()), (Some(4), Some("evicted"), true));
        let mut payload = Vec::new();
        rmpv::encode::write_value(
            &mut payload,
            &Value::Array(vec![Value::from(1u64), Value::Array(vec![event("stored")]), Value::from(0u64)]),
        )
        .unwrap_or_default();
        let frames = [bytes::Bytes::new(), bytes::Bytes::copy_from_slice(&9u64.to_be_bytes()), payload.into()];
        let (seq, events) = decode(&frames).unwrap_or_default();
        assert_eq!((seq, events.len()), (9, 1));
        assert!(decode(&frames[..2]).is_none());
        assert_eq!(header(&frames), Some((9, 1)));
        assert!(check_endpoint("ipc:///x").is_err() && check_endpoint("tcp://h:1").is_ok());
    }
}
