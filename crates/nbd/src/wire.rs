//! The NBD wire format, as pure functions: bytes in, typed values or typed
//! errors out, and typed values in, bytes out. Nothing here does I/O, so
//! every parser can be property-tested and fuzzed (`fuzz/`).
//!
//! Protocol: NetworkBlockDevice/nbd `doc/proto.md`. Every integer on the
//! wire is big-endian. The server's side is complete (it parses what
//! clients send and encodes what it answers); the client's side is here
//! only where tests and the fuzzer need it (encoding options and requests).

use crate::export::Failure;

pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
pub const IHAVEOPT: u64 = 0x4948_4156_454F_5054;
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

pub const FLAG_FIXED_NEWSTYLE: u16 = 1;
pub const FLAG_NO_ZEROES: u16 = 2;
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1;
pub const CLIENT_FLAG_NO_ZEROES: u32 = 2;

pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_TLS_REQD: u32 = 0x8000_0005;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

pub const TFLAG_HAS_FLAGS: u16 = 1;
pub const TFLAG_SEND_FLUSH: u16 = 4;
pub const TFLAG_SEND_FUA: u16 = 8;
pub const TFLAG_SEND_TRIM: u16 = 32;
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 64;
pub const TFLAG_SEND_DF: u16 = 128;
pub const TFLAG_CAN_MULTI_CONN: u16 = 256;
pub const TFLAG_SEND_CACHE: u16 = 1024;
pub const TFLAG_SEND_FAST_ZERO: u16 = 2048;

pub const CMD_FLAG_FUA: u16 = 1;
pub const CMD_FLAG_NO_HOLE: u16 = 2;
pub const CMD_FLAG_DF: u16 = 4;
pub const CMD_FLAG_REQ_ONE: u16 = 8;
pub const CMD_FLAG_FAST_ZERO: u16 = 16;
const CMD_FLAGS_KNOWN: u16 = CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_DF | CMD_FLAG_REQ_ONE | CMD_FLAG_FAST_ZERO;

pub const REPLY_FLAG_DONE: u16 = 1;
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
pub const REPLY_TYPE_ERROR: u16 = 0x8001;

/// Block sizes advertised: any request down to one byte works (the array
/// merges partial blocks, as nbdkit's file plugin does; libnbd holds
/// clients to the minimum, so fuse2fs's few-byte superblock writes through
/// nbdfuse need it), 4 KiB is its block, 32 MiB the largest request.
pub const BLOCK_SIZE_MIN: u32 = 1;
pub const BLOCK_SIZE_PREFERRED: u32 = 4096;
pub const REQUEST_BYTES_MAX: u32 = 32 << 20;
/// Option payloads longer than this are refused (NBD_REP_ERR_TOO_BIG); the
/// longest a client sends is a list of metadata context queries.
pub const OPTION_BYTES_MAX: u32 = 64 << 10;
/// The protocol's limit on a string, error messages included.
pub const STRING_BYTES_MAX: usize = 4096;
/// The protocol's limit on descriptors in one BLOCK_STATUS reply.
pub const DESCRIPTORS_MAX: usize = 1 << 20;

/// The one metadata context offered, and the id it is selected under.
pub const BASE_ALLOCATION: &str = "base:allocation";
pub const BASE_ALLOCATION_ID: u32 = 1;
/// `base:allocation` flags: not allocated (a write there may need space).
pub const STATE_HOLE: u32 = 1;
/// `base:allocation` flags: reads as zeros.
pub const STATE_ZERO: u32 = 2;

/// Errno values the protocol defines.
pub mod errno {
    pub const EPERM: u32 = 1;
    pub const EIO: u32 = 5;
    pub const ENOMEM: u32 = 12;
    pub const EINVAL: u32 = 22;
    pub const ENOSPC: u32 = 28;
    pub const EOVERFLOW: u32 = 75;
    pub const ENOTSUP: u32 = 95;
    pub const ESHUTDOWN: u32 = 108;
}

