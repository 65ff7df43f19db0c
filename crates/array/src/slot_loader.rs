//! The slot table's durable pages that opening left unread
//! (`SlotTable::defer_pages`): read after it, in the background, and at
//! once by whatever needs them first.
//!
//! - A read of data in a slot whose page is unread reads that page
//!   (`Catalog::slot_sequence`), with no lock held, as a map page miss
//!   does; this module reads the rest (`Catalog::take_unread`, a batch
//!   at a time).
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
//! lock (a page of 1,024 slots). Whoever reads them all holds
//! `Deferred::slot_loading`, so two such readers do not read the same
//! pages; a single page read for a read may be read twice (the second
//! finds it taken, and drops it).

use crate::deferred::Deferred;
use crate::error::ArrayError;
use crate::events::What;

impl Deferred {
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
            |why| What::SlotPagesUnreadable { why },
        );
    }

    /// Reads and takes in one batch of unread pages; false if none was
    /// left.
    fn read_unread_batch(&self) -> Result<bool, ArrayError> {
        let batch = self.catalog.index().slots.unread_pages(.., self.slot_pages_per_batch);
        if batch.is_empty() {
            return Ok(false);
        }
        self.catalog.take_unread(&batch)?;
        Ok(true)
    }
}
