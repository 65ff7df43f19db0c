//! The spaces served with Arrow Flight (gRPC), so that `pyarrow.flight`
//! (or any Flight client) inserts and queries them:
//!
//! - `DoAction`: `create` (`{"name": ..., "schema": {...}}`), `finalize`,
//!   `drop` (`{"name": ...}`), `status` (`{"name": ...}`, or `{}` for
//!   every space); the result is JSON.
//! - `DoPut` with the descriptor path `[space]`: the stream's batches are
//!   inserted, 16-32 MiB an insert, read at the pace `crate::intake`
//!   sets; a `PutResult` (`{"rows": n}`, the records durable so far) is
//!   sent as each insert is durable, while the stream goes on.
//! - `GetFlightInfo` with a command `{"space": ..., "query": ...}` (the
//!   query as `crate::query` has it), or a path `[space]` (every
//!   record): one endpoint whose ticket is the command; its app metadata
//!   says `{"indexed": bool}`, whether tables answer it. `DoGet` with that
//!   ticket streams the records found.
//! - `GetSchema` and `ListFlights`: the spaces' schemas.
//!
//! Errors are gRPC statuses: `INVALID_ARGUMENT` for bad requests, schemas
//! and batches, `NOT_FOUND`, `ALREADY_EXISTS`, `FAILED_PRECONDITION` (an
//! insert after `finalize`), `RESOURCE_EXHAUSTED` (a full array),
//! `DATA_LOSS`. The work runs on tokio's blocking threads: the array's
//! calls block.

