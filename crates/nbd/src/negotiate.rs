//! Option negotiation (fixed newstyle): every option a client sends gets
//! an answer, a malformed one an error it can act on; negotiation ends in
//! the transmission phase, a TLS upgrade, or a closed connection.
//!
//! With TLS required, nothing but STARTTLS and ABORT is answered before
//! the upgrade (NBD_REP_ERR_TLS_REQD), and EXPORT_NAME closes the
//! connection, as the protocol says. After the upgrade the negotiation
//! starts afresh: what was chosen in plaintext does not carry over.

use std::io::{self, BufReader, Read, Write};

use crate::export::Export;
use crate::server::{invalid_data, Server};
use crate::wire::{self, ClientOption, OptionHeader};

/// How negotiation ended.
pub(crate) enum Negotiated<E> {
    /// The session, and the export it chose.
    Transmission(Session, std::sync::Arc<E>),
    /// STARTTLS was acknowledged: the TLS handshake comes next.
    StartTls,
    Closed,
}

/// What a connection negotiated for its transmission phase.
#[derive(Clone, Copy, Default)]
pub(crate) struct Session {
    pub structured: bool,
    /// `base:allocation` selected: BLOCK_STATUS is allowed.
    pub allocation: bool,
}

/// Options one connection may send; a client that goes on longer is
/// dropped.
const OPTIONS_MAX: usize = 4096;

impl<E: Export> Server<E> {
    /// Answers options until one ends the negotiation. `secured`: the
    /// stream is already the inside of a TLS session.
    pub(crate) fn negotiate<S: Read + Write>(
        &self,
        stream: &mut BufReader<S>,
        no_zeroes: bool,
        secured: bool,
    ) -> io::Result<Negotiated<E>> {
        let mut session = Session::default();
        let tls_required = !secured && self.tls.as_ref().is_some_and(|t| t.required());
        for _ in 0..OPTIONS_MAX {
            let mut header = [0; OptionHeader::BYTES];
            stream.read_exact(&mut header)?;
            let OptionHeader { option, len } = OptionHeader::parse(&header).map_err(invalid_data)?;
            if len > wire::OPTION_BYTES_MAX {
                // Skipped, not kept: it can be no option this server takes.
                io::copy(&mut stream.by_ref().take(u64::from(len)), &mut io::sink())?;
                reply(stream, option, wire::REP_ERR_TOO_BIG, b"option data too long")?;
                continue;
            }
            let mut data = vec![0u8; len as usize];
            stream.read_exact(&mut data)?;
            let parsed = match ClientOption::parse(option, &data) {
                Ok(parsed) => parsed,
                Err(malformed) => {
                    reply(stream, option, wire::REP_ERR_INVALID, malformed.0.as_bytes())?;
                    continue;
                }
            };
            if tls_required && !matches!(parsed, ClientOption::StartTls | ClientOption::Abort) {
                if matches!(parsed, ClientOption::ExportName(_)) {
                    // No error reply exists for EXPORT_NAME: the protocol
                    // says to close.
                    return Ok(Negotiated::Closed);
                }
                reply(
                    stream,
                    option,
                    wire::REP_ERR_TLS_REQD,
                    b"this server requires TLS: use NBD_OPT_STARTTLS",
                )?;
                continue;
            }
            match parsed {
                ClientOption::ExportName(name) => {
                    let Some((_, export)) = self.lookup(&name) else {
                        return Ok(Negotiated::Closed);
                    };
                    let flags = self.transmission_flags(session.structured);
                    stream
                        .get_mut()
                        .write_all(&wire::export_name_reply(export.size(), flags, no_zeroes))?;
                    return Ok(Negotiated::Transmission(session, export));
                }
                ClientOption::Abort => {
                    reply(stream, option, wire::REP_ACK, &[])?;
                    return Ok(Negotiated::Closed);
                }
                ClientOption::List => {
                    for (name, description) in self.catalog.list() {
                        let mut entry = (name.len() as u32).to_be_bytes().to_vec();
                        entry.extend_from_slice(name.as_bytes());
                        entry.extend_from_slice(description.as_bytes());
                        reply(stream, option, wire::REP_SERVER, &entry)?;
                    }
                    reply(stream, option, wire::REP_ACK, &[])?;
                }
                ClientOption::StartTls => match &self.tls {
                    None => reply(
                        stream,
                        option,
                        wire::REP_ERR_UNSUP,
                        b"TLS is not configured on this server",
                    )?,
                    Some(_) if secured => reply(stream, option, wire::REP_ERR_INVALID, b"TLS is already on")?,
                    Some(_) => {
                        reply(stream, option, wire::REP_ACK, &[])?;
                        return Ok(Negotiated::StartTls);
                    }
                },
                ClientOption::Info { go, name, items } => {
                    let Some((name, export)) = self.lookup(&name) else {
                        reply(stream, option, wire::REP_ERR_UNKNOWN, &self.unknown_export())?;
                        continue;
                    };
                    self.info(stream, option, &items, session.structured, &name, &*export)?;
                    if go {
                        return Ok(Negotiated::Transmission(session, export));
                    }
                }
                ClientOption::StructuredReply => {
                    session.structured = true;
                    reply(stream, option, wire::REP_ACK, &[])?;
                }
                ClientOption::MetaContext { set, export, queries } => {
                    if set {
                        // Each SET replaces the selection, failed or not.
                        session.allocation = false;
                    }
                    if !session.structured {
                        reply(
                            stream,
                            option,
                            wire::REP_ERR_INVALID,
                            b"negotiate structured replies first",
                        )?;
                    } else if self.lookup(&export).is_none() {
                        reply(stream, option, wire::REP_ERR_UNKNOWN, &self.unknown_export())?;
                    } else {
                        // LIST with no query lists everything; "base:"
                        // lists the namespace; SET takes exact names.
                        let offered = (!set && queries.is_empty())
                            || queries
                                .iter()
                                .any(|q| q == wire::BASE_ALLOCATION.as_bytes() || (!set && q == b"base:"));
                        if offered {
                            let id = if set { wire::BASE_ALLOCATION_ID } else { 0 };
                            let context = wire::meta_context(id, wire::BASE_ALLOCATION);
                            reply(stream, option, wire::REP_META_CONTEXT, &context)?;
                            session.allocation = set;
                        }
                        reply(stream, option, wire::REP_ACK, &[])?;
                    }
                }
                ClientOption::Unknown(_) => reply(stream, option, wire::REP_ERR_UNSUP, b"option not supported")?,
            }
        }
        Err(invalid_data("too many options"))
    }

