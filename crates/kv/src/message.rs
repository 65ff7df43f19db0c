//! Inserted batches as Flight carries them: an Arrow IPC record batch
//! message, its flatbuffer header and its body. A space's fields are
//! fixed-width and never null, so checking the header against the schema
//! proves the body readable without decoding it; the message then goes
//! into its log frame as it came, behind the space's schema message. That
//! spares the insert path two passes over every byte: the copy Arrow's
//! decoder makes to align a body, and the IPC encoding of the decoded
//! batch. (Measured in docs/PERFORMANCE.md, "KV inserts: batches stored
//! as they came".)
//!
//! What a message must be to go in as it came, each checked here:
//!
//! - no body compression (refused: the array compresses what it stores);
//! - metadata version V4 or V5, no variadic buffer counts, room for it in
//!   a frame (otherwise it is decoded, Arrow's decoder judges it, and a
//!   batch too large for a frame is cut);
//! - `bodyLength` the body's length;
//! - a row count of 0 to `u32::MAX`;
//! - one field node a field, each as long as the batch, none with nulls;
//! - two buffers a field (validity, values), each within the body, the
//!   values at least rows x the field's width.
//!
//! The validity buffers are never read: with a null count of 0, Arrow's
//! reader takes no validity bitmap.

use crate::schema::{nulls, SpaceSchema};
use crate::KvError;
use arrow_array::RecordBatch;
use arrow_ipc::{MetadataVersion, RecordBatch as BatchHeader};
use bytes::Bytes;

/// A record batch message checked against a space's schema, not decoded.
#[derive(Clone, Debug)]
pub struct IpcBatch {
    header: Bytes,
    body: Bytes,
    rows: u32,
}

/// A batch to insert: decoded, or as it came.
#[derive(Clone, Debug)]
pub enum Incoming {
    Decoded(RecordBatch),
    Ipc(IpcBatch),
}

impl Incoming {
    /// Bytes it brings, for records of `record_bytes`: what a DoPut
    /// gathers into an insert by.
    pub fn bytes(&self, record_bytes: usize) -> usize {
        match self {
            Incoming::Decoded(batch) => batch.num_rows() * record_bytes,
            Incoming::Ipc(ipc) => ipc.body.len(),
        }
    }
}

/// The error for a message that is not Arrow IPC a space can take.
fn bad(why: String) -> KvError {
    KvError::BadBatch { why }
}

impl IpcBatch {
    /// Checks a record batch message (`message` parsed from `header`)
    /// against `schema`. `Ok(None)`: the message is one this check does
    /// not take (see the module's text), or as a stream's message it
    /// would take more than `room` bytes: decode it.
    pub fn check(
        schema: &SpaceSchema,
        message: &arrow_ipc::Message<'_>,
        header: &Bytes,
        body: &Bytes,
        room: usize,
    ) -> Result<Option<IpcBatch>, KvError> {
        let Some(batch) = message.header_as_record_batch() else {
            return Err(bad("not a record batch message".to_string()));
        };
        if let Some(compression) = batch.compression() {
            return Err(bad(format!(
                "a body compressed with {}: send batches uncompressed (the array compresses what it \
                 stores as its policy says)",
                compression.codec().variant_name().unwrap_or("an unknown codec")
            )));
        }
        if !matches!(message.version(), MetadataVersion::V4 | MetadataVersion::V5)
            || batch.variadicBufferCounts().is_some_and(|v| !v.is_empty())
            || stream_bytes(header.len(), body.len()) > room
        {
            return Ok(None);
        }
        if message.bodyLength() != body.len() as i64 {
            return Err(bad(format!(
                "its header says {} body bytes, {} came",
                message.bodyLength(),
                body.len()
            )));
        }
        let rows = u32::try_from(batch.length())
            .map_err(|_| bad(format!("a batch of {} rows (at most {})", batch.length(), u32::MAX)))?;
        check_columns(schema, &batch, rows, body.len())?;
        Ok(Some(IpcBatch {
            header: header.clone(),
            body: body.clone(),
            rows,
        }))
    }

    pub fn rows(&self) -> u32 {
        self.rows
    }

    /// Bytes of the message's body.
    pub fn body_bytes(&self) -> usize {
        self.body.len()
    }