use crate::intake::Intake;
use crate::message::{Incoming, IpcBatch};
use crate::query::Query;
use crate::space::{Space, MESSAGE_BYTES_MAX};
use crate::store::Store;
use crate::{KvError, SpaceSchema};
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::flight_service_server::{FlightService, FlightServiceServer};
use arrow_flight::{
    Action, ActionType, Criteria, Empty, FlightData, FlightDescriptor, FlightEndpoint, FlightInfo, HandshakeRequest,
    HandshakeResponse, PollInfo, PutResult, SchemaAsIpc, SchemaResult, Ticket,
};
use arrow_ipc::MessageHeader;
use futures::stream::{self, BoxStream, StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;
use tessera_array::ArrayError;
use tonic::{Request, Response, Status, Streaming};

/// A query, as a `GetFlightInfo` command and a `DoGet` ticket.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueryRequest {
    pub space: String,
    pub query: Query,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    name: String,
    schema: SpaceSchema,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NameRequest {
    #[serde(default)]
    name: Option<String>,
}

/// Inserts a DoPut stream's batches into `space`: they are queued as
/// they come and inserted 16-32 MiB an insert, one after another, the
/// next read at the pace `Intake` sets while one is under way; each
/// acknowledged on `acks`, in order, as soon as it returns (durable).
/// Returns the status that ends the stream early, if one does.
async fn insert_stream(
    space: Arc<Space>,
    mut data: BoxStream<'static, Result<FlightData, Status>>,
    mut intake: Intake<Incoming>,
    acks: &tokio::sync::mpsc::UnboundedSender<Result<PutResult, Status>>,
) -> Result<(), Status> {
    /// What came first: the insert under way ended, or the stream's
    /// next message (or its end).
    enum Next {
        Inserted(Result<Result<u64, KvError>, tokio::task::JoinError>),
        Message(Option<Result<FlightData, Status>>),
    }
    let mut reader = PutReader::new(space.schema());
    let mut rows = 0u64;
    let inserted_before = |rows: u64, status: Status| {
        Status::new(
            status.code(),
            format!(
                "{} ({rows} records of this stream were inserted before it)",
                status.message()
            ),
        )
    };
    let mut running: Option<tokio::task::JoinHandle<Result<u64, KvError>>> = None;
    let mut finished = false;
    loop {
        if running.is_none() {
            if let Some(batches) = intake.next_insert(finished, Instant::now()) {
                let space = space.clone();
                running = Some(tokio::task::spawn_blocking(move || space.insert_incoming(&batches)));
                continue;
            }
            if finished {
                return Ok(());
            }
        }
        let next = match running.as_mut() {
            // Nothing to do but wait for the insert under way.
            Some(insert) if finished || intake.full() => Next::Inserted(insert.await),
            Some(insert) => {
                let at = tokio::time::Instant::from_std(intake.next_read(Instant::now()));
                tokio::select! {
                    done = insert => Next::Inserted(done),
                    message = async {
                        tokio::time::sleep_until(at).await;
                        data.next().await
                    } => Next::Message(message),
                }
            }
            None => Next::Message(data.next().await),
        };
        let refused = match next {
            Next::Inserted(done) => {
                running = None;
                intake.inserted(Instant::now());
                rows += done
                    .map_err(|e| Status::internal(format!("a KV task failed: {e}")))?
                    .map_err(|e| inserted_before(rows, status_of(e)))?;
                let ack = PutResult {
                    app_metadata: serde_json::to_vec(&serde_json::json!({ "rows": rows })).unwrap().into(),
                };
                // A client gone ends the stream at its next message (an
                // insert under way still ends).
                let _ = acks.send(Ok(ack));
                continue;
            }
            Next::Message(None) => {
                finished = true;
                continue;
            }
            Next::Message(Some(Ok(message))) => match reader.read(message) {
                Ok(Some(batch)) => {
                    let bytes = batch.bytes(reader.record_bytes);
                    intake.push(batch, bytes, Instant::now());
                    continue;
                }
                Ok(None) => continue,
                Err(e) => status_of(e),
            },
            Next::Message(Some(Err(status))) if status.code() == tonic::Code::OutOfRange => {
                Status::invalid_argument(format!(
                    "too large: at most {MESSAGE_BYTES_MAX} bytes a message; cut the batch ({})",
                    status.message()
                ))
            }
            Next::Message(Some(Err(status))) => Status::invalid_argument(format!("malformed Flight data: {status}")),
        };
        // The insert under way ends first, so that the count said is what
        // is in the space; the batches queued with the one refused are
        // not inserted.
        if let Some(insert) = running.take() {
            if let Ok(Ok(n)) = insert.await {
                rows += n;
            }
        }
        return Err(inserted_before(rows, refused));
    }
}

/// Reads a DoPut's messages: the schema first, then record batches, each
/// checked against the space's schema and taken as it came where
/// `IpcBatch::check` can, decoded where it cannot.
struct PutReader {
    schema: SpaceSchema,
    arrow: arrow_schema::SchemaRef,
    record_bytes: usize,
    /// Bytes a message may take in a frame's payload.
    room: usize,
    schema_seen: bool,
}

impl PutReader {
    fn new(schema: SpaceSchema) -> PutReader {
        PutReader {
            arrow: schema.arrow(),
            record_bytes: schema.record_bytes(),
            room: crate::frame::message_room(&schema.arrow()),
            schema,
            schema_seen: false,
        }
    }

    /// The batch `data` carries; `None` for a message with none (the
    /// schema, or app metadata alone).
    fn read(&mut self, data: FlightData) -> Result<Option<Incoming>, KvError> {
        let malformed = |why: String| KvError::BadBatch { why };
        let message = arrow_ipc::root_as_message(&data.data_header)
            .map_err(|e| malformed(format!("a message header that is no Arrow IPC: {e}")))?;
        match message.header_type() {
            MessageHeader::NONE => Ok(None),
            MessageHeader::Schema => {
                let theirs =
                    arrow_schema::Schema::try_from(&data).map_err(|e| malformed(format!("its schema: {e}")))?;
                self.schema.conform_schema(&theirs)?;
                self.schema_seen = true;
                Ok(None)
            }
            MessageHeader::RecordBatch if self.schema_seen => {
                match IpcBatch::check(&self.schema, &message, &data.data_header, &data.data_body, self.room)? {
                    Some(ipc) => Ok(Some(Incoming::Ipc(ipc))),
                    None => arrow_flight::utils::flight_data_to_arrow_batch(&data, self.arrow.clone(), &HashMap::new())
                        .map(|batch| Some(Incoming::Decoded(batch)))
                        .map_err(|e| malformed(e.to_string())),
                }
            }
            MessageHeader::RecordBatch => Err(malformed("a record batch before the schema".to_string())),
            other => Err(malformed(format!(
                "a {} message: a space's fields are fixed-width, its batches record batches",
                other.variant_name().unwrap_or("unknown")
            ))),
        }
    }
}

pub fn status_of(e: KvError) -> Status {
    let text = e.to_string();
    match e {
        KvError::BadSchema { .. }
        | KvError::SchemaMismatch { .. }
        | KvError::BadBatch { .. }
        | KvError::BadName { .. }
        | KvError::BadQuery { .. }
        | KvError::TooLarge { .. } => Status::invalid_argument(text),
        KvError::UnknownSpace { .. } => Status::not_found(text),
        KvError::SpaceExists { .. } => Status::already_exists(text),
        KvError::Finalized { .. } | KvError::Poisoned { .. } => Status::failed_precondition(text),
        KvError::Corrupt { .. } => Status::data_loss(text),
        KvError::Stopped => Status::unavailable(text),
        KvError::Array(ArrayError::NoSpace) | KvError::Array(ArrayError::TooManyVolumes { .. }) => {
            Status::resource_exhausted(text)
        }
        KvError::Array(_) => Status::unavailable(text),
    }
}

fn json<T: for<'a> Deserialize<'a>>(bytes: &[u8], what: &str) -> Result<T, Status> {
    serde_json::from_slice(bytes).map_err(|e| Status::invalid_argument(format!("{what}: {e}")))
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, KvError> + Send + 'static) -> Result<T, Status> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Status::internal(format!("a KV task failed: {e}")))?
        .map_err(status_of)
}

pub struct KvFlight {
    store: Arc<Store>,
    /// How many DoPut streams there are (`crate::intake` shares its
    /// room out among them).
    streams: Arc<std::sync::atomic::AtomicUsize>,
}

impl KvFlight {
    fn space_of_path(&self, descriptor: &FlightDescriptor) -> Result<Arc<Space>, Status> {
        match descriptor.path.as_slice() {
            [name] => self.store.space(name).map_err(status_of),
            _ => Err(Status::invalid_argument("a descriptor path is [space name]")),
        }
    }

    /// The query a descriptor asks: its command, or its path's space whole.
    fn query_of(&self, descriptor: &FlightDescriptor) -> Result<(Arc<Space>, QueryRequest), Status> {
        if descriptor.path.is_empty() {
            let request: QueryRequest = json(&descriptor.cmd, "a query command")?;
            let space = self.store.space(&request.space).map_err(status_of)?;
            return Ok((space, request));
        }
        let space = self.space_of_path(descriptor)?;
        let request = QueryRequest {
            space: space.name().to_string(),
            query: Query::All,
        };
        Ok((space, request))
    }

    fn info(&self, space: &Space, request: &QueryRequest) -> Result<FlightInfo, Status> {
        let indexed = space.answers_from_tables(&request.query).map_err(status_of)?;
        let ticket = serde_json::to_vec(request).expect("a request serializes");
        FlightInfo::new()
            .try_with_schema(&space.schema().arrow())
            .map_err(|e| Status::internal(e.to_string()))
            .map(|info| {
                info.with_descriptor(FlightDescriptor::new_cmd(ticket.clone()))
                    .with_endpoint(FlightEndpoint::new().with_ticket(Ticket::new(ticket)))
                    .with_app_metadata(serde_json::to_vec(&serde_json::json!({ "indexed": indexed })).unwrap())
            })
    }

    /// A DoPut stream's space, from its first message (an error here is
    /// the call's status), and the acknowledgments of its inserts as
    /// they are made durable: a client streaming a long DoPut sees them
    /// while it still sends, and an error ends them with a status that
    /// counts the records inserted before it.
    async fn put(
        &self,
        request: Request<Streaming<FlightData>>,
    ) -> Result<BoxStream<'static, Result<PutResult, Status>>, Status> {
        let mut input = request.into_inner();
        let first = input
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("an empty DoPut stream"))?;
        let descriptor = first
            .flight_descriptor
            .clone()
            .ok_or_else(|| Status::invalid_argument("DoPut's first message has no descriptor (path [space])"))?;
        let space = self.space_of_path(&descriptor)?;
        let data = stream::once(async { Ok(first) }).chain(input);
        let (acks, said) = tokio::sync::mpsc::unbounded_channel();
        let streams = self.streams.clone();
        tokio::spawn(async move {
            if let Err(status) = insert_stream(space, data.boxed(), Intake::new(streams), &acks).await {
                let _ = acks.send(Err(status));
            }
        });
        Ok(stream::unfold(said, |mut said| async move { said.recv().await.map(|ack| (ack, said)) }).boxed())
    }

    async fn action(&self, action: Action) -> Result<serde_json::Value, Status> {
        let store = self.store.clone();
        let body = action.body.to_vec();
        match action.r#type.as_str() {
            "create" => {
                let request: CreateRequest = json(&body, "create")?;
                blocking(move || {
                    store
                        .create(&request.name, request.schema)
                        .map(|s| serde_json::json!(s.status()))
                })
                .await
            }
            "finalize" | "drop" | "status" => {
                let request: NameRequest = json(&body, &action.r#type)?;
                let name = request.name;
                let kind = action.r#type.clone();
                blocking(move || match (kind.as_str(), name) {
                    ("finalize", Some(name)) => {
                        let finalized = store.finalize(&name)?;
                        Ok(serde_json::json!({ "finalized": finalized }))
                    }
                    ("drop", Some(name)) => store.drop_space(&name).map(|()| serde_json::json!({ "dropped": name })),
                    ("status", Some(name)) => {
                        let status = store.space(&name)?.status();
                        Ok(serde_json::json!({ "space": status, "error": store.work_error(&name) }))
                    }
                    ("status", None) => Ok(serde_json::json!(store.list())),
                    (kind, None) => Err(KvError::BadQuery {
                        why: format!("{kind} needs {{\"name\": SPACE}}"),
                    }),
                    _ => unreachable!("matched above"),
                })
                .await
            }
            other => Err(Status::invalid_argument(format!(
                "no action {other:?}: create, finalize, drop, status"
            ))),
        }
    }
}

