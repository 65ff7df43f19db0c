//! Frames: how a space's records sit in its volume. A frame is a 64-byte
//! header and one Arrow IPC stream (the schema and one record batch),
//! padded to 4 KiB, so every frame starts on a block:
//!
//! ```text
//!  0  magic "TKVF"     4  kind (1 log, 3 table, 4 directory)
//!  5  flags: bit 0, the last frame of an insert
//!  8  sequence (u64: the log's count of frames before it; a table's
//!     batch number)
//! 16  payload bytes (u32)  20  rows (u32)  24  payload CRC32C
//! 28  CRC32C of bytes 0..28    32..64 zero
//! ```
//!
//! The header's own CRC and the sequence tell a frame from what a torn
//! write or an older frame left; the payload's CRC tells a whole frame
//! from a torn one. (The array checks every block it returns as well:
//! these checks are about which frames were written whole, not about
//! bit rot.)

use crate::message::{append_end_of_stream, Incoming, IpcBatch};
use crate::KvError;
use arrow_array::RecordBatch;
use arrow_ipc::reader::StreamReader;
use arrow_ipc::writer::StreamWriter;
use bytes::Bytes;
use tessera_array::Volume;
use tessera_checksum::{crc32c, crc32c_parts};

pub const BLOCK: u64 = 4096;
pub const HEADER_BYTES: usize = 64;
/// The largest payload a frame holds; larger batches are cut.
pub const PAYLOAD_MAX: usize = 64 << 20;
const MAGIC: [u8; 4] = *b"TKVF";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// An inserted batch, as it came.
    Log = 1,
    /// A batch of a sorted table (the records by key, or by an indexed
    /// field) or of a sorted run (a table too).
    Table = 3,
    /// A table's directory: where its batches are, and their bounds.
    Directory = 4,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub kind: Kind,
    pub sequence: u64,
    pub payload: u32,
    pub rows: u32,
    pub crc: u32,
    /// The last frame of an insert: opening takes an insert's frames
    /// all, or none.
    pub ends_insert: bool,
}

impl Header {
    /// Bytes the frame takes in the volume.
    pub fn frame_bytes(&self) -> u64 {
        frame_bytes(self.payload as usize)
    }

    fn decode(block: &[u8]) -> Option<Header> {
        let u32_at = |at: usize| u32::from_le_bytes(block[at..at + 4].try_into().unwrap());
        if block[..4] != MAGIC || crc32c(&block[..28]) != u32_at(28) {
            return None;
        }
        let kind = match block[4] {
            1 => Kind::Log,
            3 => Kind::Table,
            4 => Kind::Directory,
            _ => return None,
        };
        let payload = u32_at(16);
        (payload as usize <= PAYLOAD_MAX).then_some(Header {
            kind,
            sequence: u64::from_le_bytes(block[8..16].try_into().unwrap()),
            payload,
            rows: u32_at(20),
            crc: u32_at(24),
            ends_insert: block[5] & 1 == 1,
        })
    }
}

pub fn frame_bytes(payload: usize) -> u64 {
    (HEADER_BYTES + payload).div_ceil(BLOCK as usize) as u64 * BLOCK
}

/// A frame of `batch` (an insert's last, for a log frame), padded to
/// whole blocks.
pub fn encode(kind: Kind, sequence: u64, batch: &RecordBatch) -> Vec<u8> {
    let mut out = Vec::new();
    Unsealed::append(&mut out, batch).seal(&mut out, kind, sequence, true);
    out
}

/// A frame appended to a buffer with its payload and padding, its header
/// still to write (its sequence is known only once the insert holds the
/// log).
#[derive(Clone, Copy, Debug)]
pub struct Unsealed {
    pub at: usize,
    pub payload: usize,
    pub crc: u32,
    pub rows: u32,
}

impl Unsealed {
    /// Appends a frame of `batch` (as an Arrow IPC stream) to `out`, the
    /// IPC written in place after room for the header.
    pub fn append(out: &mut Vec<u8>, batch: &RecordBatch) -> Unsealed {
        Unsealed::append_with(out, batch.num_rows() as u32, |out| {
            let mut writer = StreamWriter::try_new(&mut *out, &batch.schema()).expect("a valid schema");
            writer.write(batch).expect("writing to memory");
            writer.finish().expect("writing to memory");
        })
    }

