//! `tessera kv`: KV spaces of a served array (`serve --kv ADDR`), through
//! its Arrow Flight server: the same calls `pyarrow.flight` makes.

use anyhow::{bail, Context, Result};
use arrow_array::RecordBatch;
use arrow_flight::encode::FlightDataEncoderBuilder;
use arrow_flight::error::FlightError;
use arrow_flight::{Action, FlightClient, FlightDescriptor, Ticket};
use futures::{StreamExt, TryStreamExt};
use std::io::Read;
use std::path::{Path, PathBuf};
use tessera_kv::flight::QueryRequest;
use tessera_kv::query::Bound;
use tessera_kv::Query;

/// The address `serve --kv` is given in the examples.
pub const DEFAULT_ADDRESS: &str = "127.0.0.1:9812";

#[derive(clap::Args)]
pub struct Args {
    /// The server's Flight address (`tessera serve DIR --kv ADDR`).
    #[arg(long, default_value = DEFAULT_ADDRESS)]
    pub at: String,
    /// File whose first line is the token the server wants
    /// (`serve --kv-token-file`).
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Connect with TLS, trusting the CA certificate (PEM) in FILE
    /// (`serve --kv-tls-cert`); the server's certificate must name the
    /// host of --at (or --tls-server-name).
    #[arg(long, value_name = "FILE")]
    pub tls_ca: Option<std::path::PathBuf>,
    /// The name the server's certificate must carry, where it is not
    /// the host of --at.
    #[arg(long, value_name = "NAME", requires = "tls_ca")]
    pub tls_server_name: Option<String>,
    #[command(subcommand)]
    pub command: KvCommand,
}

#[derive(clap::Subcommand)]
pub enum KvCommand {
    /// Create a space. SCHEMA is JSON or @FILE: {"key": "id", "fields":
    /// [{"name": "id", "type": "u64"}, {"name": "energy", "type": "f32"}],
    /// "indexes": ["energy"], "duplicates": "keep_all" or "keep_last"};
    /// types u64, i64, u32, i32, f32, f64; the key a u64.
    Create {
        name: String,
        #[arg(long)]
        schema: String,
    },
    /// Insert the records of FILE: Arrow IPC (file or stream) with the
    /// space's columns, or CSV with a header row.
    Insert {
        name: String,
        file: PathBuf,
        /// Records a batch, for CSV.
        #[arg(long, default_value_t = 65536)]
        batch_rows: usize,
    },
    /// No more inserts: the server sorts the space and builds its indexes
    /// (with --wait, shows their progress until they are done).
    Finalize {
        name: String,
        #[arg(long)]
        wait: bool,
    },
    /// Records of a space: --get KEY, or --where with conditions on one
    /// field (`energy>3.5`, `id>=10,id<20`; > >= < <= ==). Prints CSV, or
    /// writes an Arrow IPC file with --out.
    Query {
        name: String,
        #[arg(long, conflicts_with = "conditions")]
        get: Option<u64>,
        #[arg(long = "where", value_name = "CONDITIONS")]
        conditions: Option<String>,
        #[arg(long)]
        out: Option<PathBuf>,
        /// Print only how many records match.
        #[arg(long)]
        count: bool,
    },
    /// Spaces, their phase (open, sorting, indexing, ready) and progress.
    Status {
        name: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Delete a space and its records.
    Drop { name: String },
}

pub fn run(args: Args) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let plain = args.tls_ca.is_none();
    runtime.block_on(run_async(args)).map_err(|e| {
        match plain && e.chain().any(|cause| cause.is::<ConnectionFailed>()) {
            true => e.context("the connection failed after it was made: a server with --kv-tls-cert wants --tls-ca"),
            false => e,
        }
    })
}

/// A call that failed in its connection rather than at the server, e.g.
/// a plain client's first call to a server with --kv-tls-cert (which
/// `connect` does not see: the TLS server refuses what it is sent).
#[derive(Debug)]
struct ConnectionFailed(String);

impl std::fmt::Display for ConnectionFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConnectionFailed {}

