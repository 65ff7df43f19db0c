//! `serve --metrics ADDR`: the served array's metrics over HTTP, in the
//! Prometheus/OpenMetrics text format (`GET /metrics`), with the
//! `prometheus-client` crate for the format and `tiny_http` for HTTP.
//!
//! Client requests are counted and timed as they are answered (requests,
//! bytes, errors, latency histograms by operation); everything else
//! (members, capacity, write amplification, repairs, a scrub's progress)
//! is read from the array's status at each scrape, so a scrape costs one
//! `status` and nothing is kept twice.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Instant;

use std::fmt::Write;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use tessera_array::{Array, Status};

/// A client operation, as a label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Cache,
    BlockStatus,
}

impl Op {
    const ALL: [Op; 7] = [
        Op::Read,
        Op::Write,
        Op::Flush,
        Op::Trim,
        Op::WriteZeroes,
        Op::Cache,
        Op::BlockStatus,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write_zeroes",
            Op::Cache => "cache",
            Op::BlockStatus => "block_status",
        }
    }
}

impl EncodeLabelValue for Op {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.name())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: Op,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MemberStateLabels {
    member: u64,
    name: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

type FloatGauge = Gauge<f64, AtomicU64>;

fn latency_histogram() -> Histogram {
    // 10 us to about 10 s.
    Histogram::new(exponential_buckets(10e-6, 2.0, 21))
}

pub struct Metrics {
    registry: Registry,
    requests: Family<OpLabels, Counter>,
    errors: Family<OpLabels, Counter>,
    bytes: Family<OpLabels, Counter>,
    latency: Family<OpLabels, Histogram, fn() -> Histogram>,
    member_state: Family<MemberStateLabels, Gauge>,
    member_errors: Family<KindMemberLabels, Gauge>,
    stripes: Family<KindLabels, Gauge>,
    capacity: Family<KindLabels, Gauge>,
    write_amplification: FloatGauge,
    compression_ratio: FloatGauge,
    repairs: Family<KindLabels, Gauge>,
    written: Family<KindLabels, Gauge>,
    checkpoints: Family<KindLabels, Gauge>,
    map: Family<KindLabels, Gauge>,
    scrub: Family<KindLabels, Gauge>,
    rebuild: Family<KindMemberLabels, Gauge>,
    kv_records: Family<SpaceLabels, Gauge>,
    kv_phase: Family<SpaceLabels, Gauge>,
    kv_work: Family<SpaceLabels, Gauge>,
    kv_cache: Family<KindLabels, Gauge>,
    /// The KV spaces, when `serve --kv` serves them.
    kv: std::sync::OnceLock<Arc<tessera_kv::Store>>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SpaceLabels {
    space: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindMemberLabels {
    member: u64,
    kind: &'static str,
}

impl Metrics {
    pub fn new() -> Metrics {
        let mut registry = Registry::with_prefix("tessera");
        let requests = Family::<OpLabels, Counter>::default();
        registry.register("client_requests", "Client requests answered", requests.clone());
        let errors = Family::<OpLabels, Counter>::default();
        registry.register(
            "client_errors",
            "Client requests answered with an error",
            errors.clone(),
        );
        // Served at 0 from the start, so that a rate or an alert over
        // them reads 0, not nothing, before the first error.
        for op in Op::ALL {
            errors.get_or_create(&OpLabels { op }).inc_by(0);
        }
        let bytes = Family::<OpLabels, Counter>::default();
        registry.register("client_bytes", "Bytes client requests covered", bytes.clone());
        let latency = Family::<OpLabels, Histogram, fn() -> Histogram>::new_with_constructor(latency_histogram);
        registry.register(
            "client_latency_seconds",
            "Time the array took to carry out a request",
            latency.clone(),
        );
        let member_state = Family::<MemberStateLabels, Gauge>::default();
        registry.register(
            "member_state",
            "1 for each member's state (healthy, failed, missing, rebuilding)",
            member_state.clone(),
        );
        let member_errors = Family::<KindMemberLabels, Gauge>::default();
        registry.register(
            "member_errors",
            "Errors on each member since the server started, by kind (read, write, checksum) and chunks repaired",
            member_errors.clone(),
        );
        let stripes = Family::<KindLabels, Gauge>::default();
        registry.register("stripes", "Stripe slots: total, used, free, degraded", stripes.clone());
        let capacity = Family::<KindLabels, Gauge>::default();
        registry.register(
            "capacity_bytes",
            "Bytes: raw, usable, logical (exported), mapped, stored",
            capacity.clone(),
        );
        let write_amplification = FloatGauge::default();
        registry.register(
            "write_amplification",
            "Bytes written to members per byte written by clients, since start",
            write_amplification.clone(),
        );
        let compression_ratio = FloatGauge::default();
        registry.register(
            "compression_ratio",
            "Stored bytes per mapped byte",
            compression_ratio.clone(),
        );
        let repairs = Family::<KindLabels, Gauge>::default();
        registry.register(
            "repair_events",
            "Since start: checksum errors, chunks repaired, reads reconstructed, stripes reconstructed, unrecoverable reads",
            repairs.clone(),
        );
        let written = Family::<KindLabels, Gauge>::default();
        registry.register(
            "bytes_written",
            "Since start: bytes clients wrote, bytes written to the members (stripes with parity, log blocks), bytes garbage collection relocated, bytes of map checkpoints written to the members, and what those checkpoints held by part (checkpoint_page_images, checkpoint_page_deltas, checkpoint_directory_pages, checkpoint_directory_page_deltas, checkpoint_slot_pages, checkpoint_slot_page_deltas, checkpoint_roots: stored bytes, before parity; checkpoint_page_images_moved: of the page images, those of clean pages moved out of sparse map stripes)",
            written.clone(),
        );
        let checkpoints = Family::<KindLabels, Gauge>::default();
        registry.register(
            "checkpoints",
            "Since start: map checkpoints written, those of them a root alone, those forced for room, those dropped",
            checkpoints.clone(),
        );
        let map = Family::<KindLabels, Gauge>::default();
        registry.register(
            "map",
            "The map: mappings held in memory and the bytes they take, pages held and changed since the checkpoint, map stripes holding the checkpoint's page images; the map cache's size, pages with an image on the members and their bytes, the map's directory pages and those in memory, lookups that found their pages, pages read in, reads of map stripes that brought them in, pages evicted, pages read for one lookup and not kept; the bytes of memory the slot table takes; the slot pages opening left to read after it that are still unread, and whether one of them cannot be read (1: the next opening reads them all)",
            map.clone(),
        );
        let scrub = Family::<KindLabels, Gauge>::default();
        registry.register(
            "scrub_stripes",
            "The running scrub: stripes total and checked, chunks bad and repaired (absent when none runs)",
            scrub.clone(),
        );
        let rebuild = Family::<KindMemberLabels, Gauge>::default();
        registry.register(
            "rebuild",
            "The running rebuild of a member: stripes total and done, chunks written and kept, bytes written (absent when none runs)",
            rebuild.clone(),
        );
        let kv_records = Family::<SpaceLabels, Gauge>::default();
        registry.register(
            "kv_records",
            "Records of each KV space: inserted, and sorted (once the primary table is built)",
            kv_records.clone(),
        );
        let kv_phase = Family::<SpaceLabels, Gauge>::default();
        registry.register(
            "kv_phase",
            "1 for each KV space's phase (open, sorting, indexing, ready)",
            kv_phase.clone(),
        );
        let kv_work = Family::<SpaceLabels, Gauge>::default();
        registry.register(
            "kv_work_rows",
            "A KV space's deferred work under way: rows done and rows to do in its step (absent when none runs)",
            kv_work.clone(),
        );
        let kv_cache = Family::<KindLabels, Gauge>::default();
        registry.register(
            "kv_cache",
            "The KV batch cache (serve --kv-cache): its budget and the bytes and batches it holds, bytes; batches queries found there and batches they read",
            kv_cache.clone(),
        );
        Metrics {
            kv_records,
            kv_cache,
            kv_phase,
            kv_work,
            kv: std::sync::OnceLock::new(),
            rebuild,
            registry,
            requests,
            errors,
            bytes,
            latency,
            member_state,
            member_errors,
            stripes,
            capacity,
            write_amplification,
            compression_ratio,
            repairs,
            written,
            checkpoints,
            map,
            scrub,
        }
    }

    /// Counts a request of `bytes` that started at `started` and ended
    /// now, `ok` or not.
    pub fn record(&self, op: Op, bytes: u64, started: Instant, ok: bool) {
        let labels = OpLabels { op };
        self.requests.get_or_create(&labels).inc();
        self.bytes.get_or_create(&labels).inc_by(bytes);
        if !ok {
            self.errors.get_or_create(&labels).inc();
        }
        self.latency
            .get_or_create(&labels)
            .observe(started.elapsed().as_secs_f64());
    }

    /// Serves the KV spaces' figures too.
    pub fn set_kv(&self, store: Arc<tessera_kv::Store>) {
        let _ = self.kv.set(store);
    }

    /// The text to answer a scrape with, the array's state read now.
    pub fn scrape(&self, array: &Array) -> Result<String, String> {
        let status = array.status().map_err(|e| e.to_string())?;
        self.update(&status);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.registry).map_err(|e| e.to_string())?;
        Ok(text)
    }

    fn update(&self, s: &Status) {
        self.member_state.clear();
        for m in &s.members {
            let state = m.state.name().to_string();
            let member = m.index as u64;
            let name = m.name.clone();
            self.member_state
                .get_or_create(&MemberStateLabels { member, name, state })
                .set(1);
            for (kind, value) in [
                ("read", m.errors.read_errors),
                ("write", m.errors.write_errors),
                ("checksum", m.errors.checksum_errors),
                ("repaired", m.errors.chunks_repaired),
            ] {
                self.member_errors
                    .get_or_create(&KindMemberLabels { member, kind })
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
        gauge(&self.stripes, "total", s.stripes_total);
        gauge(&self.stripes, "used", s.stripes_used);
        gauge(&self.stripes, "free", s.stripes_free);
        gauge(&self.stripes, "degraded", s.stripes_degraded);
        gauge(&self.capacity, "raw", s.raw_bytes);
        gauge(&self.capacity, "usable", s.usable_bytes);
        gauge(&self.capacity, "logical", s.logical_bytes);
        gauge(&self.capacity, "mapped", s.mapped_bytes);
        gauge(&self.capacity, "stored", s.stored_bytes);
        self.write_amplification.set(s.write_amplification);
        self.compression_ratio.set(s.compression_ratio);
        gauge(&self.repairs, "checksum_errors", s.checksum_errors);
        gauge(&self.repairs, "chunks_repaired", s.chunks_repaired);
        gauge(&self.repairs, "reads_reconstructed", s.reconstructed_reads);
        gauge(&self.repairs, "stripes_reconstructed", s.stripes_reconstructed);
        gauge(&self.repairs, "unrecoverable_reads", s.unrecoverable_reads);
        gauge(&self.written, "client", s.user_bytes_written);
        gauge(&self.written, "members", s.member_bytes_written);
        gauge(&self.written, "gc_relocated", s.gc_bytes_relocated);
        gauge(&self.written, "checkpoint", s.checkpoint_bytes_written);
        let parts = &s.checkpoint_parts;
        gauge(&self.written, "checkpoint_page_images", parts.page_images);
        gauge(&self.written, "checkpoint_page_deltas", parts.page_deltas);
        gauge(&self.written, "checkpoint_page_images_moved", parts.page_images_moved);
        gauge(&self.written, "checkpoint_directory_pages", parts.directory_pages);
        gauge(
            &self.written,
            "checkpoint_directory_page_deltas",
            parts.directory_page_deltas,
        );
        gauge(&self.written, "checkpoint_slot_pages", parts.slot_pages);
        gauge(&self.written, "checkpoint_slot_page_deltas", parts.slot_page_deltas);
        gauge(&self.written, "checkpoint_roots", parts.roots);
        gauge(&self.checkpoints, "written", s.checkpoints_written);
        gauge(&self.checkpoints, "root_only", s.checkpoints_root_only);
        gauge(&self.checkpoints, "forced", s.checkpoints_forced);
        gauge(&self.checkpoints, "dropped", s.checkpoints_dropped);
        gauge(&self.map, "mappings", s.map_mappings);
        gauge(&self.map, "bytes", s.map_bytes);
        gauge(&self.map, "pages", s.map_pages);
        gauge(&self.map, "dirty_pages", s.map_dirty_pages);
        gauge(&self.map, "stripes", s.map_stripes);
        gauge(&self.map, "cache_bytes", s.map_cache_bytes);
        gauge(&self.map, "pages_on_members", s.map_pages_on_members);
        gauge(&self.map, "bytes_on_members", s.map_bytes_on_members);
        gauge(&self.map, "directory_pages", s.map_directory_pages);
        gauge(&self.map, "directory_pages_in_memory", s.map_directory_pages_in_memory);
        gauge(&self.map, "page_hits", s.map_page_hits);
        gauge(&self.map, "page_misses", s.map_page_misses);
        gauge(&self.map, "page_reads", s.map_page_reads);
        gauge(&self.map, "pages_evicted", s.map_pages_evicted);
        gauge(&self.map, "pages_read_once", s.map_pages_read_once);
        gauge(&self.map, "slot_table_bytes", s.slot_table_bytes);
        gauge(&self.map, "slot_pages_unread", s.slot_pages_unread);
        gauge(&self.map, "slot_pages_unreadable", u64::from(s.slot_pages_unreadable));
        gauge(&self.map, "replay_pages_waiting", s.replay_pages_waiting);
        gauge(&self.map, "replay_pages_stale", s.replay_pages_stale);
        self.scrub.clear();
        if let Some(scrub) = &s.scrub {
            gauge(&self.scrub, "total", scrub.stripes_total);
            gauge(&self.scrub, "checked", scrub.stripes_checked);
            gauge(&self.scrub, "chunks_bad", scrub.chunks_bad);
            gauge(&self.scrub, "chunks_repaired", scrub.chunks_repaired);
        }
        self.update_kv();
        self.rebuild.clear();
        if let Some(r) = &s.rebuild {
            let member = r.member as u64;
            for (kind, value) in [
                ("stripes_total", r.stripes_total),
                ("stripes_done", r.stripes_done),
                ("chunks_written", r.chunks_written),
                ("chunks_kept", r.chunks_current),
                ("stripes_trusted", r.stripes_trusted),
                ("bytes_written", r.bytes_written),
            ] {
                self.rebuild
                    .get_or_create(&KindMemberLabels { member, kind })
                    .set(i64::try_from(value).unwrap_or(i64::MAX));
            }
        }
    }
}

impl Metrics {
    fn update_kv(&self) {
        let Some(store) = self.kv.get() else { return };
        for family in [&self.kv_records, &self.kv_phase, &self.kv_work] {
            family.clear();
        }
        let set = |family: &Family<SpaceLabels, Gauge>, space: &str, kind: &str, value: u64| {
            let labels = SpaceLabels {
                space: space.to_string(),
                kind: kind.to_string(),
            };
            family
                .get_or_create(&labels)
                .set(i64::try_from(value).unwrap_or(i64::MAX));
        };
        for space in store.list() {
            set(&self.kv_records, &space.name, "inserted", space.inserted);
            if let Some(sorted) = space.sorted {
                set(&self.kv_records, &space.name, "sorted", sorted);
            }
            let phase = match &space.phase {
                tessera_kv::Phase::Open => "open",
                tessera_kv::Phase::Sorting => "sorting",
                tessera_kv::Phase::Indexing(_) => "indexing",
                tessera_kv::Phase::Ready => "ready",
            };
            set(&self.kv_phase, &space.name, phase, 1);
            if let Some(progress) = &space.progress {
                set(&self.kv_work, &space.name, "done", progress.done);
                set(&self.kv_work, &space.name, "total", progress.total);
            }
        }
        let cache = store.cache();
        gauge(&self.kv_cache, "capacity", cache.capacity);
        gauge(&self.kv_cache, "bytes", cache.bytes);
        gauge(&self.kv_cache, "batches", cache.batches);
        gauge(&self.kv_cache, "hits", cache.hits);
        gauge(&self.kv_cache, "misses", cache.misses);
    }
}

/// Sets `family`'s gauge of `kind` to `value`.
fn gauge(family: &Family<KindLabels, Gauge>, kind: &'static str, value: u64) {
    family
        .get_or_create(&KindLabels { kind })
        .set(i64::try_from(value).unwrap_or(i64::MAX));
}

/// Serves `GET /metrics` on `address` from a thread of its own, for as
/// long as the process runs. Other paths get 404.
pub fn serve(address: &str, metrics: Arc<Metrics>, array: Arc<Array>) -> anyhow::Result<String> {
    let server =
        tiny_http::Server::http(address).map_err(|e| anyhow::anyhow!("listening for metrics on {address}: {e}"))?;
    let bound = server
        .server_addr()
        .to_ip()
        .map_or_else(|| address.to_string(), |a| a.to_string());
    std::thread::Builder::new().name("metrics".to_string()).spawn(move || {
        for request in server.incoming_requests() {
            let response = if request.url() == "/metrics" {
                match metrics.scrape(&array) {
                    Ok(text) => tiny_http::Response::from_string(text).with_header(
                        "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"
                            .parse::<tiny_http::Header>()
                            .expect("a valid header"),
                    ),
                    Err(e) => tiny_http::Response::from_string(format!("error: {e}\n")).with_status_code(500),
                }
            } else {
                tiny_http::Response::from_string("try /metrics\n").with_status_code(404)
            };
            let _ = request.respond(response);
        }
    })?;
    Ok(bound)
}
