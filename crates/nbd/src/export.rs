//! What the server serves: a [`Catalog`] of [`Export`]s by name, and how
//! an export says a request failed. The server checks every offset and
//! length against [`Export::size`] before it calls anything here.

use std::sync::Arc;

/// Why an export could not carry out a request: the protocol's errno, and
/// what went wrong in words for clients that take structured replies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub errno: u32,
    pub message: Option<String>,
}

impl From<u32> for Failure {
    fn from(errno: u32) -> Failure {
        Failure { errno, message: None }
    }
}

/// A byte range with these operations, called from many threads at once.
pub trait Export: Send + Sync + 'static {
    fn size(&self) -> u64;
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Failure>;
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Failure>;
    fn flush(&self) -> Result<(), Failure>;
    fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure>;
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Failure>;
    /// How [offset, offset+len) is stored, as consecutive runs from
    /// `offset` (bytes, [`crate::STATE_HOLE`] | [`crate::STATE_ZERO`]
    /// flags) that cover at least its first byte. By default: all
    /// allocated, contents unknown, which the protocol always allows.
    fn block_status(&self, _offset: u64, len: u64) -> Result<Vec<(u64, u32)>, Failure> {
        Ok(vec![(len, 0)])
    }
    /// NBD_CMD_CACHE: make the next reads of [offset, offset+len) cheap if
    /// anything can. By default nothing needs doing.
    fn cache(&self, _offset: u64, _len: u64) -> Result<(), Failure> {
        Ok(())
    }
}

/// The exports a server offers, by name. Names may come and go while it
/// serves (volumes created and deleted); a connection keeps the export it
/// chose.
pub trait Catalog<E: Export>: Send + Sync + 'static {
    /// The exports' names and descriptions, the default export first.
    fn list(&self) -> Vec<(String, String)>;
    /// The export called `name`; the empty name is the default export.
    fn open(&self, name: &str) -> Option<Arc<E>>;
}

/// One export under one name (the empty name reaches it too).
pub struct Single<E> {
    pub export: Arc<E>,
    pub name: String,
    pub description: String,
}

impl<E: Export> Catalog<E> for Single<E> {
    fn list(&self) -> Vec<(String, String)> {
        vec![(self.name.clone(), self.description.clone())]
    }

    fn open(&self, name: &str) -> Option<Arc<E>> {
        (name.is_empty() || name == self.name).then(|| self.export.clone())
    }
}
