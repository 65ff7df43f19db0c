//! How a DoPut stream takes its batches in: into a queue held in memory,
//! from which inserts of 16-32 MiB are made one after another, each made
//! durable before the next begins. While one is under way the
//! queue is read into at a pace set by how full it is, against the rate
//! the inserts have gone at: freely up to one insert's worth, as fast as
//! the inserts go at the middle of the room above that, slower and slower
//! towards the stream's share of the queue (`QUEUE_BYTES` for up to four
//! streams), where reading stops until the insert ends.
//!
//! Why paced: a sender faster than the disk has to wait for it somewhere.
//! Read greedily, the queue fills at once and the sender then waits for
//! the whole insert under way (its write and its sync: 100-350 ms on a
//! disk of 200 MB/s); read at the inserts' pace, each batch's send waits
//! its own share of that (a few milliseconds), and the room left above
//! the middle takes in a sync slower than usual without holding the
//! sender up. (The mechanism is the one Linux throttles writers of dirty
//! pages with: a pace that falls as a buffer fills towards its limit.)

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Bytes of batches an insert (one flush) waits for while the stream
/// goes on. 16 MiB against 64 (a DoPut of 1 M records, 36 MB, thirty
/// times a run, six runs alternating on 2 vCPUs): the slowest took 84-126
/// ms against 108-226, one stream of 720 MB went as fast (498-774 MB/s
/// against 542-778); 8 MiB did no better than 16 (docs/PERFORMANCE.md).
pub(crate) const INSERT_BYTES: usize = 16 << 20;
/// Bytes an insert takes at most, when more than `INSERT_BYTES` are
/// queued (a sender ahead of the disk): a flush's own cost shared by more
/// bytes. 32 MiB against 16 on a 2-vCPU AMD EPYC VM, four 1.8 GB streams
/// each, alternating: 143-190 MB/s (median 180) against 144-164 (153),
/// the longest sends alike (docs/PERFORMANCE.md).
pub(crate) const INSERT_BYTES_MOST: usize = 32 << 20;
/// Bytes a stream holds read and not yet in an insert, at most (besides
/// the insert under way): reading stops there until that insert ends.
pub(crate) const QUEUE_BYTES: usize = 64 << 20;
/// Bytes all streams together may hold queued, shared out equally: a
/// stream's queue holds this over the number of streams, within
/// `INSERT_BYTES` and `QUEUE_BYTES` (so one to four streams hold 64 MiB
/// each, eight 32, sixteen or more 16 as each did before this queue),
/// and its inserts half of that, within `INSERT_BYTES` and
/// `INSERT_BYTES_MOST`.
pub(crate) const QUEUED_ALL_BYTES: usize = 256 << 20;
/// The longest pause before one read: a send is held up that long at
/// most until the queue is full.
const PAUSE_MAX: Duration = Duration::from_millis(50);

/// The queue of one stream's batches (`T`: a batch as it came).
pub(crate) struct Intake<T> {
    queue: VecDeque<(T, usize)>,
    queued: usize,
    /// How many streams there are, this one included.
    streams: Arc<AtomicUsize>,
    /// Bytes a second the stream's inserts have gone at, smoothed; none
    /// before the first has ended.
    rate: Option<f64>,
    /// The insert under way: its bytes, and when it began.
    running: Option<(usize, Instant)>,
    /// When the last batch was queued, and its bytes: the next is read
    /// `pause` after it.
    last: (Instant, usize),
}

impl<T> Intake<T> {
    /// A stream's queue, counted in `streams` with every other.
    pub fn new(streams: Arc<AtomicUsize>) -> Intake<T> {
        streams.fetch_add(1, Ordering::Relaxed);
        Intake {
            queue: VecDeque::new(),
            queued: 0,
            streams,
            rate: None,
            running: None,
            last: (Instant::now(), 0),
        }
    }

    /// `batch`, of `bytes`, read `at`.
    pub fn push(&mut self, batch: T, bytes: usize, at: Instant) {
        self.queue.push_back((batch, bytes));
        self.queued += bytes;
        self.last = (at, bytes);
    }

