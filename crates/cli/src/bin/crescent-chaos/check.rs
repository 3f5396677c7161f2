//! The history checker. Every get that returned bytes is judged against the writes and removals around it:
//!
//! * **torn**: the bytes are not a whole value of the key (header, key, length, crc32c), or carry a write id
//!   no put or upsert of that key issued, or one whose put-if-absent found the key taken (never written), or
//!   one whose write began only after the get had completed;
//! * **resurrected**: the value's write was acknowledged before an acknowledged removal of the key (a removal
//!   of it, answered ok or "not found", or an rm-all that removed everything, or left objects but none that can
//!   be this key's: no write of it may have been in progress, and, when it left leased objects, no read of it
//!   began within a lease before it) was invoked, and the get was invoked after that removal completed;
//! * **stale**: the value's write was acknowledged before another acknowledged write of the key was invoked, and
//!   the get was invoked after that one completed;
//! * **panic**: a server log says `panicked`.
//!
//! A write that failed or whose outcome is unknown may or may not have been applied: it never makes a read
//! illegal, and a read of its value is legal at any time after it was invoked. Misses are always legal (a cache
//! may lose what it holds): they are counted, not judged.

use crate::history::{Kind, Op, Outcome};
use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

/// What rule a get broke, with the operations that show it.
#[derive(Debug, Clone, PartialEq)]
pub enum Violation {
    /// Bytes that are not a value written to this key.
    Torn {
        /// The get.
        get: Op,
        /// Why.
        why: String,
        /// The write its id names, if any.
        write: Option<Op>,
    },
    /// A value whose write was acknowledged before an acknowledged removal the get followed.
    Resurrected {
        /// The get.
        get: Op,
        /// The write of the value it returned.
        write: Op,
        /// The removal it followed.
        removal: Op,
    },
    /// A value whose write was acknowledged before an acknowledged overwrite the get followed.
    Stale {
        /// The get.
        get: Op,
        /// The write of the value it returned.
        write: Op,
        /// The later write it followed.
        newer: Op,
    },
    /// A server panicked.
    Panic {
        /// The log file.
        file: String,
        /// The line.
        line: String,
    },
    /// The history itself is malformed (a write id issued twice).
    Malformed(String),
}

impl Violation {
    /// The violation's kind, as the summary counts it.
    pub fn name(&self) -> &'static str {
        match self {
            Violation::Torn { .. } => "torn",
            Violation::Resurrected { .. } => "resurrected",
            Violation::Stale { .. } => "stale",
            Violation::Panic { .. } => "panic",
            Violation::Malformed(_) => "malformed",
        }
    }

    /// The violation with the history lines that show it.
    pub fn describe(&self) -> String {
        let j = |op: &Op| serde_json::to_string(op).unwrap_or_default();
        match self {
            Violation::Torn { get, why, write } => {
                let w = write.as_ref().map(|w| format!("\n    write:   {}", j(w))).unwrap_or_default();
                format!("torn: {why}\n    get:     {}{w}", j(get))
            }
            Violation::Resurrected { get, write, removal } => format!(
                "resurrected: a value acknowledged before an acknowledged removal was read after it\n    write:   {}\n    removal: {}\n    get:     {}",
                j(write),
                j(removal),
                j(get)
            ),
            Violation::Stale { get, write, newer } => format!(
                "stale: a value acknowledged before an acknowledged overwrite was read after it\n    write:   {}\n    newer:   {}\n    get:     {}",
                j(write),
                j(newer),
                j(get)
            ),
            Violation::Panic { file, line } => format!("panic in {file}: {line}"),
            Violation::Malformed(why) => format!("malformed history: {why}"),
        }
    }
}

/// Acknowledged events of one key that end a value's life: their `(t0, t1)` sorted by `t0`, with the minimum
/// `t1` of every suffix, so "is there one invoked after `a` and completed before `b`" is one binary search.
#[derive(Default)]
struct Fences {
    spans: Vec<(u64, u64, usize)>,
    suffix_min_t1: Vec<u64>,
}

