//! Checkpoints: the map's pages written to map stripes, and a root that
//! names them, written to stripes of the Meta stream and named by the
//! superblocks, so that opening reads them and rolls forward over the
//! slots of the root's window instead of reading every stripe's summary.
//!
//! # How a checkpoint is taken while clients write
//!
//! 1. Note the last sequence sealed, S. Choose the window: the slots new
//!    stripes may take until the next checkpoint. It holds every slot a
//!    stripe newer than S may be in (the open stripes' slots, any sealed
//!    since S, and the usable free slots, to which allocation is narrowed
//!    until the checkpoint is durable; a window's worth of them at most),
//!    then the slots this checkpoint frees (the durable root's, and the
//!    map stripes whose images will all be replaced: free, and usable at
//!    once, when this one is durable), then a window's worth of other
//!    free slots (or, on a full array, the stripes garbage collection
//!    will empty first). Under the same hold of the index, take the set of
//!    pages changed since the last checkpoint (the dirty pages), with the
//!    pages whose images sit in the sparsest map stripes, where there are
//!    more than twice (and one) as many as the images need.
//!    No slot is freed until the checkpoint is done: the pages' images may
//!    point into slots that drain meanwhile, and step 4 takes free slots.
//! 2. Copy the dirty pages' images (or, for a page of many entries with
//!    few keys changed since its image, the delta over that image:
//!    `map/delta.rs`), some per short hold of the index's read lock.
//!    Writes go on between holds, so the copy is "fuzzy": a block may be
//!    copied before or after a write to it. Every write the
//!    copy may have missed or caught half-way is in a stripe newer than S,
//!    in the window, and recovery keeps the newest version of each block,
//!    so replaying those stripes over the pages gives the right map. A
//!    page not dirty is unchanged since its image was written.
//! 3. Seal and sync the open stripes: everything the copy points at is
//!    durable.
//! 4. Write the new images to map stripes (a directory page of which a
//!    few entries changed, or a slot page of which a few slots did, as a
//!    delta over its image, while the deltas since that image take no
//!    more than the page whole: FORMAT.md, "Directory page deltas" and
//!    "Slot page deltas"), then the root (live stripes,
//!    window, map stripes, where each page's image is) to Meta stripes,
//!    in free slots (outside the window where it can), with consecutive
//!    sequences; sync, then point the superblocks at the root. Only then
//!    are the old root's slots and the map stripes no page names free,
//!    and the new window the one allocation uses. If anything fails, the
//!    pages taken are marked dirty again (those taken whole with their
//!    keys changed since their images given back: `Map::give_back`).
//!
//! For a spent window (`checkpoint_as_needed`), a checkpoint may be a
//! root alone: steps 2 and 3 skipped, the last pages and their sequence
//! named again, the window the new one with those of the roots since the
//! pages (a stripe newer than that sequence is in one of them), the live
//! stripes those the pages' checkpoint listed with those live now. It is
//! while the changed pages would cost more than 1/20 of the client bytes
//! written since the pages were (counted as if written whole: deltas cost
//! less, but less a key the more keys they hold, so pages written less
//! often still cost less) and at most a window's worth of stripes were
//! sealed since, 8 in a row at most: under uniform random
//! overwrites every page changes within a window, and writing them all
//! each time cost more than the data (`scripts/bench-waf.sh`). The bound
//! on the stripes is the bound on replay after a crash: the stripes a
//! root alone leaves to replay are at most a window's worth, and what
//! the next window adds.
//!
//! A root of more stripes than the superblock lists (480) is followed by
//! its directory, which lists them; the superblock lists the directory's
//! stripes. Without room for the checkpoint (no free slots, or a directory
//! past 480 stripes), the superblocks say "no checkpoint": recovery then
//! scans every slot, any free slot may be used, and every page is
//! written again by the next checkpoint.

use crate::catalog::Catalog;
use crate::counters::Counters;
use crate::deferred::Deferred;
use crate::error::ArrayError;
use crate::format::{
    self, Checkpoint, CheckpointRef, ImagePiece, MapImages, MapStripe, PageImage, Stream, CHECKPOINT_SLOTS_MAX,
};
use crate::index::{Index, Resident};
use crate::intent::IntentLog;
use crate::lanes::Lanes;
use crate::limits::{
    CHECKPOINT_COPY_HOLD_MAX, CHECKPOINT_PAGES_COST_DIVISOR, CHECKPOINT_ROOTS_PER_PAGES_MAX,
    CHECKPOINT_SLOT_PAGES_PER_LOCK, CHECKPOINT_STRIPES_PER_SUBMIT, CHECKPOINT_WINDOW_CHUNKS_MAX,
    CHECKPOINT_WINDOW_DIVISOR, CHECKPOINT_WINDOW_MAX, CHECKPOINT_WINDOW_MIN, MAP_STRIPES_PER_NEEDED,
};
use crate::map::directory::NewDir;
use crate::map::directory::{dir_of, under_directory_page, DirEntries};
use crate::map::DirUpdate;
use crate::slots::{SlotState, TakenPages};
use crate::stripe::OpenStripe;
use crate::stripes::Stripes;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};

/// Stored bytes the checkpoints wrote since opening, by part.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct CheckpointParts {
    /// Map pages written whole (moved ones with their deltas).
    pub page_images: u64,
    /// Map pages written as deltas over their images (`map/delta.rs`).
    #[serde(default)]
    pub page_deltas: u64,
    /// Of `page_images`: clean pages' images (with their deltas) copied
    /// out of sparse map stripes, so that those are freed.
    #[serde(default)]
    pub page_images_moved: u64,
    /// Directory pages written whole.
    pub directory_pages: u64,
    /// Directory pages written as deltas over their images.
    #[serde(default)]
    pub directory_page_deltas: u64,
    /// Slot table pages written whole.
    pub slot_pages: u64,
    /// Slot table pages written as deltas over their images.
    #[serde(default)]
    pub slot_page_deltas: u64,
    pub roots: u64,
}

/// What the checkpoint lock guards: where the durable checkpoint's page
/// images are, and what has been written since the pages were last.
#[derive(Default)]
pub(crate) struct Durable {
    pub images: MapImages,
    /// Since the last checkpoint that wrote pages (in this process):
    /// `None` after opening or a dropped checkpoint.
    pub since: Option<SincePages>,
}

/// The roots written since the last checkpoint that wrote pages, each
/// naming that checkpoint's pages and sequence with a longer window.
pub(crate) struct SincePages {
    /// The sequence the pages are as of.
    pub sequence: u64,
    /// The next write version and the volumes' counts then (the slot
    /// table's are in its durable pages, taken with the map's).
    pub next_version: u64,
    pub volumes: Vec<(u64, u128)>,
    /// The stripes its root listed as sealed since its pages were taken
    /// (those open then that its pages count in are among them).
    pub resealed: Vec<(u64, u64)>,
    /// Every slot a stripe newer than `sequence` may be in: the windows
    /// of the roots since.
    pub replay: BTreeSet<u64>,
    /// Roots written since that named no new pages.
    pub roots: usize,
    /// Client bytes written when it was taken.
    pub user_bytes: u64,
}

/// What a checkpoint takes under one hold of the index (step 1): its
/// window, the dirty pages (whose images the map keeps as they are
/// now), the clean pages whose images move out of sparse map stripes,
/// the slot table's changed durable pages (and those in sparse map
/// stripes) as they are then, and the next write version and the
/// volumes' counts as of then (`None` for a root alone, which names the
/// last pages' again).
struct Taken {
    window: BTreeSet<u64>,
    dirty: BTreeSet<u64>,
    /// The dirty pages taken as deltas, each with the durable image whose
    /// base the delta goes over.
    deltas: BTreeMap<u64, Arc<PageImage>>,
    moved: BTreeMap<u64, Arc<PageImage>>,
    /// The directory pages written: those of the pages written, and
    /// those whose images are in sparse map stripes.
    dirs: BTreeSet<u64>,
    /// Each map stripe's live bytes once the map pages written have left
    /// it (the directory pages and slot pages leave it as they are sized
    /// in `write_checkpoint`, whole or as deltas).
    live: BTreeMap<u64, u64>,
    /// The slot table's pages being copied (`None` for a root alone).
    slot_pages: Option<BTreeSet<u64>>,
    as_of: Option<AsOf>,
}

/// What a checkpoint that writes pages takes of the index with them: the
/// next write version, and the volumes' and the slot table's counts.
struct AsOf {
    next_version: u64,
    volumes: Vec<(u64, u128)>,
    slot_live: u128,
}

/// The images in the map stripes a checkpoint empties (`Checkpoints::images_in`):
/// pages (with their image), directory pages and slot pages.
#[derive(Default)]
struct InStripes {
    pages: BTreeMap<u64, Arc<PageImage>>,
    dirs: BTreeSet<u64>,
    slot_pages: BTreeSet<u64>,
}

/// The pages' images, copied (step 2) and compressed as stored, back to
/// back at the start of the run of images, and each page's new image as
/// the directory will name it, in page order.
struct Copied {
    run: Run,
    pages: Vec<NewPage>,
    /// The last of the run's bytes: those of clean pages moved out of
    /// sparse map stripes.
    moved_bytes: usize,
    /// Of the run's bytes: deltas over images written before.
    delta_bytes: usize,
}

/// A page's new image (`None`: the page was empty), its pieces written by
/// this checkpoint naming their stripe by number among the new ones until
/// they have slots; and whether this checkpoint wrote its image (false: it
/// wrote a delta over an image written before, which stays).
struct NewPage {
    page: u64,
    image: Option<Arc<PageImage>>,
    base_written: bool,
}

