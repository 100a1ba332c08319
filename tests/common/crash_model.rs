//! The crash loop's verifier: what the parent knows of every value, from the facts its
//! children reported, and the checks each run's facts must pass.
//!
//! A value's state says what a restart may do with it:
//!
//! | state | how it got there | at the next open |
//! |---|---|---|
//! | `Trying` | `try` seen, `sent` not | may come back |
//! | `Durable` | `sent` seen, or it came back | must come back |
//! | `Acking` | `acking` seen, `acked` not | may come back |
//! | `Undone` | `Done`, then a cut took its done record | may come back |
//! | `Done` | `acked` seen, or missing from a complete recovery | must not come back |
//!
//! A value that may come back and does is `Durable` from then on; one that may and does not,
//! in a recovery reported to its end, is `Done`.

use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};

use crate::crash_child::{body, digest};
use crate::crash_log::{Body, Segment};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Trying,
    Durable,
    Acking,
    Undone,
    Done,
}

/// What the parent knows of one value.
#[derive(Debug)]
struct Val {
    key: u32,
    state: State,
    /// It was `Durable` once: its send record may not be cut, since a torn write only
    /// takes what no wait had seen written.
    kept: bool,
    /// Its deliveries reported, over every run: a delivery's attempt is at most one more.
    delivered: u32,
    /// How many times the log says it was handed out, at least: retry records known to
    /// be written.
    logged: u32,
    /// The same, in the running child's memory.
    handed: u32,
    /// The line of this run's facts that said `try`.
    try_at: usize,
}

/// One run's facts so far.
#[derive(Debug, Default)]
struct Run {
    cycle: u64,
    expect_truncated: u64,
    expect_segments: usize,
    /// `log_recovered`, as the `open` line said.
    opened: Option<u64>,
    recovered: HashSet<u64>,
    rec_keys: HashSet<u32>,
    recdone: bool,
    /// Acknowledgements started: the `acking` line and the values.
    acks: HashMap<u64, (usize, Vec<u64>)>,
    /// Retries not yet known to be written: the `retry` line and the counts they record.
    retries: Vec<(usize, Vec<(u64, u32)>)>,
    /// Values delivered and not retried since.
    flying: HashSet<u64>,
    /// Values delivered in this run.
    delivered: HashSet<u64>,
    /// Per key, the values sent in this run and not yet delivered, in order.
    waiting: HashMap<u32, VecDeque<u64>>,
}

/// Totals for the loop's report.
#[derive(Clone, Debug, Default)]
pub(crate) struct Figures {
    /// Runs whose recovery was reported to its end: every value checked both ways.
    pub(crate) full_checks: u64,
    /// Runs killed before their recovery was all reported: what was reported is checked.
    pub(crate) partial_checks: u64,
    /// Values that came back at an open, checked.
    pub(crate) recovered: u64,
    /// Values delivered while a child ran, checked.
    pub(crate) delivered: u64,
    /// Values the children sent.
    pub(crate) sent: u64,
    /// Values whose acknowledgement resolved.
    pub(crate) acked: u64,
    /// Opens that cut a torn tail and said so.
    pub(crate) truncations: u64,
    /// The most segments an open reported.
    pub(crate) max_segments: usize,
}

/// The verifier.
#[derive(Debug, Default)]
pub(crate) struct Model {
    values: HashMap<u64, Val>,
    /// Values not `Done`.
    live: BTreeSet<u64>,
    run: Run,
    pub(crate) figures: Figures,
    pub(crate) violations: Vec<String>,
}

impl Model {
    /// Starts a run: what its open must report, from the files as the parent left them.
    pub(crate) fn start_run(&mut self, cycle: u64, expect_truncated: u64, segments: usize) {
        self.run = Run {
            cycle,
            expect_truncated,
            expect_segments: segments,
            ..Run::default()
        };
        for id in &self.live {
            let val = self.values.get_mut(id).expect("a live value is known");
            val.handed = val.logged;
        }
    }