    /// Bytes of the message's header (its flatbuffer, unpadded).
    pub fn header_bytes(&self) -> usize {
        self.header.len()
    }

    /// Appends the message as an IPC stream has it (`stream_bytes`): the
    /// continuation marker, the header's length (padded so that the body
    /// starts 8-aligned), the header and its padding, the body.
    pub fn append_to(&self, out: &mut Vec<u8>) {
        self.append_header(out, padded_header(self.header.len()));
        out.extend_from_slice(&self.body);
    }

    /// Appends what comes before the body: the continuation marker, the
    /// header's length `meta` (a multiple of 8, at least the header's),
    /// the header and zeros to `meta` bytes. (IPC readers take the header
    /// from the `meta` bytes and skip the padding.)
    pub fn append_header(&self, out: &mut Vec<u8>, meta: usize) {
        assert!(meta >= self.header.len() && meta.is_multiple_of(8));
        out.extend_from_slice(&CONTINUATION);
        out.extend_from_slice(&(meta as i32).to_le_bytes());
        out.extend_from_slice(&self.header);
        out.resize(out.len() + meta - self.header.len(), 0);
    }

    pub fn body(&self) -> &Bytes {
        &self.body
    }
}

/// A header of `header` bytes, padded so that the body after the 8-byte
/// prefix starts 8-aligned.
fn padded_header(header: usize) -> usize {
    header.next_multiple_of(8)
}

/// Bytes a message of these sizes takes in an IPC stream.
pub fn stream_bytes(header: usize, body: usize) -> usize {
    8 + padded_header(header) + body
}

/// What starts every message of an IPC stream (and, with a length of 0,
/// ends it).
pub const CONTINUATION: [u8; 4] = [0xff; 4];

/// Appends the end of an IPC stream: the continuation marker with a
/// length of 0.
pub fn append_end_of_stream(out: &mut Vec<u8>) {
    out.extend_from_slice(&CONTINUATION);
    out.extend_from_slice(&[0; 4]);
}

/// The field nodes and buffers of `batch`, for `rows` records in a body
/// of `body` bytes.
fn check_columns(schema: &SpaceSchema, batch: &BatchHeader<'_>, rows: u32, body: usize) -> Result<(), KvError> {
    let fields = &schema.fields;
    let nodes = batch.nodes().map_or(0, |n| n.len());
    let buffers = batch.buffers().map_or(0, |b| b.len());
    if nodes != fields.len() || buffers != 2 * fields.len() {
        return Err(bad(format!(
            "{nodes} field nodes and {buffers} buffers for {} fixed-width fields (one node and two buffers each)",
            fields.len()
        )));
    }
    let (nodes, buffers) = (batch.nodes().unwrap_or_default(), batch.buffers().unwrap_or_default());
    for (i, spec) in fields.iter().enumerate() {
        let node = nodes.get(i);
        if node.length() != i64::from(rows) {
            return Err(bad(format!(
                "field {:?} has {} values in a batch of {rows} rows",
                spec.name,
                node.length()
            )));
        }
        if node.null_count() != 0 {
            return Err(nulls(&spec.name, node.null_count().max(0) as usize));
        }
        for (j, what) in [(2 * i, "validity"), (2 * i + 1, "values")] {
            let buffer = buffers.get(j);
            let end = buffer.offset().checked_add(buffer.length());
            if buffer.offset() < 0 || buffer.length() < 0 || end.is_none_or(|end| end > body as i64) {
                return Err(bad(format!(
                    "field {:?}'s {what} buffer at {} of {} bytes, in a body of {body}",
                    spec.name,
                    buffer.offset(),
                    buffer.length()
                )));
            }
        }
        let values = buffers.get(2 * i + 1).length();
        let needed = u64::from(rows) * spec.kind.bytes() as u64;
        if (values as u64) < needed {
            return Err(bad(format!(
                "field {:?} has {values} bytes of values for {rows} rows of {} bytes",
                spec.name,
                spec.kind.bytes()
            )));
        }
    }
    Ok(())
}