impl Fences {
    fn build(mut spans: Vec<(u64, u64, usize)>) -> Fences {
        spans.sort_unstable();
        let mut suffix_min_t1 = vec![u64::MAX; spans.len() + 1];
        for i in (0..spans.len()).rev() {
            suffix_min_t1[i] = suffix_min_t1[i + 1].min(spans[i].1);
        }
        Fences { spans, suffix_min_t1 }
    }

    /// The index (into the history) of one fence invoked after `after` and completed before `before`.
    fn between(&self, after: u64, before: u64, skip: Option<usize>) -> Option<usize> {
        let start = self.spans.partition_point(|s| s.0 <= after);
        if self.suffix_min_t1[start] >= before {
            return None;
        }
        self.spans[start..].iter().find(|s| s.1 < before && Some(s.2) != skip).map(|s| s.2)
    }
}

/// What the checker found.
#[derive(Debug, Default)]
pub struct Report {
    /// Operations by kind and outcome.
    pub outcomes: BTreeMap<(Kind, Outcome), u64>,
    /// Failed or unknown operations by kind and error code.
    pub codes: BTreeMap<(Kind, String), u64>,
    /// Gets that returned a value, and of those how many were checked against a removal or overwrite.
    pub gets_checked: u64,
    /// Gets of the final sweep and what they found.
    pub sweep: BTreeMap<Outcome, u64>,
    /// rm-alls that left objects (they fence only the keys no write could have been in progress on).
    pub partial_rm_alls: u64,
    /// Misses of a key whose last change was an acknowledged write, nothing else on the key since it began
    /// (the write was lost, or evicted: both allowed).
    pub lost_writes: u64,
    /// The violations found.
    pub violations: Vec<Violation>,
    /// The history's span, in ns.
    pub span_ns: u64,
}

impl Report {
    /// Violations by kind.
    pub fn by_kind(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for v in &self.violations {
            *m.entry(v.name()).or_default() += 1;
        }
        m
    }

    /// The summary, with the first few violations of each kind.
    pub fn summary(&self) -> String {
        let mut s = String::new();
        let total: u64 = self.outcomes.values().sum();
        let _ = writeln!(s, "history: {total} operations over {:.1} s", self.span_ns as f64 / 1e9);
        let mut kinds: BTreeMap<Kind, Vec<(Outcome, u64)>> = BTreeMap::new();
        for ((k, o), n) in &self.outcomes {
            kinds.entry(*k).or_default().push((*o, *n));
        }
        for (k, os) in kinds {
            let parts: Vec<String> = os.iter().map(|(o, n)| format!("{} {n}", name(*o))).collect();
            let _ = writeln!(s, "  {:<7} {}", format!("{k:?}").to_lowercase(), parts.join(", "));
        }
        if !self.codes.is_empty() {
            let parts: Vec<String> =
                self.codes.iter().map(|((k, c), n)| format!("{} {c} {n}", format!("{k:?}").to_lowercase())).collect();
            let _ = writeln!(s, "  errors: {}", parts.join(", "));
        }
        let sweep: Vec<String> = self.sweep.iter().map(|(o, n)| format!("{} {n}", name(*o))).collect();
        let _ = writeln!(s, "  final sweep gets: {}", if sweep.is_empty() { "none".into() } else { sweep.join(", ") });
        let _ = writeln!(s, "  gets with a value checked: {}", self.gets_checked);
        let _ = writeln!(s, "  rm-alls that left objects: {}", self.partial_rm_alls);
        let _ = writeln!(
            s,
            "  misses right after an acknowledged write, nothing else on the key (lost or evicted): {}",
            self.lost_writes
        );
        let kinds = self.by_kind();
        let parts: Vec<String> = kinds.iter().map(|(k, n)| format!("{k} {n}")).collect();
        let _ = writeln!(
            s,
            "violations: {}{}",
            self.violations.len(),
            if parts.is_empty() { String::new() } else { format!(" ({})", parts.join(", ")) }
        );
        let mut shown: BTreeMap<&str, usize> = BTreeMap::new();
        for v in &self.violations {
            let n = shown.entry(v.name()).or_default();
            *n += 1;
            if *n <= 5 {
                let _ = writeln!(s, "  {}", v.describe());
            }
        }
        s
    }
}