/// The run of bytes a checkpoint writes to consecutive stripes, a
/// stripe's worth a buffer: none grown by doubling (the run of a
/// checkpoint of 46 MiB of images was one buffer of 64 MiB), each let go
/// once its stripe is sealed.
struct Run {
    per_stripe: usize,
    stripes: Vec<Vec<u8>>,
    len: usize,
}

impl Run {
    fn new(per_stripe: usize) -> Run {
        Run {
            per_stripe,
            stripes: Vec::new(),
            len: 0,
        }
    }

    fn len(&self) -> usize {
        self.len
    }

    /// Appends `bytes`: where they are in the run.
    fn push(&mut self, mut bytes: &[u8]) -> Range<usize> {
        let start = self.len;
        while !bytes.is_empty() {
            if self.stripes.last().is_none_or(|last| last.len() == self.per_stripe) {
                self.stripes.push(Vec::with_capacity(self.per_stripe));
            }
            let last = self.stripes.last_mut().expect("a stripe with room");
            let taken = (self.per_stripe - last.len()).min(bytes.len());
            last.extend_from_slice(&bytes[..taken]);
            bytes = &bytes[taken..];
            self.len += taken;
        }
        start..self.len
    }

    /// Appends the stored image `stored`: its image, its pieces naming
    /// their stripe by number.
    fn push_image(&mut self, stored: &[u8], algorithm: tessera_checksum::Algorithm) -> PageImage {
        let range = self.push(stored);
        PageImage::whole(
            stored.len() as u32,
            algorithm.digest(stored),
            place(self.per_stripe, range),
        )
    }

    /// Zeros up to `len`.
    fn pad_to(&mut self, len: usize) {
        let zeros = vec![0u8; len.saturating_sub(self.len).min(self.per_stripe)];
        while self.len < len {
            let more = (len - self.len).min(zeros.len());
            self.push(&zeros[..more]);
        }
    }

    fn into_stripes(self) -> Vec<Vec<u8>> {
        self.stripes
    }
}

/// The pieces `range` of a run is in, `per_stripe` bytes a stripe, each
/// naming its stripe by number in the run.
fn place(per_stripe: usize, range: Range<usize>) -> Vec<ImagePiece> {
    let mut pieces = Vec::new();
    let mut at = range.start;
    while at < range.end {
        let end = range.end.min((at / per_stripe + 1) * per_stripe);
        pieces.push(ImagePiece {
            slot: (at / per_stripe) as u64,
            offset: (at % per_stripe) as u32,
            bytes: (end - at) as u32,
        });
        at = end;
    }
    pieces
}

/// What a checkpoint writes (steps 1 and 2): the pages' images copied,
/// the directory pages that name them, the slot table's pages taken
/// (`None` for a root alone), and what each map stripe keeps once the
/// images these replace have left it.
struct Changes<'a> {
    copied: Copied,
    dirs: &'a BTreeSet<u64>,
    slot_pages: Option<&'a TakenPages>,
    live: BTreeMap<u64, u64>,
}

/// A directory page a checkpoint writes: what it named before (pages,
/// their images' bytes), where its new image or delta goes in the run of
/// images (`None`: it names no page any more), and for a delta the pages
/// it lists and the bytes the deltas over the image took with it
/// (`MapImages::dir_deltas`).
struct DirWrite {
    dir: u64,
    old: (u64, u64),
    range: Option<Range<usize>>,
    delta: Option<(BTreeSet<u64>, u32)>,
}

/// A slot table page a checkpoint writes: its entries, and where its
/// image goes in the run of images (`None`: it lists no slot any more).
struct SlotPageWrite<'a> {
    page: u64,
    entries: &'a [format::SlotEntry],
    /// Its stored image or delta, and where it goes (none: it lists no slot).
    encoded: Option<(Vec<u8>, Range<usize>)>,
    /// For a delta over its durable image, the bytes the deltas over that
    /// image took with this one (`SlotPageImage::deltas`).
    deltas: Option<u32>,
}

/// What a durable checkpoint left to do: the root written (where the
/// images are now, its live stripes and counts) and its slots, the map
/// stripes no image is in any more, the directory pages written and the
/// pages' new images.
struct Written {
    root: Checkpoint,
    root_slots: Vec<u64>,
    emptied: Vec<u64>,
    dirs: Vec<DirUpdate>,
    /// In page order.
    pages: Vec<(u64, Option<Arc<PageImage>>)>,
    /// The slots its window names (where stripes newer than its sequence may be).
    replay: BTreeSet<u64>,
}

/// The checkpoint layer, over the lanes, the intent log and the work
/// opening left for later: it writes checkpoints, one at a time, and
/// says what the next may need.
pub(crate) struct Checkpoints {
    stripes: Arc<Stripes>,
    catalog: Arc<Catalog>,
    lanes: Arc<Lanes>,
    /// Retired by `checkpoint` and `checkpoint_to_close` once the open
    /// stripes are sealed and synced, so that an opening after them
    /// replays no log block.
    intent: Option<Arc<IntentLog>>,
    /// Finished before any checkpoint: it writes every slot page, and
    /// the map with every record replayed.
    deferred: Arc<Deferred>,
    /// One checkpoint at a time; held across its I/O. It guards where
    /// the durable checkpoint's page images are.
    durable: Mutex<Durable>,
    /// `EngineOptions::window_slots`.
    window: Option<u64>,
    /// `EngineOptions::next_window_early`.
    next_window_early: bool,
}

impl Checkpoints {
    pub fn new(
        lanes: Arc<Lanes>,
        intent: Option<Arc<IntentLog>>,
        deferred: Arc<Deferred>,
        window: Option<u64>,
        next_window_early: bool,
    ) -> Checkpoints {
        let stripes = deferred.catalog.stripes.clone();
        Checkpoints {
            stripes,
            catalog: deferred.catalog.clone(),
            lanes,
            intent,
            deferred,
            durable: Mutex::new(Durable::default()),
            window,
            next_window_early,
        }
    }

    /// The checkpoint lock: waits for the checkpoint being written, if
    /// one is.
    pub(crate) fn durable(&self) -> MutexGuard<'_, Durable> {
        self.durable.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Returns once the checkpoint being written, if one is, has ended
    /// (the lock taken and let go).
    pub(crate) fn wait_for_one_under_way(&self) {
        drop(self.durable());
    }

    /// Slots a checkpoint adds to its window: a quarter of the array, within
    /// bounds in slots and in chunks.
    pub(crate) fn window_slots(&self) -> u64 {
        let default = || {
            let max = CHECKPOINT_WINDOW_MAX.min(CHECKPOINT_WINDOW_CHUNKS_MAX / self.stripes.geometry.width() as u64);
            (self.stripes.geometry.slot_count() / CHECKPOINT_WINDOW_DIVISOR).clamp(CHECKPOINT_WINDOW_MIN, max)
        };
        self.window
            .map_or_else(default, |slots| slots.max(CHECKPOINT_WINDOW_MIN))
    }

    /// Slots the next checkpoint may need, and one more for it to be
    /// written beside the durable one: every page's image at the worst
    /// its entries can cost (each with its own record words, the most a
    /// record has), every slot table page listing a used slot, and a root
    /// listing every used slot, a window as large as the array and a
    /// piece for each image and stripe boundary. The
    /// reserve the last checkpoint's size gave was too small once the map
    /// fragmented after it (a compact map, then random overwrites: a
    /// checkpoint of 7 slots against a reserve of 2), and writes filled
    /// what the next checkpoint needed (`tests/space.rs`). At most what a
    /// checkpoint may take: past that none is written.
    pub(crate) fn checkpoint_reserve(&self, index: &Index) -> usize {
        let g = &self.stripes.geometry;
        let per_stripe = self.meta_stripe_bytes();
        let resident = index.map.page_count();
        let (named, named_bytes) = index.map.directory_totals();
        let pages = resident + named as usize;
        // Pages not in memory are clean: only moved, at their stored size.
        let page_images = crate::map::images_bytes_max(g.checksum, resident, index.map.len()) + named_bytes as usize;
        // Every directory page written, each naming its pages' images
        // in at most a piece per image and one per stripe boundary.
        let dirs = (index.map.directory_counts().0 + resident).min(pages);
        let page_stripes = page_images.div_ceil(per_stripe);
        // Each image with a delta (in pieces of its own).
        let dir_images = format::directory_image_bytes(g.checksum, pages, pages + page_stripes)
            + format::directory_deltas_bytes(g.checksum, pages, pages + page_stripes)
            + dirs * format::directory_image_bytes(g.checksum, 0, 0);
        // (A directory page written as a delta over an image that stays
        // takes no more than it would whole.)
        // Every slot table page that lists a slot written, each whole or
        // a delta (no larger than the page whole) over an image that stays.
        let used = index.slots.count() as usize - index.slots.free_count();
        let slot_pages = used.min(index.slots.count().div_ceil(crate::limits::SLOT_TABLE_PAGE_SLOTS) as usize);
        let slot_images = slot_pages * format::slot_page_image_bytes_max(0) + format::slot_page_image_bytes_max(used);
        let images = page_images + dir_images + slot_images;
        let image_stripes = images.div_ceil(per_stripe);
        let root = format::checkpoint_bytes(
            g.checksum,
            format::RootShape {
                stripes: used,
                window: index.slots.count() as usize,
                map_stripes: used + image_stripes,
                named: dirs + slot_pages,
                deltas: dirs + slot_pages,
                pieces: 2 * dirs + 2 * slot_pages + image_stripes,
                volumes: crate::volume::VOLUME_COUNT_MAX,
            },
        );
        RootStripes::behind(g.checksum, per_stripe, images, root).map_or(image_stripes, |r| r.end()) + 1
    }