    /// Appends a frame of a checked message as it came: the space's
    /// schema message (`schema_message`), the message, the stream's end;
    /// the IPC stream `append` would have written for the batch, but for
    /// the message's own header and padding.
    pub fn append_ipc(out: &mut Vec<u8>, schema_message: &[u8], batch: &IpcBatch) -> Unsealed {
        Unsealed::append_with(out, batch.rows(), |out| {
            out.extend_from_slice(schema_message);
            batch.append_to(out);
            append_end_of_stream(out);
        })
    }

    /// Appends a frame whose payload `write` appends, of `rows` records.
    fn append_with(out: &mut Vec<u8>, rows: u32, write: impl FnOnce(&mut Vec<u8>)) -> Unsealed {
        let at = out.len();
        out.resize(at + HEADER_BYTES, 0);
        write(out);
        let payload = out.len() - at - HEADER_BYTES;
        assert!(payload <= PAYLOAD_MAX, "a frame's payload is cut to PAYLOAD_MAX");
        let crc = crc32c(&out[at + HEADER_BYTES..]);
        out.resize(at + frame_bytes(payload) as usize, 0);
        Unsealed { at, payload, crc, rows }
    }

    /// Writes the frame's header into `out`.
    pub fn seal(&self, out: &mut [u8], kind: Kind, sequence: u64, ends_insert: bool) {
        let header = &mut out[self.at..self.at + HEADER_BYTES];
        header[..4].copy_from_slice(&MAGIC);
        header[4] = kind as u8;
        header[5] = u8::from(ends_insert);
        header[8..16].copy_from_slice(&sequence.to_le_bytes());
        header[16..20].copy_from_slice(&(self.payload as u32).to_le_bytes());
        header[20..24].copy_from_slice(&self.rows.to_le_bytes());
        header[24..28].copy_from_slice(&self.crc.to_le_bytes());
        let crc = crc32c(&header[..28]);
        header[28..32].copy_from_slice(&crc.to_le_bytes());
    }
}

/// A message whose body is at least this long goes into its frame without
/// being copied (`LogFrames::push_ipc`); a smaller one is copied, where
/// padding its frame's head to a block would cost more than the copy.
pub const BODY_AS_IT_CAME_MIN: usize = 256 << 10;

/// An insert's log frames, end to end in whole blocks, to be written from
/// one offset: built in one buffer, but for the bodies of large messages,
/// which are written from where they came (the frame's head, its header,
/// schema message and message header, padded so that the body starts on
/// a block; its tail, the body's last partial block and the stream's end,
/// built). The frames and their bytes are as `Unsealed::append_ipc` would
/// make them, but for that padding.
#[derive(Default)]
pub struct LogFrames {
    built: Vec<u8>,
    parts: Vec<Part>,
    unsealed: Vec<Unsealed>,
    bytes: usize,
}

/// Bytes of an insert's frames, in order.
enum Part {
    Built(std::ops::Range<usize>),
    Body(Bytes),
}

impl LogFrames {
    /// Frames for `parts` (records of `record_bytes`, behind
    /// `schema_message`), their buffer sized for what `push_batch` and
    /// `push_ipc` will build of them: a large body is not copied.
    pub fn for_parts(parts: &[Incoming], record_bytes: usize, schema_message: &[u8]) -> LogFrames {
        let built = parts
            .iter()
            .map(|p| match p {
                Incoming::Decoded(b) => b.num_rows() * record_bytes,
                Incoming::Ipc(ipc) if ipc.body_bytes() >= BODY_AS_IT_CAME_MIN => 0,
                Incoming::Ipc(ipc) => ipc.body_bytes(),
            })
            .map(|bytes| bytes + schema_message.len() + 3 * BLOCK as usize)
            .sum();
        LogFrames {
            built: Vec::with_capacity(built),
            ..LogFrames::default()
        }
    }

    /// A frame of a decoded batch.
    pub fn push_batch(&mut self, batch: &RecordBatch) {
        let at = self.built.len();
        let frame = Unsealed::append(&mut self.built, batch);
        self.push_built(at, frame);
    }