    /// The batches of the next insert, from the front of the queue, taken
    /// as under way from `at`: the first, then the next while they fit in
    /// half the stream's room (16-32 MiB; a batch larger than that is an
    /// insert by itself). None while less than `INSERT_BYTES` is queued
    /// and the stream goes on.
    pub fn next_insert(&mut self, ended: bool, at: Instant) -> Option<Vec<T>> {
        if self.queue.is_empty() || (self.queued < INSERT_BYTES && !ended) {
            return None;
        }
        let most = (self.room() / 2).clamp(INSERT_BYTES, INSERT_BYTES_MOST);
        let (mut batches, mut bytes) = (Vec::new(), 0);
        while let Some(&(_, n)) = self.queue.front() {
            if bytes > 0 && bytes + n > most {
                break;
            }
            let (batch, _) = self.queue.pop_front().expect("a front");
            batches.push(batch);
            bytes += n;
        }
        self.queued -= bytes;
        self.running = Some((bytes, at));
        Some(batches)
    }

    /// The insert under way ended `at` (written and flushed, or failed).
    pub fn inserted(&mut self, at: Instant) {
        let Some((bytes, began)) = self.running.take() else {
            return;
        };
        let now = bytes as f64 / at.saturating_duration_since(began).as_secs_f64().max(1e-6);
        self.rate = Some(match self.rate {
            None => now,
            Some(rate) => rate + (now - rate) / 4.0,
        });
    }

    /// Bytes this stream's queue may hold: its share of
    /// `QUEUED_ALL_BYTES`.
    fn room(&self) -> usize {
        let streams = self.streams.load(Ordering::Relaxed).max(1);
        (QUEUED_ALL_BYTES / streams).clamp(INSERT_BYTES, QUEUE_BYTES)
    }

    /// Whether to read nothing more until the insert under way ends: the
    /// queue holds its share.
    pub fn full(&self) -> bool {
        self.queued >= self.room()
    }

    /// When to read the next message, asked `at` a time while an insert
    /// is under way: `pause` after the last batch was queued.
    pub fn next_read(&self, at: Instant) -> Instant {
        self.last.0 + self.pause(self.last.1, at)
    }

    /// How long to wait, `at` a time while an insert is under way, before
    /// reading the message after one of `bytes`: `PAUSE_MAX` once the
    /// queue holds its share, else none up to one insert's worth; between,
    /// the time the inserts take for `bytes`, over a factor that falls
    /// from 2 to 0 as the queue fills, so that it settles in the middle
    /// of its room. The inserts' rate is the smoothed one, or the one
    /// under way's if it has taken longer than that says (its bytes over
    /// the time so far): so a slow sync slows the reads as it goes on,
    /// where it would be found only at its end, and the first insert
    /// paces the reads before any has ended.
    pub fn pause(&self, bytes: usize, at: Instant) -> Duration {
        let cap = self.room();
        if self.queued >= cap {
            return PAUSE_MAX;
        }
        if self.queued <= INSERT_BYTES {
            return Duration::ZERO;
        }
        let under_way = self
            .running
            .map(|(bytes, began)| bytes as f64 / at.saturating_duration_since(began).as_secs_f64().max(1e-6));
        let rate = match (self.rate, under_way) {
            (Some(smoothed), Some(now)) => smoothed.min(now),
            (Some(rate), None) | (None, Some(rate)) => rate,
            (None, None) => return Duration::ZERO,
        };
        // INSERT_BYTES < queued < cap: the factor is above 0.
        let factor = 2.0 * (cap - self.queued) as f64 / (cap - INSERT_BYTES) as f64;
        Duration::try_from_secs_f64(bytes as f64 / (rate * factor))
            .unwrap_or(PAUSE_MAX)
            .min(PAUSE_MAX)
    }
}