async fn connect(args: &Args, token: Option<&str>) -> Result<FlightClient> {
    let at = &args.at;
    let endpoint = match &args.tls_ca {
        None => tonic::transport::Channel::from_shared(format!("http://{at}"))?,
        Some(path) => {
            let ca = std::fs::read(path).with_context(|| format!("reading --tls-ca {}", path.display()))?;
            let marker = b"-----BEGIN CERTIFICATE-----";
            if !ca.windows(marker.len()).any(|w| w == marker) {
                bail!("--tls-ca {}: no PEM certificate in it", path.display());
            }
            let mut tls =
                tonic::transport::ClientTlsConfig::new().ca_certificate(tonic::transport::Certificate::from_pem(ca));
            if let Some(name) = &args.tls_server_name {
                tls = tls.domain_name(name.clone());
            }
            tonic::transport::Channel::from_shared(format!("https://{at}"))?
                .tls_config(tls)
                .map_err(|e| anyhow::anyhow!("--tls-ca: {}", tessera_kv::flight::error_chain(&e)))?
        }
    };
    let channel = endpoint.connect().await.map_err(|e| {
        let tls = if args.tls_ca.is_some() {
            " --kv-tls-cert ..."
        } else {
            ""
        };
        anyhow::anyhow!(
            "connecting to the KV server at {at} (is `tessera serve DIR --kv {at}{tls}` running?): {}",
            tessera_kv::flight::error_chain(&e)
        )
    })?;
    let mut client = FlightClient::new(channel);
    if let Some(token) = token {
        client
            .add_header("authorization", &format!("Bearer {token}"))
            .map_err(said)?;
    }
    Ok(client)
}

/// A Flight error as the server said it.
fn said(e: FlightError) -> anyhow::Error {
    match e {
        // A status with a source failed in the connection, not at the
        // server: the source says how.
        FlightError::Tonic(status) => match std::error::Error::source(&*status) {
            Some(source) => ConnectionFailed(tessera_kv::flight::error_chain(source)).into(),
            None => anyhow::anyhow!("{}", status.message()),
        },
        other => anyhow::anyhow!("{other}"),
    }
}

async fn action(client: &mut FlightClient, kind: &str, body: serde_json::Value) -> Result<serde_json::Value> {
    let mut results = client
        .do_action(Action::new(kind, serde_json::to_vec(&body)?))
        .await
        .map_err(said)?;
    let body = results
        .next()
        .await
        .context("the server gave no answer")?
        .map_err(said)?;
    Ok(serde_json::from_slice(&body)?)
}