    /// Bytes of checkpoint (or directory, or page images) one Meta stripe holds.
    pub(crate) fn meta_stripe_bytes(&self) -> usize {
        format::meta_stripe_bytes(&self.stripes.geometry)
    }

    /// Writes a checkpoint of the map now: the pages changed since the
    /// last one, and a new root.
    pub fn checkpoint(&self) -> Result<(), ArrayError> {
        // The open stripes sealed first, so that the checkpoint's pages
        // hold what they hold and opening has nothing to replay (a clean
        // stop's checkpoint: opening then reads the root alone).
        self.seal_and_sync_open()?;
        if let Some(log) = &self.intent {
            log.retire()?;
        }
        self.take_checkpoint(false)
    }

    /// The sequence of the durable checkpoint, if its map holds every
    /// data stripe sealed (none is newer than the sequence it is as of: a
    /// root alone is as of older pages, and the stripes since are in its
    /// window to be replayed), no stripe at all was sealed after its own,
    /// and writes are not refused for lost members: then the members hold
    /// nothing its map lacks.
    pub(crate) fn nothing_after_checkpoint(&self) -> Option<u64> {
        let reference = self.stripes.members.superblock().checkpoint.clone()?;
        let last = reference.first_stripe_sequence + reference.stripe_count(self.meta_stripe_bytes()) as u64 - 1;
        let mapped = self.catalog.index().last_data_sealed <= reference.sequence;
        (mapped && self.stripes.members.lost().is_none() && self.lanes.tracker.last_sequence() == last)
            .then_some(reference.sequence)
    }

    /// A clean stop's checkpoint: the open stripes sealed and synced, the
    /// log retired, and a new checkpoint unless no stripe was sealed since
    /// the durable one (an array opened only to be looked at writes none).
    pub(crate) fn checkpoint_to_close(&self) -> Result<(), ArrayError> {
        self.seal_and_sync_open()?;
        if let Some(log) = &self.intent {
            log.retire()?;
        }
        if self.nothing_after_checkpoint().is_some() {
            return Ok(());
        }
        self.take_checkpoint(false)
    }

    /// Seals the open stripes and syncs through the last one.
    fn seal_and_sync_open(&self) -> Result<(), ArrayError> {
        let sealed: Vec<_> = (0..self.lanes.open.len())
            .filter_map(|lane| self.lanes.seal_lane(lane))
            .collect();
        self.lanes
            .submit(sealed)
            .and_then(|()| self.lanes.sync_through(self.lanes.tracker.last_sequence()))
    }

    /// The checkpoint a spent window needs: a new root alone, naming the
    /// last pages written with a window that grows, while writing the
    /// changed pages would cost more than 1/20 of the client bytes
    /// written since the pages were last written and at most a window's
    /// worth of stripes were sealed since (replay after a crash reads
    /// those, and what the next window adds); for at most 8 roots in a
    /// row; else the pages too.
    pub(crate) fn checkpoint_as_needed(&self) -> Result<(), ArrayError> {
        self.take_checkpoint(true)
    }

    pub(crate) fn take_checkpoint(&self, root_may_do: bool) -> Result<(), ArrayError> {
        self.stripes.members.check_writable()?;
        // It writes the slot pages that changed, and takes the next
        // window from every free slot; and the map with every record
        // replayed.
        self.deferred.finish()?;
        let mut durable = self.durable();
        // A root alone may not fit where the pages would: it may not take
        // the free slots it lists as live, and on a full array those are
        // most of them (a bench dropped the checkpoint so, and opening
        // then scanned every slot).
        match self.take_checkpoint_locked(&mut durable, root_may_do)? {
            Some(()) => Ok(()),
            None => match self.take_checkpoint_locked(&mut durable, false)? {
                Some(()) => Ok(()),
                None => self.drop_checkpoint(&mut durable),
            },
        }
    }

    /// One try at a checkpoint (a root alone if `root_may_do` and it is
    /// worth it); `None` if it did not fit (nothing changed then but the
    /// pages taken, dirty again).
    fn take_checkpoint_locked(&self, durable: &mut Durable, root_may_do: bool) -> Result<Option<()>, ArrayError> {
        let start = self.lanes.tracker.last_sequence();
        let user_bytes = Counters::get(&self.stripes.counters.user_bytes_written);
        // Stripes taken early by a checkpoint that then failed lie outside
        // every window a root names: only pages (which hold what they
        // hold) name them.
        let root_only = root_may_do
            && !self.early_unnamed()
            && durable.since.as_ref().is_some_and(|since| {
                let index = self.catalog.index();
                let per_page = index.map.bytes() / index.map.page_count().max(1);
                let pages_cost = (index.map.dirty_count() * per_page) as u64;
                since.roots < CHECKPOINT_ROOTS_PER_PAGES_MAX
                    && start - since.sequence <= self.window_slots()
                    && pages_cost * CHECKPOINT_PAGES_COST_DIVISOR > user_bytes - since.user_bytes
            });
        let in_sparse = match root_only {
            true => InStripes::default(),
            false => self.images_in(
                &sparse_map_stripes(&durable.images, self.meta_stripe_bytes() as u64),
                &durable.images,
            )?,
        };
        let taken = self.choose_window(start, &durable.images, !root_only, in_sparse);
        let Taken {
            mut window,
            dirty,
            deltas,
            moved,
            dirs,
            live,
            slot_pages,
            as_of,
        } = taken;
        let slot_pages = slot_pages.map(|_| self.copy_slot_pages());
        let give_back_pages = || {
            let mut index = self.catalog.index_mut();
            index.map.give_back(dirty.iter().copied());
            if let Some(taken) = &slot_pages {
                index.slots.give_back_pages(taken);
            }
        };
        let give_back = |error: ArrayError| {
            self.end_restriction();
            give_back_pages();
            Err(error)
        };
        let copied = match self.copy_pages(&dirty, &deltas, &moved) {
            Ok(copied) => copied,
            Err(error) => return give_back(error),
        };
        // 3. Everything the copy points at is made durable (a root alone
        // names nothing new: the stripes it may not know of are in its
        // window).
        if !root_only {
            if let Err(error) = self.seal_and_sync_open() {
                return give_back(error);
            }
        }
        // Every stripe a page's image may point into is in the slot
        // table's pages as they were taken with the map's (no slot is
        // freed while the checkpoint is taken), or was sealed since: the
        // root names those too. A stripe may be open when the pages are
        // taken and hold a sequence older than the root's (assigned
        // before, sealed after); opening after a clean stop replays
        // nothing and must find it listed. A root alone names the last
        // pages' again, with the stripes sealed since those were taken
        // that are still there (a page left alone points only where the
        // map did when its image was taken: where the last pages'
        // checkpoint said, or where the slot's newer stripe is now).
        let mut resealed: BTreeMap<u64, u64> = self.catalog.index().slots.resealed().into_iter().collect();
        let (sequence, replay, as_of) = match (as_of, durable.since.as_ref()) {
            (Some(as_of), _) => (start, BTreeSet::new(), as_of),
            (None, Some(since)) => {
                // Those the pages' root listed, some since freed: the
                // pages may count in them.
                for &(slot, sequence) in &since.resealed {
                    resealed.entry(slot).or_insert(sequence);
                }
                let as_of = AsOf {
                    next_version: since.next_version,
                    volumes: since.volumes.clone(),
                    slot_live: durable.images.slot_live,
                };
                (since.sequence, since.replay.clone(), as_of)
            }
            (None, None) => unreachable!("a root alone names pages written before"),
        };
        let resealed: Vec<(u64, u64)> = resealed.into_iter().collect();
        let checkpoint = Checkpoint {
            sequence,
            next_version: as_of.next_version,
            resealed,
            window: Vec::new(),
            images: MapImages {
                slot_live: as_of.slot_live,
                ..MapImages::default()
            },
            volumes: as_of.volumes,
        };
        let changes = Changes {
            copied,
            dirs: &dirs,
            slot_pages: slot_pages.as_ref(),
            live,
        };
        match self.write_checkpoint(checkpoint, &mut window, replay, &durable.images, changes) {
            Ok(Some(written)) => {
                let mut index = self.catalog.index_mut();
                for taken in slot_pages.iter().flat_map(|taken| &taken.pages) {
                    index.slots.page_durable(taken.page, &taken.entries);
                    // Written as a delta (a page written whole has no
                    // deltas over it): the next one lists them again.
                    let pages = &written.root.images.slot_pages;
                    if pages.get(&taken.page).is_some_and(|p| p.deltas > 0) {
                        index.slots.still_changed(&taken.changed);
                    }
                }
                index.slots.set_window(Some(window.clone()));
                // Every stripe taken early is named now: in the window, or
                // sealed before the pages were taken.
                let recoverable = self.all_named();
                index.slots.release_drained(recoverable);
                let old = std::mem::replace(&mut index.checkpoint_slots, written.root_slots);
                for slot in old.into_iter().chain(written.emptied) {
                    index.slots.free(slot);
                }
                let root = written.root;
                index.map_stripes = root.images.stripes.len();
                // The pages written are as their new images say, unless
                // they changed since they were taken (dirty again).
                index.map.publish(written.dirs, written.pages);
                self.catalog.evict_pages(&mut index);
                drop(index);
                durable.images = root.images;
                match durable.since.as_mut().filter(|_| root_only) {
                    Some(since) => {
                        since.replay = written.replay;
                        since.roots += 1;
                        Counters::add(&self.stripes.counters.checkpoints_root_only, 1);
                    }
                    None => {
                        durable.since = Some(SincePages {
                            sequence: root.sequence,
                            next_version: root.next_version,
                            volumes: root.volumes,
                            resealed: root.resealed,
                            replay: written.replay,
                            roots: 0,
                            user_bytes,
                        })
                    }
                }
                Counters::add(&self.stripes.counters.checkpoints_written, 1);
                Ok(Some(()))
            }
            Ok(None) => {
                self.end_restriction();
                give_back_pages();
                Ok(None)
            }
            Err(error) => give_back(error),
        }
    }

