//! What the runtime did, when: spans of its work, recorded while tracing
//! is on ([`Runtime::start_tracing`]), exported as a Chrome/Perfetto trace
//! (JSON trace events, one track per thread) and summarized
//! ([`TraceSummary`]).
//!
//! Spans: `record` (one recorded op), `sync` (a caller waiting for a
//! materialization), `materialize` (nodes, subgraph size), `lower`,
//! `cache lookup` (tier: plan, memory, disk, remote, or miss, and the
//! module's bytes), `compile` (inside a miss), `kernel jit` (a host kernel
//! compiled for this process), `h2d` and `d2h` (bytes), `execute`
//! (transposes and their bytes), `bucket` (length, bucket, padding bytes)
//! and `collective` (an all-reduce, all-gather or reduce-scatter in the
//! program that ran). Off, a span costs one relaxed atomic load.
//!
//! ```no_run
//! # fn main() -> Result<(), graph::RuntimeError> {
//! use graph::Runtime;
//! let rt = Runtime::cpu()?;
//! rt.start_tracing();
//! let x = rt.tensor(&kernel_ir::Array::zeros(kernel_ir::DType::F32, [4, 4]))?;
//! x.exp()?.to_host()?;
//! let trace = rt.stop_tracing();
//! std::fs::write("trace.json", trace.to_chrome_json()).unwrap(); // open in ui.perfetto.dev
//! println!("{}", trace.summary());
//! # Ok(()) }
//! ```

use kernel_ir::quote::json_str;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// One span of work on one thread.
#[derive(Clone, Debug, PartialEq)]
pub struct Span {
    /// What (`lower`, `execute`, ...).
    pub name: &'static str,
    /// Start, µs since tracing started.
    pub start_us: f64,
    /// Duration, µs.
    pub dur_us: f64,
    /// The thread's track.
    pub track: u64,
    /// Details (`tier`, `bytes`, `length`, ...).
    pub args: Vec<(&'static str, String)>,
}

/// The spans recorded between [`Runtime::start_tracing`](super::Runtime::start_tracing) and
/// [`Runtime::stop_tracing`](super::Runtime::stop_tracing), with each track's thread name.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Trace {
    /// Every span, in the order they ended.
    pub spans: Vec<Span>,
    /// Track id → thread name.
    pub tracks: BTreeMap<u64, String>,
    /// Spans dropped past [`MAX_SPANS`].
    pub dropped: u64,
}

/// Spans kept at most; later ones are dropped and counted, so a trace
/// left on cannot grow without bound.
pub const MAX_SPANS: usize = 1_000_000;

struct Log {
    /// When tracing started: span times are relative to it.
    epoch: Instant,
    spans: Vec<Span>,
    tracks: BTreeMap<u64, String>,
    dropped: u64,
}

impl Log {
    fn new() -> Log {
        Log {
            epoch: Instant::now(),
            spans: Vec::new(),
            tracks: BTreeMap::new(),
            dropped: 0,
        }
    }
}

/// The recorder a runtime holds.
pub(crate) struct Tracer {
    on: AtomicBool,
    log: Mutex<Log>,
}

static NEXT_TRACK: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static TRACK: u64 = NEXT_TRACK.fetch_add(1, Ordering::Relaxed);
}

/// A span in progress; recorded when dropped (or [`Guard::end`]).
pub(crate) struct Guard<'a> {
    tracer: &'a Tracer,
    name: &'static str,
    start: Instant,
    args: Vec<(&'static str, String)>,
}

impl Guard<'_> {
    /// Adds a detail.
    pub fn arg(&mut self, k: &'static str, v: impl fmt::Display) {
        self.args.push((k, v.to_string()));
    }
}

impl Drop for Guard<'_> {
    fn drop(&mut self) {
        let end = Instant::now();
        self.tracer
            .push(self.name, self.start, end, std::mem::take(&mut self.args));
    }
}

impl Tracer {
    pub fn new() -> Tracer {
        Tracer {
            on: AtomicBool::new(false),
            log: Mutex::new(Log::new()),
        }
    }

    pub fn is_on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    pub fn start(&self) {
        *self.log.lock().unwrap_or_else(|p| p.into_inner()) = Log::new();
        self.on.store(true, Ordering::SeqCst);
    }

    pub fn stop(&self) -> Trace {
        self.on.store(false, Ordering::SeqCst);
        let log = std::mem::replace(
            &mut *self.log.lock().unwrap_or_else(|p| p.into_inner()),
            Log::new(),
        );
        Trace {
            spans: log.spans,
            tracks: log.tracks,
            dropped: log.dropped,
        }
    }

