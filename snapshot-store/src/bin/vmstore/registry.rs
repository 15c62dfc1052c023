//! `vmstore push`, `pull`, `push-files`, `pull-files` and `image-pull`: the
//! progress line and the reports.

use std::io::{IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use snapshot_store::oci::{self, BlobStatus, Compression, Connection, Event, EventFn, Limits};
use snapshot_store::Store;

use super::mib;

/// How the registry subcommands connect: plain HTTP or HTTPS, and the
/// transfer limits (`oci::Limits`), as options.
#[derive(clap::Args, Debug, Clone)]
pub struct ConnectionArgs {
    /// Plain HTTP instead of HTTPS (a local registry).
    #[arg(long)]
    plain_http: bool,
    /// Seconds a connection may take to open (DNS, TCP, TLS).
    #[arg(long, value_name = "SECS", value_parser = seconds,
          default_value_t = Limits::DEFAULT.connect_timeout.as_secs_f64())]
    connect_timeout: f64,
    /// Seconds a request may go with no byte moving either way (its answer
    /// awaited, its body sent or read); then it fails, naming what it was
    /// doing.
    #[arg(long, value_name = "SECS", value_parser = seconds,
          default_value_t = Limits::DEFAULT.idle_timeout.as_secs_f64())]
    idle_timeout: f64,
    /// Seconds a request may take all told, plus the time to move its
    /// bytes (a blob's declared size, a manifest's 4 MiB cap, a token's
    /// 1 MiB) at --min-rate: a registry that sends a byte now and then
    /// fails by this deadline.
    #[arg(long, value_name = "SECS", value_parser = seconds,
          default_value_t = Limits::DEFAULT.request_timeout.as_secs_f64())]
    request_timeout: f64,
    /// Slowest average rate accepted, in KiB/s (see --request-timeout).
    #[arg(long, value_name = "KIB_PER_S", value_parser = clap::value_parser!(u64).range(1..),
          default_value_t = Limits::DEFAULT.min_rate / 1024)]
    min_rate: u64,
    /// Further attempts of a request that failed for a moment (no
    /// connection, idle timeout, broken connection, HTTP 408, 429 or 5xx),
    /// after 0.5 s, 1 s, 2 s ... (at most 8 s, less a random part of up to
    /// half); a blob is then sent or received again from its start. Never
    /// after a size limit, a deadline or a digest mismatch.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=10),
          default_value_t = Limits::DEFAULT.retries)]
    retries: u32,
}

/// A positive, finite number of seconds.
fn seconds(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() && v <= oci::MAX_DEADLINE.as_secs_f64() => Ok(v),
        Ok(_) => Err(format!(
            "must be more than 0 and at most {} s",
            oci::MAX_DEADLINE.as_secs()
        )),
        Err(e) => Err(e.to_string()),
    }
}

impl ConnectionArgs {
    /// A connection under these limits, with the auth file's credentials.
    pub fn connection(&self) -> Connection {
        Connection {
            plain_http: self.plain_http,
            credential: None,
            limits: self.limits(),
        }
    }

    /// As the library's limits.
    fn limits(&self) -> Limits {
        Limits {
            connect_timeout: Duration::from_secs_f64(self.connect_timeout),
            idle_timeout: Duration::from_secs_f64(self.idle_timeout),
            request_timeout: Duration::from_secs_f64(self.request_timeout),
            min_rate: self.min_rate.saturating_mul(1024),
            retries: self.retries,
        }
    }
}

/// Least time between two redraws of the progress line.
const REDRAW: Duration = Duration::from_millis(100);

struct Line {
    start: Instant,
    last: Option<Instant>,
    key: String,
    width: usize,
}

/// `"2.0 s"`, `"1 min 05 s"`.
fn eta(secs: f64) -> String {
    if !secs.is_finite() {
        return "?".into();
    }
    let s = secs.round() as u64;
    if s < 60 {
        format!("{s} s")
    } else {
        format!("{} min {:02} s", s / 60, s % 60)
    }
}