    /// Ends a failed checkpoint's narrowing of allocation, and frees what
    /// drained meanwhile.
    fn end_restriction(&self) {
        let recoverable = self.lanes.tracker.lock().recoverable_through();
        let mut index = self.catalog.index_mut();
        index.slots.lift_restriction();
        index.slots.release_drained(recoverable);
    }

    /// Whether a stripe taken early (in the next window's slots while a
    /// checkpoint was written) is not named by the durable checkpoint:
    /// that checkpoint failed (sealed, or still open).
    fn early_unnamed(&self) -> bool {
        if self.lanes.tracker.lock().unnamed_from.is_some() {
            return true;
        }
        let index = self.catalog.index();
        let open = index
            .resident
            .iter()
            .any(|(&slot, r)| matches!(r, Resident::Open(_)) && index.slots.outside_window(slot));
        open
    }

    /// Called under the `index` write lock once a checkpoint that names
    /// every stripe is durable: FLUSHes waiting for it go on. Returns the
    /// sequence recovery finds every stripe through.
    fn all_named(&self) -> u64 {
        let mut t = self.lanes.tracker.lock();
        t.unnamed_from = None;
        let recoverable = t.recoverable_through();
        drop(t);
        self.lanes.tracker.changed.notify_all();
        recoverable
    }

    /// The images in map stripes `sparse`: the pages', found by reading
    /// every directory page (from memory, or from its map stripes: the
    /// directory is ~1/200 of the images it names, and this is done only
    /// once the map stripes are twice what the images need), and the
    /// directory pages'. Called with the checkpoint lock held, so that
    /// no directory page changes or map stripe is freed meanwhile.
    fn images_in(&self, sparse: &BTreeSet<u64>, images: &MapImages) -> Result<InStripes, ArrayError> {
        let mut found = InStripes::default();
        if sparse.is_empty() {
            return Ok(found);
        }
        let in_sparse = |image: &PageImage| image.all_pieces().any(|piece| sparse.contains(&piece.slot));
        found.slot_pages = images
            .slot_pages
            .iter()
            .filter(|(_, p)| in_sparse(&p.image))
            .map(|(&page, _)| page)
            .collect();
        for (&dir, own) in &images.dirs {
            if in_sparse(own) {
                found.dirs.insert(dir);
            }
            let entries = self.catalog.directory_page(dir, own)?.images;
            found
                .pages
                .extend(entries.into_iter().filter(|(_, image)| in_sparse(image)));
        }
        Ok(found)
    }

    /// Whether each map stripe's live bytes, as the durable root lists
    /// them, are the stored bytes of the images and deltas it names there
    /// (the map pages' through the directory, the directory pages' and
    /// the slot pages'): what a checkpoint subtracts for each image it
    /// replaces, and frees the stripe on at 0. `Array::check` runs it.
    pub(crate) fn check_map_stripes(&self) -> Result<(), String> {
        let durable = self.durable();
        let images = &durable.images;
        let mut named: BTreeMap<u64, u64> = BTreeMap::new();
        let mut count = |image: &PageImage| {
            for piece in image.all_pieces() {
                *named.entry(piece.slot).or_default() += u64::from(piece.bytes);
            }
        };
        for (&dir, own) in &images.dirs {
            count(own);
            let entries = self.catalog.directory_page(dir, own).map_err(|e| e.to_string())?;
            entries.images.values().for_each(|image| count(image));
        }
        images.slot_pages.values().for_each(|p| count(&p.image));
        let listed: BTreeMap<u64, u64> = images.stripes.iter().map(|(&slot, s)| (slot, s.live)).collect();
        match named == listed {
            true => Ok(()),
            false => Err(format!(
                "map stripes' live bytes {listed:?}, where the images named in them take {named:?}"
            )),
        }
    }

    /// Step 1: the next window (allocation is narrowed to it meanwhile)
    /// and the pages to write: the dirty ones, and, where the map stripes
    /// are more than twice (and one) what the images need, those whose
    /// images are in the sparsest of them (`in_sparse`, so that those are
    /// freed); with the durable images they replace, the directory pages
    /// that name them, and what each map stripe keeps.
    fn choose_window(&self, start: u64, images: &MapImages, pages: bool, in_sparse: InStripes) -> Taken {
        let size = self.window_slots() as usize;
        let mut live = images.live_bytes();
        let mut index = self.catalog.index_mut();
        let dirty = if pages { index.map.take_dirty() } else { BTreeSet::new() };
        // The dirty pages are copied as they are now, whatever changes
        // them before they are; the counts are what they add up to. Those
        // whose images are in sparse map stripes are taken whole, so that
        // their bases leave those.
        let mut delta_pages = BTreeSet::new();
        let as_of = pages.then(|| {
            delta_pages = index.map.begin_snapshot(&dirty, &|p| in_sparse.pages.contains_key(&p));
            AsOf {
                next_version: index.next_version,
                volumes: index.slots.volumes(),
                slot_live: index.slots.live_units(),
            }
        });
        // Clean pages in sparse map stripes: their images are copied as
        // they are stored.
        let moved: BTreeMap<u64, Arc<PageImage>> = in_sparse
            .pages
            .into_iter()
            .filter(|(page, _)| !dirty.contains(page))
            .collect();
        let slot_pages = pages.then(|| index.slots.begin_snapshot(&in_sparse.slot_pages));
        // What the pages written replace, and the directory pages that
        // name them (a changed page names its own: `Map::durable_image`).
        let mut old: BTreeMap<u64, Option<Arc<PageImage>>> = dirty
            .iter()
            .map(|&page| (page, index.map.durable_image(page)))
            .collect();
        old.extend(moved.iter().map(|(&page, image)| (page, Some(image.clone()))));
        let mut dirs = in_sparse.dirs;
        dirs.extend(old.keys().map(|&page| dir_of(page)));
        let deltas: BTreeMap<u64, Arc<PageImage>> = delta_pages
            .iter()
            .map(|&page| (page, old[&page].clone().expect("a page taken as a delta has an image")))
            .collect();
        // The map stripes this checkpoint empties (what it does with the
        // directory pages' and slot pages' images, whole or a delta over
        // them, it decides as it writes them: `write_checkpoint`).
        for (page, image) in old.iter().filter_map(|(page, image)| Some((page, image.as_ref()?))) {
            replaced(&mut live, image, deltas.contains_key(page));
        }
        let emptied = live.iter().filter(|&(_, &bytes)| bytes == 0).map(|(&slot, _)| slot);
        // Slots that may hold stripes newer than `start` before the new
        // checkpoint is durable: all of them go in, whatever the size.
        let mut window: BTreeSet<u64> = index
            .resident
            .iter()
            .filter(|(_, r)| matches!(r, Resident::Open(_)))
            .map(|(&slot, _)| slot)
            .collect();
        window.extend(index.slots.sealed_after(start));
        // Up to a window's worth of the usable slots stay (allocation goes
        // on from them, and from nothing else, until this is durable); a
        // window's worth of other free slots join.
        let usable = self.healthy_first(|| index.slots.usable_slots(), size);
        window.extend(usable);
        // The current root's slots, and the map stripes emptied, are free
        // once this checkpoint is durable, and only then: in the window,
        // they serve at once (on a full array, each checkpoint took free
        // slots for its stripes and gave back the old ones outside the
        // window, unusable, until garbage collection found no slot for
        // its copies).
        window.extend(index.checkpoint_slots.iter().copied());
        window.extend(emptied);
        let floor = window.len();
        let other_free = self.healthy_first(|| index.slots.free_slots().filter(|s| !window.contains(s)), size);
        window.extend(other_free);
        // On a full array, also the stripes garbage collection empties
        // first: emptied, they serve without waiting for a checkpoint.
        if window.len() < floor + size {
            let area = format::stripe_live_max(&self.stripes.geometry);
            let next = start + 1;
            let victims = index
                .slots
                .victims(area, next, floor + size - window.len(), true, |slot| {
                    window.contains(&slot)
                });
            window.extend(victims);
        }
        index.slots.restrict_usable(&window, self.next_window_early);
        Taken {
            window,
            dirty,
            deltas,
            moved,
            dirs,
            live,
            slot_pages,
            as_of,
        }
    }

    /// Up to `count` of the slots `slots` yields, those on healthy members
    /// first, each kind in the order given. Taken as they come, not
    /// collected and sorted: an array may have hundreds of millions of
    /// free slots, and a checkpoint wants a window's worth.
    fn healthy_first<I: Iterator<Item = u64>>(&self, slots: impl Fn() -> I, count: usize) -> Vec<u64> {
        let mut picked: Vec<u64> = slots().filter(|&s| self.stripes.all_healthy(s)).take(count).collect();
        if picked.len() < count {
            let wanted = count - picked.len();
            picked.extend(slots().filter(|&s| !self.stripes.all_healthy(s)).take(wanted));
        }
        picked
    }

    /// Step 2 for the slot table: the pages taken, as they were then,
    /// copied some per hold of the index (each changed before it is
    /// copied is copied before it changes).
    fn copy_slot_pages(&self) -> TakenPages {
        while !self
            .catalog
            .index_mut()
            .slots
            .copy_snapshot(CHECKPOINT_SLOT_PAGES_PER_LOCK)
        {}
        self.catalog.index_mut().slots.end_snapshot()
    }