    /// Ends a run, once the child is gone.
    pub(crate) fn end_run(&mut self) {
        match self.run.recdone {
            true => self.figures.full_checks += 1,
            false => self.figures.partial_checks += 1,
        }
    }

    /// Whether `HELD` needs a value: none that may be in the log.
    pub(crate) fn needs(&self, key: u32) -> bool {
        !self.live.iter().any(|id| self.values[id].key == key)
    }

    fn violation(&mut self, what: String) {
        self.violations
            .push(format!("cycle {}: {what}", self.run.cycle));
    }

    /// Takes one line of the facts, found at line `at`.
    pub(crate) fn fact(&mut self, at: usize, line: &str) {
        let words: Vec<&str> = line.split(' ').collect();
        let num = |i: usize| -> u64 {
            words
                .get(i)
                .and_then(|w| w.parse().ok())
                .unwrap_or_else(|| panic!("a number in fact {at}: {line:?}"))
        };
        let ids = |from: usize| -> Vec<u64> {
            words[from..]
                .iter()
                .map(|w| w.parse().expect("an id"))
                .collect()
        };
        match words[0] {
            "open" => self.open(num(1), num(2), num(3) as usize),
            "rec" | "got" => {
                let items = words[3..]
                    .iter()
                    .map(|w| {
                        let (id, digest) = w.split_once(':').expect("id:digest");
                        let digest = u64::from_str_radix(digest, 16).expect("a digest");
                        (id.parse().expect("an id"), digest)
                    })
                    .collect();
                let (key, attempt) = (num(1) as u32, num(2) as u32);
                self.delivery(words[0] == "rec", key, attempt, items);
            }
            "recdone" => self.recdone(),
            "try" => self.try_send(at, num(1), num(2) as u32),
            "sent" => self.sent(num(1)),
            "acking" => self.acking(at, num(1), ids(2)),
            "acked" => self.acked(num(1)),
            "retry" => self.retry(at, ids(1)),
            _ => self.violation(format!("the child reported a failure: {line}")),
        }
    }

    fn open(&mut self, truncated: u64, recovered: u64, segments: usize) {
        let run = &self.run;
        let (want_truncated, want_segments) = (run.expect_truncated, run.expect_segments);
        if truncated != want_truncated {
            self.violation(format!(
                "log_truncated_bytes is {truncated}; the newest segment had {want_truncated} bytes after its last whole record"
            ));
        }
        if segments != want_segments {
            self.violation(format!(
                "log_segments is {segments}; the directory had {want_segments}"
            ));
        }
        self.figures.truncations += u64::from(truncated > 0);
        self.figures.max_segments = self.figures.max_segments.max(segments);
        self.run.opened = Some(recovered);
    }