    /// A frame of a checked message, after the space's schema message.
    pub fn push_ipc(&mut self, schema_message: &[u8], batch: &IpcBatch) {
        if batch.body().len() < BODY_AS_IT_CAME_MIN {
            let at = self.built.len();
            let frame = Unsealed::append_ipc(&mut self.built, schema_message, batch);
            self.push_built(at, frame);
            return;
        }
        let block = BLOCK as usize;
        let at = self.built.len();
        self.built.resize(at + HEADER_BYTES, 0);
        self.built.extend_from_slice(schema_message);
        // The message header padded so that the body starts on a block.
        let before = self.built.len() - at + 8;
        let meta = (before + batch.header_bytes()).next_multiple_of(block) - before;
        batch.append_header(&mut self.built, meta);
        let head = at..self.built.len();
        let whole = batch.body().len() / block * block;
        let body = batch.body().slice(..whole);
        let tail = self.built.len();
        self.built.extend_from_slice(&batch.body()[whole..]);
        append_end_of_stream(&mut self.built);
        let tail_payload = tail..self.built.len();
        self.built.resize(tail + tail_payload.len().next_multiple_of(block), 0);
        let payload = head.len() - HEADER_BYTES + whole + tail_payload.len();
        assert!(payload <= PAYLOAD_MAX, "a message's room in a frame is checked");
        let crc = crc32c_parts(&[
            &self.built[at + HEADER_BYTES..head.end],
            &body,
            &self.built[tail_payload],
        ]);
        let frame = Unsealed {
            at,
            payload,
            crc,
            rows: batch.rows(),
        };
        debug_assert_eq!(
            frame_bytes(payload) as usize,
            head.len() + whole + self.built.len() - tail
        );
        self.bytes += frame_bytes(payload) as usize;
        self.unsealed.push(frame);
        self.parts.push(Part::Built(head));
        self.parts.push(Part::Body(body));
        self.parts.push(Part::Built(tail..self.built.len()));
    }

    fn push_built(&mut self, at: usize, frame: Unsealed) {
        self.bytes += self.built.len() - at;
        self.unsealed.push(frame);
        match self.parts.last_mut() {
            Some(Part::Built(range)) if range.end == at => range.end = self.built.len(),
            _ => self.parts.push(Part::Built(at..self.built.len())),
        }
    }

    /// Bytes the frames take.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn frames(&self) -> &[Unsealed] {
        &self.unsealed
    }

    /// Writes the frames' headers, the first `first_sequence`, the last
    /// the end of the insert.
    pub fn seal(&mut self, first_sequence: u64) {
        let last = self.unsealed.len().saturating_sub(1);
        for (i, frame) in self.unsealed.iter().enumerate() {
            frame.seal(&mut self.built, Kind::Log, first_sequence + i as u64, i == last);
        }
    }

    /// The frames' bytes in order, each piece whole blocks.
    pub fn pieces(&self) -> Vec<&[u8]> {
        self.parts
            .iter()
            .map(|part| match part {
                Part::Built(range) => &self.built[range.clone()],
                Part::Body(body) => &body[..],
            })
            .collect()
    }
}

/// The frame at `offset`, if one of `kind` and `sequence` is there whole;
/// `None` where there is none (zeros, a torn or an older frame).
pub fn read(volume: &Volume, offset: u64, kind: Kind, sequence: u64) -> Result<Option<(Header, Vec<u8>)>, KvError> {
    if offset + BLOCK > volume.size() {
        return Ok(None);
    }
    let mut bytes = vec![0u8; BLOCK as usize];
    volume.read(offset, &mut bytes)?;
    let Some(header) = header_of(&bytes, kind, sequence) else {
        return Ok(None);
    };
    if offset + header.frame_bytes() > volume.size() {
        return Ok(None);
    }
    if header.frame_bytes() > BLOCK {
        bytes.resize(header.frame_bytes() as usize, 0);
        volume.read(offset + BLOCK, &mut bytes[BLOCK as usize..])?;
    }
    Ok(payload_of(&bytes, header).map(|payload| (header, payload.to_vec())))
}

/// The header at the start of `bytes`, if it is a frame's of `kind` and
/// `sequence`.
fn header_of(bytes: &[u8], kind: Kind, sequence: u64) -> Option<Header> {
    Header::decode(bytes.get(..HEADER_BYTES)?).filter(|h| h.kind == kind && h.sequence == sequence)
}

/// The payload of the frame `header` heads in `bytes`, if it is whole.
fn payload_of(bytes: &[u8], header: Header) -> Option<&[u8]> {
    let payload = bytes.get(HEADER_BYTES..HEADER_BYTES + header.payload as usize)?;
    (crc32c(payload) == header.crc).then_some(payload)
}

/// The frame of `kind` and `sequence` at the start of `bytes` (read from
/// where a committed manifest names one), taking `bytes` whole: anything
/// else is corruption.
pub fn parse_expected(bytes: &[u8], kind: Kind, sequence: u64) -> Option<(Header, RecordBatch)> {
    let header = header_of(bytes, kind, sequence).filter(|h| h.frame_bytes() == bytes.len() as u64)?;
    let batch = decode_batch(payload_of(bytes, header)?).ok()?;
    Some((header, batch))
}