    /// Step 2: the images of the pages `dirty` names, as they were when
    /// taken, copied for a millisecond per hold of the index's read lock
    /// (a page at least), then compressed, each hold's outside the lock
    /// (those `deltas` names as deltas over their durable image); and the
    /// stored images of the pages `moved` names, read from their map
    /// stripes, each followed by its delta if it has one.
    fn copy_pages(
        &self,
        dirty: &BTreeSet<u64>,
        deltas: &BTreeMap<u64, Arc<PageImage>>,
        moved: &BTreeMap<u64, Arc<PageImage>>,
    ) -> Result<Copied, ArrayError> {
        let algorithm = self.stripes.geometry.checksum;
        let mut run = Run::new(self.meta_stripe_bytes());
        let mut pages: Vec<NewPage> = Vec::with_capacity(dirty.len() + moved.len());
        let mut delta_bytes = 0;
        // A hold's copies, raw: each page's bytes (none: it was empty).
        let mut raw = Vec::new();
        let mut held: Vec<(u64, Option<Range<usize>>)> = Vec::new();
        let mut left = dirty.iter().copied().peekable();
        while left.peek().is_some() {
            {
                let index = self.catalog.index();
                let held_since = std::time::Instant::now();
                for page in left.by_ref() {
                    let at = raw.len();
                    let copied = index.map.snapshot_image(page, &mut raw);
                    held.push((page, copied.then_some(at..raw.len())));
                    if held_since.elapsed() >= CHECKPOINT_COPY_HOLD_MAX {
                        break;
                    }
                }
            }
            for (page, range) in held.drain(..) {
                let mut base_written = true;
                let image = range.map(|range| {
                    let new = run.push_image(&format::store_page_image(&raw[range]), algorithm);
                    match deltas.get(&page) {
                        Some(over) => {
                            base_written = false;
                            delta_bytes += new.bytes as usize;
                            PageImage {
                                delta: Some(Arc::new(new)),
                                ..PageImage::clone(over)
                            }
                        }
                        None => new,
                    }
                });
                let image = image.map(Arc::new);
                pages.push(NewPage {
                    page,
                    image,
                    base_written,
                });
            }
            raw.clear();
        }
        self.catalog.index().map.end_snapshot();
        let moved_from = run.len();
        for (&page, image) in moved {
            let whole = run.push_image(&self.catalog.read_page_image(page, image)?, algorithm);
            let delta = match &image.delta {
                Some(delta) => Some(Arc::new(
                    run.push_image(&self.catalog.read_page_image(page, delta)?, algorithm),
                )),
                None => None,
            };
            pages.push(NewPage {
                page,
                image: Some(Arc::new(PageImage { delta, ..whole })),
                base_written: true,
            });
        }
        // (The pages moved are clean: none is also dirty.)
        pages.sort_unstable_by_key(|p| p.page);
        debug_assert!(pages.windows(2).all(|two| two[0].page < two[1].page));
        Ok(Copied {
            moved_bytes: run.len() - moved_from,
            delta_bytes,
            run,
            pages,
        })
    }