    /// A span from now until the guard drops, if tracing is on.
    pub fn span(&self, name: &'static str) -> Option<Guard<'_>> {
        self.is_on().then(|| Guard {
            tracer: self,
            name,
            start: Instant::now(),
            args: Vec::new(),
        })
    }

    /// Records a finished span `[start, end]`.
    pub fn push(
        &self,
        name: &'static str,
        start: Instant,
        end: Instant,
        args: Vec<(&'static str, String)>,
    ) {
        if !self.is_on() {
            return;
        }
        let track = TRACK.with(|t| *t);
        let mut log = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let epoch = log.epoch;
        let us = |t: Instant| t.saturating_duration_since(epoch).as_secs_f64() * 1e6;
        if log.spans.len() >= MAX_SPANS {
            log.dropped += 1;
            return;
        }
        log.tracks.entry(track).or_insert_with(|| {
            std::thread::current()
                .name()
                .map(str::to_string)
                .unwrap_or_else(|| format!("thread {track}"))
        });
        log.spans.push(Span {
            name,
            start_us: us(start),
            dur_us: (us(end) - us(start)).max(0.0),
            track,
            args,
        });
    }

    /// Records a span of `dur` that ended now (work timed elsewhere).
    pub fn push_ended(&self, name: &'static str, dur: Duration, args: Vec<(&'static str, String)>) {
        if self.is_on() {
            let end = Instant::now();
            self.push(name, end.checked_sub(dur).unwrap_or(end), end, args);
        }
    }
}

impl Trace {
    /// The trace in Chrome's trace-event format (complete events, `ph:
    /// "X"`, µs; one `tid` per thread with its name as metadata), which
    /// Perfetto and `chrome://tracing` open.
    pub fn to_chrome_json(&self) -> String {
        let mut ev: Vec<String> = self
            .tracks
            .iter()
            .map(|(t, n)| {
                format!(
                    "{{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": 1, \"tid\": {t}, \"args\": {{\"name\": {}}}}}",
                    json_str(n)
                )
            })
            .collect();
        for s in &self.spans {
            let args: Vec<String> = s
                .args
                .iter()
                .map(|(k, v)| format!("{}: {}", json_str(k), json_str(v)))
                .collect();
            ev.push(format!(
                "{{\"name\": {}, \"cat\": \"tessera\", \"ph\": \"X\", \"ts\": {:.3}, \"dur\": {:.3}, \"pid\": 1, \"tid\": {}, \"args\": {{{}}}}}",
                json_str(s.name),
                s.start_us,
                s.dur_us,
                s.track,
                args.join(", ")
            ));
        }
        format!(
            "{{\"displayTimeUnit\": \"ms\", \"traceEvents\": [\n  {}\n]}}\n",
            ev.join(",\n  ")
        )
    }

    fn arg<'a>(s: &'a Span, k: &str) -> Option<&'a str> {
        s.args
            .iter()
            .find(|(n, _)| *n == k)
            .map(|(_, v)| v.as_str())
    }

    fn num(s: &Span, k: &str) -> u64 {
        Trace::arg(s, k).and_then(|v| v.parse().ok()).unwrap_or(0)
    }

    /// The totals the spans add up to.
    pub fn summary(&self) -> TraceSummary {
        let mut t = TraceSummary::default();
        // Materializations per track, to tell their scalar uploads from
        // the caller's own.
        let mats: Vec<(u64, f64, f64)> = self
            .spans
            .iter()
            .filter(|s| s.name == "materialize")
            .map(|s| (s.track, s.start_us, s.start_us + s.dur_us))
            .collect();
        let inside = |s: &Span| {
            mats.iter()
                .any(|&(t, a, b)| t == s.track && s.start_us >= a && s.start_us + s.dur_us <= b)
        };
        for s in &self.spans {
            match s.name {
                "cache lookup" => {
                    let tier = Trace::arg(s, "tier").unwrap_or("?").to_string();
                    *t.lookups.entry(tier).or_default() += 1;
                }
                "compile" => t.compile_us += s.dur_us,
                "kernel jit" => t.kernel_jit_us += s.dur_us,
                "h2d" => {
                    t.bytes_to_device += Trace::num(s, "bytes");
                    t.transfer_us += s.dur_us;
                    if inside(s) {
                        t.transfer_in_materialize_us += s.dur_us;
                    }
                }
                "d2h" => {
                    t.bytes_to_host += Trace::num(s, "bytes");
                    t.transfer_us += s.dur_us;
                }
                "execute" => {
                    t.execute_us += s.dur_us;
                    t.executions += 1;
                    t.transposes += Trace::num(s, "transposes");
                    t.transpose_bytes += Trace::num(s, "transpose_bytes");
                }
                "bucket" => {
                    let b = Trace::num(s, "bucket") as usize;
                    let e = t.buckets.entry(b).or_default();
                    e.0 += 1;
                    t.padding_bytes += Trace::num(s, "padding_bytes");
                    t.padded_bytes += Trace::num(s, "bytes");
                }
                "lower" => t.lower_us += s.dur_us,
                "materialize" => t.materialize_us += s.dur_us,
                "record" => {
                    t.records += 1;
                    t.record_us += s.dur_us;
                }
                "collective" => t.collectives += 1,
                _ => {}
            }
        }
        t
    }
}