/// Bytes a client sent that end the conversation: after any of these the
/// framing of what follows cannot be trusted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("client flags {0:#x}: fixed newstyle is required and no other flags are known")]
    ClientFlags(u32),
    #[error("option magic {0:#x} is not IHAVEOPT")]
    OptionMagic(u64),
    #[error("request magic {0:#x} is not NBD_REQUEST_MAGIC")]
    RequestMagic(u32),
    #[error("a write of {0} bytes: over the largest request, {REQUEST_BYTES_MAX}")]
    WriteTooLarge(u32),
}

/// The server's greeting: magic, IHAVEOPT, handshake flags.
pub fn greeting() -> [u8; 18] {
    let mut hello = [0; 18];
    hello[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
    hello[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
    hello[16..].copy_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    hello
}

/// The client's flags; whether it asked for no zeroes after EXPORT_NAME.
pub fn parse_client_flags(bytes: [u8; 4]) -> Result<bool, WireError> {
    let flags = u32::from_be_bytes(bytes);
    if flags & CLIENT_FLAG_FIXED_NEWSTYLE == 0 || flags & !(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES) != 0 {
        return Err(WireError::ClientFlags(flags));
    }
    Ok(flags & CLIENT_FLAG_NO_ZEROES != 0)
}

/// An option's header: which option, and how many bytes of data follow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionHeader {
    pub option: u32,
    pub len: u32,
}

impl OptionHeader {
    pub const BYTES: usize = 16;

    pub fn parse(bytes: &[u8; Self::BYTES]) -> Result<OptionHeader, WireError> {
        let magic = u64::from_be_bytes(bytes[..8].try_into().expect("8 bytes"));
        if magic != IHAVEOPT {
            return Err(WireError::OptionMagic(magic));
        }
        Ok(OptionHeader {
            option: u32::from_be_bytes(bytes[8..12].try_into().expect("4 bytes")),
            len: u32::from_be_bytes(bytes[12..].try_into().expect("4 bytes")),
        })
    }
}

/// An option a client sent, its data parsed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ClientOption {
    ExportName(Vec<u8>),
    Abort,
    List,
    StartTls,
    /// NBD_OPT_INFO (`go` false) or NBD_OPT_GO: an export name and the
    /// information items asked for.
    Info {
        go: bool,
        name: Vec<u8>,
        items: Vec<u16>,
    },
    StructuredReply,
    /// NBD_OPT_LIST_META_CONTEXT (`set` false) or SET_META_CONTEXT.
    MetaContext {
        set: bool,
        export: Vec<u8>,
        queries: Vec<Vec<u8>>,
    },
    Unknown(u32),
}

/// Option data that does not parse: answered with NBD_REP_ERR_INVALID and
/// this reason; the negotiation goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct MalformedOption(pub &'static str);