impl<T> Drop for Intake<T> {
    fn drop(&mut self) {
        self.streams.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: usize = 1 << 20;

    /// `intake` queued `mib` batches of 1 MiB.
    fn fill(intake: &mut Intake<u32>, mib: usize) {
        for i in 0..mib {
            intake.push(i as u32, MIB, Instant::now());
        }
    }

    /// An insert of `bytes` that took `took` (its batches not queued).
    fn ran(intake: &mut Intake<u32>, bytes: usize, took: Duration) {
        let began = Instant::now();
        intake.running = Some((bytes, began));
        intake.inserted(began + took);
    }

    /// The next insert's batches and bytes.
    fn take(intake: &mut Intake<u32>, ended: bool) -> Option<(Vec<u32>, usize)> {
        let batches = intake.next_insert(ended, Instant::now())?;
        Some((batches, intake.running.unwrap().0))
    }

    #[test]
    fn inserts_take_the_queue_in_order_up_to_32_mib_and_the_rest_at_the_end() {
        let mut intake = Intake::new(Arc::default());
        let now = Instant::now();
        for i in 0..10 {
            intake.push(i, 3 * MIB, now);
        }
        // 30 MiB queued: one insert of them all (16 MiB reached, and no
        // more than 32).
        assert_eq!(take(&mut intake, false), Some(((0..10).collect(), 30 * MIB)));
        for i in 0..20 {
            intake.push(i, 3 * MIB, now);
        }
        // 60 MiB queued: ten batches (30 MiB; an eleventh would pass 32),
        // then ten again, then less than 16 MiB left till the end.
        assert_eq!(take(&mut intake, false), Some(((0..10).collect(), 30 * MIB)));
        intake.push(20, 3 * MIB, now);
        assert_eq!(take(&mut intake, false), Some(((10..20).collect(), 30 * MIB)));
        assert_eq!(take(&mut intake, false), None);
        assert_eq!(take(&mut intake, true), Some((vec![20], 3 * MIB)));
        assert_eq!(take(&mut intake, true), None);
        // A batch that would take an insert past 32 MiB waits for the
        // next; one larger than that is an insert by itself.
        intake.push(21, 15 * MIB, now);
        intake.push(22, 40 * MIB, now);
        intake.push(23, MIB, now);
        assert_eq!(take(&mut intake, false), Some((vec![21], 15 * MIB)));
        assert_eq!(take(&mut intake, false), Some((vec![22], 40 * MIB)));
        assert_eq!(take(&mut intake, false), None);
    }

    #[test]
    fn reads_are_paced_as_the_queue_fills_and_stop_when_it_is_full() {
        // No pace before an insert has begun or ended: no rate is known.
        let mut intake = Intake::new(Arc::default());
        fill(&mut intake, 40);
        assert_eq!(intake.pause(2 * MIB, Instant::now()), Duration::ZERO);
        // At 100 MiB/s, the pause before the next 2 MiB with `queued`.
        let pause = |queued: usize| {
            let mut intake = Intake::new(Arc::default());
            fill(&mut intake, queued / MIB);
            ran(&mut intake, 100 * MIB, Duration::from_secs(1));
            intake.pause(2 * MIB, Instant::now())
        };
        // Up to an insert's worth: read freely.
        assert_eq!(pause(INSERT_BYTES), Duration::ZERO);
        // In the middle of the room above it: as fast as the inserts go
        // (2 MiB at 100 MiB/s).
        let middle = pause((INSERT_BYTES + QUEUE_BYTES) / 2);
        assert!(
            middle.abs_diff(Duration::from_millis(20)) < Duration::from_micros(10),
            "{middle:?}"
        );
        // Above the middle slower, below it faster, never past the cap,
        // which a full queue gets.
        assert!(pause(QUEUE_BYTES - 8 * MIB) > middle);
        assert!(pause(INSERT_BYTES + 8 * MIB) < middle);
        assert_eq!(pause(QUEUE_BYTES - MIB), PAUSE_MAX);
        assert_eq!(pause(QUEUE_BYTES), PAUSE_MAX);
        // Full at its room; an insert taken makes room.
        fill(&mut intake, 23);
        assert!(!intake.full());
        fill(&mut intake, 1);
        assert!(intake.full());
        take(&mut intake, false);
        assert!(!intake.full());
    }

    #[test]
    fn the_next_read_is_a_pause_after_the_last_batch_queued() {
        let mut intake = Intake::new(Arc::default());
        fill(&mut intake, 39);
        ran(&mut intake, 100 * MIB, Duration::from_secs(1));
        let at = Instant::now();
        intake.push(0, 2 * MIB, at);
        // 41 MiB queued: just past the middle, about 20 ms for 2 MiB.
        assert_eq!(intake.next_read(at), at + intake.pause(2 * MIB, at));
        assert!(intake.next_read(at) > at + Duration::from_millis(19));
    }

    #[test]
    fn the_rate_follows_the_inserts_smoothed() {
        let mut intake = Intake::new(Arc::default());
        fill(&mut intake, 40);
        ran(&mut intake, 16 * MIB, Duration::from_millis(100));
        let first = intake.pause(MIB, Instant::now());
        // One insert four times as slow moves the pace a quarter of the
        // way (not all the way: one slow sync is not the disk's rate).
        ran(&mut intake, 16 * MIB, Duration::from_millis(400));
        let second = intake.pause(MIB, Instant::now());
        let rate = |pause: Duration| MIB as f64 / pause.as_secs_f64();
        let (r1, r2) = (rate(first), rate(second));
        let expected = r1 + (r1 / 4.0 - r1) / 4.0;
        assert!((r2 - expected).abs() / expected < 1e-4, "{r1} {r2}");
    }

    #[test]
    fn an_insert_slower_than_the_rate_slows_the_reads_as_it_goes_on() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut intake = Intake::new(Arc::default());
        fill(&mut intake, 40);
        // The first insert paces the reads before any has ended: 16 MiB
        // under way for 100 ms, 160 MiB/s at most.
        intake.running = Some((16 * MIB, t0));
        let first = intake.pause(MIB, ms(100));
        assert!(
            first.abs_diff(Duration::from_micros(6_250)) < Duration::from_micros(10),
            "{first:?}"
        );
        // Its end at 160 ms: 100 MiB/s. The next one, on time, is paced at
        // that rate; once it has taken twice as long as that says, at half.
        intake.inserted(ms(160));
        intake.running = Some((16 * MIB, ms(160)));
        let on_time = intake.pause(MIB, ms(200));
        assert!(
            on_time.abs_diff(Duration::from_millis(10)) < Duration::from_micros(10),
            "{on_time:?}"
        );
        assert_eq!(intake.pause(MIB, ms(160 + 160)), on_time);
        let late = intake.pause(MIB, ms(160 + 320));
        assert!(late.abs_diff(2 * on_time) < Duration::from_micros(10), "{late:?}");
    }

