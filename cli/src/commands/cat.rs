//! `cat DATASET`: print samples in dataset order; with `--json`, one canonical JSON object per line
//! (`sample_to_canonical_json`, the shape `docs/formats.md` documents).

use std::io::{BufWriter, Write};

use shardstream_sharding::input::InputFormat;
use shardstream_sharding::value::{sample_to_canonical_json, Value};
use shardstream_sharding::Sample;

use crate::{dataset, output, runtime, Global};

/// Arguments of `cat`.
#[derive(Debug, clap::Args)]
pub struct CatArgs {
    /// Dataset: an MDS or LitData folder or URL, a .tar, a brace pattern of tars, or a folder of tars.
    pub dataset: String,
    /// First sample to print (0-based, in dataset order).
    #[arg(long, default_value_t = 0)]
    pub start: u64,
    /// Print at most this many samples.
    #[arg(long)]
    pub limit: Option<u64>,
    /// One canonical JSON object per line (JSON Lines).
    #[arg(long)]
    pub json: bool,
    /// Dataset format: auto, mds, litdata or wds.
    #[arg(long, default_value = "auto")]
    pub input_format: InputFormat,
    /// Decode pickle (`pkl`) columns too (as bytes).
    #[arg(long)]
    pub allow_unsafe_types: bool,
}

/// Runs `cat`.
pub fn run(args: CatArgs, _global: &Global) -> anyhow::Result<()> {
    let rt = runtime::build(runtime::default_workers())?;
    rt.block_on(async {
        let dataset =
            dataset::open(&args.dataset, args.input_format, args.allow_unsafe_types).await?;
        let stdout = std::io::stdout();
        let mut out = BufWriter::new(stdout.lock());
        let result = dataset::visit_samples(&dataset, args.start, args.limit, |i, sample| {
            if args.json {
                serde_json::to_writer(&mut out, &sample_to_canonical_json(&sample))
                    .map_err(std::io::Error::from)
                    .and_then(|()| out.write_all(b"\n"))
            } else {
                write_text(&mut out, i, &sample)
            }
            // `cat ... | head` closes the pipe: `StdoutClosed` ends the command quietly.
            .map_err(output::stdout_error)?;
            Ok(true)
        })
        .await;
        result?;
        out.flush().map_err(output::stdout_error)
    })
}

/// A readable rendering: one line per column, long values cut.
fn write_text(out: &mut impl Write, index: u64, sample: &Sample) -> std::io::Result<()> {
    writeln!(out, "--- sample {index}")?;
    for (name, value) in sample {
        writeln!(out, "{name}: {}", summary(value))?;
    }
    Ok(())
}

fn summary(value: &Value) -> String {
    const MAX: usize = 120;
    let cut = |s: String| {
        if s.chars().count() > MAX {
            format!(
                "{}... ({} chars)",
                s.chars().take(MAX).collect::<String>(),
                s.chars().count()
            )
        } else {
            s
        }
    };
    let hex_head = |b: &[u8]| hex_prefix(b, 16);
    match value {
        Value::Bytes(b) => format!("bytes[{}] {}", b.len(), hex_head(b)),
        Value::Str(s) => cut(format!("{s:?}")),
        Value::Image(format, b) => format!("{format:?} image, {} bytes", b.len()).to_lowercase(),
        Value::Pil(p) => format!(
            "pil image {}x{} {}, {} bytes",
            p.width,
            p.height,
            p.mode,
            p.data.len()
        ),
        Value::Pickle(b) => format!("pickle[{}] {}", b.len(), hex_head(b)),
        other => cut(other.to_canonical_json().to_string()),
    }
}

fn hex_prefix(b: &[u8], n: usize) -> String {
    let head: String = b.iter().take(n).map(|x| format!("{x:02x}")).collect();
    if b.len() > n {
        format!("{head}...")
    } else {
        head
    }
}