impl ClientOption {
    /// Parses option `option`'s `data`.
    pub fn parse(option: u32, data: &[u8]) -> Result<ClientOption, MalformedOption> {
        let empty = |value: ClientOption| {
            if data.is_empty() {
                Ok(value)
            } else {
                Err(MalformedOption("this option takes no data"))
            }
        };
        match option {
            OPT_EXPORT_NAME => Ok(ClientOption::ExportName(data.to_vec())),
            // ABORT's data is to be ignored, not refused.
            OPT_ABORT => Ok(ClientOption::Abort),
            OPT_LIST => empty(ClientOption::List),
            OPT_STARTTLS => empty(ClientOption::StartTls),
            OPT_STRUCTURED_REPLY => empty(ClientOption::StructuredReply),
            OPT_INFO | OPT_GO => {
                let mut at = Cursor(data);
                let name = at.string_u32().ok_or(MalformedOption("malformed NBD_OPT_INFO/GO"))?;
                let count = at.u16().ok_or(MalformedOption("malformed NBD_OPT_INFO/GO"))?;
                let items = (0..count).map(|_| at.u16()).collect::<Option<Vec<u16>>>();
                match items {
                    Some(items) if at.0.is_empty() => Ok(ClientOption::Info {
                        go: option == OPT_GO,
                        name,
                        items,
                    }),
                    _ => Err(MalformedOption("malformed NBD_OPT_INFO/GO")),
                }
            }
            OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
                let malformed = MalformedOption("malformed metadata context request");
                let mut at = Cursor(data);
                let export = at.string_u32().ok_or(malformed)?;
                let count = at.u32().ok_or(malformed)?;
                // Each query takes at least its 4-byte length: a count the
                // data cannot hold is refused before anything is reserved.
                if count as usize > at.0.len() / 4 {
                    return Err(malformed);
                }
                let queries = (0..count).map(|_| at.string_u32()).collect::<Option<Vec<_>>>();
                match queries {
                    Some(queries) if at.0.is_empty() => Ok(ClientOption::MetaContext {
                        set: option == OPT_SET_META_CONTEXT,
                        export,
                        queries,
                    }),
                    _ => Err(malformed),
                }
            }
            other => Ok(ClientOption::Unknown(other)),
        }
    }

    /// The option as a client sends it: header and data.
    pub fn encode(&self) -> Vec<u8> {
        let (option, data) = match self {
            ClientOption::ExportName(name) => (OPT_EXPORT_NAME, name.clone()),
            ClientOption::Abort => (OPT_ABORT, Vec::new()),
            ClientOption::List => (OPT_LIST, Vec::new()),
            ClientOption::StartTls => (OPT_STARTTLS, Vec::new()),
            ClientOption::StructuredReply => (OPT_STRUCTURED_REPLY, Vec::new()),
            ClientOption::Info { go, name, items } => {
                let mut data = string_u32(name);
                data.extend_from_slice(&(items.len() as u16).to_be_bytes());
                for item in items {
                    data.extend_from_slice(&item.to_be_bytes());
                }
                (if *go { OPT_GO } else { OPT_INFO }, data)
            }
            ClientOption::MetaContext { set, export, queries } => {
                let mut data = string_u32(export);
                data.extend_from_slice(&(queries.len() as u32).to_be_bytes());
                for query in queries {
                    data.extend_from_slice(&string_u32(query));
                }
                let option = if *set {
                    OPT_SET_META_CONTEXT
                } else {
                    OPT_LIST_META_CONTEXT
                };
                (option, data)
            }
            ClientOption::Unknown(option) => (*option, Vec::new()),
        };
        let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&data);
        bytes
    }
}

/// A length-prefixed string (u32 length).
fn string_u32(bytes: &[u8]) -> Vec<u8> {
    let mut data = (bytes.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(bytes);
    data
}

/// Reads big-endian fields off the front of a byte slice.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take(4)?.try_into().ok()?))
    }
    fn string_u32(&mut self) -> Option<Vec<u8>> {
        let len = self.u32()? as usize;
        Some(self.take(len)?.to_vec())
    }
}

/// A reply to an option: its magic, option, type and data.
pub fn option_reply(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut reply = Vec::with_capacity(20 + data.len());
    reply.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    reply.extend_from_slice(&option.to_be_bytes());
    reply.extend_from_slice(&kind.to_be_bytes());
    reply.extend_from_slice(&(data.len() as u32).to_be_bytes());
    reply.extend_from_slice(data);
    reply
}

/// The end of negotiation by NBD_OPT_EXPORT_NAME: size, flags, and the
/// 124 zero bytes unless the client asked for none.
pub fn export_name_reply(size: u64, transmission_flags: u16, no_zeroes: bool) -> Vec<u8> {
    let mut reply = Vec::with_capacity(10 + 124);
    reply.extend_from_slice(&size.to_be_bytes());
    reply.extend_from_slice(&transmission_flags.to_be_bytes());
    if !no_zeroes {
        reply.extend_from_slice(&[0u8; 124]);
    }
    reply
}

/// NBD_INFO_EXPORT's data.
pub fn info_export(size: u64, transmission_flags: u16) -> Vec<u8> {
    let mut info = INFO_EXPORT.to_be_bytes().to_vec();
    info.extend_from_slice(&size.to_be_bytes());
    info.extend_from_slice(&transmission_flags.to_be_bytes());
    info
}

