//! The slot table's durable pages that opening left unread
//! (`SlotTable::defer_pages`): read after it, in the background, and at
//! once by whatever needs them first.
//!
//! - A read of data in a slot whose page is unread reads that page
//!   (`slot_sequence`), with no lock held, as a map page miss does.
//! - Whatever looks at every slot reads every page first
//!   (`read_every_slot_page`): a checkpoint (it writes the pages, and
//!   chooses the next window from the free slots), garbage collection,
//!   a rebuild, a scrub, a heal and the engine's check. So nothing
//!   durable changes until every page is read, and a crash before then
//!   reopens from the same root.
//! - A page that cannot be read (past repair, or not adding up with the
//!   root) is marked in the members' activity records, synced within a
//!   heartbeat: the next opening reads every page before it serves, and
//!   if one still fails, scans every slot (`recovery`). Without the mark
//!   each opening would leave the page for later again, and no
//!   checkpoint could ever be written.
//! - Client writes do not wait: the map's deltas on a slot of an unread
//!   page are kept aside and taken from what the page lists when it is
//!   read (`SlotTable::restore_unread`); stripes go only to the window's
//!   slots, whose pages opening read.
//!
//! Pages are read a batch at a time in parallel on the I/O pool, and
//! taken into the table each under its own hold of the index's write
//! lock (a page of 1,024 slots). Whoever reads them all holds `Shared::slot_loading`, so two
//! such readers do not read the same pages; a single page read for a
//! read may be read twice (the second finds it taken, and drops it).

use crate::engine::Shared;
use crate::error::{ArrayError, CheckpointFault};
use crate::format::PageImage;
use crate::limits::SLOT_TABLE_PAGE_SLOTS;
use std::sync::Arc;

impl Shared {
    /// Reads every slot page opening left unread, if any is.
    pub(crate) fn read_every_slot_page(&self) -> Result<(), ArrayError> {
        if self.catalog.index().slots.unread_count() == 0 {
            return Ok(());
        }
        self.every_batch(&self.slot_loading, || self.read_unread_batch())
    }

    /// The background thread's work after opening: every unread page,
    /// stopping between batches once the array closes (whoever needs
    /// the rest then reads it). A page that cannot be read is left
    /// unread, and an event says so: what needs it fails with the error.
    pub(crate) fn read_slot_pages_in_background(&self) {
        self.batches_in_background(
            &self.slot_loading,
            || self.read_unread_batch(),
            |why| crate::events::What::SlotPagesUnreadable { why },
        );
    }

    /// Reads and takes in one batch of unread pages; false if none was
    /// left.
    fn read_unread_batch(&self) -> Result<bool, ArrayError> {
        let batch = self
            .catalog
            .index()
            .slots
            .unread_pages(.., self.options.open_slot_pages_per_batch.max(1));
        if batch.is_empty() {
            return Ok(false);
        }
        self.take_unread(&batch)?;
        Ok(true)
    }

    /// The sequence of the stripe in `slot` (on the members), its slot
    /// page read first if opening left it unread.
    pub(crate) fn slot_sequence(&self, slot: u64) -> Result<u64, ArrayError> {
        let page = {
            let index = self.catalog.index();
            if !index.slots.is_unread(slot) {
                return Ok(index.slots.get(slot).sequence);
            }
            let page = slot / SLOT_TABLE_PAGE_SLOTS;
            index.slots.unread_pages(page..=page, 1)
        };
        // Taken in here, or by another meanwhile: either way it is read.
        self.take_unread(&page)?;
        Ok(self.catalog.index().slots.get(slot).sequence)
    }

    /// Reads `pages` and takes them into the slot table (those another
    /// took meanwhile are dropped); a slot emptied by the deltas kept
    /// aside drains as one a write empties does. If one cannot be taken,
    /// the table is marked so, and the activity records then tell the
    /// next opening to read every page at once (where a page past repair
    /// sends it to the full scan) instead of leaving them for later
    /// again.
    fn take_unread(&self, pages: &[(u64, Arc<PageImage>)]) -> Result<(), ArrayError> {
        let taken = self.take_unread_now(pages);
        if taken.is_err() {
            self.catalog.index_mut().slots.mark_unreadable();
        }
        taken
    }

    fn take_unread_now(&self, pages: &[(u64, Arc<PageImage>)]) -> Result<(), ArrayError> {
        let unreadable = |why: CheckpointFault| ArrayError::CheckpointUnreadable { why };
        let read = self.read_slot_pages(pages).map_err(unreadable)?;
        // A hold of the index a page (1,024 slots), not a batch: clients
        // go on between.
        for (page, entries) in read {
            let mut index = self.catalog.index_mut();
            let emptied = index.slots.restore_unread(page, &entries).map_err(|fault| {
                unreadable(CheckpointFault::SlotPage {
                    page,
                    source: Box::new(unreadable(fault)),
                })
            })?;
            // Every stripe that superseded what they held is sealed by
            // now, or open and known to `superseded` (garbage collection,
            // which relocates, waits for every page).
            index.drain_emptied_now(emptied);
        }
        Ok(())
    }
}
