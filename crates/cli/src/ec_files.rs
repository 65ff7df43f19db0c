//! `tessera ec encode|decode DIR`: erasure coding of shard files.
//!
//! DIR holds shards as files named `0` .. `K+M-1`. Files are streamed in
//! chunks, so shards larger than memory work, and every output is written to
//! a temporary name, synced, then renamed: an interrupted run never leaves a
//! half-written shard under a real shard name.

use anyhow::{bail, Context, Result};
use std::fs::File;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use tessera_ec::{Codec, Kernel, MatrixKind};

#[derive(clap::Args)]
pub struct Shape {
    /// Data shards (K).
    #[arg(long)]
    pub data: usize,
    /// Parity shards (M).
    #[arg(long)]
    pub parity: usize,
    /// Encoding matrix: cauchy (any K+M <= 256) or vandermonde (ISA-L's gf_gen_rs_matrix).
    #[arg(long, default_value = "cauchy")]
    pub matrix: MatrixKind,
    /// Force a kernel: reference, neon, avx2, avx2-gfni, avx512, avx512-gfni (default: the fastest; also TESSERA_EC_KERNEL).
    #[arg(long)]
    pub kernel: Option<Kernel>,
}

impl Shape {
    pub fn codec(&self) -> Result<Codec> {
        let codec = Codec::new(self.data, self.parity, self.matrix)?;
        Ok(match self.kernel {
            Some(kernel) => codec.with_kernel(kernel)?,
            None => codec,
        })
    }
}

#[derive(clap::Subcommand)]
pub enum EcCommand {
    /// Write parity files K..K+M-1 from data files 0..K-1 in DIR.
    Encode {
        #[command(flatten)]
        shape: Shape,
        dir: PathBuf,
    },
    /// Recreate every missing file among 0..K+M-1 in DIR.
    Decode {
        #[command(flatten)]
        shape: Shape,
        dir: PathBuf,
    },
}

/// Runs `ec encode` or `ec decode`.
pub fn run(command: EcCommand) -> Result<()> {
    match command {
        EcCommand::Encode { shape, dir } => encode(&shape.codec()?, &dir),
        EcCommand::Decode { shape, dir } => decode(&shape.codec()?, &dir),
    }
}

/// Bytes of each shard processed per step.
const CHUNK_BYTES: usize = 1 << 20;

fn shard_path(dir: &Path, index: usize) -> PathBuf {
    dir.join(index.to_string())
}

/// Writes a shard under a temporary name and renames it into place on `finish`.
struct ShardWriter {
    file: File,
    temporary: PathBuf,
    target: PathBuf,
}

impl ShardWriter {
    fn create(dir: &Path, index: usize) -> Result<Self> {
        let target = shard_path(dir, index);
        let temporary = dir.join(format!(".{index}.partial"));
        let file = File::create(&temporary).with_context(|| format!("creating {}", temporary.display()))?;
        Ok(ShardWriter {
            file,
            temporary,
            target,
        })
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.file
            .write_all(bytes)
            .with_context(|| format!("writing {}", self.temporary.display()))
    }

    fn finish(self) -> Result<()> {
        self.file
            .sync_all()
            .with_context(|| format!("syncing {}", self.temporary.display()))?;
        std::fs::rename(&self.temporary, &self.target)
            .with_context(|| format!("renaming {} to {}", self.temporary.display(), self.target.display()))
    }
}

/// Opens the shards at `indices`, which must all exist with one length.
fn open_same_length(dir: &Path, indices: &[usize]) -> Result<(Vec<File>, u64)> {
    let mut files = Vec::with_capacity(indices.len());
    let mut length = None;
    for &index in indices {
        let path = shard_path(dir, index);
        let file = File::open(&path).with_context(|| format!("opening shard {}", path.display()))?;
        let len = file.metadata()?.len();
        match length {
            None => length = Some((index, len)),
            Some((first, expected)) if expected != len => bail!(
                "shard {} is {len} bytes but shard {first} is {expected}: all shards must be the same length",
                path.display()
            ),
            Some(_) => {}
        }
        files.push(file);
    }
    Ok((files, length.map_or(0, |(_, len)| len)))
}