async fn run_async(args: Args) -> Result<()> {
    let token = args
        .token_file
        .as_deref()
        .map(|path| crate::serve::http::read_token(path, "KV"))
        .transpose()?;
    let mut client = connect(&args, token.as_deref()).await?;
    match args.command {
        KvCommand::Create { name, schema } => {
            let text = match schema.strip_prefix('@') {
                Some(path) => std::fs::read_to_string(path).with_context(|| format!("reading {path}"))?,
                None => schema,
            };
            let schema: serde_json::Value = serde_json::from_str(&text).context("the schema is not JSON")?;
            action(
                &mut client,
                "create",
                serde_json::json!({ "name": name, "schema": schema }),
            )
            .await?;
            eprintln!("tessera: space {name} created");
        }
        KvCommand::Insert { name, file, batch_rows } => {
            let descriptor = FlightDescriptor::new_path(vec![name.clone()]);
            let schema = client.get_schema(descriptor.clone()).await.map_err(said)?;
            let batches = read_batches(&file, std::sync::Arc::new(schema), batch_rows)?;
            let data = FlightDataEncoderBuilder::new()
                .with_flight_descriptor(Some(descriptor))
                .build(futures::stream::iter(batches.map(|b| b.map_err(FlightError::from))));
            let mut acks = client.do_put(data).await.map_err(said)?;
            let mut rows = 0;
            while let Some(ack) = acks.next().await {
                let ack: serde_json::Value = serde_json::from_slice(&ack.map_err(said)?.app_metadata)?;
                rows = ack["rows"].as_u64().unwrap_or(rows);
            }
            eprintln!("tessera: {rows} records inserted into {name} (durable)");
        }
        KvCommand::Finalize { name, wait } => {
            let answer = action(&mut client, "finalize", serde_json::json!({ "name": name })).await?;
            match answer["finalized"].as_bool() {
                Some(true) => eprintln!("tessera: {name} finalized; the server sorts and indexes it now"),
                _ => eprintln!("tessera: {name} was finalized already"),
            }
            if wait {
                wait_ready(&mut client, &name).await?;
            }
        }
        KvCommand::Query {
            name,
            get,
            conditions,
            out,
            count,
        } => {
            let schema = client
                .get_schema(FlightDescriptor::new_path(vec![name.clone()]))
                .await
                .map_err(said)?;
            let key = space_key(&mut client, &name).await?;
            let query = match (get, conditions) {
                (Some(key), _) => Query::Get(key),
                (None, Some(text)) => parse_conditions(&text, &key)?,
                (None, None) => Query::All,
            };
            let ticket = serde_json::to_vec(&QueryRequest { space: name, query })?;
            let stream = client.do_get(Ticket::new(ticket)).await.map_err(said)?;
            let batches: Vec<RecordBatch> = stream.try_collect().await.map_err(said)?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            if count {
                println!("{rows}");
            } else if let Some(path) = out {
                let file = std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?;
                let mut writer = arrow_ipc::writer::FileWriter::try_new(file, &std::sync::Arc::new(schema))?;
                for b in &batches {
                    writer.write(b)?;
                }
                writer.finish()?;
                eprintln!("tessera: {rows} records written to {}", path.display());
            } else {
                let mut writer = arrow_csv::WriterBuilder::new().with_header(true).build(crate::Stdout);
                for b in &batches {
                    writer.write(b)?;
                }
            }
        }
        KvCommand::Status { name, json } => {
            let answer = action(&mut client, "status", serde_json::json!({ "name": name })).await?;
            let spaces: Vec<serde_json::Value> = match answer {
                serde_json::Value::Array(all) => all,
                one => vec![one["space"].clone()],
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&spaces)?);
                return Ok(());
            }
            println!(
                "{:<24} {:<18} {:>14} {:>14}  progress",
                "space", "phase", "inserted", "sorted"
            );
            for s in &spaces {
                let phase = match &s["phase"] {
                    serde_json::Value::String(p) => p.clone(),
                    other => format!("indexing {}", other["indexing"].as_str().unwrap_or("?")),
                };
                let progress = match &s["progress"] {
                    serde_json::Value::Null => String::new(),
                    p => format!(
                        "{}: {:.0}%",
                        p["step"].as_str().unwrap_or(""),
                        100.0 * p["done"].as_f64().unwrap_or(0.0) / p["total"].as_f64().unwrap_or(1.0).max(1.0)
                    ),
                };
                let sorted = s["sorted"].as_u64().map_or("-".to_string(), |n| n.to_string());
                println!(
                    "{:<24} {:<18} {:>14} {:>14}  {progress}",
                    s["name"].as_str().unwrap_or("?"),
                    phase,
                    s["inserted"],
                    sorted
                );
            }
        }
        KvCommand::Drop { name } => {
            action(&mut client, "drop", serde_json::json!({ "name": name })).await?;
            eprintln!("tessera: space {name} dropped");
        }
    }
    Ok(())
}