    /// Step 4: the copied images into map stripes and the root into Meta
    /// stripes, in free slots (outside `window` where there are enough;
    /// those taken from it leave it), the root followed by its
    /// directory's stripes where it has more than the superblock lists;
    /// synced, then named by the superblocks. `None` if it does not fit.
    fn write_checkpoint(
        &self,
        mut checkpoint: Checkpoint,
        window: &mut BTreeSet<u64>,
        mut replay: BTreeSet<u64>,
        durable: &MapImages,
        changes: Changes<'_>,
    ) -> Result<Option<Written>, ArrayError> {
        let g = &self.stripes.geometry;
        let algorithm = g.checksum;
        let per_stripe = self.meta_stripe_bytes();
        let Changes {
            copied,
            dirs: touched,
            slot_pages: taken_slot_pages,
            mut live,
        } = changes;
        let root_alone = taken_slot_pages.is_none();
        // The images as one run of bytes over `image_stripes` stripes,
        // each cut where a stripe ends: the pages' (as copied), then the
        // directory pages'. Their pieces name a stripe by its number
        // among the new ones until they have slots.
        let place = |range: Range<usize>| place(per_stripe, range);
        let fresh = &copied.pages;
        let fresh_image = |page: u64| {
            fresh
                .binary_search_by_key(&page, |p| p.page)
                .ok()
                .map(|at| fresh[at].image.as_deref())
        };
        // The directory pages written, as they are now (the checkpoint
        // lock keeps them so), and where each one's new image goes: each
        // read, sized and let go, one at a time (a checkpoint after
        // writes all over a large array rewrites many), and read again
        // to be written once the slots are known. Each as a delta over
        // its durable image while the deltas since that image take no
        // more than the page would whole (FORMAT.md, "Directory page
        // deltas"), else whole, as those whose image or delta lies in a
        // sparse map stripe are (step 1 took them for that).
        let entries_of = |dir: u64| -> Result<DirEntries, ArrayError> {
            match durable.dirs.get(&dir) {
                Some(own) => self.catalog.directory_page(dir, own),
                None => Ok(DirEntries::default()),
            }
        };
        let sparse = match root_alone {
            true => BTreeSet::new(),
            false => sparse_map_stripes(durable, per_stripe as u64),
        };
        let in_sparse = |image: &PageImage| image.all_pieces().any(|piece| sparse.contains(&piece.slot));
        let mut at = copied.run.len();
        let mut dirs: Vec<DirWrite> = Vec::new();
        for &dir in touched {
            let DirEntries {
                images: entries,
                mut changed,
            } = entries_of(dir)?;
            let old = (
                entries.len() as u64,
                entries.values().map(|i| i.stored_bytes()).sum::<u64>(),
            );
            let entry_bytes = |image: &PageImage| format::directory_entry_bytes(algorithm, image);
            let (mut count, mut bytes) = (entries.len(), entries.values().map(|i| entry_bytes(i)).sum::<usize>());
            for new in under_directory_page(fresh, dir, |p| p.page) {
                if let Some(was) = entries.get(&new.page) {
                    count -= 1;
                    bytes -= entry_bytes(was);
                }
                if let Some(image) = &new.image {
                    count += 1;
                    bytes += entry_bytes(image);
                }
                changed.insert(new.page);
            }
            let whole = format::directory_image_bytes_of(bytes);
            let over = durable
                .dirs
                .get(&dir)
                .filter(|own| count > 0 && !changed.is_empty() && !in_sparse(own));
            let delta = over.and_then(|_| {
                let now = |page: &u64| match fresh_image(*page) {
                    Some(image) => image,
                    None => entries.get(page).map(|image| &**image),
                };
                let listed: usize = changed.iter().filter_map(now).map(entry_bytes).sum();
                let bytes = format::directory_delta_bytes_of(listed);
                let before = durable.dir_deltas.get(&dir).copied().unwrap_or(0);
                deltas_within(before, bytes, whole).map(|sum| (bytes, sum))
            });
            if let Some(own) = durable.dirs.get(&dir) {
                replaced(&mut live, own, delta.is_some());
            }
            let range = (count > 0).then(|| {
                let bytes = delta.map_or(whole, |(bytes, _)| bytes);
                at += bytes;
                at - bytes..at
            });
            let delta = delta.map(|(_, sum)| (changed, sum));
            dirs.push(DirWrite { dir, old, range, delta });
        }
        // Then the slot table's pages taken, each where it goes: as a
        // delta over its durable image while the deltas since that image
        // take no more than the page would whole (FORMAT.md, "Slot page
        // deltas"), else whole, as those whose image or delta lies in a
        // sparse map stripe are (step 1 took them for that). Packed as
        // their values allow: encoded to be sized.
        let slot_pages: Vec<SlotPageWrite> = taken_slot_pages
            .iter()
            .flat_map(|taken| &taken.pages)
            .map(|taken| {
                let page = taken.page;
                let mut deltas = None;
                let encoded = (!taken.entries.is_empty()).then(|| {
                    let over = durable
                        .slot_pages
                        .get(&page)
                        .filter(|over| !in_sparse(&over.image))
                        .filter(|_| !taken.changed.is_empty());
                    let delta = over.and_then(|over| {
                        let listed: Vec<format::SlotEntry> = taken
                            .entries
                            .iter()
                            .filter(|e| taken.changed.binary_search(&e.slot).is_ok())
                            .copied()
                            .collect();
                        let delta = format::encode_slot_delta_image(page, &taken.changed, &listed);
                        // (Sized, not encoded, whole: at 100 TiB of 8+2 a
                        // checkpoint may take 204,800 pages, and encoding
                        // one of 1,024 slots takes ~9 us.)
                        let whole = format::slot_page_image_bytes(&taken.entries);
                        deltas = deltas_within(over.deltas, delta.len(), whole);
                        deltas.map(|_| delta)
                    });
                    let encoded = delta.unwrap_or_else(|| format::encode_slot_page_image(page, &taken.entries));
                    at += encoded.len();
                    let range = at - encoded.len()..at;
                    (encoded, range)
                });
                if let Some(over) = durable.slot_pages.get(&page) {
                    replaced(&mut live, &over.image, deltas.is_some());
                }
                SlotPageWrite {
                    page,
                    entries: &taken.entries,
                    encoded,
                    deltas,
                }
            })
            .collect();
        let run_bytes = at;
        // What the run holds, by part (`Status::checkpoint_parts`; the
        // root's bytes are set once it is encoded).
        let range_bytes = |range: &Option<Range<usize>>| range.as_ref().map_or(0, |r| r.len() as u64);
        let slot_bytes = |as_deltas: bool| -> u64 {
            let written = slot_pages.iter().filter(|w| w.deltas.is_some() == as_deltas);
            written.flat_map(|w| &w.encoded).map(|(e, _)| e.len() as u64).sum()
        };
        let mut parts = CheckpointParts {
            page_images: (copied.run.len() - copied.delta_bytes) as u64,
            page_deltas: copied.delta_bytes as u64,
            page_images_moved: copied.moved_bytes as u64,
            directory_pages: dirs
                .iter()
                .filter(|d| d.delta.is_none())
                .map(|d| range_bytes(&d.range))
                .sum(),
            directory_page_deltas: dirs
                .iter()
                .filter(|d| d.delta.is_some())
                .map(|d| range_bytes(&d.range))
                .sum(),
            slot_pages: slot_bytes(false),
            slot_page_deltas: slot_bytes(true),
            roots: 0,
        };
        let image_stripes = run_bytes.div_ceil(per_stripe);
        let emptied: Vec<u64> = live.iter().filter(|&(_, &b)| b == 0).map(|(&slot, _)| slot).collect();
        for slot in &emptied {
            live.remove(slot);
        }
        // The root's size: its window is the new one, and those of the
        // roots since the pages (`replay`): stripes newer than its
        // sequence may be in either.
        replay.extend(window.iter().copied());
        checkpoint.window = replay.iter().copied().collect();
        // What the root names: the directory pages and slot pages left
        // alone, and those written.
        let written_slot_pages: BTreeSet<u64> = slot_pages.iter().map(|w| w.page).collect();
        let kept = durable.dirs.iter().filter(|(dir, _)| !touched.contains(dir)).chain(
            durable
                .slot_pages
                .iter()
                .filter(|(page, _)| !written_slot_pages.contains(page))
                .map(|(page, p)| (page, &p.image)),
        );
        let new = dirs.iter().filter_map(|d| d.range.clone()).chain(
            slot_pages
                .iter()
                .flat_map(|w| &w.encoded)
                .map(|(_, range)| range.clone()),
        );
        // A delta written names its durable image's pieces too.
        let dir_bases = dirs
            .iter()
            .filter(|d| d.delta.is_some())
            .map(|d| durable.dirs[&d.dir].pieces.len());
        let bases = slot_pages
            .iter()
            .filter(|w| w.deltas.is_some())
            .map(|w| durable.slot_pages[&w.page].image.pieces.len())
            .chain(dir_bases.clone());
        let named = kept.clone().count() + new.clone().count();
        let deltas = kept.clone().filter(|(_, image)| image.delta.is_some()).count()
            + slot_pages.iter().filter(|w| w.deltas.is_some()).count()
            + dir_bases.count();
        let named_pieces = kept.map(|(_, image)| image.all_pieces().count()).sum::<usize>()
            + new.map(|range| place(range).len()).sum::<usize>()
            + bases.sum::<usize>();
        let map_stripes = live.len() + image_stripes;
        let root_bytes = |checkpoint: &Checkpoint| {
            format::checkpoint_bytes(
                algorithm,
                format::RootShape {
                    stripes: checkpoint.resealed.len(),
                    window: checkpoint.window.len(),
                    map_stripes,
                    named,
                    deltas,
                    pieces: named_pieces,
                    volumes: checkpoint.volumes.len(),
                },
            )
        };
        let Some(mut root_at) = RootStripes::behind(algorithm, per_stripe, run_bytes, root_bytes(&checkpoint)) else {
            return Ok(None);
        };
        let count = root_at.end();
        let mut meta: Vec<u64> = {
            let mut index = self.catalog.index_mut();
            // A free slot has held nothing since the checkpoint began (no
            // slot drains free while allocation is restricted), so one in
            // the window may be taken (it then leaves the window).
            // Outside the window first, on healthy members first.
            // Nor one the root lists as live: a root alone names the
            // slot pages that listed the slots the pages pointed into,
            // some since freed (replay moves their blocks to where they
            // are now). (A free slot is in no page a checkpoint writes,
            // and freeing a slot changes its page.)
            let mut free: Vec<u64> = Vec::with_capacity(count);
            let window: &BTreeSet<u64> = window;
            let resealed = &checkpoint.resealed;
            let listed = |s: u64| {
                (root_alone && index.slots.listed(s)) || resealed.binary_search_by_key(&s, |&(slot, _)| slot).is_ok()
            };
            for in_window in [false, true] {
                let wanted = count - free.len();
                let more = self.healthy_first(
                    || {
                        index.slots.free_slots().filter(move |&s| {
                            !self.catalog.pins.pinned(s) && window.contains(&s) == in_window && !listed(s)
                        })
                    },
                    wanted,
                );
                free.extend(more);
            }
            if free.len() < count {
                return Ok(None);
            }
            for &slot in &free {
                index.slots.take(slot, SlotState::Open, &self.catalog.pins);
            }
            free
        };
        // Slots taken from the window leave it, and the root says so (it
        // only shrinks, so it needs no more stripes).
        // (Every one is removed: `any` would stop at the first.)
        let taken_from_window = meta
            .iter()
            .filter(|slot| window.remove(slot) | replay.remove(slot))
            .count();
        if taken_from_window > 0 {
            checkpoint.window = replay.iter().copied().collect();
            root_at = RootStripes::behind(algorithm, per_stripe, run_bytes, root_bytes(&checkpoint))
                .expect("a root whose window shrank needs no more stripes");
            let spare = meta.split_off(root_at.end());
            let mut index = self.catalog.index_mut();
            for slot in spare {
                // Not in the root's window (any more): no writer may take
                // it until a root names it.
                index.slots.narrow(slot);
                index.slots.release_open(slot);
            }
        }
        // The new stripes' slots go into the pages' and directory pages'
        // new images, then into the root with their sequences (assigned
        // once nothing can fail before they are written: a sequence
        // assigned and never written would hold back every sync).
        let with_slots = |mut pieces: Vec<ImagePiece>| {
            for piece in &mut pieces {
                piece.slot = meta[piece.slot as usize];
            }
            pieces
        };
        // In place: each image is the checkpoint's own until published.
        let Copied { mut run, mut pages, .. } = copied;
        let mine = "a new image is the checkpoint's alone";
        for new in &mut pages {
            let Some(image) = &mut new.image else {
                continue;
            };
            let image = Arc::get_mut(image).expect(mine);
            if new.base_written {
                image.pieces = with_slots(std::mem::take(&mut image.pieces));
            }
            if let Some(delta) = &mut image.delta {
                let delta = Arc::get_mut(delta).expect(mine);
                delta.pieces = with_slots(std::mem::take(&mut delta.pieces));
            }
        }
        let mut images = MapImages {
            stripes: BTreeMap::new(),
            dirs: durable.dirs.clone(),
            dir_deltas: durable.dir_deltas.clone(),
            slot_pages: durable.slot_pages.clone(),
            slot_live: checkpoint.images.slot_live,
            pages: durable.pages,
            page_bytes: durable.page_bytes,
        };
        // The directory pages whose entries are kept once it is durable:
        // those in memory, and new ones. The others stay out of memory
        // (one read in meanwhile is made from its old entries and the
        // pages written: `Directory::publish`).
        let kept: BTreeSet<u64> = {
            let index = self.catalog.index();
            let kept = |dir: &u64| !durable.dirs.contains_key(dir) || index.map.directory_page_resident(*dir);
            dirs.iter().map(|d| d.dir).filter(kept).collect()
        };
        let mut updates = Vec::with_capacity(dirs.len());
        for DirWrite { dir, old, range, delta } in dirs {
            let mut entries = match entries_of(dir) {
                Ok(entries) => entries.images,
                Err(error) => {
                    // Nothing written yet: the slots taken go back.
                    let mut index = self.catalog.index_mut();
                    for &slot in &meta {
                        index.slots.release_open(slot);
                    }
                    return Err(error);
                }
            };
            for NewPage { page, image, .. } in under_directory_page(&pages, dir, |p| p.page) {
                if let Some(was) = entries.remove(page) {
                    images.pages -= 1;
                    images.page_bytes -= was.stored_bytes();
                }
                if let Some(image) = image {
                    images.pages += 1;
                    images.page_bytes += image.stored_bytes();
                    entries.insert(*page, image.clone());
                }
            }
            images.dir_deltas.remove(&dir);
            let Some(range) = range else {
                assert!(entries.is_empty(), "a directory page sized empty names none");
                images.dirs.remove(&dir);
                updates.push(DirUpdate { dir, old, new: None });
                continue;
            };
            let encoded = match &delta {
                Some((changed, _)) => format::encode_directory_delta_image(algorithm, dir, changed, &entries),
                None => format::encode_directory_image(algorithm, dir, &entries),
            };
            assert_eq!(
                (run.len(), encoded.len()),
                (range.start, range.len()),
                "directory page {dir} as sized"
            );
            let written = PageImage::whole(
                encoded.len() as u32,
                algorithm.digest(&encoded),
                with_slots(place(range)),
            );
            run.push(&encoded);
            let own = Arc::new(match &delta {
                Some(_) => PageImage {
                    delta: Some(Arc::new(written)),
                    ..PageImage::clone(&durable.dirs[&dir])
                },
                None => written,
            });
            images.dirs.insert(dir, own.clone());
            let new = match (delta, kept.contains(&dir)) {
                (Some((changed, deltas)), keep) => {
                    images.dir_deltas.insert(dir, deltas);
                    match keep {
                        true => NewDir::delta(dir, &entries, own, changed),
                        false => NewDir::out_of_memory(&entries, own, changed),
                    }
                }
                (None, true) => NewDir::whole(dir, &encoded, algorithm.digest_bytes(), own),
                (None, false) => NewDir::out_of_memory(&entries, own, BTreeSet::new()),
            };
            updates.push(DirUpdate {
                dir,
                old,
                new: Some(new),
            });
        }
        for SlotPageWrite {
            page,
            entries,
            encoded,
            deltas,
        } in slot_pages
        {
            let Some((encoded, range)) = encoded else {
                images.slot_pages.remove(&page);
                continue;
            };
            assert_eq!(
                (run.len(), encoded.len()),
                (range.start, range.len()),
                "slot page {page} as sized"
            );
            let written = PageImage::whole(
                encoded.len() as u32,
                algorithm.digest(&encoded),
                with_slots(place(range)),
            );
            run.push(&encoded);
            let image = match deltas {
                Some(_) => PageImage {
                    delta: Some(Arc::new(written)),
                    ..PageImage::clone(&durable.slot_pages[&page].image)
                },
                None => written,
            };
            images.slot_pages.insert(
                page,
                format::SlotPageImage {
                    image: Arc::new(image),
                    kept: format::SlotPageImage::kept_of(entries),
                    deltas: deltas.unwrap_or(0),
                },
            );
        }
        assert_eq!(run.len(), run_bytes);
        let first = self.lanes.tracker.assign_many(meta.len());
        for (slot, bytes) in live {
            let sequence = durable.stripes[&slot].sequence;
            images.stripes.insert(slot, MapStripe { sequence, live: bytes });
        }
        for (i, &slot) in meta[..image_stripes].iter().enumerate() {
            let live = (run_bytes - i * per_stripe).min(per_stripe) as u64;
            images.stripes.insert(
                slot,
                MapStripe {
                    sequence: first + i as u64,
                    live,
                },
            );
        }
        checkpoint.images = images;
        debug_assert_eq!(checkpoint.encoded_bytes(algorithm), root_bytes(&checkpoint));
        let bytes = checkpoint.encode(algorithm);
        let RootStripes {
            first: root_first,
            body,
            directory,
        } = root_at;
        let root = &meta[root_first..];
        let listing = (directory > 0).then(|| format::encode_checkpoint_directory(algorithm, &root[..body]));
        // The root ends where its last stripe's room ends (in the images'
        // last stripe, if it fits behind them).
        run.pad_to((root_first + body) * per_stripe - bytes.len());
        run.push(&bytes);
        let listed = listing.iter().flat_map(|l| l.chunks(per_stripe)).map(<[u8]>::to_vec);
        let buffers: Vec<Vec<u8>> = run.into_stripes().into_iter().chain(listed).collect();
        assert_eq!(buffers.len(), meta.len());
        let mut buffers = buffers.into_iter();
        // Sealed and handed to the members a few at a time, in order, each
        // batch's buffers taken as it is built (`submit` waits while too
        // much is in flight): all at once, during a checkpoint of 46 MiB
        // of page images the heap held 108 MB of stripe buffers, the
        // lanes' own among them; 28-57 MB in batches (PERFORMANCE.md, "RAM
        // the map's count left out").
        let mut written = Ok(());
        for (batch, slots) in meta.chunks(CHECKPOINT_STRIPES_PER_SUBMIT).enumerate() {
            let at = batch * CHECKPOINT_STRIPES_PER_SUBMIT;
            let sealed = slots
                .iter()
                .zip(buffers.by_ref())
                .enumerate()
                .map(|(i, (&slot, piece))| {
                    let mut open = OpenStripe::new(slot, Stream::Meta, self.stripes.spare_area(), g);
                    // (Its bytes let go once copied into the stripe.)
                    open.push_data(&piece, false);
                    self.lanes.seal_as(open, SlotState::Checkpoint, first + (at + i) as u64)
                })
                .collect();
            // Every batch is submitted, whatever one before gave: a
            // failure waits for the last stripe to be written.
            written = written.and(self.lanes.submit(sealed));
        }
        let last = first + meta.len() as u64 - 1;
        let written = written.and_then(|()| self.lanes.sync_through(last));
        if written.is_ok() {
            let c = &self.stripes.counters;
            Counters::add(
                &c.checkpoint_bytes_written,
                (meta.len() * crate::lanes::stripe_bytes(g)) as u64,
            );
            parts.roots = (bytes.len() + listing.as_ref().map_or(0, |l| l.len())) as u64;
            Counters::add(&c.checkpoint_page_image_bytes, parts.page_images);
            Counters::add(&c.checkpoint_page_delta_bytes, parts.page_deltas);
            Counters::add(&c.checkpoint_page_moved_bytes, parts.page_images_moved);
            Counters::add(&c.checkpoint_directory_bytes, parts.directory_pages);
            Counters::add(&c.checkpoint_directory_delta_bytes, parts.directory_page_deltas);
            Counters::add(&c.checkpoint_slot_page_bytes, parts.slot_pages);
            Counters::add(&c.checkpoint_slot_delta_bytes, parts.slot_page_deltas);
            Counters::add(&c.checkpoint_root_bytes, parts.roots);
        }
        let reference = CheckpointRef {
            sequence: checkpoint.sequence,
            bytes: bytes.len() as u64,
            first_stripe_sequence: first + root_first as u64,
            digest: algorithm.digest(&bytes),
            slots: if directory > 0 {
                root[body..].to_vec()
            } else {
                root.to_vec()
            },
            directory: directory > 0,
        };
        let published = written.and_then(|()| {
            let mut superblock = self.stripes.members.superblock();
            let mut template = superblock.clone();
            template.checkpoint = Some(reference);
            self.stripes.members.publish_locked(&mut superblock, template)
        });
        if let Err(error) = published {
            // The old checkpoint stays the durable one; these slots are
            // free again once their writes are done.
            self.lanes.tracker.wait_written(last);
            let mut index = self.catalog.index_mut();
            for &slot in &meta {
                index.slots.free(slot);
            }
            return Err(error);
        }
        Ok(Some(Written {
            // Not the images' last stripe where the root begins in it: a
            // map stripe, freed once no image in it is named.
            root_slots: meta[root_first.max(image_stripes)..].to_vec(),
            root: checkpoint,
            emptied,
            replay,
            dirs: updates,
            pages: pages.into_iter().map(|new| (new.page, new.image)).collect(),
        }))
    }