/// What a trace adds up to.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TraceSummary {
    /// Compile-cache look-ups per tier (`plan`: the structural fast path,
    /// `memory`, `disk`, `remote`, `miss`: compiled).
    pub lookups: BTreeMap<String, u64>,
    /// Inputs per bucket size: (count).
    pub buckets: BTreeMap<usize, (u64,)>,
    /// Padding added to reach bucket sizes, bytes.
    pub padding_bytes: u64,
    /// Bytes of the padded uploads.
    pub padded_bytes: u64,
    /// Layout transposes the executions implied, and their bytes.
    pub transposes: u64,
    /// Their bytes.
    pub transpose_bytes: u64,
    /// Host → device bytes.
    pub bytes_to_device: u64,
    /// Device → host bytes.
    pub bytes_to_host: u64,
    /// Programs executed.
    pub executions: u64,
    /// Collectives in the programs executed.
    pub collectives: u64,
    /// Ops recorded.
    pub records: u64,
    /// Time compiling (µs).
    pub compile_us: f64,
    /// Time compiling host kernels (µs).
    pub kernel_jit_us: f64,
    /// Time in transfers (µs).
    pub transfer_us: f64,
    /// The part of it inside materializations (scalar parameters).
    pub transfer_in_materialize_us: f64,
    /// Time executing (µs).
    pub execute_us: f64,
    /// Time lowering (µs).
    pub lower_us: f64,
    /// Time in materializations, all of it (µs).
    pub materialize_us: f64,
    /// Time recording ops (µs).
    pub record_us: f64,
}

impl TraceSummary {
    /// Look-ups that did not compile, over all.
    pub fn hit_rate(&self) -> f64 {
        let all: u64 = self.lookups.values().sum();
        let miss = self.lookups.get("miss").copied().unwrap_or(0);
        if all == 0 {
            0.0
        } else {
            (all - miss) as f64 / all as f64
        }
    }

    /// Time in the runtime on the host: materializations outside
    /// compiling, transfers and executing (lowering, fingerprints, cache
    /// look-ups, binding), plus recording (µs).
    pub fn host_us(&self) -> f64 {
        (self.materialize_us
            - self.compile_us
            - self.kernel_jit_us
            - self.execute_us
            - self.transfer_in_materialize_us)
            .max(0.0)
            + self.record_us
    }
}

impl fmt::Display for TraceSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let all: u64 = self.lookups.values().sum();
        writeln!(
            f,
            "compile cache: {all} look-ups, hit rate {:.1}%",
            100.0 * self.hit_rate()
        )?;
        for (tier, n) in &self.lookups {
            writeln!(
                f,
                "  {tier:<8} {n:>6} ({:.1}%)",
                100.0 * *n as f64 / all.max(1) as f64
            )?;
        }
        let inputs: u64 = self.buckets.values().map(|b| b.0).sum();
        writeln!(
            f,
            "buckets: {inputs} padded inputs, padding {} of {} bytes ({:.1}%)",
            self.padding_bytes,
            self.padded_bytes,
            100.0 * self.padding_bytes as f64 / self.padded_bytes.max(1) as f64
        )?;
        for (b, (n,)) in &self.buckets {
            writeln!(f, "  {b:>8} {n:>6}")?;
        }
        writeln!(
            f,
            "transposes: {} ({} bytes)",
            self.transposes, self.transpose_bytes
        )?;
        writeln!(
            f,
            "bytes: {} to the device, {} to the host",
            self.bytes_to_device, self.bytes_to_host
        )?;
        writeln!(
            f,
            "programs executed: {}; collectives in them: {}",
            self.executions, self.collectives
        )?;
        let total = self.compile_us
            + self.kernel_jit_us
            + self.transfer_us
            + self.execute_us
            + self.host_us();
        let pct = |x: f64| 100.0 * x / total.max(1e-9);
        writeln!(
            f,
            "time: compile {:.1} ms ({:.0}%), kernel JIT {:.1} ms ({:.0}%), transfer {:.1} ms ({:.0}%), execute {:.1} ms ({:.0}%), host {:.1} ms ({:.0}%)",
            self.compile_us / 1e3,
            pct(self.compile_us),
            self.kernel_jit_us / 1e3,
            pct(self.kernel_jit_us),
            self.transfer_us / 1e3,
            pct(self.transfer_us),
            self.execute_us / 1e3,
            pct(self.execute_us),
            self.host_us() / 1e3,
            pct(self.host_us())
        )
    }
}