/// The frame at `offset`, which a committed manifest names: anything but
/// that frame whole is corruption.
pub fn read_expected(
    volume: &Volume,
    offset: u64,
    kind: Kind,
    sequence: u64,
) -> Result<(Header, RecordBatch), KvError> {
    match read(volume, offset, kind, sequence)? {
        Some((header, payload)) => Ok((header, decode_batch(&payload)?)),
        None => Err(KvError::Corrupt {
            why: format!(
                "no whole {kind:?} frame {sequence} at byte {offset} of {}",
                volume.name()
            ),
        }),
    }
}

pub fn decode_batch(payload: &[u8]) -> Result<RecordBatch, KvError> {
    let corrupt = |e: arrow_schema::ArrowError| KvError::Corrupt {
        why: format!("a frame's Arrow IPC: {e}"),
    };
    let mut reader = StreamReader::try_new(std::io::Cursor::new(payload), None).map_err(corrupt)?;
    match reader.next() {
        Some(batch) => batch.map_err(corrupt),
        None => Err(KvError::Corrupt {
            why: "a frame with no record batch".into(),
        }),
    }
}

/// The IPC stream's schema message for `schema`: what starts every frame's
/// payload.
pub fn schema_message(schema: &arrow_schema::Schema) -> Vec<u8> {
    let writer = StreamWriter::try_new(Vec::new(), schema).expect("a valid schema");
    writer.get_ref().clone()
}

/// Bytes a record batch message may take in a frame's payload, with the
/// schema message of `schema` before it and the stream's end after.
pub fn message_room(schema: &arrow_schema::Schema) -> usize {
    // (Less a block: the padding that starts a large body on one.)
    PAYLOAD_MAX - schema_message(schema).len() - 8 - BLOCK as usize
}