    /// Makes the superblocks say there is no checkpoint, so that any free
    /// slot may be written: recovery will scan them all. The pages'
    /// images stay where they are (an evicted page has no other copy),
    /// for the next checkpoint to name again; only the root's slots are
    /// given back.
    fn drop_checkpoint(&self, durable: &mut Durable) -> Result<(), ArrayError> {
        durable.since = None;
        let mut superblock = self.stripes.members.superblock();
        if superblock.checkpoint.is_some() {
            let mut template = superblock.clone();
            template.checkpoint = None;
            self.stripes.members.publish_locked(&mut superblock, template)?;
            Counters::add(&self.stripes.counters.checkpoints_dropped, 1);
        }
        drop(superblock);
        let mut index = self.catalog.index_mut();
        index.slots.set_window(None);
        // Recovery scans every slot now.
        let recoverable = self.all_named();
        index.slots.release_drained(recoverable);
        for slot in std::mem::take(&mut index.checkpoint_slots) {
            index.slots.free(slot);
        }
        Ok(())
    }
}

/// Where a root goes behind a checkpoint's run of page images, in
/// stripes counted from the run's first: it ends where a stripe's room
/// ends (`format::CheckpointRef::root_offset`), in the run's last stripe
/// if it fits behind the images there.
#[derive(Clone, Copy, Debug, PartialEq)]
struct RootStripes {
    /// The stripe it begins in: the run's last, or the one after.
    first: usize,
    /// Its stripes, from `first`.
    body: usize,
    /// Its directory's, after those (0 when the superblock lists its own).
    directory: usize,
}

impl RootStripes {
    /// A root of `bytes` behind `run` bytes of images, `per_stripe`
    /// bytes a stripe; `None` past what a directory the superblock lists
    /// can hold.
    fn behind(algorithm: tessera_checksum::Algorithm, per_stripe: usize, run: usize, bytes: usize) -> Option<Self> {
        let end = (run + bytes).div_ceil(per_stripe);
        let first = (end * per_stripe - bytes) / per_stripe;
        let body = end - first;
        let directory = match body <= CHECKPOINT_SLOTS_MAX {
            true => 0,
            false => format::checkpoint_directory_bytes(algorithm, body).div_ceil(per_stripe),
        };
        (directory <= CHECKPOINT_SLOTS_MAX).then_some(Self { first, body, directory })
    }

    /// The stripes the checkpoint takes: the images', the root's, its
    /// directory's.
    fn end(&self) -> usize {
        self.first + self.body + self.directory
    }
}

/// Takes out of the map stripes' live bytes (`live`) what a page's new
/// image or delta replaces of `durable`, its durable image: written as a
/// delta over it (`as_delta`), the delta over it alone (the image
/// stays); else the image and its delta. For map pages, directory pages
/// and slot pages alike.
fn replaced(live: &mut BTreeMap<u64, u64>, durable: &PageImage, as_delta: bool) {
    let image = durable.pieces.iter().filter(|_| !as_delta);
    for piece in image.chain(durable.delta.iter().flat_map(|delta| delta.pieces.iter())) {
        *live.get_mut(&piece.slot).expect("a piece is in a listed map stripe") -= u64::from(piece.bytes);
    }
}

/// The bytes the deltas over a page's image take with one more of
/// `delta` bytes (`before`: those written since the image), if that is no
/// more than the page takes whole now (`whole`); `None`: it goes whole.
/// The rule directory pages and slot pages follow (map pages', with their
/// keys for bytes, is `map/delta.rs`).
fn deltas_within(before: u32, delta: usize, whole: usize) -> Option<u32> {
    let sum = before as usize + delta;
    (sum <= whole).then_some(sum as u32)
}