/// A progress callback drawing one line on stderr (bytes, rate, ETA) when
/// stderr is a terminal, or `None` (quiet) when it is not.
pub fn progress(verb: &'static str) -> Option<EventFn> {
    if !std::io::stderr().is_terminal() {
        return None;
    }
    let line = Mutex::new(Line {
        start: Instant::now(),
        last: None,
        key: String::new(),
        width: 0,
    });
    Some(Arc::new(move |e: Event<'_>| {
        let mut l = line.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        let text = match e {
            Event::Stage(s) => format!("vmstore: {s}"),
            Event::Bytes {
                layer,
                file,
                done,
                total,
            } => {
                let key = format!("{layer}/{file}");
                if key != l.key {
                    l.key = key;
                    l.start = now;
                    l.last = None;
                }
                let redraw = l.last.is_none_or(|t| now - t >= REDRAW) || done == total;
                if !redraw {
                    return;
                }
                let secs = (now - l.start).as_secs_f64().max(1e-3);
                let rate = done as f64 / secs;
                let left = if rate > 0.0 {
                    (total - done.min(total)) as f64 / rate
                } else {
                    f64::INFINITY
                };
                format!(
                    "vmstore: {verb} {}: {} of {} ({:.0}%), {}/s, ETA {}",
                    l.key,
                    mib(done),
                    mib(total),
                    if total == 0 {
                        100.0
                    } else {
                        100.0 * done as f64 / total as f64
                    },
                    mib(rate as u64),
                    eta(left)
                )
            }
        };
        l.last = Some(now);
        let pad = l.width.saturating_sub(text.len());
        l.width = text.len();
        let mut err = std::io::stderr().lock();
        let end = if matches!(e, Event::Stage(_)) {
            "\n"
        } else {
            ""
        };
        let _ = write!(err, "\r{text}{:pad$}{end}", "");
        if !end.is_empty() {
            l.width = 0;
        }
        let _ = err.flush();
    }))
}

/// Ends the progress line, if one was drawn.
fn end_line(p: &Option<EventFn>) {
    if p.is_some() {
        eprintln!();
    }
}

/// The options of `vmstore push --compress ALGO --mount-from REPO` and
/// its connection.
pub fn push_options(
    compress: Option<&str>,
    mount_from: Option<String>,
    conn: &ConnectionArgs,
) -> oci::PushOptions {
    oci::PushOptions {
        connection: conn.connection(),
        compression: match compress {
            Some("zstd") => Compression::Zstd,
            _ => Compression::None,
        },
        mount_from,
        progress: None,
    }
}