/// Reads the next `len` bytes of each file into its buffer.
fn read_chunk(files: &mut [File], buffers: &mut [Vec<u8>], len: usize) -> Result<()> {
    for (file, buffer) in files.iter_mut().zip(buffers.iter_mut()) {
        buffer.resize(len, 0);
        file.read_exact(buffer)
            .context("reading a shard (was it changed during the run?)")?;
    }
    Ok(())
}

pub fn encode(codec: &Codec, dir: &Path) -> Result<()> {
    let (k, m) = (codec.data_shards(), codec.parity_shards());
    let data_indices: Vec<usize> = (0..k).collect();
    let (mut inputs, length) = open_same_length(dir, &data_indices)?;
    let mut writers = (k..k + m)
        .map(|i| ShardWriter::create(dir, i))
        .collect::<Result<Vec<_>>>()?;
    let mut data = vec![Vec::new(); k];
    let mut parity = vec![Vec::new(); m];
    let mut offset = 0u64;
    while offset < length {
        let len = (length - offset).min(CHUNK_BYTES as u64) as usize;
        read_chunk(&mut inputs, &mut data, len)?;
        parity.iter_mut().for_each(|p| p.resize(len, 0));
        let data_refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
        let mut parity_refs: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
        codec.encode(&data_refs, &mut parity_refs)?;
        for (writer, bytes) in writers.iter_mut().zip(&parity) {
            writer.write(bytes)?;
        }
        offset += len as u64;
    }
    for writer in writers {
        writer.finish()?;
    }
    eprintln!("encoded {k} data shards of {length} bytes into {m} parity shards");
    Ok(())
}

pub fn decode(codec: &Codec, dir: &Path) -> Result<()> {
    let total = codec.total_shards();
    let (present, missing): (Vec<usize>, Vec<usize>) = (0..total).partition(|&i| shard_path(dir, i).exists());
    if missing.is_empty() {
        eprintln!("all {total} shards are present: nothing to rebuild");
        return Ok(());
    }
    if missing.len() > codec.parity_shards() {
        bail!(
            "{} shards are missing ({missing:?}) but only {} can be rebuilt with {} parity: the data is lost",
            missing.len(),
            codec.parity_shards(),
            codec.parity_shards()
        );
    }
    let (mut inputs, length) = open_same_length(dir, &present)?;
    let mut writers = missing
        .iter()
        .map(|&i| ShardWriter::create(dir, i))
        .collect::<Result<Vec<_>>>()?;
    let mut present_buffers = vec![Vec::new(); present.len()];
    let mut shards = vec![Vec::new(); total];
    let mut offset = 0u64;
    while offset < length {
        let len = (length - offset).min(CHUNK_BYTES as u64) as usize;
        read_chunk(&mut inputs, &mut present_buffers, len)?;
        for (&index, buffer) in present.iter().zip(present_buffers.iter_mut()) {
            std::mem::swap(&mut shards[index], buffer);
        }
        for &index in &missing {
            shards[index].resize(len, 0);
        }
        let mut refs: Vec<&mut [u8]> = shards.iter_mut().map(|s| s.as_mut_slice()).collect();
        codec.reconstruct(&mut refs, &missing)?;
        for (writer, &index) in writers.iter_mut().zip(&missing) {
            writer.write(&shards[index])?;
        }
        for (&index, buffer) in present.iter().zip(present_buffers.iter_mut()) {
            std::mem::swap(&mut shards[index], buffer);
        }
        offset += len as u64;
    }
    for writer in writers {
        writer.finish()?;
    }
    eprintln!("rebuilt shards {missing:?} ({length} bytes each)");
    Ok(())
}
