//! `tessera status`: the array's report, from its server or from the
//! array opened here, printed or as JSON.

use anyhow::Result;
use std::path::PathBuf;
use tessera_array::Status;

use crate::api::{self, Answer, Request};
use crate::array_dir::{human, lock, open};

/// `tessera status`'s flags.
#[derive(clap::Args)]
pub struct Args {
    pub dir: PathBuf,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: &Args) -> Result<()> {
    let (dir, json) = (args.dir.as_path(), args.json);
    let served = api::ask_for(dir, &Request::Status, status_of)?;
    let from_server = served.is_some();
    let status: Status = match served {
        Some(status) => status,
        None => {
            let _lock = lock(dir)?;
            let array = open(dir)?;
            let status = array.status()?;
            // Closed cleanly, so that the next opening reads no stripe
            // header either; an array that refuses writes cannot be, and
            // its status is still worth showing.
            if let Err(error) = array.close() {
                eprintln!("tessera: not closed cleanly: {error}");
            }
            status
        }
    };
    if json {
        println!("{}", serde_json::to_string(&status)?);
        return Ok(());
    }
    print_status(&status);
    if from_server {
        if let Some(kv) = api::ask_for(dir, &Request::KvSpaces, kv_spaces_of)? {
            print_kv_spaces(&kv);
        }
    }
    Ok(())
}

fn kv_spaces_of(answer: Answer) -> Option<api::KvSpaces> {
    match answer {
        Answer::KvSpaces(spaces) => Some(spaces),
        _ => None,
    }
}

/// The KV spaces a server serves, one line each (nothing where it serves none).
fn print_kv_spaces(kv: &api::KvSpaces) {
    if !kv.served {
        return;
    }
    println!("KV spaces: {}", kv.spaces.len());
    for s in &kv.spaces {
        let phase = match &s.phase {
            tessera_kv::Phase::Open => "open".to_string(),
            tessera_kv::Phase::Sorting => "sorting".to_string(),
            tessera_kv::Phase::Indexing(field) => format!("indexing {field}"),
            tessera_kv::Phase::Ready => "ready".to_string(),
        };
        let sorted = s.sorted.map_or(String::new(), |n| format!(", {n} sorted"));
        let work = s.progress.as_ref().map_or(String::new(), |p| {
            let percent = if p.total == 0 {
                100.0
            } else {
                100.0 * p.done as f64 / p.total as f64
            };
            format!(", {} {percent:.0}% ({} of {})", p.step, p.done, p.total)
        });
        println!("  {}: {phase}, {} records inserted{sorted}{work}", s.name, s.inserted);
    }
    if let Some(c) = &kv.cache {
        println!(
            "KV batch cache: {} of {} in {} batches; {} batches found there, {} read",
            human(c.bytes),
            human(c.capacity),
            c.batches,
            c.hits,
            c.misses
        );
    }
}

/// The status in an answer.
pub(crate) fn status_of(answer: Answer) -> Option<Status> {
    match answer {
        Answer::Status(status) => Some(*status),
        _ => None,
    }
}