/// NBD_INFO_NAME or NBD_INFO_DESCRIPTION's data.
pub fn info_text(item: u16, text: &str) -> Vec<u8> {
    let mut info = item.to_be_bytes().to_vec();
    info.extend_from_slice(truncated(text, STRING_BYTES_MAX).as_bytes());
    info
}

/// NBD_INFO_BLOCK_SIZE's data.
pub fn info_block_size() -> Vec<u8> {
    let mut info = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for size in [BLOCK_SIZE_MIN, BLOCK_SIZE_PREFERRED, REQUEST_BYTES_MAX] {
        info.extend_from_slice(&size.to_be_bytes());
    }
    info
}

/// A META_CONTEXT reply's data: the context's id and name.
pub fn meta_context(id: u32, name: &str) -> Vec<u8> {
    let mut reply = id.to_be_bytes().to_vec();
    reply.extend_from_slice(name.as_bytes());
    reply
}

pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;

/// A request's header, as sent; a write's payload follows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RequestHeader {
    pub flags: u16,
    pub command: u16,
    pub cookie: u64,
    pub offset: u64,
    pub len: u32,
}

impl RequestHeader {
    pub const BYTES: usize = 28;

    pub fn parse(bytes: &[u8; Self::BYTES]) -> Result<RequestHeader, WireError> {
        let magic = u32::from_be_bytes(bytes[0..4].try_into().expect("4 bytes"));
        if magic != REQUEST_MAGIC {
            return Err(WireError::RequestMagic(magic));
        }
        let header = RequestHeader {
            flags: u16::from_be_bytes([bytes[4], bytes[5]]),
            command: u16::from_be_bytes([bytes[6], bytes[7]]),
            cookie: u64::from_be_bytes(bytes[8..16].try_into().expect("8 bytes")),
            offset: u64::from_be_bytes(bytes[16..24].try_into().expect("8 bytes")),
            len: u32::from_be_bytes(bytes[24..28].try_into().expect("4 bytes")),
        };
        if header.command == CMD_WRITE && header.len > REQUEST_BYTES_MAX {
            // Its payload could not be skipped without reading it all.
            return Err(WireError::WriteTooLarge(header.len));
        }
        Ok(header)
    }