/// `batch` cut into slices whose IPC payloads fit a frame.
pub fn cut(batch: &RecordBatch, row_bytes: usize) -> Vec<RecordBatch> {
    let rows_max = ((PAYLOAD_MAX - 64 * 1024) / row_bytes.max(1)).max(1);
    (0..batch.num_rows())
        .step_by(rows_max)
        .map(|start| batch.slice(start, rows_max.min(batch.num_rows() - start)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_frames_with_bodies_as_they_came_read_back_as_the_batches_sent() {
        let schema = crate::message::tests::schema();
        let batch = |rows: u64, from: u64| {
            RecordBatch::try_new(
                schema.arrow(),
                vec![
                    std::sync::Arc::new(arrow_array::UInt64Array::from_iter_values(from..from + rows)),
                    std::sync::Arc::new(arrow_array::Float32Array::from_iter_values(
                        (from..from + rows).map(|i| i as f32),
                    )),
                ],
            )
            .unwrap()
        };
        // Bodies past the bound (one a whole number of blocks, one not),
        // one under it, and a decoded batch, in one insert.
        let big = BODY_AS_IT_CAME_MIN / 12 + 1000;
        let sent = [
            batch(big as u64, 0),
            batch(49_152, 1 << 20),
            batch(1000, 2 << 20),
            batch(77, 3 << 20),
        ];
        let ipc: Vec<IpcBatch> = sent[..3].iter().map(|b| crate::message::sent(&schema, b)).collect();
        assert!(ipc[0].body_bytes() >= BODY_AS_IT_CAME_MIN && !ipc[0].body_bytes().is_multiple_of(BLOCK as usize));
        assert!(ipc[1].body_bytes() >= BODY_AS_IT_CAME_MIN && ipc[1].body_bytes().is_multiple_of(BLOCK as usize));
        assert!(ipc[2].body_bytes() < BODY_AS_IT_CAME_MIN);
        let schema_message = schema_message(&schema.arrow());
        let mut frames = LogFrames::default();
        for ipc in &ipc {
            frames.push_ipc(&schema_message, ipc);
        }
        frames.push_batch(&sent[3]);
        frames.seal(40);
        let bytes: Vec<u8> = frames.pieces().concat();
        assert_eq!(bytes.len(), frames.bytes());
        assert!(frames.pieces().iter().all(|p| p.len().is_multiple_of(BLOCK as usize)));
        let mut at = 0;
        for (i, want) in sent.iter().enumerate() {
            let header = header_of(&bytes[at..], Kind::Log, 40 + i as u64).expect("a frame where the last ended");
            assert_eq!(header.ends_insert, i == sent.len() - 1);
            let frame = &bytes[at..at + header.frame_bytes() as usize];
            let (_, got) = parse_expected(frame, Kind::Log, 40 + i as u64).expect("a whole frame");
            assert_eq!(&got, want, "frame {i}");
            at += frame.len();
        }
        assert_eq!(at, bytes.len());
    }

    #[test]
    fn the_largest_message_s_batch_framed_is_one_insert() {
        use crate::schema::{FieldType, FIELDS_MAX, FIELD_NAME_BYTES_MAX};
        use crate::space::{INSERT_BYTES_MAX, MESSAGE_BYTES_MAX};
        // The schema whose frames cost the most past their records: every
        // field a space may have, each with the longest name, of the
        // narrowest type (most columns, so most padding, a frame).
        let fields: Vec<_> = (0..FIELDS_MAX)
            .map(|i| {
                let name = format!("{i:0>width$}", width = FIELD_NAME_BYTES_MAX);
                arrow_schema::Field::new(name, FieldType::U32.arrow(), false)
            })
            .collect();
        let schema = std::sync::Arc::new(arrow_schema::Schema::new(fields));
        let record_bytes = FIELDS_MAX * FieldType::U32.bytes();
        let rows = MESSAGE_BYTES_MAX / record_bytes;
        let columns = (0..FIELDS_MAX)
            .map(|i| {
                let column = arrow_array::UInt32Array::from_iter_values((0..rows as u32).map(|r| r ^ i as u32));
                std::sync::Arc::new(column) as arrow_array::ArrayRef
            })
            .collect();
        let batch = RecordBatch::try_new(schema.clone(), columns).unwrap();
        let schema_message = schema_message(&schema);
        let slices = cut(&batch, record_bytes);
        let parts: Vec<_> = slices.iter().cloned().map(Incoming::Decoded).collect();
        let mut frames = LogFrames::for_parts(&parts, record_bytes, &schema_message);
        for slice in &slices {
            frames.push_batch(slice);
        }
        let (bytes, count) = (frames.bytes(), frames.frames().len());
        assert!(count > 4, "{count} frames");
        assert!(bytes > MESSAGE_BYTES_MAX, "framing costs bytes: {bytes}");
        assert!(
            bytes <= INSERT_BYTES_MAX,
            "{bytes} bytes framed, more than an insert may write"
        );
        let overhead = (bytes - rows * record_bytes) / count;
        assert!(overhead < 32 << 10, "{overhead} bytes a frame past its records");
    }

    #[test]
    fn a_frame_s_header_refuses_what_is_not_one() {
        let batch = RecordBatch::try_new(
            std::sync::Arc::new(arrow_schema::Schema::new(vec![arrow_schema::Field::new(
                "a",
                arrow_schema::DataType::UInt64,
                false,
            )])),
            vec![std::sync::Arc::new(arrow_array::UInt64Array::from(vec![1, 2, 3]))],
        )
        .unwrap();
        let bytes = encode(Kind::Table, 7, &batch);
        assert_eq!(bytes.len(), 4096);
        let header = Header::decode(&bytes).unwrap();
        assert_eq!((header.kind, header.sequence, header.rows), (Kind::Table, 7, 3));
        assert!(header.ends_insert);
        // Appended after other bytes, sealed later, not ending an insert.
        let mut out = vec![1u8; 10];
        let unsealed = Unsealed::append(&mut out, &batch);
        unsealed.seal(&mut out, Kind::Log, 9, false);
        let framed = &out[10..];
        assert_eq!(framed.len() as u64, frame_bytes(unsealed.payload));
        let header = Header::decode(framed).unwrap();
        assert_eq!((header.sequence, header.rows, header.ends_insert), (9, 3, false));
        let payload = &framed[HEADER_BYTES..HEADER_BYTES + header.payload as usize];
        assert_eq!(crc32c(payload), header.crc);
        assert_eq!(decode_batch(payload).unwrap(), batch);
        for at in [0, 4, 5, 8, 16, 20, 28] {
            let mut bad = bytes.clone();
            bad[at] ^= 1;
            assert!(Header::decode(&bad).is_none(), "byte {at}");
        }
        assert!(Header::decode(&[0u8; 4096]).is_none());
        assert_eq!(frame_bytes(4096 - 64), 4096);
        assert_eq!(frame_bytes(4096 - 63), 8192);
    }
}