/// `vmstore push`.
pub fn push(
    store: &Store,
    spec: &str,
    reference: &str,
    mut opts: oci::PushOptions,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let progress = progress("sending");
    opts.progress = progress.clone();
    let r = oci::push(store, spec, reference, &opts);
    end_line(&progress);
    let r = r?;
    let ratio = compression_ratio(r.file_bytes, r.blob_bytes);
    if json {
        let layers: Vec<serde_json::Value> = r
            .layers
            .iter()
            .map(|l| {
                serde_json::json!({
                    "name": l.name,
                    "manifest_digest": l.manifest_digest,
                    "manifest_size": l.manifest_size,
                    "blobs": l.blobs.iter().map(|b| serde_json::json!({
                        "file": b.file, "media_type": b.media_type, "digest": b.digest,
                        "size": b.size, "file_size": b.file_size, "status": b.status.to_string(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "reference": r.reference, "digest": r.digest, "compression": r.compression.to_string(),
            "layers": layers, "bytes_sent": r.bytes_sent, "bytes_skipped": r.bytes_skipped,
            "file_bytes": r.file_bytes, "blob_bytes": r.blob_bytes, "compression_ratio": ratio,
            "compress_seconds": r.compress_seconds, "upload_seconds": r.upload_seconds, "seconds": r.seconds,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for l in &r.layers {
        for b in &l.blobs {
            writeln!(
                out,
                "{:<8} {}/{:<12} {} {:>10}",
                b.status.to_string(),
                l.name,
                b.file,
                b.digest,
                mib(b.size)
            )?;
        }
        writeln!(out, "layer    {:<15} {}", l.name, l.manifest_digest)?;
    }
    let sent = r
        .layers
        .iter()
        .flat_map(|l| &l.blobs)
        .filter(|b| b.status == BlobStatus::Sent)
        .count();
    let skipped = r.layers.iter().flat_map(|l| &l.blobs).count() - sent;
    writeln!(
        out,
        "pushed {} layer(s) to {} ({}): {sent} blob(s) sent ({}), {skipped} already there ({}), {:.1} s",
        r.layers.len(),
        r.reference,
        r.digest,
        mib(r.bytes_sent),
        mib(r.bytes_skipped),
        r.seconds
    )?;
    if r.compression != Compression::None {
        writeln!(
            out,
            "compression {}: {} of files in {} of blobs (ratio {ratio:.2}), {:.1} s compressing",
            r.compression,
            mib(r.file_bytes),
            mib(r.blob_bytes),
            r.compress_seconds
        )?;
    }
    Ok(())
}

/// `vmstore pull`.
pub fn pull(
    store: &Store,
    reference: &str,
    rename: Option<String>,
    conn: Connection,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let progress = progress("receiving");
    let opts = oci::PullOptions {
        connection: conn,
        rename_top: rename,
        progress: progress.clone(),
    };
    let r = oci::pull(store, reference, &opts);
    end_line(&progress);
    let r = r?;
    let ratio = compression_ratio(r.file_bytes, r.bytes_received);
    if json {
        let layers: Vec<serde_json::Value> = r
            .layers
            .iter()
            .map(|l| {
                serde_json::json!({
                    "name": l.name, "manifest_digest": l.manifest_digest,
                    "content_sha256": l.content_sha256,
                    "status": if l.pulled { "pulled" } else { "present" },
                    "bytes_received": l.bytes_received, "file_bytes": l.file_bytes,
                    "compression": l.compression.to_string(),
                })
            })
            .collect();
        let doc = serde_json::json!({
            "reference": r.reference, "digest": r.digest, "name": r.name, "layers": layers,
            "bytes_received": r.bytes_received, "file_bytes": r.file_bytes,
            "compression_ratio": ratio, "download_seconds": r.download_seconds,
            "commit_seconds": r.commit_seconds, "seconds": r.seconds,
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for l in &r.layers {
        writeln!(
            out,
            "{:<8} {:<20} {} {:>10}",
            if l.pulled { "pulled" } else { "present" },
            l.name,
            l.manifest_digest,
            mib(l.bytes_received)
        )?;
    }
    let pulled = r.layers.iter().filter(|l| l.pulled).count();
    writeln!(
        out,
        "pulled {reference} as '{}': {pulled} layer(s) fetched ({} received, {} written), {} already in the store, {:.1} s",
        r.name,
        mib(r.bytes_received),
        mib(r.file_bytes),
        r.layers.len() - pulled,
        r.seconds
    )?;
    Ok(())
}

/// Layer-file bytes per byte on the wire (1.0 when nothing was sent).
fn compression_ratio(file_bytes: u64, wire_bytes: u64) -> f64 {
    if wire_bytes > 0 {
        file_bytes as f64 / wire_bytes as f64
    } else {
        1.0
    }
}

/// The report of `push-files` (`verb` "pushed": each file `sent` or
/// `present`) or `pull-files` ("pulled").
pub fn files_report(
    r: &oci::FilesReport,
    verb: &str,
    json: bool,
    out: &mut dyn Write,
) -> anyhow::Result<()> {
    let pushed = verb == "pushed";
    let status = |f: &oci::FileEntry| if f.transferred { "sent" } else { "present" };
    if json {
        let files: Vec<serde_json::Value> = r
            .files
            .iter()
            .map(|f| {
                let mut v = serde_json::json!({"name": f.name, "digest": f.digest, "size": f.size});
                if pushed {
                    v["status"] = status(f).into();
                }
                v
            })
            .collect();
        let doc = serde_json::json!({"reference": r.reference, "digest": r.digest, "files": files});
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for f in &r.files {
        let s = if pushed { status(f) } else { "pulled" };
        writeln!(
            out,
            "{s:<8} {:<24} {} {:>10}",
            f.name,
            f.digest,
            mib(f.size)
        )?;
    }
    let bytes: u64 = r.files.iter().map(|f| f.size).sum();
    writeln!(
        out,
        "{verb} {} file(s), {} ({}, {})",
        r.files.len(),
        mib(bytes),
        r.reference,
        r.digest
    )?;
    Ok(())
}

/// The report of `image-pull`.
pub fn image_report(r: &oci::ImageReport, json: bool, out: &mut dyn Write) -> anyhow::Result<()> {
    let status = |b: &oci::ImageBlob| if b.transferred { "pulled" } else { "present" };
    let blob = |b: &oci::ImageBlob| serde_json::json!({"media_type": b.media_type, "digest": b.digest, "size": b.size, "status": status(b)});
    if json {
        let doc = serde_json::json!({
            "reference": r.reference,
            "index_digest": r.index_digest,
            "digest": r.digest,
            "media_type": r.media_type,
            "config": blob(&r.config),
            "layers": r.layers.iter().map(blob).collect::<Vec<_>>(),
        });
        writeln!(out, "{}", serde_json::to_string_pretty(&doc)?)?;
        return Ok(());
    }
    for (i, b) in std::iter::once(&r.config).chain(&r.layers).enumerate() {
        let what = if i == 0 {
            "config".to_string()
        } else {
            format!("layer {}", i - 1)
        };
        writeln!(
            out,
            "{:<8} {what:<9} {} {:>10}",
            status(b),
            b.digest,
            mib(b.size)
        )?;
    }
    writeln!(out, "image {} ({})", r.reference, r.digest)?;
    Ok(())
}