#[tonic::async_trait]
impl FlightService for KvFlight {
    type HandshakeStream = BoxStream<'static, Result<HandshakeResponse, Status>>;
    type ListFlightsStream = BoxStream<'static, Result<FlightInfo, Status>>;
    type DoGetStream = BoxStream<'static, Result<FlightData, Status>>;
    type DoPutStream = BoxStream<'static, Result<PutResult, Status>>;
    type DoActionStream = BoxStream<'static, Result<arrow_flight::Result, Status>>;
    type ListActionsStream = BoxStream<'static, Result<ActionType, Status>>;
    type DoExchangeStream = BoxStream<'static, Result<FlightData, Status>>;

    async fn handshake(
        &self,
        _: Request<Streaming<HandshakeRequest>>,
    ) -> Result<Response<Self::HandshakeStream>, Status> {
        Err(Status::unimplemented(
            "no handshake: the server listens on loopback or a trusted network",
        ))
    }

    async fn list_flights(&self, _: Request<Criteria>) -> Result<Response<Self::ListFlightsStream>, Status> {
        let mut infos = Vec::new();
        for status in self.store.list() {
            let space = self.store.space(&status.name).map_err(status_of)?;
            let request = QueryRequest {
                space: status.name.clone(),
                query: Query::All,
            };
            let info = self.info(&space, &request)?;
            infos.push(Ok(info
                .with_descriptor(FlightDescriptor::new_path(vec![status.name]))
                .with_total_records(status.sorted.unwrap_or(status.inserted) as i64)));
        }
        Ok(Response::new(stream::iter(infos).boxed()))
    }