fn name(o: Outcome) -> &'static str {
    match o {
        Outcome::Ok => "ok",
        Outcome::Existed => "existed",
        Outcome::Missing => "missing",
        Outcome::Failed => "failed",
        Outcome::Unknown => "unknown",
    }
}

/// Checks a history (the operations of every client, in any order).
pub fn check(ops: &[Op]) -> Report {
    let mut r = Report::default();
    let (mut first, mut last) = (u64::MAX, 0);
    let mut writes: HashMap<u64, usize> = HashMap::new();
    // Per key: acknowledged writes, acknowledged removals, and every write (for rm-alls that left objects).
    let mut acked: HashMap<&str, Vec<(u64, u64, usize)>> = HashMap::new();
    let mut removals: HashMap<&str, Vec<(u64, u64, usize)>> = HashMap::new();
    let mut writes_of: HashMap<&str, Vec<usize>> = HashMap::new();
    let mut rm_alls = Vec::new();
    for (i, op) in ops.iter().enumerate() {
        *r.outcomes.entry((op.kind, op.outcome)).or_default() += 1;
        if let Some(code) = &op.code {
            *r.codes.entry((op.kind, code.clone())).or_default() += 1;
        }
        if op.sweep {
            *r.sweep.entry(op.outcome).or_default() += 1;
        }
        first = first.min(op.t0);
        last = last.max(op.t1);
        let key = op.key.as_deref().unwrap_or("");
        match op.kind {
            Kind::Put | Kind::Upsert => {
                if let Some(wid) = op.wid
                    && let Some(prev) = writes.insert(wid, i)
                {
                    r.violations.push(Violation::Malformed(format!(
                        "write id {wid} issued twice: {:?} and {:?}",
                        ops[prev], op
                    )));
                }
                writes_of.entry(key).or_default().push(i);
                if op.outcome == Outcome::Ok {
                    acked.entry(key).or_default().push((op.t0, op.t1, i));
                }
            }
            Kind::Remove if matches!(op.outcome, Outcome::Ok | Outcome::Missing) => {
                removals.entry(key).or_default().push((op.t0, op.t1, i));
            }
            Kind::RmAll if op.outcome == Outcome::Ok => rm_alls.push(i),
            Kind::Get | Kind::Remove | Kind::RmAll => {}
        }
    }
    r.span_ns = last.saturating_sub(first.min(last));
    // An rm-all fences every key, except (when it left objects) the keys a write may have been in progress on,
    // and (when it left leased objects) the keys read within a lease before it.
    let mut reads_of: HashMap<&str, Vec<u64>> = HashMap::new();
    for op in ops.iter().filter(|op| op.kind == Kind::Get && op.outcome != Outcome::Missing) {
        reads_of.entry(op.key.as_deref().unwrap_or("")).or_default().push(op.t0);
    }
    reads_of.values_mut().for_each(|v| v.sort_unstable());
    let keys: Vec<&str> = writes_of.keys().copied().collect();
    for &i in &rm_alls {
        let rm = &ops[i];
        let partial = rm.left.unwrap_or(0) > 0;
        let leased = partial && rm.leased.is_none_or(|n| n > 0);
        r.partial_rm_alls += u64::from(partial);
        for &k in &keys {
            let writing = partial
                && writes_of[k].iter().any(|&w| {
                    let w = &ops[w];
                    w.t0 < rm.t1 && (w.t1 > rm.t0 || !matches!(w.outcome, Outcome::Ok | Outcome::Existed))
                });
            let read = leased
                && rm.lease_ms.is_none_or(|lease| {
                    // A read's lease starts when the master answers it, after it began; a second of slack.
                    let since = rm.t0.saturating_sub((lease + 1000) * 1_000_000);
                    let reads = reads_of.get(k).map(Vec::as_slice).unwrap_or_default();
                    let from = reads.partition_point(|&t| t < since);
                    reads.get(from).is_some_and(|&t| t < rm.t1)
                });
            if !writing && !read {
                removals.entry(k).or_default().push((rm.t0, rm.t1, i));
            }
        }
    }
    r.lost_writes = lost_writes(ops, &writes_of, &rm_alls);
    let removals: HashMap<&str, Fences> = removals.into_iter().map(|(k, v)| (k, Fences::build(v))).collect();
    let acked: HashMap<&str, Fences> = acked.into_iter().map(|(k, v)| (k, Fences::build(v))).collect();
    let none = Fences::build(Vec::new());
    for get in ops.iter().filter(|op| op.kind == Kind::Get && op.outcome == Outcome::Ok) {
        let key = get.key.as_deref().unwrap_or("");
        let torn = |why: String, write: Option<&Op>| Violation::Torn { get: get.clone(), why, write: write.cloned() };
        if let Some(why) = &get.torn {
            r.violations.push(torn(why.clone(), None));
            continue;
        }
        let Some(wid) = get.got else {
            r.violations.push(torn("a get answered ok without a value".into(), None));
            continue;
        };
        let Some(&wi) = writes.get(&wid) else {
            r.violations.push(torn(format!("write id {wid} was never issued"), None));
            continue;
        };
        let write = &ops[wi];
        if write.key.as_deref() != Some(key) {
            r.violations.push(torn(format!("write id {wid} was issued for another key"), Some(write)));
            continue;
        }
        if write.outcome == Outcome::Existed {
            r.violations.push(torn(format!("write {wid} found the key taken and wrote nothing"), Some(write)));
            continue;
        }
        if write.t0 > get.t1 {
            r.violations.push(torn(format!("write {wid} began after the get completed"), Some(write)));
            continue;
        }
        r.gets_checked += 1;
        if write.outcome != Outcome::Ok {
            // Possibly applied at any time after it began: nothing fences it.
            continue;
        }
        if let Some(ri) = removals.get(key).unwrap_or(&none).between(write.t1, get.t0, None) {
            r.violations.push(Violation::Resurrected {
                get: get.clone(),
                write: write.clone(),
                removal: ops[ri].clone(),
            });
        } else if let Some(ni) = acked.get(key).unwrap_or(&none).between(write.t1, get.t0, Some(wi)) {
            r.violations.push(Violation::Stale { get: get.clone(), write: write.clone(), newer: ops[ni].clone() });
        }
    }
    r
}