    /// Checks a delivery: `rec`, one taken at once after the open, or `got`, one received
    /// while the child ran.
    fn delivery(&mut self, rec: bool, key: u32, attempt: u32, items: Vec<(u64, u64)>) {
        if rec && !self.run.rec_keys.insert(key) {
            self.violation(format!("key {key} came back in two deliveries"));
        }
        let mut problems = Vec::new();
        let (mut most_delivered, mut most_handed) = (0, (0, 0));
        let mut fresh = Vec::new();
        let mut last = None;
        for &(id, got) in &items {
            if let Some(before) = last.filter(|&before| before >= id) {
                problems.push(format!("key {key}: value {before} came before {id}"));
            }
            last = Some(id);
            let Some(val) = self.values.get_mut(&id) else {
                problems.push(format!("value {id} (key {key}) was never sent"));
                continue;
            };
            if val.key != key {
                problems.push(format!(
                    "value {id} of key {} came under key {key}",
                    val.key
                ));
            }
            if digest(&body(id)) != got {
                problems.push(format!("value {id} (key {key}) came back changed"));
            }
            match val.state {
                State::Done => problems.push(format!(
                    "value {id} (key {key}) came back, but its acknowledgement had resolved (or a complete recovery had not had it)"
                )),
                State::Acking if !rec => problems.push(format!(
                    "value {id} (key {key}) was delivered again while being acknowledged"
                )),
                _ => {}
            }
            if !self.run.flying.insert(id) {
                problems.push(format!(
                    "value {id} (key {key}) was delivered again without a retry"
                ));
            }
            most_delivered = most_delivered.max(val.delivered);
            most_handed = most_handed.max((val.handed, id));
            val.delivered += 1;
            if rec {
                val.state = State::Durable;
                val.kept = true;
                self.live.insert(id);
                self.run.recovered.insert(id);
            } else if !self.run.delivered.contains(&id) {
                fresh.push(id);
            }
            self.run.delivered.insert(id);
        }
        if !rec {
            let waiting = self.run.waiting.entry(key).or_default();
            let next: Vec<u64> = waiting.iter().take(fresh.len()).copied().collect();
            if next != fresh {
                problems.push(format!(
                    "key {key}: delivered {fresh:?} for the first time, but the values sent first were {next:?}"
                ));
            }
            waiting.retain(|id| !fresh.contains(id));
        }
        if attempt > most_delivered + 1 {
            problems.push(format!(
                "key {key}: attempt {attempt}, but its values were delivered at most {most_delivered} times before"
            ));
        }
        if attempt < most_handed.0 + 1 {
            let (handed, id) = most_handed;
            problems.push(format!(
                "key {key}: attempt {attempt}, but value {id} was handed out {handed} times before, as a retry record known to be written says"
            ));
        }
        for problem in problems {
            self.violation(problem);
        }
        match rec {
            true => self.figures.recovered += items.len() as u64,
            false => self.figures.delivered += items.len() as u64,
        }
    }

    /// Every value was reported: each that had to come back did, and each that may have
    /// and did not is gone for good.
    fn recdone(&mut self) {
        self.run.recdone = true;
        let reported = self.run.recovered.len() as u64;
        if self.run.opened != Some(reported) {
            let opened = self.run.opened;
            self.violation(format!(
                "log_recovered is {opened:?}, but {reported} values came back"
            ));
        }
        let mut lost = Vec::new();
        let mut gone = Vec::new();
        for &id in &self.live {
            if self.run.recovered.contains(&id) {
                continue;
            }
            let val = &self.values[&id];
            match val.state {
                State::Durable => lost.push((id, val.key)),
                _ => gone.push(id),
            }
        }
        for id in gone {
            self.values.get_mut(&id).expect("known").state = State::Done;
            self.live.remove(&id);
        }
        for (id, key) in lost {
            self.violation(format!(
                "value {id} (key {key}) did not come back: its send had returned (or it had come back before) and no acknowledgement was made"
            ));
        }
    }

    fn try_send(&mut self, at: usize, id: u64, key: u32) {
        let val = Val {
            key,
            state: State::Trying,
            kept: false,
            delivered: 0,
            logged: 0,
            handed: 0,
            try_at: at,
        };
        if self.values.insert(id, val).is_some() {
            panic!("the loop gave id {id} twice");
        }
        self.live.insert(id);
        self.run.waiting.entry(key).or_default().push_back(id);
    }

    fn sent(&mut self, id: u64) {
        let val = self.values.get_mut(&id).expect("`sent` follows `try`");
        if val.state == State::Trying {
            val.state = State::Durable;
            val.kept = true;
        }
        let try_at = val.try_at;
        self.figures.sent += 1;
        self.written_before(try_at);
    }

    fn acking(&mut self, at: usize, token: u64, ids: Vec<u64>) {
        for id in &ids {
            let val = self.values.get_mut(id).expect("a delivered value is known");
            if val.state != State::Done {
                val.state = State::Acking;
            }
        }
        self.run.acks.insert(token, (at, ids));
    }