    async fn get_flight_info(&self, request: Request<FlightDescriptor>) -> Result<Response<FlightInfo>, Status> {
        let (space, query) = self.query_of(request.get_ref())?;
        Ok(Response::new(self.info(&space, &query)?))
    }

    async fn poll_flight_info(&self, _: Request<FlightDescriptor>) -> Result<Response<PollInfo>, Status> {
        Err(Status::unimplemented("queries are answered at once: use GetFlightInfo"))
    }

    async fn get_schema(&self, request: Request<FlightDescriptor>) -> Result<Response<SchemaResult>, Status> {
        let (space, _) = self.query_of(request.get_ref())?;
        let options = arrow_ipc::writer::IpcWriteOptions::default();
        let schema = SchemaResult::try_from(SchemaAsIpc::new(&space.schema().arrow(), &options))
            .map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(schema))
    }

    async fn do_get(&self, request: Request<Ticket>) -> Result<Response<Self::DoGetStream>, Status> {
        let request: QueryRequest = json(&request.get_ref().ticket, "a ticket")?;
        let space = self.store.space(&request.space).map_err(status_of)?;
        let schema = space.schema().arrow();
        let result = blocking(move || space.query(&request.query)).await?;
        let metadata = serde_json::to_vec(&serde_json::json!({ "indexed": result.indexed })).unwrap();
        let batches = stream::iter(result.batches.into_iter().map(Ok));
        let data = FlightDataEncoderBuilder::new()
            .with_schema(schema)
            .with_metadata(metadata.into())
            .build(batches)
            .map_err(Status::from);
        Ok(Response::new(data.boxed()))
    }

    async fn do_put(&self, request: Request<Streaming<FlightData>>) -> Result<Response<Self::DoPutStream>, Status> {
        Ok(Response::new(self.put(request).await?))
    }

    async fn do_action(&self, request: Request<Action>) -> Result<Response<Self::DoActionStream>, Status> {
        let answer = self.action(request.into_inner()).await?;
        let body = serde_json::to_vec(&answer).expect("an answer serializes");
        let result = arrow_flight::Result { body: body.into() };
        Ok(Response::new(stream::iter([Ok(result)]).boxed()))
    }

    async fn list_actions(&self, _: Request<Empty>) -> Result<Response<Self::ListActionsStream>, Status> {
        let actions = [
            ("create", "create a space: {\"name\": ..., \"schema\": {...}}"),
            ("finalize", "no more inserts; sort and index: {\"name\": ...}"),
            ("drop", "delete a space and its records: {\"name\": ...}"),
            ("status", "a space's status ({\"name\": ...}), or every space's ({})"),
        ]
        .map(|(kind, description)| {
            Ok(ActionType {
                r#type: kind.to_string(),
                description: description.to_string(),
            })
        });
        Ok(Response::new(stream::iter(actions).boxed()))
    }

    async fn do_exchange(&self, _: Request<Streaming<FlightData>>) -> Result<Response<Self::DoExchangeStream>, Status> {
        Err(Status::unimplemented("no DoExchange: DoPut inserts, DoGet queries"))
    }
}