    pub fn encode(&self) -> [u8; Self::BYTES] {
        let mut bytes = [0; Self::BYTES];
        bytes[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        bytes[4..6].copy_from_slice(&self.flags.to_be_bytes());
        bytes[6..8].copy_from_slice(&self.command.to_be_bytes());
        bytes[8..16].copy_from_slice(&self.cookie.to_be_bytes());
        bytes[16..24].copy_from_slice(&self.offset.to_be_bytes());
        bytes[24..28].copy_from_slice(&self.len.to_be_bytes());
        bytes
    }

    /// Bytes of payload that follow the header on the wire.
    pub fn payload_bytes(&self) -> usize {
        if self.command == CMD_WRITE {
            self.len as usize
        } else {
            0
        }
    }

    /// What the request asks for, checked against an export of `size`
    /// bytes and what was negotiated (`allocation`: `base:allocation` was
    /// selected), or the errno to answer it with.
    pub fn check(&self, size: u64, allocation: bool) -> Result<Command, u32> {
        let (offset, len, flags) = (self.offset, self.len, self.flags);
        let in_range = offset.checked_add(u64::from(len)).is_some_and(|end| end <= size);
        let fua = flags & CMD_FLAG_FUA != 0;
        // Flags that only one command takes.
        let misplaced = (flags & CMD_FLAG_REQ_ONE != 0 && self.command != CMD_BLOCK_STATUS)
            || (flags & CMD_FLAG_FAST_ZERO != 0 && self.command != CMD_WRITE_ZEROES);
        if flags & !CMD_FLAGS_KNOWN != 0 || misplaced {
            return Err(errno::EINVAL);
        }
        match self.command {
            CMD_DISC => Ok(Command::Disc),
            CMD_FLUSH if offset != 0 || len != 0 => Err(errno::EINVAL),
            CMD_FLUSH => Ok(Command::Flush),
            CMD_READ if len > REQUEST_BYTES_MAX => Err(errno::EINVAL),
            // Past the end: no space for a write, a bad range otherwise.
            CMD_WRITE | CMD_WRITE_ZEROES if !in_range => Err(errno::ENOSPC),
            CMD_BLOCK_STATUS if !allocation => Err(errno::EINVAL),
            CMD_READ | CMD_WRITE | CMD_TRIM | CMD_CACHE | CMD_WRITE_ZEROES | CMD_BLOCK_STATUS if !in_range => {
                Err(errno::EINVAL)
            }
            CMD_READ => Ok(Command::Read { offset, len }),
            CMD_WRITE => Ok(Command::Write { offset, fua }),
            CMD_TRIM => Ok(Command::Trim { offset, len, fua }),
            CMD_CACHE => Ok(Command::Cache { offset, len }),
            CMD_WRITE_ZEROES => Ok(Command::WriteZeroes { offset, len, fua }),
            CMD_BLOCK_STATUS => Ok(Command::BlockStatus {
                offset,
                len,
                req_one: flags & CMD_FLAG_REQ_ONE != 0,
            }),
            _ => Err(errno::EINVAL),
        }
    }
}

/// A request that passed [`RequestHeader::check`]: within the export, its
/// flags known and where they belong. FAST_ZERO needs nothing of its own:
/// zeroing is never slower than writing here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read {
        offset: u64,
        len: u32,
    },
    /// The payload (the header's `len` bytes) follows.
    Write {
        offset: u64,
        fua: bool,
    },
    Disc,
    Flush,
    Trim {
        offset: u64,
        len: u32,
        fua: bool,
    },
    Cache {
        offset: u64,
        len: u32,
    },
    WriteZeroes {
        offset: u64,
        len: u32,
        fua: bool,
    },
    BlockStatus {
        offset: u64,
        len: u32,
        req_one: bool,
    },
}