    #[test]
    fn streams_share_the_room_out_and_their_inserts_shrink_with_it() {
        let streams = Arc::new(AtomicUsize::new(0));
        let mut first = Intake::new(streams.clone());
        fill(&mut first, 40);
        // Alone: 64 MiB of room, inserts of up to 32.
        assert!(!first.full());
        let mut others: Vec<Intake<u32>> = (0..7).map(|_| Intake::new(streams.clone())).collect();
        // One of eight: 32 MiB of room (full at 40), inserts of up to 16,
        // paced from 16 to 32 (at 24, the middle, as fast as the inserts).
        assert!(first.full());
        assert_eq!(take(&mut first, false).map(|(_, n)| n), Some(16 * MIB));
        ran(&mut first, 100 * MIB, Duration::from_secs(1));
        take(&mut first, false);
        fill(&mut first, 16);
        let middle = first.pause(2 * MIB, Instant::now());
        assert!(
            middle.abs_diff(Duration::from_millis(20)) < Duration::from_micros(10),
            "{middle:?}"
        );
        // Seventeen: 16 MiB each, a wall there with no pace below it.
        others.extend((0..8).map(|_| Intake::new(streams.clone())));
        let mut light = Intake::new(streams.clone());
        fill(&mut light, 15);
        ran(&mut light, 100 * MIB, Duration::from_secs(1));
        assert!(!light.full());
        assert_eq!(light.pause(2 * MIB, Instant::now()), Duration::ZERO);
        fill(&mut light, 1);
        assert!(light.full());
        assert_eq!(light.pause(2 * MIB, Instant::now()), PAUSE_MAX);
        // Streams gone give their share back.
        drop(others);
        drop(light);
        assert_eq!(streams.load(Ordering::Relaxed), 1);
        assert!(!first.full());
    }
}