    fn acked(&mut self, token: u64) {
        let (at, ids) = self
            .run
            .acks
            .remove(&token)
            .expect("`acked` follows `acking`");
        for id in &ids {
            self.values.get_mut(id).expect("known").state = State::Done;
            self.live.remove(id);
        }
        self.figures.acked += ids.len() as u64;
        self.written_before(at);
    }

    fn retry(&mut self, at: usize, ids: Vec<u64>) {
        let counts = ids
            .iter()
            .map(|id| {
                self.run.flying.remove(id);
                let val = self.values.get_mut(id).expect("a delivered value is known");
                val.handed += 1;
                (*id, val.handed)
            })
            .collect();
        self.run.retries.push((at, counts));
    }

    /// Something appended after line `at` was written (a send returned, or an
    /// acknowledgement resolved): the log writes in order, so every retry reported before
    /// that line is written too.
    fn written_before(&mut self, at: usize) {
        let values = &mut self.values;
        self.run.retries.retain(|(line, counts)| {
            if *line >= at {
                return true;
            }
            for (id, count) in counts {
                let val = values.get_mut(id).expect("known");
                val.logged = val.logged.max(*count);
            }
            false
        });
    }

    /// Where the newest segment may be cut: after every record that was synced. Two kinds
    /// are known to be: the send record of a value that was ever known to be in the log
    /// (see the module docs of the test), with all before it; and a copy-forward's write (the
    /// moved values' retry record, then the copies) whose source segment is gone, since the
    /// journal syncs the copy before it deletes the source. A copy is a send record whose
    /// sequence number is below one named before it.
    pub(crate) fn cut_floor(&self, segments: &[Segment]) -> u64 {
        let Some((newest, older)) = segments.split_last() else {
            return 0;
        };
        let older = older.iter().flat_map(|s| &s.records);
        let elsewhere: HashSet<u64> = older
            .clone()
            .filter_map(|r| match r.body {
                Body::Send { seq, .. } => Some(seq),
                _ => None,
            })
            .collect();
        let mut highest = older.filter_map(|r| r.body.highest()).max();
        let (mut floor, mut after_copy) = (0, false);
        for record in &newest.records {
            match record.body {
                Body::Send { seq, id } => {
                    let kept = self.values.get(&id).is_some_and(|v| v.kept);
                    let copy = highest.is_some_and(|h| seq < h) && !elsewhere.contains(&seq);
                    if kept || copy {
                        floor = record.end;
                    }
                    after_copy = copy;
                }
                Body::Retry(_) if after_copy => {
                    floor = record.end;
                    after_copy = false;
                }
                _ => after_copy = false,
            }
            highest = highest.max(record.body.highest());
        }
        floor
    }

    /// A cut took the records `gone`, and left `after`: a value whose done record went may
    /// come back, and a value whose retry record went is counted as the records left say.
    pub(crate) fn cut(&mut self, gone: &[Body], id_of: &HashMap<u64, u64>, after: &[Segment]) {
        let mut left: HashMap<u64, u32> = HashMap::new();
        for record in after.iter().flat_map(|s| &s.records) {
            if let Body::Retry(pairs) = &record.body {
                for &(seq, count) in pairs {
                    let most = left.entry(seq).or_default();
                    *most = count.max(*most);
                }
            }
        }
        for body in gone {
            match body {
                Body::Send { .. } => {}
                Body::Done(seqs) => {
                    for id in seqs.iter().filter_map(|seq| id_of.get(seq)) {
                        let Some(val) = self.values.get_mut(id) else {
                            continue;
                        };
                        if val.state == State::Done {
                            val.state = State::Undone;
                            self.live.insert(*id);
                        }
                    }
                }
                Body::Retry(pairs) => {
                    for (seq, _) in pairs {
                        let Some(val) = id_of.get(seq).and_then(|id| self.values.get_mut(id))
                        else {
                            continue;
                        };
                        val.logged = val.logged.min(left.get(seq).copied().unwrap_or(0));
                    }
                }
            }
        }
    }
}