    /// The information NBD_OPT_INFO and NBD_OPT_GO return: the export's
    /// size and flags, its name and description when asked, and its block
    /// sizes always (a client that did not ask may still use them).
    fn info<S: Write>(
        &self,
        stream: &mut BufReader<S>,
        option: u32,
        items: &[u16],
        structured: bool,
        name: &str,
        export: &E,
    ) -> io::Result<()> {
        let flags = self.transmission_flags(structured);
        reply(stream, option, wire::REP_INFO, &wire::info_export(export.size(), flags))?;
        if items.contains(&wire::INFO_NAME) {
            reply(stream, option, wire::REP_INFO, &wire::info_text(wire::INFO_NAME, name))?;
        }
        if items.contains(&wire::INFO_DESCRIPTION) {
            let description = self
                .catalog
                .list()
                .into_iter()
                .find(|(n, _)| n == name)
                .map(|(_, d)| d)
                .unwrap_or_default();
            let description = wire::info_text(wire::INFO_DESCRIPTION, &description);
            reply(stream, option, wire::REP_INFO, &description)?;
        }
        reply(stream, option, wire::REP_INFO, &wire::info_block_size())?;
        reply(stream, option, wire::REP_ACK, &[])
    }
}

impl<E: Export> Server<E> {
    /// The message for a name no export has: the names there are.
    fn unknown_export(&self) -> Vec<u8> {
        let names: Vec<String> = self.catalog.list().into_iter().map(|(n, _)| format!("'{n}'")).collect();
        format!("no such export: try {}", names.join(", ")).into_bytes()
    }
}

fn reply<S: Write>(stream: &mut BufReader<S>, option: u32, kind: u32, data: &[u8]) -> io::Result<()> {
    stream.get_mut().write_all(&wire::option_reply(option, kind, data))
}