/// The Flight server's certificate (chain) and private key, PEM, checked
/// to make a TLS configuration when read.
#[derive(Clone)]
pub struct FlightTls {
    config: tonic::transport::ServerTlsConfig,
}

/// A TLS client that has not finished its handshake by then is dropped.
const TLS_HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl FlightTls {
    /// From PEM files; a certificate or key that cannot be read or used
    /// is an error here, before anything is served.
    pub fn from_pem_files(certificate: &std::path::Path, key: &std::path::Path) -> Result<FlightTls, String> {
        let read = |path: &std::path::Path| std::fs::read(path).map_err(|e| format!("reading {}: {e}", path.display()));
        let identity = tonic::transport::Identity::from_pem(read(certificate)?, read(key)?);
        let config = tonic::transport::ServerTlsConfig::new()
            .identity(identity)
            .timeout(TLS_HANDSHAKE_TIMEOUT);
        // The configuration is only parsed when a server takes it.
        tonic::transport::Server::builder()
            .tls_config(config.clone())
            .map_err(|e| format!("{} with {}: {}", certificate.display(), key.display(), error_chain(&e)))?;
        Ok(FlightTls { config })
    }
}

/// An error and its sources, as one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut line = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        // (Some errors print their source in their own text.)
        let cause_text = cause.to_string();
        if !line.contains(&cause_text) {
            line.push_str(&format!(": {cause_text}"));
        }
        source = cause.source();
    }
    line
}