/// `tessera status` for people: the typed report, field by field.
fn print_status(s: &Status) {
    println!(
        "array {}: {}+{}, {} KiB chunks, checksum {}, compression {}",
        s.array_uuid,
        s.data,
        s.parity,
        s.chunk_bytes >> 10,
        s.checksum,
        s.compression
    );
    for m in &s.members {
        let e = &m.errors;
        let errors = [
            ("read errors", e.read_errors),
            ("write errors", e.write_errors),
            ("checksum errors", e.checksum_errors),
            ("chunks repaired", e.chunks_repaired),
        ]
        .iter()
        .filter(|(_, count)| *count > 0)
        .map(|(what, count)| format!("{what} {count}"))
        .collect::<Vec<_>>();
        println!(
            "  member {:>3}  {:<8} {}{}",
            m.index,
            m.state.name(),
            m.name,
            if errors.is_empty() {
                String::new()
            } else {
                format!("  ({})", errors.join(", "))
            }
        );
    }
    for rejected in &s.devices_rejected {
        println!("  left out: {}", rejected.why);
    }
    if let Some(why) = &s.writes_refused {
        println!("WRITES REFUSED: {why}");
    }
    let percent = |done: u64, total: u64| 100.0 * done as f64 / total.max(1) as f64;
    if let Some(r) = &s.rebuild {
        println!(
            "rebuilding member {}: {} of {} stripes ({:.0}%), {} chunks written, {} kept",
            r.member,
            r.stripes_done,
            r.stripes_total,
            percent(r.stripes_done, r.stripes_total),
            r.chunks_written,
            r.chunks_current
        );
    }
    if let Some(h) = &s.heal {
        println!(
            "healing: {} of {} degraded stripes ({:.0}%), {} moved to healthy members ({})",
            h.stripes_done,
            h.stripes_total,
            percent(h.stripes_done, h.stripes_total),
            h.stripes_healed,
            human(h.bytes_relocated)
        );
    }
    if let Some(scrub) = &s.scrub {
        println!(
            "scrub running: {} of {} stripes checked, {} bad chunks found, {} repaired",
            scrub.stripes_checked, scrub.stripes_total, scrub.chunks_bad, scrub.chunks_repaired
        );
    }
    let accel = &s.accelerator;
    println!(
        "accelerator {}{}: {} stripes sealed, {} rebuilt, {} on the device",
        accel.name,
        if accel.detail.is_empty() {
            String::new()
        } else {
            format!(" ({})", accel.detail)
        },
        accel.stripes_sealed,
        accel.stripes_reconstructed,
        human(accel.bytes_on_device)
    );
    println!(
        "stripes: {} used of {} ({} free), {} degraded; the slot table takes {} of memory",
        s.stripes_used,
        s.stripes_total,
        s.stripes_free,
        s.stripes_degraded,
        human(s.slot_table_bytes)
    );
    println!(
        "capacity: raw {}, usable {}, logical {}; mapped {} stored as {} (compression ratio {:.2})",
        human(s.raw_bytes),
        human(s.usable_bytes),
        human(s.logical_bytes),
        human(s.mapped_bytes),
        human(s.stored_bytes),
        s.compression_ratio
    );
    println!(
        "since start: {} written by clients, {} to members (write amplification {:.2}); {} stripes sealed, {} short (FLUSH); {} FLUSHes, {} syncs",
        human(s.user_bytes_written),
        human(s.member_bytes_written),
        s.write_amplification,
        s.stripes_sealed,
        s.short_stripes_sealed,
        s.flushes,
        s.syncs
    );
    match &s.log {
        Some(log) => {
            let devices: Vec<String> = log
                .devices
                .iter()
                .map(|d| format!("{} ({})", d.name, d.state.name()))
                .collect();
            let where_log = if devices.is_empty() {
                "on each member".to_string()
            } else {
                format!("on each log device: {}", devices.join(", "))
            };
            println!(
                "intent log: {} {}, {} live; {} FLUSHes logged in {} blocks ({} written, write amplification {:.2} of the {:.2}); {} stripes sealed instead, {} failed log writes",
                human(log.area_bytes),
                where_log,
                human(log.live_bytes),
                log.flushes_logged,
                log.blocks_written,
                human(log.bytes_written),
                s.write_amplification_log,
                s.write_amplification,
                log.stripes_sealed_instead,
                log.write_failures
            );
        }
        None => println!("intent log: none (FLUSH seals short stripes)"),
    }
    println!(
        "garbage collection: {} rounds, {} stripes emptied, {} relocated; writers waited {} ms for members, {} ms for a free slot",
        s.gc_rounds,
        s.gc_stripes_collected,
        human(s.gc_bytes_relocated),
        s.writers_waited_for_members_ms,
        s.writers_waited_for_slot_ms
    );
    let parts = &s.checkpoint_parts;
    println!(
        "checkpoints held (stored bytes, before parity): {} of map page images ({} of them moved out of sparse map stripes), {} of map page deltas, {} of directory pages ({} more as deltas), {} of slot table pages ({} more as deltas), {} of roots",
        human(parts.page_images),
        human(parts.page_images_moved),
        human(parts.page_deltas),
        human(parts.directory_pages),
        human(parts.directory_page_deltas),
        human(parts.slot_pages),
        human(parts.slot_page_deltas),
        human(parts.roots)
    );
    println!(
        "during checkpoints: {} stripes written to the next window's slots; FLUSHes waited {} ms for the checkpoint naming them",
        s.stripes_sealed_early, s.flushes_waited_for_checkpoint_ms
    );
    println!(
        "errors: {} bad chunks found, {} repaired; {} reads reconstructed (from {} stripes rebuilt), {} unrecoverable",
        s.checksum_errors, s.chunks_repaired, s.reconstructed_reads, s.stripes_reconstructed, s.unrecoverable_reads
    );
    println!(
        "map cache: {} of {} used by {} pages and {} of {} directory pages in memory; {} pages ({}) with an image on the members; {} lookups found their pages, {} pages read in ({} reads of map stripes), {} evicted, {} read for one lookup and not kept",
        human(s.map_bytes),
        human(s.map_cache_bytes),
        s.map_pages,
        s.map_directory_pages_in_memory,
        s.map_directory_pages,
        s.map_pages_on_members,
        human(s.map_bytes_on_members),
        s.map_page_hits,
        s.map_page_misses,
        s.map_page_reads,
        s.map_pages_evicted,
        s.map_pages_read_once
    );
    let sequence = |value: Option<u64>| value.map_or("none".to_string(), |s| s.to_string());
    let r = &s.recovery;
    println!(
        "metadata: map of {} mappings in {} pages in memory ({} changed since the checkpoint), {} of memory; checkpoint at sequence {}, its page images in {} map stripes ({} written since start, {} of them a root alone, {} forced for room, {} dropped, {} of checkpoint stripes written); opening took {} ms from checkpoint {}{}, {} slots scanned, {} stripes replayed, {} torn stripes dropped, {} chunks repaired",
        s.map_mappings,
        s.map_pages,
        s.map_dirty_pages,
        human(s.map_bytes),
        sequence(s.checkpoint_sequence),
        s.map_stripes,
        s.checkpoints_written,
        s.checkpoints_root_only,
        s.checkpoints_forced,
        s.checkpoints_dropped,
        human(s.checkpoint_bytes_written),
        r.milliseconds,
        sequence(r.checkpoint_sequence),
        if r.clean_stop { " (after a clean stop)" } else { "" },
        r.slots_scanned,
        r.stripes_replayed,
        r.torn_stripes_dropped,
        r.chunks_repaired
    );
    if r.stripes_replayed > 0 || r.slots_scanned > 0 {
        let p = &r.phases;
        println!(
            "  opening's steps: checkpoint {} ms, headers {} ms, summaries {} ms, map pages {} ms, mapping {} ms, check {} ms",
            p.checkpoint, p.headers, p.summaries, p.map_pages, p.mapping, p.check
        );
    }
    if r.pages_mapped_later > 0 {
        println!(
            "  the replay's records in {} map pages left to be mapped after opening; {} still waiting",
            r.pages_mapped_later, s.replay_pages_waiting
        );
        if r.replayed_slots_reused > 0 {
            println!(
                "  {} of the replayed stripes are in slots the checkpoint counted live: each page is checked as it is mapped",
                r.replayed_slots_reused
            );
        }
    }
    if r.slot_pages_deferred > 0 {
        println!(
            "  {} of its {} slot pages left to be read after opening; {} still unread",
            r.slot_pages_deferred, r.slot_pages, s.slot_pages_unread
        );
    }
    if s.replay_pages_stale > 0 {
        println!(
            "  {} map pages the replay mapped point into a replayed slot where it wrote nothing: they cannot be read or written, and no checkpoint is written until the next opening, which replays before serving and scans every slot; see the events",
            s.replay_pages_stale
        );
    }
    if s.slot_pages_unreadable {
        println!(
            "  a slot page left for later cannot be read: no checkpoint until the next opening, which reads them all (and scans every slot if one still fails); see the events"
        );
    }
    if let Some(error) = &r.checkpoint_error {
        println!("  the checkpoint could not be used ({error}); every slot was scanned instead");
    }
}