/// The sparsest map stripes, past twice (and one) the stripes the
/// images need: their images are written again, so that they are freed.
fn sparse_map_stripes(images: &MapImages, per_stripe: u64) -> BTreeSet<u64> {
    let live = images.live_bytes();
    let needed = live.values().sum::<u64>().div_ceil(per_stripe) as usize;
    let excess = live.len().saturating_sub(MAP_STRIPES_PER_NEEDED * needed + 1);
    let mut by_live: Vec<(u64, u64)> = live.iter().map(|(&bytes_slot, &bytes)| (bytes, bytes_slot)).collect();
    by_live.sort_unstable();
    by_live.iter().take(excess).map(|&(_, slot)| slot).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::MAP_DIRECTORY_PAGES;

    /// 4+2 of 64 KiB chunks on six 64 MiB memory devices (lz4, no log, no
    /// background work), exporting `pages` map pages' worth of blocks.
    fn thin_array(pages: u64) -> crate::engine::Array {
        let devices: Vec<(String, Arc<dyn crate::device::Device>)> = (0..6)
            .map(|i| {
                let device = crate::device::MemoryDevice::new(64 << 20);
                (format!("m{i}"), Arc::new(device) as Arc<dyn crate::device::Device>)
            })
            .collect();
        let options = crate::create::CreateOptions {
            data: 4,
            parity: 2,
            chunk_bytes: 64 << 10,
            checksum: tessera_checksum::Algorithm::Crc32c,
            compression: Some(tessera_compress::Codec::Lz4),
            logical_bytes: Some(pages * crate::limits::MAP_PAGE_BLOCKS * 4096),
            log_bytes: Some(0),
        };
        let engine = crate::options::EngineOptions {
            background: false,
            ..crate::options::EngineOptions::default()
        };
        crate::create::create_with(devices, &options, engine).unwrap()
    }

    /// A checkpoint's working memory: what it holds at most while it
    /// writes, beyond what the array held before it began, is within the
    /// room the cache keeps for it (`Map::checkpoint_work_bytes`), for
    /// pages of one block each (as random writes over a large array leave
    /// them: each page's image is small, and the checkpoint's own
    /// bookkeeping most of what it holds) and of 16. It failed before the
    /// checkpoint kept its pages in one sorted list, compressed each
    /// hold's copies as it went and held its run of bytes a stripe a
    /// buffer: 615 bytes a page of one block, beside the 192 the page
    /// takes in the cache (PERFORMANCE.md, "A checkpoint's working
    /// memory").
    #[test]
    fn a_checkpoint_holds_little_beside_the_pages_it_writes() {
        use crate::test_heap as heap;
        let page_bytes = crate::limits::MAP_PAGE_BLOCKS * 4096;
        for (pages, per_page) in [(20_000u64, 1u64), (5_000, 16)] {
            let array = thin_array(pages);
            // Blocks over every page, in an order that leaves no two of a
            // page's blocks side by side in a stripe; then a block in
            // each page again, its directory pages let go (as a small
            // cache does under writes all over a large array): the
            // checkpoint rewrites them without keeping them.
            let mut model = BTreeMap::new();
            for round in 0..2u64 {
                let mut page = 0;
                let blocks = if round == 0 { pages * per_page } else { pages };
                for i in 0..blocks {
                    page = (page + 7919) % pages;
                    let at = page * page_bytes + ((i + round) * 37 % crate::limits::MAP_PAGE_BLOCKS) * 4096;
                    let byte = ((i + round) % 251) as u8;
                    array.write(at, &[byte; 4096], false).unwrap();
                    model.insert(at, byte);
                }
                array.flush().unwrap();
                if round == 1 {
                    let mut index = array.shared.catalog.index_mut();
                    index.map.evict(0, &|_| false, &|_| false);
                    assert_eq!(index.map.directory_counts().1, 0, "every directory page let go");
                }
                // (A spent window may have had a checkpoint write some.)
                let (dirty, room) = {
                    let index = array.shared.catalog.index();
                    (index.map.dirty_count() as u64, index.map.checkpoint_work_bytes() as i64)
                };
                assert!(
                    dirty > pages * 9 / 10,
                    "{dirty} of {pages} pages changed since the last checkpoint"
                );
                let before = heap::watch();
                array.checkpoint().unwrap();
                let held = (heap::peak() - before) as i64;
                assert_eq!(array.shared.catalog.index().map.dirty_count(), 0);
                assert!(
                    held <= room,
                    "pages of {per_page} blocks, round {round}: a checkpoint held {} bytes a page, {} kept for it",
                    held / dirty as i64,
                    room / dirty as i64
                );
            }
            assert_eq!(
                array.shared.catalog.index().map.directory_counts().1,
                0,
                "the directory pages written stay out of memory"
            );
            for (&at, &byte) in model.iter().step_by(97) {
                let mut back = [0u8; 4096];
                array.read(at, &mut back).unwrap();
                assert_eq!(back, [byte; 4096], "the block at {at}");
            }
            array.close().unwrap();
        }
    }

    /// A checkpoint of a few pages all over a large array holds little
    /// more than they take: the directory pages it rewrites, out of
    /// memory, are read, rewritten and let go one at a time. It failed
    /// before a directory page not in memory was left out of memory once
    /// written: every one written was kept packed until the checkpoint
    /// was durable, 22 KiB for each page of this test (1,480,461 bytes
    /// held, where 582,781 are now).
    #[test]
    fn a_checkpoint_of_pages_all_over_keeps_no_directory_page() {
        use crate::test_heap as heap;
        let page_bytes = crate::limits::MAP_PAGE_BLOCKS * 4096;
        let (dirs, pages) = (40, 40 * MAP_DIRECTORY_PAGES);
        let array = thin_array(pages);
        for page in 0..pages {
            array.write(page * page_bytes, &[page as u8; 4096], false).unwrap();
        }
        array.checkpoint().unwrap();
        // A block in one page of each directory page, then the directory
        // pages let go (and every clean page).
        for dir in 0..dirs {
            let page = dir * MAP_DIRECTORY_PAGES + 100;
            array.write(page * page_bytes + 4096, &[1; 4096], false).unwrap();
        }
        array.flush().unwrap();
        let room = {
            let mut index = array.shared.catalog.index_mut();
            index.map.evict(0, &|_| false, &|_| false);
            assert_eq!(index.map.directory_counts().1, 0, "every directory page let go");
            assert_eq!(index.map.dirty_count() as u64, dirs);
            index.map.checkpoint_work_bytes() as i64
        };
        let c = &array.shared.stripes.counters;
        let written = || {
            [
                &c.checkpoint_page_image_bytes,
                &c.checkpoint_page_delta_bytes,
                &c.checkpoint_directory_bytes,
                &c.checkpoint_directory_delta_bytes,
                &c.checkpoint_slot_page_bytes,
                &c.checkpoint_slot_delta_bytes,
                &c.checkpoint_root_bytes,
            ]
            .into_iter()
            .map(|counter| Counters::get(counter) as i64)
            .sum::<i64>()
        };
        let written_before = written();
        let before = heap::watch();
        array.checkpoint().unwrap();
        let held = (heap::peak() - before) as i64;
        let written = written() - written_before;
        // Beside the room kept for the pages and the bytes it wrote, a
        // stripe's buffer of its run and one of a stripe being sealed.
        let stripes = 2 * crate::lanes::stripe_bytes(&array.shared.stripes.geometry) as i64;
        assert!(
            held <= room + written + stripes,
            "a checkpoint of {dirs} pages held {held} bytes: {room} kept for them, {written} written"
        );
        assert_eq!(array.shared.catalog.index().map.directory_counts().1, 0);
        let mut back = [0u8; 4096];
        array
            .read((5 * MAP_DIRECTORY_PAGES + 100) * page_bytes + 4096, &mut back)
            .unwrap();
        assert_eq!(back, [1; 4096]);
        array.read(7 * page_bytes, &mut back).unwrap();
        assert_eq!(back, [7; 4096]);
        array.close().unwrap();
    }

    #[test]
    fn a_root_goes_behind_the_images_where_it_fits() {
        let a = tessera_checksum::Algorithm::Crc32c;
        let at = |run, bytes| RootStripes::behind(a, 1000, run, bytes).unwrap();
        let place = |first, body, directory| RootStripes { first, body, directory };
        // Alone: in stripes of its own, ending where the last one ends.
        assert_eq!(at(0, 300), place(0, 1, 0));
        assert_eq!(at(0, 1000), place(0, 1, 0));
        assert_eq!(at(0, 1001), place(0, 2, 0));
        // Behind the images, in their last stripe where it fits.
        assert_eq!(at(2500, 500), place(2, 1, 0));
        assert_eq!(at(2500, 501), place(3, 1, 0));
        // Begun there, it goes on into the next: only the tail is shared.
        assert_eq!(at(2500, 1400), place(2, 2, 0));
        // Images that fill their last stripe: the root after them.
        assert_eq!(at(3000, 10), place(3, 1, 0));
        // Every byte placed once: the stripes hold the run and the root.
        for run in [0, 1, 999, 1000, 1001, 7777] {
            for bytes in [1, 2, 999, 1000, 1001, 4321] {
                let r = at(run, bytes);
                let end = (r.first + r.body) * 1000;
                // After the run, less than a stripe after it, in no more
                // stripes than its size needs.
                assert!(end - bytes >= run && end - bytes - run < 1000, "{run} {bytes}");
                assert_eq!(r.first + r.body, (run + bytes).div_ceil(1000));
                assert_eq!(r.body, bytes.div_ceil(1000), "{run} {bytes}");
            }
        }
        // More stripes than the superblock lists: a directory after them.
        let wide = at(0, 1000 * (CHECKPOINT_SLOTS_MAX + 1));
        assert_eq!((wide.body, wide.directory), (CHECKPOINT_SLOTS_MAX + 1, 4));
        assert!(RootStripes::behind(a, 1000, 0, 1000 * 1000 * CHECKPOINT_SLOTS_MAX).is_none());
    }
}