/// Misses whose key's last change before them was an acknowledged write that began after every earlier change
/// of the key ended and completed before the get began: the cache lost or evicted an acknowledged value.
fn lost_writes(ops: &[Op], writes_of: &HashMap<&str, Vec<usize>>, rm_alls: &[usize]) -> u64 {
    // Every change of each key (writes, removals and rm-alls of any outcome), sorted by invocation.
    let mut changes: HashMap<&str, Vec<usize>> =
        writes_of.iter().map(|(k, v)| (*k, v.iter().chain(rm_alls).copied().collect())).collect();
    let all_rm_alls: Vec<usize> = (0..ops.len()).filter(|&i| ops[i].kind == Kind::RmAll).collect();
    for (i, op) in ops.iter().enumerate() {
        if op.kind == Kind::Remove {
            changes.entry(op.key.as_deref().unwrap_or("")).or_default().push(i);
        }
    }
    let mut misses: HashMap<&str, Vec<&Op>> = HashMap::new();
    for get in ops.iter().filter(|g| g.kind == Kind::Get && g.outcome == Outcome::Missing) {
        misses.entry(get.key.as_deref().unwrap_or("")).or_default().push(get);
    }
    let mut lost = 0;
    for (key, mut list) in changes {
        let Some(misses) = misses.get(key) else { continue };
        list.extend(all_rm_alls.iter().filter(|i| !rm_alls.contains(i)));
        list.sort_unstable_by_key(|&i| (ops[i].t0, i));
        list.dedup();
        // The latest completion among the changes before each position.
        let mut max_t1_before = Vec::with_capacity(list.len());
        let mut m = None;
        for &i in &list {
            max_t1_before.push(m);
            m = m.max(Some(ops[i].t1));
        }
        for get in misses {
            let j = list.partition_point(|&i| ops[i].t0 < get.t1);
            let Some(last) = j.checked_sub(1) else { continue };
            let w = &ops[list[last]];
            if matches!(w.kind, Kind::Put | Kind::Upsert)
                && w.outcome == Outcome::Ok
                && w.t1 < get.t0
                && max_t1_before[last].is_none_or(|m| m < w.t0)
            {
                lost += 1;
            }
        }
    }
    lost
}