/// The Flight server's socket, bound (so that an address in use is
/// found before the array is opened), and its runtime.
pub struct FlightListener {
    runtime: tokio::runtime::Runtime,
    listener: tokio::net::TcpListener,
    pub address: SocketAddr,
}

impl FlightListener {
    pub fn bind(address: SocketAddr) -> std::io::Result<FlightListener> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("kv-flight")
            .enable_all()
            .build()?;
        let listener = runtime.block_on(tokio::net::TcpListener::bind(address))?;
        let address = listener.local_addr()?;
        Ok(FlightListener {
            runtime,
            listener,
            address,
        })
    }

    /// Serves `store` on the bound socket, on threads of its own. With a
    /// `token`, every call must carry `authorization: Bearer TOKEN` in its
    /// metadata, or is refused (`UNAUTHENTICATED`) before it does anything.
    /// With `tls`, only TLS connections are served (gRPC over HTTP/2 in
    /// TLS: `grpc+tls://` to pyarrow).
    pub fn serve(
        self,
        store: Arc<Store>,
        token: Option<String>,
        tls: Option<FlightTls>,
    ) -> std::io::Result<FlightServer> {
        let FlightListener {
            runtime,
            listener,
            address,
        } = self;
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let service = FlightServiceServer::new(KvFlight {
            store,
            streams: Arc::default(),
        })
        .max_decoding_message_size(MESSAGE_BYTES_MAX)
        .max_encoding_message_size(MESSAGE_BYTES_MAX);
        let check = move |request: Request<()>| -> Result<Request<()>, Status> {
            let Some(token) = &token else { return Ok(request) };
            let sent = request
                .metadata()
                .get("authorization")
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.strip_prefix("Bearer "));
            match sent {
                Some(sent) if tokens_equal(sent.as_bytes(), token.as_bytes()) => Ok(request),
                _ => Err(Status::unauthenticated(
                    "this server wants a token: send 'authorization: Bearer TOKEN' (tessera kv --token-file FILE)",
                )),
            }
        };
        let service = tonic::service::interceptor::InterceptedService::new(service, check);
        // Without TCP_NODELAY a small answer (a point get) waits out the
        // client's delayed ACK: 44 ms a get where it takes 0.3.
        let incoming = tonic::transport::server::TcpIncoming::from(listener).with_nodelay(Some(true));
        let mut builder = tonic::transport::Server::builder();
        if let Some(tls) = tls {
            builder = builder.tls_config(tls.config).map_err(std::io::Error::other)?;
        }
        let thread = std::thread::Builder::new().name("kv-flight".into()).spawn(move || {
            let served = runtime.block_on(
                builder
                    .add_service(service)
                    .serve_with_incoming_shutdown(incoming, async {
                        let _ = stopped.await;
                    }),
            );
            if let Err(e) = served {
                eprintln!("tessera: the KV Flight server stopped: {e}");
            }
        })?;
        Ok(FlightServer {
            address,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

/// Whether two tokens are the same, in time that does not depend on where
/// they differ.
pub fn tokens_equal(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A Flight server running on its own threads.
pub struct FlightServer {
    pub address: SocketAddr,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl FlightServer {
    pub fn stop(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for FlightServer {
    fn drop(&mut self) {
        self.stop();
    }
}