/// `batch` as a Flight client sends it, checked against `schema`.
#[cfg(test)]
pub(crate) fn sent(schema: &SpaceSchema, batch: &RecordBatch) -> IpcBatch {
    let messages = arrow_flight::utils::batches_to_flight_data(&schema.arrow(), [batch]).unwrap();
    let data = &messages[1];
    let message = arrow_ipc::root_as_message(&data.data_header).unwrap();
    IpcBatch::check(schema, &message, &data.data_header, &data.data_body, usize::MAX)
        .unwrap()
        .expect("a batch sent whole is taken as it came")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::schema::{FieldSpec, FieldType};
    use arrow_array::{Float32Array, UInt64Array};
    use arrow_ipc::{BodyCompression, BodyCompressionArgs, FieldNode, Message, MessageArgs, MessageHeader};
    use std::sync::Arc;

    /// A u64 key `id` and an f32 `e`.
    pub(crate) fn schema() -> SpaceSchema {
        SpaceSchema {
            key: "id".into(),
            fields: vec![
                FieldSpec {
                    name: "id".into(),
                    kind: FieldType::U64,
                },
                FieldSpec {
                    name: "e".into(),
                    kind: FieldType::F32,
                },
            ],
            indexes: vec![],
            duplicates: Default::default(),
        }
    }

    fn batch(rows: u64) -> RecordBatch {
        RecordBatch::try_new(
            schema().arrow(),
            vec![
                Arc::new(UInt64Array::from_iter_values(0..rows)),
                Arc::new(Float32Array::from_iter_values((0..rows).map(|i| i as f32 / 2.0))),
            ],
        )
        .unwrap()
    }

    /// `batch` as a Flight client sends it: header and body.
    fn encoded(batch: &RecordBatch) -> (Bytes, Bytes) {
        let messages = arrow_flight::utils::batches_to_flight_data(&schema().arrow(), [batch]).unwrap();
        let [_schema, data] = <[_; 2]>::try_from(messages).unwrap();
        (data.data_header, data.data_body)
    }

    fn check(header: &Bytes, body: &Bytes) -> Result<Option<IpcBatch>, KvError> {
        let message = arrow_ipc::root_as_message(header).unwrap();
        IpcBatch::check(&schema(), &message, header, body, 64 << 20)
    }

    /// The parts of a batch message's header.
    #[derive(Clone)]
    struct Parts {
        rows: i64,
        nodes: Vec<(i64, i64)>,
        buffers: Vec<(i64, i64)>,
        body: i64,
        compressed: bool,
    }

    fn parts_of(rows: u64) -> (Parts, Bytes) {
        let (header, body) = encoded(&batch(rows));
        let message = arrow_ipc::root_as_message(&header).unwrap();
        let b = message.header_as_record_batch().unwrap();
        let parts = Parts {
            rows: b.length(),
            nodes: b
                .nodes()
                .unwrap()
                .iter()
                .map(|n| (n.length(), n.null_count()))
                .collect(),
            buffers: b.buffers().unwrap().iter().map(|b| (b.offset(), b.length())).collect(),
            body: message.bodyLength(),
            compressed: false,
        };
        (parts, body)
    }

    fn header_of(parts: &Parts) -> Bytes {
        let mut fbb = flatbuffers::FlatBufferBuilder::new();
        let nodes: Vec<FieldNode> = parts.nodes.iter().map(|&(l, n)| FieldNode::new(l, n)).collect();
        let buffers: Vec<arrow_ipc::Buffer> = parts
            .buffers
            .iter()
            .map(|&(o, l)| arrow_ipc::Buffer::new(o, l))
            .collect();
        let nodes = fbb.create_vector(&nodes);
        let buffers = fbb.create_vector(&buffers);
        let compression = parts.compressed.then(|| {
            BodyCompression::create(
                &mut fbb,
                &BodyCompressionArgs {
                    codec: arrow_ipc::CompressionType::LZ4_FRAME,
                    method: arrow_ipc::BodyCompressionMethod::BUFFER,
                },
            )
        });
        let batch = BatchHeader::create(
            &mut fbb,
            &arrow_ipc::RecordBatchArgs {
                length: parts.rows,
                nodes: Some(nodes),
                buffers: Some(buffers),
                compression,
                variadicBufferCounts: None,
            },
        );
        let message = Message::create(
            &mut fbb,
            &MessageArgs {
                version: MetadataVersion::V5,
                header_type: MessageHeader::RecordBatch,
                header: Some(batch.as_union_value()),
                bodyLength: parts.body,
                custom_metadata: None,
            },
        );
        fbb.finish(message, None);
        Bytes::copy_from_slice(fbb.finished_data())
    }

    #[test]
    fn a_message_taken_as_it_came_reads_back_as_the_batch_sent() {
        for rows in [0, 1, 1000] {
            let sent = batch(rows);
            let (header, body) = encoded(&sent);
            let ipc = check(&header, &body).unwrap().expect("taken as it came");
            assert_eq!(ipc.rows() as u64, rows);
            // The schema message, the batch, the end of the stream: what a
            // log frame's payload is.
            let mut stream = arrow_ipc::writer::StreamWriter::try_new(Vec::new(), &schema().arrow())
                .unwrap()
                .get_ref()
                .clone();
            ipc.append_to(&mut stream);
            append_end_of_stream(&mut stream);
            let read: Vec<RecordBatch> = arrow_ipc::reader::StreamReader::try_new(&stream[..], None)
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
            assert_eq!(read, vec![sent]);
        }
    }

    #[test]
    fn the_header_rebuilt_here_is_taken_before_it_is_spoiled() {
        // The test's own header builder makes a message the check takes,
        // so that each spoiled one below differs from a good one in one
        // part only.
        let (parts, body) = parts_of(100);
        assert!(check(&header_of(&parts), &body).unwrap().is_some());
    }

    #[test]
    fn a_message_that_does_not_describe_its_body_is_refused() {
        let (good, body) = parts_of(100);
        type Spoil = Box<dyn Fn(&mut Parts)>;
        let spoiled: Vec<(&str, Spoil)> = vec![
            ("a body length that is not the body's", Box::new(|p| p.body += 8)),
            ("a negative row count", Box::new(|p| p.rows = -1)),
            ("more rows than u32 counts", Box::new(|p| p.rows = 1 << 32)),
            ("a node short of the rows", Box::new(|p| p.nodes[1].0 -= 1)),
            (
                "a node missing",
                Box::new(|p| {
                    p.nodes.pop();
                }),
            ),
            (
                "a buffer missing",
                Box::new(|p| {
                    p.buffers.pop();
                }),
            ),
            ("a buffer past the body", Box::new(|p| p.buffers[3].0 = p.body - 8)),
            ("a negative buffer offset", Box::new(|p| p.buffers[1].0 = -8)),
            ("a negative buffer length", Box::new(|p| p.buffers[0].1 = -1)),
            (
                "a buffer end that overflows",
                Box::new(|p| p.buffers[2] = (8, i64::MAX)),
            ),
            ("values short of the rows", Box::new(|p| p.buffers[3].1 = 4 * 99)),
            (
                "more rows than values",
                Box::new(|p| {
                    p.rows += 1;
                    p.nodes.iter_mut().for_each(|n| n.0 += 1);
                }),
            ),
        ];
        for (what, spoil) in spoiled {
            let mut parts = good.clone();
            spoil(&mut parts);
            match check(&header_of(&parts), &body) {
                Err(KvError::BadBatch { .. }) => {}
                other => panic!("{what}: {other:?}"),
            }
        }
    }

    #[test]
    fn nulls_and_compressed_bodies_are_refused_and_a_batch_too_large_for_a_frame_is_left_to_the_decoder() {
        let (good, body) = parts_of(100);
        let mut with_nulls = good.clone();
        with_nulls.nodes[1].1 = 3;
        let err = check(&header_of(&with_nulls), &body).unwrap_err();
        assert!(err.to_string().contains("column \"e\" has 3 nulls"), "{err}");
        let mut compressed = good.clone();
        compressed.compressed = true;
        let err = check(&header_of(&compressed), &body).unwrap_err();
        assert!(err.to_string().contains("compressed with LZ4_FRAME"), "{err}");
        // A message that would take more room than its frame has: left
        // to be decoded and cut.
        let header = header_of(&good);
        let message = arrow_ipc::root_as_message(&header).unwrap();
        let bytes = stream_bytes(header.len(), body.len());
        let mut stream = Vec::new();
        check(&header, &body).unwrap().unwrap().append_to(&mut stream);
        assert_eq!(stream.len(), bytes);
        let room = |room| IpcBatch::check(&schema(), &message, &header, &body, room).unwrap();
        assert!(room(bytes).is_some());
        assert!(room(bytes - 1).is_none());
    }
}