/// Shows the deferred work's progress until the space is ready; its
/// error, if the server reports one.
async fn wait_ready(client: &mut FlightClient, name: &str) -> Result<()> {
    let mut progress = crate::array_dir::Progress::counting("kv", "rows");
    loop {
        let answer = action(client, "status", serde_json::json!({ "name": name })).await?;
        let space = &answer["space"];
        if space["phase"] == "ready" {
            eprintln!("tessera: {name} is sorted and indexed: {} records", space["sorted"]);
            return Ok(());
        }
        if let Some(error) = answer["error"].as_str() {
            bail!("the server's sort of {name} failed (it tries again): {error}");
        }
        if let Some(p) = space["progress"].as_object() {
            let count = |key: &str| p.get(key).and_then(|v| v.as_u64()).unwrap_or(0);
            let step = p.get("step").and_then(|v| v.as_str()).unwrap_or("").to_string();
            progress.update(count("done"), count("total"), step);
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

async fn space_key(client: &mut FlightClient, name: &str) -> Result<String> {
    let status = action(client, "status", serde_json::json!({ "name": name })).await?;
    status["space"]["schema"]["key"]
        .as_str()
        .map(str::to_string)
        .context("the server's status names no key")
}

/// `energy>3.5,energy<=10` (conditions on one field; on the key, a key
/// range).
fn parse_conditions(text: &str, key: &str) -> Result<Query> {
    let mut field: Option<String> = None;
    let mut bound = Bound::default();
    for condition in text.split(',') {
        let condition = condition.trim();
        let at = condition
            .find(['<', '>', '='])
            .with_context(|| format!("{condition:?}: a condition is FIELD OP VALUE, OP one of > >= < <= =="))?;
        let (name, rest) = condition.split_at(at);
        let (op, value) = ["==", ">=", "<=", ">", "<"]
            .iter()
            .find_map(|op| rest.strip_prefix(op).map(|v| (*op, v.trim())))
            .with_context(|| format!("{condition:?}: OP is one of > >= < <= =="))?;
        let name = name.trim().to_string();
        if field.get_or_insert_with(|| name.clone()) != &name {
            bail!(
                "conditions on one field only ({} and {name})",
                field.unwrap_or_default()
            );
        }
        let number: serde_json::Number =
            serde_json::from_str(value).with_context(|| format!("{value:?} is not a number"))?;
        let slot = |b: &mut Option<serde_json::Number>| {
            if b.replace(number.clone()).is_some() {
                bail!("{condition:?} bounds the field twice");
            }
            Ok(())
        };
        match op {
            ">" => slot(&mut bound.gt)?,
            ">=" => slot(&mut bound.ge)?,
            "<" => slot(&mut bound.lt)?,
            "<=" => slot(&mut bound.le)?,
            _ => {
                slot(&mut bound.ge)?;
                slot(&mut bound.le)?;
            }
        }
    }
    let field = field.context("no condition")?;
    if field == key {
        return Ok(Query::Keys(bound));
    }
    bound.field = Some(field);
    Ok(Query::Where(bound))
}

type Batches = Box<dyn Iterator<Item = Result<RecordBatch, arrow_schema::ArrowError>> + Send>;

/// The batches of an Arrow IPC file or stream, or of a CSV file read with
/// the space's schema.
fn read_batches(path: &Path, schema: arrow_schema::SchemaRef, batch_rows: usize) -> Result<Batches> {
    let mut file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut magic = [0u8; 6];
    let n = file.read(&mut magic)?;
    let file = std::fs::File::open(path)?;
    if n == 6 && &magic == b"ARROW1" {
        return Ok(Box::new(arrow_ipc::reader::FileReader::try_new(file, None)?));
    }
    if n >= 4 && magic[..4] == [0xff; 4] {
        return Ok(Box::new(arrow_ipc::reader::StreamReader::try_new(file, None)?));
    }
    let reader = arrow_csv::ReaderBuilder::new(schema)
        .with_header(true)
        .with_batch_size(batch_rows)
        .build(file)?;
    Ok(Box::new(reader))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn conditions_become_queries() {
        let q = parse_conditions("energy > 3.5", "id").unwrap();
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            r#"{"where":{"field":"energy","gt":3.5}}"#
        );
        let q = parse_conditions("id>=10,id<20", "id").unwrap();
        assert_eq!(serde_json::to_string(&q).unwrap(), r#"{"keys":{"ge":10,"lt":20}}"#);
        let q = parse_conditions("q==4", "id").unwrap();
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            r#"{"where":{"field":"q","ge":4,"le":4}}"#
        );
        for bad in ["energy", "energy>x", "a>1,b<2", "a>1,a>2", "a!1"] {
            assert!(parse_conditions(bad, "id").is_err(), "{bad}");
        }
    }
}