/// A simple reply: no data follows, or a read's data does.
pub fn simple_reply(cookie: u64, error: u32) -> [u8; 16] {
    let mut reply = [0; 16];
    reply[..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    reply[4..8].copy_from_slice(&error.to_be_bytes());
    reply[8..].copy_from_slice(&cookie.to_be_bytes());
    reply
}

/// The header of a structured reply chunk, the last of its reply, whose
/// payload is `length` bytes.
pub fn structured_header(kind: u16, cookie: u64, length: u32) -> Vec<u8> {
    let mut chunk = Vec::with_capacity(20 + 8);
    chunk.extend_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    chunk.extend_from_slice(&REPLY_FLAG_DONE.to_be_bytes());
    chunk.extend_from_slice(&kind.to_be_bytes());
    chunk.extend_from_slice(&cookie.to_be_bytes());
    chunk.extend_from_slice(&length.to_be_bytes());
    chunk
}

/// The start of a structured read reply: its header and offset; the
/// `len` bytes of data follow.
pub fn read_chunk_header(cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut chunk = structured_header(REPLY_TYPE_OFFSET_DATA, cookie, 8 + len);
    chunk.extend_from_slice(&offset.to_be_bytes());
    chunk
}

/// A reply without data to a request that failed with `failure` (or, with
/// `None`, succeeded): simple, or a structured error chunk carrying the
/// export's message.
pub fn reply(structured: bool, cookie: u64, failure: Option<&Failure>) -> Vec<u8> {
    match failure {
        Some(failure) if structured => {
            let message = failure.message.as_deref().unwrap_or(match failure.errno {
                errno::ENOSPC => "no space: past the end of the export, or the array is full",
                errno::EINVAL => "request out of range or malformed",
                _ => "I/O error in the array",
            });
            let message = truncated(message, STRING_BYTES_MAX).as_bytes();
            let mut chunk = structured_header(REPLY_TYPE_ERROR, cookie, 6 + message.len() as u32);
            chunk.extend_from_slice(&failure.errno.to_be_bytes());
            chunk.extend_from_slice(&(message.len() as u16).to_be_bytes());
            chunk.extend_from_slice(message);
            chunk
        }
        Some(failure) => simple_reply(cookie, failure.errno).to_vec(),
        None => simple_reply(cookie, 0).to_vec(),
    }
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn truncated(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The descriptors of a BLOCK_STATUS reply for a request of `len` bytes,
/// from an export's runs (bytes, flags): clipped to `len`, empty runs
/// dropped, equal neighbours merged, at most [`DESCRIPTORS_MAX`] (one with
/// REQ_ONE), and never none (an export that reported nothing: allocated,
/// contents unknown, which the protocol always allows).
pub fn block_status_descriptors(runs: &[(u64, u32)], len: u32, req_one: bool) -> Vec<(u32, u32)> {
    let mut descriptors: Vec<(u32, u32)> = Vec::new();
    let mut covered = 0u64;
    for &(bytes, flags) in runs {
        let bytes = bytes.min(u64::from(len) - covered);
        if bytes == 0 {
            continue;
        }
        covered += bytes;
        match descriptors.last_mut() {
            Some(last) if last.1 == flags => last.0 += bytes as u32,
            _ => descriptors.push((bytes as u32, flags)),
        }
        if covered == u64::from(len) {
            break;
        }
    }
    if descriptors.is_empty() {
        descriptors.push((len.max(1), 0));
    }
    descriptors.truncate(if req_one { 1 } else { DESCRIPTORS_MAX });
    descriptors
}

/// The reply to BLOCK_STATUS: one chunk for `base:allocation`.
pub fn block_status_chunk(cookie: u64, descriptors: &[(u32, u32)]) -> Vec<u8> {
    let mut chunk = structured_header(REPLY_TYPE_BLOCK_STATUS, cookie, 4 + 8 * descriptors.len() as u32);
    chunk.extend_from_slice(&BASE_ALLOCATION_ID.to_be_bytes());
    for (bytes, flags) in descriptors {
        chunk.extend_from_slice(&bytes.to_be_bytes());
        chunk.extend_from_slice(&flags.to_be_bytes());
    }
    chunk
}

#[cfg(test)]
mod tests {
    //! Properties of the codec over arbitrary input: parsers never panic,
    //! what is encoded parses back the same, and what `check` lets
    //! through is within the export.

    use super::*;
    use proptest::prelude::*;

    fn bytes(max: usize) -> impl Strategy<Value = Vec<u8>> {
        proptest::collection::vec(any::<u8>(), 0..max)
    }

    fn client_option() -> impl Strategy<Value = ClientOption> {
        prop_oneof![
            bytes(64).prop_map(ClientOption::ExportName),
            Just(ClientOption::Abort),
            Just(ClientOption::List),
            Just(ClientOption::StartTls),
            Just(ClientOption::StructuredReply),
            (any::<bool>(), bytes(64), proptest::collection::vec(any::<u16>(), 0..8))
                .prop_map(|(go, name, items)| ClientOption::Info { go, name, items }),
            (any::<bool>(), bytes(64), proptest::collection::vec(bytes(32), 0..8))
                .prop_map(|(set, export, queries)| ClientOption::MetaContext { set, export, queries }),
            (11u32..).prop_map(ClientOption::Unknown),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        #[test]
        fn options_round_trip(option in client_option()) {
            let encoded = option.encode();
            let header = OptionHeader::parse(encoded[..16].try_into().unwrap()).unwrap();
            prop_assert_eq!(header.len as usize, encoded.len() - 16);
            prop_assert_eq!(ClientOption::parse(header.option, &encoded[16..]), Ok(option));
        }

        #[test]
        fn option_data_never_panics_and_what_parses_encodes_back(option in 0u32..16, data in bytes(256)) {
            if let Ok(parsed) = ClientOption::parse(option, &data) {
                // What parsed is exactly what was sent (for known options).
                if !matches!(parsed, ClientOption::Unknown(_) | ClientOption::Abort) {
                    prop_assert_eq!(&parsed.encode()[16..], &data[..]);
                }
            }
        }

        #[test]
        fn request_headers_round_trip(flags: u16, command: u16, cookie: u64, offset: u64, len: u32) {
            let header = RequestHeader { flags, command, cookie, offset, len };
            match RequestHeader::parse(&header.encode()) {
                Ok(parsed) => prop_assert_eq!(parsed, header),
                Err(e) => prop_assert_eq!(e, WireError::WriteTooLarge(len)),
            }
        }

        #[test]
        fn arbitrary_request_bytes_parse_or_fail_typed(raw in proptest::array::uniform28(any::<u8>())) {
            match RequestHeader::parse(&raw) {
                Ok(header) => prop_assert_eq!(header.encode(), raw),
                Err(WireError::RequestMagic(_)) => prop_assert_ne!(&raw[..4], &REQUEST_MAGIC.to_be_bytes()[..]),
                Err(e) => prop_assert!(matches!(e, WireError::WriteTooLarge(_)), "{:?}", e),
            }
        }

        #[test]
        fn checked_requests_stay_within_the_export(
            flags in prop_oneof![any::<u16>(), 0u16..32],
            command in 0u16..10,
            offset in prop_oneof![any::<u64>(), 0u64..(1 << 21)],
            len in prop_oneof![any::<u32>(), 0u32..(1 << 21)],
            size in 0u64..(1 << 22),
            allocation: bool,
        ) {
            let header = RequestHeader { flags, command, cookie: 1, offset, len };
            let Ok(checked) = header.check(size, allocation) else { return Ok(()) };
            prop_assert_eq!(flags & !CMD_FLAGS_KNOWN, 0);
            let in_range = |offset: u64, len: u32| offset.checked_add(u64::from(len)).is_some_and(|end| end <= size);
            match checked {
                Command::Read { offset, len } => prop_assert!(in_range(offset, len) && len <= REQUEST_BYTES_MAX),
                Command::Write { offset, .. } => prop_assert!(in_range(offset, header.len)),
                Command::Trim { offset, len, .. }
                | Command::Cache { offset, len }
                | Command::WriteZeroes { offset, len, .. } => prop_assert!(in_range(offset, len)),
                Command::BlockStatus { offset, len, .. } => prop_assert!(allocation && in_range(offset, len)),
                Command::Flush => prop_assert!(offset == 0 && len == 0),
                Command::Disc => prop_assert_eq!(command, CMD_DISC),
            }
        }

        #[test]
        fn block_status_descriptors_obey_the_protocol(
            runs in proptest::collection::vec((0u64..20_000, 0u32..4), 0..40),
            len in 1u32..60_000,
            req_one: bool,
        ) {
            let descriptors = block_status_descriptors(&runs, len, req_one);
            let total: u64 = descriptors.iter().map(|&(bytes, _)| u64::from(bytes)).sum();
            prop_assert!(!descriptors.is_empty());
            prop_assert!(descriptors.iter().all(|&(bytes, _)| bytes > 0));
            prop_assert!(descriptors.windows(2).all(|w| w[0].1 != w[1].1), "neighbours merged");
            let reported: u64 = runs.iter().map(|&(bytes, _)| bytes).sum();
            if req_one {
                prop_assert_eq!(descriptors.len(), 1);
            } else if reported > 0 {
                prop_assert_eq!(total, reported.min(u64::from(len)));
            }
            prop_assert!(total <= u64::from(len));
        }
    }

    #[test]
    fn client_flags_and_option_magic_are_checked() {
        assert_eq!(parse_client_flags(1u32.to_be_bytes()), Ok(false));
        assert_eq!(parse_client_flags(3u32.to_be_bytes()), Ok(true));
        assert_eq!(parse_client_flags(2u32.to_be_bytes()), Err(WireError::ClientFlags(2)));
        assert_eq!(parse_client_flags(5u32.to_be_bytes()), Err(WireError::ClientFlags(5)));
        assert_eq!(OptionHeader::parse(&[0; 16]), Err(WireError::OptionMagic(0)));
    }
}