/// Adds a `Panic` violation for every line saying `panicked` in the files of `dir` (server logs).
pub fn scan_logs(dir: &std::path::Path, report: &mut Report) -> anyhow::Result<usize> {
    let mut files = 0;
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if !path.is_file() {
            continue;
        }
        files += 1;
        let bytes = std::fs::read(&path)?;
        for line in String::from_utf8_lossy(&bytes).lines().filter(|l| l.contains("panicked")) {
            report.violations.push(Violation::Panic { file: path.display().to_string(), line: line.to_owned() });
        }
    }
    Ok(files)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn op(kind: Kind, key: &str, t0: u64, t1: u64, outcome: Outcome) -> Op {
        let mut o = Op::new(0, kind, Some(key), t0);
        o.t1 = t1;
        o.outcome = outcome;
        o
    }
    fn write(kind: Kind, key: &str, wid: u64, t0: u64, t1: u64, outcome: Outcome) -> Op {
        let mut o = op(kind, key, t0, t1, outcome);
        o.wid = Some(wid);
        o
    }
    fn put(key: &str, wid: u64, t0: u64, t1: u64) -> Op {
        write(Kind::Put, key, wid, t0, t1, Outcome::Ok)
    }
    fn upsert(key: &str, wid: u64, t0: u64, t1: u64) -> Op {
        write(Kind::Upsert, key, wid, t0, t1, Outcome::Ok)
    }
    fn get(key: &str, got: u64, t0: u64, t1: u64) -> Op {
        let mut o = op(Kind::Get, key, t0, t1, Outcome::Ok);
        o.got = Some(got);
        o
    }
    fn remove(key: &str, t0: u64, t1: u64) -> Op {
        op(Kind::Remove, key, t0, t1, Outcome::Ok)
    }
    fn rm_all(t0: u64, t1: u64, left: u64) -> Op {
        let mut o = Op::new(0, Kind::RmAll, None, t0);
        o.t1 = t1;
        o.left = Some(left);
        o.leased = Some(0);
        o
    }
    /// An rm-all that left `leased` objects held by leases of `lease_ms`.
    fn rm_all_leased(t0: u64, t1: u64, leased: u64, lease_ms: Option<u64>) -> Op {
        let mut o = rm_all(t0, t1, leased);
        o.leased = Some(leased);
        o.lease_ms = lease_ms;
        o
    }
    fn kinds(ops: &[Op]) -> Vec<&'static str> {
        check(ops).violations.iter().map(Violation::name).collect()
    }

    #[test]
    fn legal_concurrent_histories_pass() {
        let legal = [
            // A read overlapping a removal may see the value or miss.
            vec![put("a", 1, 0, 10), remove("a", 20, 30), get("a", 1, 25, 40)],
            // A read overlapping an overwrite may see either value.
            vec![put("a", 1, 0, 10), upsert("a", 2, 20, 30), get("a", 1, 25, 35), get("a", 2, 26, 36)],
            // A write concurrent with the removal may survive it.
            vec![put("a", 1, 5, 25), remove("a", 20, 30), get("a", 1, 40, 50)],
            // A write whose outcome is unknown may be applied, even after later removals and writes.
            vec![
                write(Kind::Upsert, "a", 1, 0, 10, Outcome::Unknown),
                remove("a", 20, 30),
                upsert("a", 2, 40, 50),
                get("a", 1, 60, 70),
            ],
            // A failed write likewise.
            vec![write(Kind::Put, "a", 1, 0, 10, Outcome::Failed), rm_all(20, 30, 0), get("a", 1, 60, 70)],
            // Removals and overwrites of another key fence nothing here.
            vec![put("a", 1, 0, 10), remove("b", 20, 30), upsert("b", 2, 40, 50), get("a", 1, 60, 70)],
            // A read that began before the removal completed.
            vec![put("a", 1, 0, 10), remove("a", 20, 30), get("a", 1, 29, 70)],
            // An rm-all that left objects does not fence a key a write was in progress on.
            vec![put("a", 1, 0, 10), upsert("a", 2, 15, 25), rm_all(20, 30, 1), get("a", 2, 40, 50)],
            vec![
                put("a", 1, 0, 10),
                write(Kind::Upsert, "a", 2, 12, 14, Outcome::Unknown),
                rm_all(20, 30, 1),
                get("a", 1, 40, 50),
            ],
            // An rm-all that left leased objects does not fence a key read within a lease before it (ms here).
            vec![put("a", 1, 0, 10), get("a", 1, 15, 16), rm_all_leased(20, 30, 1, Some(0)), get("a", 1, 40, 50)],
            vec![put("a", 1, 0, 10), rm_all_leased(20, 30, 1, None), get("a", 1, 40, 50)],
            // The value's own write, read after it.
            vec![upsert("a", 1, 0, 10), upsert("a", 2, 20, 30), upsert("a", 3, 40, 50), get("a", 3, 60, 70)],
        ];
        for (i, h) in legal.iter().enumerate() {
            let r = check(h);
            assert!(r.violations.is_empty(), "history {i}: {}", r.summary());
        }
    }

    #[test]
    fn each_violation_is_found() {
        // Torn or foreign bytes.
        let mut bad = get("a", 1, 20, 30);
        bad.got = None;
        bad.torn = Some("payload crc32c differs".into());
        assert_eq!(kinds(&[put("a", 1, 0, 10), bad]), ["torn"]);
        assert_eq!(kinds(&[put("a", 1, 0, 10), get("a", 9, 20, 30)]), ["torn"], "never issued");
        assert_eq!(kinds(&[put("b", 1, 0, 10), get("a", 1, 20, 30)]), ["torn"], "another key's write");
        assert_eq!(
            kinds(&[put("a", 1, 0, 10), write(Kind::Put, "a", 2, 5, 8, Outcome::Existed), get("a", 2, 20, 30)]),
            ["torn"],
            "a put-if-absent that wrote nothing"
        );
        assert_eq!(kinds(&[get("a", 1, 0, 10), put("a", 1, 20, 30)]), ["torn"], "read before written");
        // Resurrection after a removal, a "not found" removal, and an rm-all.
        assert_eq!(kinds(&[put("a", 1, 0, 10), remove("a", 20, 30), get("a", 1, 40, 50)]), ["resurrected"]);
        let absent = op(Kind::Remove, "a", 20, 30, Outcome::Missing);
        assert_eq!(kinds(&[put("a", 1, 0, 10), absent, get("a", 1, 40, 50)]), ["resurrected"]);
        assert_eq!(kinds(&[upsert("a", 1, 0, 10), rm_all(20, 30, 0), get("a", 1, 40, 50)]), ["resurrected"]);
        // An rm-all that left objects still fences a key no write was in progress on.
        assert_eq!(
            kinds(&[put("a", 1, 0, 10), upsert("b", 2, 15, 25), rm_all(20, 30, 1), get("a", 1, 40, 50)]),
            ["resurrected"]
        );
        // An rm-all that left leased objects still fences a key not read within a lease before it.
        let ms = 1_000_000;
        assert_eq!(
            kinds(&[
                put("a", 1, 0, 10),
                get("a", 1, 12, 14),
                rm_all_leased(20 + 3000 * ms, 21 + 3000 * ms, 1, Some(1000)),
                get("a", 1, 22 + 3000 * ms, 23 + 3000 * ms)
            ]),
            ["resurrected"]
        );
        // A failed removal fences nothing.
        let failed = op(Kind::Remove, "a", 20, 30, Outcome::Failed);
        assert_eq!(kinds(&[put("a", 1, 0, 10), failed, get("a", 1, 40, 50)]), Vec::<&str>::new());
        // Stale after an overwrite, by upsert or by a put that stored.
        assert_eq!(kinds(&[put("a", 1, 0, 10), upsert("a", 2, 20, 30), get("a", 1, 40, 50)]), ["stale"]);
        assert_eq!(
            kinds(&[
                put("a", 1, 0, 10),
                remove("a", 11, 12),
                put("a", 2, 20, 30),
                get("a", 2, 35, 36),
                get("a", 1, 40, 50)
            ]),
            ["resurrected"],
            "the removal is named first"
        );
        assert_eq!(
            kinds(&[upsert("a", 1, 0, 10), upsert("a", 2, 20, 30), upsert("a", 3, 31, 32), get("a", 2, 40, 50)]),
            ["stale"]
        );
        // The history's own errors.
        assert_eq!(kinds(&[put("a", 1, 0, 10), put("a", 1, 20, 30)]), ["malformed"]);
    }

    #[test]
    fn the_report_shows_the_lines_and_counts_outcomes() {
        let mut miss = op(Kind::Get, "a", 60, 70, Outcome::Missing);
        miss.sweep = true;
        let mut refused = write(Kind::Upsert, "a", 3, 60, 70, Outcome::Failed);
        refused.code = Some("PERSISTENT_FAIL".into());
        let r = check(&[put("a", 1, 0, 10), remove("a", 20, 30), get("a", 1, 40, 50), miss, refused]);
        assert_eq!(r.lost_writes, 0, "the miss followed a removal and overlaps a write");
        assert_eq!(r.outcomes[&(Kind::Get, Outcome::Missing)], 1);
        assert_eq!(r.codes[&(Kind::Upsert, "PERSISTENT_FAIL".to_owned())], 1);
        assert_eq!(r.sweep[&Outcome::Missing], 1);
        let s = r.summary();
        assert!(s.contains("violations: 1 (resurrected 1)"), "{s}");
        assert!(s.contains("\"kind\":\"remove\""), "{s}");
    }

    #[test]
    fn misses_of_acknowledged_writes_are_counted() {
        let miss = |t0, t1| op(Kind::Get, "a", t0, t1, Outcome::Missing);
        // Lost: the last change was an acknowledged write, alone on the key.
        assert_eq!(check(&[put("a", 1, 0, 10), miss(20, 30)]).lost_writes, 1);
        assert_eq!(check(&[remove("a", 0, 5), upsert("a", 1, 6, 10), miss(20, 30)]).lost_writes, 1);
        // Not lost: a removal, a concurrent change, a failed write, or a get overlapping the write.
        assert_eq!(check(&[put("a", 1, 0, 10), remove("a", 12, 14), miss(20, 30)]).lost_writes, 0);
        assert_eq!(check(&[put("a", 1, 0, 10), rm_all(12, 14, 0), miss(20, 30)]).lost_writes, 0);
        assert_eq!(check(&[remove("a", 0, 8), put("a", 1, 5, 10), miss(20, 30)]).lost_writes, 0);
        let failed = write(Kind::Upsert, "a", 1, 0, 10, Outcome::Failed);
        assert_eq!(check(&[failed, miss(20, 30)]).lost_writes, 0);
        assert_eq!(check(&[put("a", 1, 0, 10), miss(5, 30)]).lost_writes, 0);
        assert_eq!(check(&[put("b", 1, 0, 10), miss(20, 30)]).lost_writes, 0);
    }

    #[test]
    fn panics_in_server_logs_are_violations() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("master-0.log"), "INFO ok\nthread 'tokio' panicked at src/x.rs:1:2\n").unwrap();
        std::fs::write(dir.path().join("node-0.log"), "INFO fine\n").unwrap();
        let mut r = check(&[]);
        assert_eq!(scan_logs(dir.path(), &mut r).unwrap(), 2);
        assert_eq!(r.by_kind()["panic"], 1);
    }
}
