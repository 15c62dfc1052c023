//! The guest agent's wire format (`guest/tools/ignition-agent.c` is the
//! other end; the book's "The guest agent" chapter documents it byte for
//! byte).
//!
//! A frame is an 8-byte header, then `len` bytes of payload:
//!
//! ```text
//! offset 0  u8   version (1)
//! offset 1  u8   type (FrameType)
//! offset 2  u16  reserved, 0
//! offset 4  u32  len, little-endian, at most MAX_PAYLOAD
//! ```
//!
//! Integers are little-endian; a string is a `u32` length and that many
//! bytes (no NUL). Everything decoded here comes from the guest and is
//! checked: a wrong version, reserved bits, an oversized or truncated
//! frame or payload is an error, never a panic.

use std::io::{self, Read};

/// The protocol version in every header.
pub const VERSION: u8 = 1;
/// Bytes of a header.
pub const HEADER_LEN: usize = 8;
/// Largest payload of one frame, in bytes (1 MiB), both ways.
pub const MAX_PAYLOAD: u32 = 1 << 20;
/// The vsock port the agent listens on.
pub const AGENT_PORT: u32 = 1024;
/// Most argv entries, and most env entries, of an exec.
pub const MAX_ARGS: usize = 4096;
/// Bytes of stdin or file data the clients put in one frame.
pub const CHUNK: usize = 256 << 10;

/// Error codes of an ERROR frame beside errno values (which are below 4096).
pub mod code {
    /// A malformed or unexpected frame; the agent closed the connection.
    pub const BAD_REQUEST: u32 = 4096;
    /// The agent serves its most requests at once (64).
    pub const BUSY: u32 = 4097;
    /// Another protocol version, or an unknown request type.
    pub const UNSUPPORTED: u32 = 4098;
}

/// Frame types. Requests and their follow-ups go host to agent (`0x01` to
/// `0x12`), responses agent to host (`0x20` to `0x27`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum FrameType {
    /// Run a command ([`ExecRequest`]).
    Exec = 0x01,
    /// Read a file: its path.
    ReadFile = 0x02,
    /// Write a file atomically ([`WriteFileRequest`]), content in `Data`.
    WriteFile = 0x03,
    /// A path's [`Stat`].
    Stat = 0x04,
    /// A directory's entries.
    List = 0x05,
    /// Connect to a guest TCP port on 127.0.0.1: u16 port, u16 reserved.
    Expose = 0x06,
    /// The agent's [`Info`]; empty payload.
    Info = 0x07,
    /// A new generation ID ([`IdentityRequest`]).
    Identity = 0x08,
    /// stdin or file bytes; an empty one ends them.
    Data = 0x10,
    /// u32 signal number, sent to the command's process group.
    Signal = 0x11,
    /// u16 rows, u16 columns: a pty's new size.
    Resize = 0x12,
    /// The command runs: u32 pid.
    Started = 0x20,
    /// Bytes of the command's stdout (in pty mode, the terminal's output).
    Stdout = 0x21,
    /// Bytes of the command's stderr.
    Stderr = 0x22,
    /// The command ended ([`Exit`]); the last frame of an exec.
    Exit = 0x23,
    /// Bytes of a file being read.
    FileData = 0x24,
    /// One directory entry: a [`Stat`] and a name.
    Entry = 0x25,
    /// The request succeeded; the last frame (but of an expose, after which
    /// the connection carries the TCP stream).
    Ok = 0x26,
    /// The request failed: u32 code, string message; the last frame.
    Error = 0x27,
}

impl FrameType {
    /// The type of byte `b`, if it names one.
    pub fn from_byte(b: u8) -> Option<Self> {
        use FrameType::*;
        Some(match b {
            0x01 => Exec,
            0x02 => ReadFile,
            0x03 => WriteFile,
            0x04 => Stat,
            0x05 => List,
            0x06 => Expose,
            0x07 => Info,
            0x08 => Identity,
            0x10 => Data,
            0x11 => Signal,
            0x12 => Resize,
            0x20 => Started,
            0x21 => Stdout,
            0x22 => Stderr,
            0x23 => Exit,
            0x24 => FileData,
            0x25 => Entry,
            0x26 => Ok,
            0x27 => Error,
            _ => return None,
        })
    }
}

/// Why bytes from the agent are not a valid frame or payload.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    /// The header's version is not [`VERSION`].
    #[error("protocol version {0} (this client speaks {VERSION})")]
    Version(u8),
    /// The header's reserved bytes are not zero.
    #[error("reserved header bits set")]
    Reserved,
    /// The header's type byte names no frame type.
    #[error("unknown frame type {0:#04x}")]
    UnknownType(u8),
    /// The header announces more than [`MAX_PAYLOAD`] bytes.
    #[error("frame of {0} bytes (at most {MAX_PAYLOAD})")]
    TooLong(u32),
    /// The stream ended inside a frame.
    #[error("the stream ended inside a frame")]
    Truncated,
    /// A payload too short, too long or otherwise not what its type holds.
    #[error("malformed {0} payload")]
    Malformed(&'static str),
    /// Reading the stream failed (a timeout included).
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// A frame's header fields, the values a sender chose.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    /// The frame's type.
    pub kind: FrameType,
    /// Payload bytes that follow.
    pub len: u32,
}

/// The 8 header bytes of a frame of `kind` with `len` payload bytes.
pub fn encode_header(kind: FrameType, len: u32) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = VERSION;
    h[1] = kind as u8;
    h[4..8].copy_from_slice(&len.to_le_bytes());
    h
}

/// Checks and decodes 8 header bytes.
pub fn decode_header(h: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
    if h[0] != VERSION {
        return Err(FrameError::Version(h[0]));
    }
    if h[2] != 0 || h[3] != 0 {
        return Err(FrameError::Reserved);
    }
    let kind = FrameType::from_byte(h[1]).ok_or(FrameError::UnknownType(h[1]))?;
    let len = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if len > MAX_PAYLOAD {
        return Err(FrameError::TooLong(len));
    }
    Ok(Header { kind, len })
}

/// A whole frame: header and payload, ready to send. `payload` must be at
/// most [`MAX_PAYLOAD`] bytes (the encoders here keep to it).
pub fn encode_frame(kind: FrameType, payload: &[u8]) -> Vec<u8> {
    debug_assert!(payload.len() <= MAX_PAYLOAD as usize);
    let mut f = Vec::with_capacity(HEADER_LEN + payload.len());
    f.extend_from_slice(&encode_header(kind, payload.len() as u32));
    f.extend_from_slice(payload);
    f
}

/// Reads one frame from `r` into `payload` (replacing its content).
/// Returns its type, or `None` if the stream ended cleanly before a header.
/// Reads at most [`HEADER_LEN`] + [`MAX_PAYLOAD`] bytes.
pub fn read_frame<R: Read + ?Sized>(
    r: &mut R,
    payload: &mut Vec<u8>,
) -> Result<Option<FrameType>, FrameError> {
    let mut h = [0u8; HEADER_LEN];
    let mut got = 0;
    while got < HEADER_LEN {
        match r.read(&mut h[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(FrameError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let header = decode_header(&h)?;
    payload.clear();
    payload.resize(header.len as usize, 0);
    r.read_exact(payload).map_err(|e| match e.kind() {
        io::ErrorKind::UnexpectedEof => FrameError::Truncated,
        _ => FrameError::Io(e),
    })?;
    Ok(Some(header.kind))
}

/// A payload being built.
#[derive(Default)]
struct Out(Vec<u8>);

impl Out {
    fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn str(&mut self, s: &[u8]) -> &mut Self {
        self.u32(s.len() as u32).bytes(s)
    }
}

/// A payload being decoded; every read is bounds-checked.
pub struct In<'a> {
    p: &'a [u8],
    what: &'static str,
}

impl<'a> In<'a> {
    /// Decodes `p`, a payload of kind `what` (named in errors).
    pub fn new(p: &'a [u8], what: &'static str) -> Self {
        In { p, what }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], FrameError> {
        if n > self.p.len() {
            return Err(FrameError::Malformed(self.what));
        }
        let (a, b) = self.p.split_at(n);
        self.p = b;
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, FrameError> {
        Ok(self.take(1)?[0])
    }
    fn u16(&mut self) -> Result<u16, FrameError> {
        let b = self.take(2)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Result<u32, FrameError> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self) -> Result<u64, FrameError> {
        let mut v = [0u8; 8];
        v.copy_from_slice(self.take(8)?);
        Ok(u64::from_le_bytes(v))
    }
    fn string(&mut self) -> Result<String, FrameError> {
        let n = self.u32()? as usize;
        let b = self.take(n)?;
        if b.contains(&0) {
            return Err(FrameError::Malformed(self.what));
        }
        String::from_utf8(b.to_vec()).map_err(|_| FrameError::Malformed(self.what))
    }
    fn end(&self) -> Result<(), FrameError> {
        if self.p.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Malformed(self.what))
        }
    }
}

/// Why a request cannot be encoded.
#[derive(Debug, thiserror::Error)]
pub enum EncodeError {
    /// No argv, or more than [`MAX_ARGS`] argv or env entries.
    #[error("an exec needs 1 to {MAX_ARGS} arguments and at most {MAX_ARGS} variables")]
    Count,
    /// A string holds a NUL byte, or an env entry has no `=`.
    #[error("{0:?}: NUL bytes, or an environment entry without '='")]
    Bad(String),
    /// The payload would exceed [`MAX_PAYLOAD`].
    #[error("the request is larger than {MAX_PAYLOAD} bytes")]
    TooLarge,
}

fn check_str(s: &str) -> Result<&[u8], EncodeError> {
    if s.as_bytes().contains(&0) {
        return Err(EncodeError::Bad(s.into()));
    }
    Ok(s.as_bytes())
}

fn finish(o: Out) -> Result<Vec<u8>, EncodeError> {
    if o.0.len() > MAX_PAYLOAD as usize {
        return Err(EncodeError::TooLarge);
    }
    Ok(o.0)
}

/// An exec request's payload:
///
/// ```text
/// u32 flags (1: pty, 2: stdin follows in Data frames; else /dev/null)
/// u32 timeout_ms (0: none; then the agent kills the process group)
/// u16 rows, u16 cols (pty mode; 0: 24x80)
/// u32 argc, u32 envc
/// str cwd ("" : /), str argv[argc], str env[envc] ("NAME=VALUE")
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecRequest {
    /// The command and its arguments; `argv[0]` is looked up in `PATH`.
    pub argv: Vec<String>,
    /// `NAME=VALUE` entries over the agent's base environment (`PATH`,
    /// `HOME`, and `TERM` in pty mode).
    pub env: Vec<String>,
    /// The working directory (empty: `/`).
    pub cwd: String,
    /// Whether stdin comes in Data frames (else it is `/dev/null`).
    pub stdin: bool,
    /// A pty of `(rows, cols)` for stdin, stdout and stderr, or pipes.
    pub pty: Option<(u16, u16)>,
    /// Milliseconds until the agent kills the command (0: never).
    pub timeout_ms: u32,
}

impl ExecRequest {
    /// The payload, or why it cannot be sent.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        if self.argv.is_empty() || self.argv.len() > MAX_ARGS || self.env.len() > MAX_ARGS {
            return Err(EncodeError::Count);
        }
        let mut o = Out::default();
        let flags = u32::from(self.pty.is_some()) | (u32::from(self.stdin) << 1);
        let (rows, cols) = self.pty.unwrap_or((0, 0));
        o.u32(flags)
            .u32(self.timeout_ms)
            .u16(rows)
            .u16(cols)
            .u32(self.argv.len() as u32)
            .u32(self.env.len() as u32)
            .str(check_str(&self.cwd)?);
        for a in &self.argv {
            o.str(check_str(a)?);
        }
        for e in &self.env {
            if !e.contains('=') {
                return Err(EncodeError::Bad(e.clone()));
            }
            o.str(check_str(e)?);
        }
        finish(o)
    }
}

/// A path-only request's payload (read_file, stat, list): `str path`.
pub fn encode_path(path: &str) -> Result<Vec<u8>, EncodeError> {
    let mut o = Out::default();
    o.str(check_str(path)?);
    finish(o)
}

/// A write_file request's payload: `u32 mode` (permission bits, at most
/// `0o7777`), `u32 flags` (0), `str path`. The content follows in Data
/// frames and an empty Data frame ends it; the agent writes a temporary
/// file beside `path`, syncs it and renames it over `path`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WriteFileRequest {
    /// The file's path.
    pub path: String,
    /// Its permission bits.
    pub mode: u32,
}

impl WriteFileRequest {
    /// The payload.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        if self.mode & !0o7777 != 0 {
            return Err(EncodeError::Bad(format!("mode {:#o}", self.mode)));
        }
        let mut o = Out::default();
        o.u32(self.mode).u32(0).str(check_str(&self.path)?);
        finish(o)
    }
}

/// An expose request's payload: `u16 port`, `u16 reserved` (0).
pub fn encode_expose(port: u16) -> Vec<u8> {
    let mut o = Out::default();
    o.u16(port).u16(0);
    o.0
}

/// A signal frame's payload: `u32 signal`.
pub fn encode_signal(signal: u32) -> Vec<u8> {
    signal.to_le_bytes().to_vec()
}

/// A resize frame's payload: `u16 rows`, `u16 cols`.
pub fn encode_resize(rows: u16, cols: u16) -> Vec<u8> {
    let mut o = Out::default();
    o.u16(rows).u16(cols);
    o.0
}

/// Identity flag: the host restored (or branched) this VM from a snapshot,
/// so a guest that has no generation ID yet rotates all the same.
pub const IDENTITY_RESTORED: u32 = 1;

/// An identity request's payload: 16 bytes generation ID, `u32 flags`
/// ([`IDENTITY_RESTORED`]), `str address` (empty: DHCP; else
/// `ADDR/PREFIX[,GATEWAY]` for eth0).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRequest {
    /// The VM's generation ID, as the VMM published it through vmgenid.
    pub generation_id: [u8; 16],
    /// The VM was restored from a snapshot.
    pub restored: bool,
    /// eth0's new address (`ADDR/PREFIX[,GATEWAY]`), or empty for DHCP.
    pub address: String,
}

impl IdentityRequest {
    /// The payload.
    pub fn encode(&self) -> Result<Vec<u8>, EncodeError> {
        let mut o = Out::default();
        o.bytes(&self.generation_id)
            .u32(if self.restored { IDENTITY_RESTORED } else { 0 })
            .str(check_str(&self.address)?);
        finish(o)
    }
}

/// How a command ended: an Exit frame's payload, `u8 signaled`, `u8
/// timed_out`, `u16 reserved` (0), `u32 code` (the exit status, or the
/// signal number).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// Killed by a signal (`code` is its number) rather than exited.
    pub signaled: bool,
    /// The agent killed it at the request's timeout.
    pub timed_out: bool,
    /// The exit status (0 to 255), or the signal number.
    pub code: u32,
}

impl Exit {
    /// Decodes an Exit payload.
    pub fn decode(p: &[u8]) -> Result<Self, FrameError> {
        let mut i = In::new(p, "exit");
        let signaled = i.u8()?;
        let timed_out = i.u8()?;
        let reserved = i.u16()?;
        let code = i.u32()?;
        i.end()?;
        if signaled > 1 || timed_out > 1 || reserved != 0 || (signaled == 0 && code > 255) {
            return Err(FrameError::Malformed("exit"));
        }
        Ok(Exit {
            signaled: signaled == 1,
            timed_out: timed_out == 1,
            code,
        })
    }
}

/// An Error frame's payload: `u32 code` (an errno value, or one of
/// [`code`]), `str message`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AgentErrorPayload {
    /// The code.
    pub code: u32,
    /// What failed, for people.
    pub message: String,
}

impl AgentErrorPayload {
    /// Decodes an Error payload.
    pub fn decode(p: &[u8]) -> Result<Self, FrameError> {
        let mut i = In::new(p, "error");
        let code = i.u32()?;
        let message = i.string()?;
        i.end()?;
        Ok(AgentErrorPayload { code, message })
    }
}

/// A file's metadata (32 bytes): `u32 st_mode` (type and permission
/// bits), `u32 uid`, `u32 gid`, `u32 mtime_nsec`, `u64 size`, `i64
/// mtime_sec`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stat {
    /// `st_mode`: the file type (`S_IFMT` bits) and permissions.
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Bytes.
    pub size: u64,
    /// Modification time, seconds since the epoch.
    pub mtime_sec: i64,
    /// Its nanoseconds (below 10^9).
    pub mtime_nsec: u32,
}

impl Stat {
    /// Whether it is a directory.
    pub fn is_dir(&self) -> bool {
        self.mode & 0o170000 == 0o040000
    }

    fn read(i: &mut In<'_>) -> Result<Self, FrameError> {
        let mode = i.u32()?;
        let uid = i.u32()?;
        let gid = i.u32()?;
        let mtime_nsec = i.u32()?;
        let size = i.u64()?;
        let mtime_sec = i.u64()? as i64;
        if mtime_nsec >= 1_000_000_000 {
            return Err(FrameError::Malformed("stat"));
        }
        Ok(Stat {
            mode,
            uid,
            gid,
            size,
            mtime_sec,
            mtime_nsec,
        })
    }

    /// Decodes a stat request's Ok payload.
    pub fn decode(p: &[u8]) -> Result<Self, FrameError> {
        let mut i = In::new(p, "stat");
        let s = Stat::read(&mut i)?;
        i.end()?;
        Ok(s)
    }
}

/// A directory entry: an Entry frame's payload, a [`Stat`] (of the entry
/// itself, not a symlink's target) then `str name`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The entry's name (no `/`, not `.` or `..`).
    pub name: String,
    /// Its metadata.
    pub stat: Stat,
}

impl Entry {
    /// Decodes an Entry payload.
    pub fn decode(p: &[u8]) -> Result<Self, FrameError> {
        let mut i = In::new(p, "entry");
        let stat = Stat::read(&mut i)?;
        let name = i.string()?;
        i.end()?;
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(FrameError::Malformed("entry"));
        }
        Ok(Entry { name, stat })
    }
}

/// Most addresses an Info payload may list.
pub const MAX_ADDRESSES: u32 = 256;

/// The agent's view of the guest: an info (or identity) request's Ok
/// payload, `u32 version`, `u64 generation counter`, 16 bytes generation
/// ID, `u64 uptime_ms`, `str boot_id`, `str machine_id`, `u32 count`, then
/// `count` strings `"IFNAME ADDRESS/PREFIX"` (loopback left out).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Info {
    /// The agent's protocol version.
    pub version: u32,
    /// Identity rotations since the guest booted (0 until its first
    /// restore).
    pub generation: u64,
    /// The last generation ID the host sent (zero until then).
    pub generation_id: [u8; 16],
    /// Milliseconds since the guest kernel booted (`CLOCK_BOOTTIME`; a
    /// restored guest counts on from its snapshot).
    pub uptime_ms: u64,
    /// The kernel's boot ID (`/proc/sys/kernel/random/boot_id`).
    pub boot_id: String,
    /// `/etc/machine-id`, or empty without one.
    pub machine_id: String,
    /// `"IFNAME ADDRESS/PREFIX"` per address of a non-loopback interface.
    pub addresses: Vec<String>,
}

impl Info {
    /// Decodes an Info payload.
    pub fn decode(p: &[u8]) -> Result<Self, FrameError> {
        let mut i = In::new(p, "info");
        let version = i.u32()?;
        let generation = i.u64()?;
        let mut generation_id = [0u8; 16];
        generation_id.copy_from_slice(i.take(16)?);
        let uptime_ms = i.u64()?;
        let boot_id = i.string()?;
        let machine_id = i.string()?;
        let n = i.u32()?;
        if n > MAX_ADDRESSES {
            return Err(FrameError::Malformed("info"));
        }
        let addresses = (0..n).map(|_| i.string()).collect::<Result<_, _>>()?;
        i.end()?;
        Ok(Info {
            version,
            generation,
            generation_id,
            uptime_ms,
            boot_id,
            machine_id,
            addresses,
        })
    }
}

/// Decodes a `u32` payload (Started's pid, List's Ok count).
pub fn decode_u32(p: &[u8], what: &'static str) -> Result<u32, FrameError> {
    let mut i = In::new(p, what);
    let v = i.u32()?;
    i.end()?;
    Ok(v)
}

/// Decodes a `u64` payload (read_file's and write_file's Ok byte counts).
pub fn decode_u64(p: &[u8], what: &'static str) -> Result<u64, FrameError> {
    let mut i = In::new(p, what);
    let v = i.u64()?;
    i.end()?;
    Ok(v)
}

/// Decodes an empty payload (expose's Ok).
pub fn decode_empty(p: &[u8], what: &'static str) -> Result<(), FrameError> {
    In::new(p, what).end()
}

/// Checks a stream of frames an agent sent (`stream`, from the first
/// header to the end): every frame is a response whose payload decodes as
/// its type says (an Ok payload is checked by the request it answers, so
/// any is taken here). Returns the number of frames. What the clients
/// check frame by frame, for the fuzz target and its seeds.
pub fn check_responses(mut stream: &[u8]) -> Result<usize, FrameError> {
    let mut payload = Vec::new();
    let mut n = 0;
    while let Some(kind) = read_frame(&mut stream, &mut payload)? {
        let p = &payload[..];
        match kind {
            FrameType::Started => decode_u32(p, "started").map(drop)?,
            FrameType::Exit => Exit::decode(p).map(drop)?,
            FrameType::Entry => Entry::decode(p).map(drop)?,
            FrameType::Error => AgentErrorPayload::decode(p).map(drop)?,
            FrameType::Stdout | FrameType::Stderr | FrameType::FileData | FrameType::Ok => {}
            _ => return Err(FrameError::Malformed("response (a request type)")),
        }
        n += 1;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frames(parts: &[(FrameType, &[u8])]) -> Vec<u8> {
        parts
            .iter()
            .flat_map(|(t, p)| encode_frame(*t, p))
            .collect()
    }

    #[test]
    fn a_stream_of_frames_reads_back_in_order_and_ends_cleanly() {
        let bytes = frames(&[(FrameType::Stdout, b"hi"), (FrameType::Ok, b"")]);
        let mut r = &bytes[..];
        let mut p = Vec::new();
        assert_eq!(read_frame(&mut r, &mut p).unwrap(), Some(FrameType::Stdout));
        assert_eq!(p, b"hi");
        assert_eq!(read_frame(&mut r, &mut p).unwrap(), Some(FrameType::Ok));
        assert!(p.is_empty());
        assert_eq!(read_frame(&mut r, &mut p).unwrap(), None);
    }

    #[test]
    fn the_header_is_byte_for_byte_as_documented() {
        assert_eq!(
            encode_header(FrameType::Exec, 0x0102_0304),
            [1, 0x01, 0, 0, 4, 3, 2, 1]
        );
    }

    #[test]
    fn bad_headers_are_refused() {
        let mut h = encode_header(FrameType::Ok, 0);
        h[0] = 2;
        assert!(matches!(decode_header(&h), Err(FrameError::Version(2))));
        let mut h = encode_header(FrameType::Ok, 0);
        h[3] = 1;
        assert!(matches!(decode_header(&h), Err(FrameError::Reserved)));
        let mut h = encode_header(FrameType::Ok, 0);
        h[1] = 0x7f;
        assert!(matches!(
            decode_header(&h),
            Err(FrameError::UnknownType(0x7f))
        ));
        let h = encode_header(FrameType::Stdout, MAX_PAYLOAD + 1);
        assert!(matches!(decode_header(&h), Err(FrameError::TooLong(_))));
        assert!(decode_header(&encode_header(FrameType::Stdout, MAX_PAYLOAD)).is_ok());
    }

    #[test]
    fn an_oversized_frame_is_refused_before_its_payload_is_read() {
        // A header announcing 4 GiB and no payload: refused at the header,
        // nothing allocated.
        let mut bytes = encode_header(FrameType::Stdout, 0).to_vec();
        bytes[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut p = Vec::new();
        assert!(matches!(
            read_frame(&mut &bytes[..], &mut p),
            Err(FrameError::TooLong(u32::MAX))
        ));
        assert_eq!(p.capacity(), 0);
    }

    #[test]
    fn truncated_frames_are_refused() {
        let whole = encode_frame(FrameType::Stdout, b"hello");
        for cut in 1..whole.len() {
            let mut p = Vec::new();
            assert!(
                matches!(
                    read_frame(&mut &whole[..cut], &mut p),
                    Err(FrameError::Truncated)
                ),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn exec_requests_encode_as_documented_and_refuse_bad_input() {
        let r = ExecRequest {
            argv: vec!["echo".into(), "hi".into()],
            env: vec!["A=1".into()],
            cwd: "/tmp".into(),
            stdin: true,
            pty: Some((30, 100)),
            timeout_ms: 5000,
        };
        let p = r.encode().unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(&3u32.to_le_bytes());
        want.extend_from_slice(&5000u32.to_le_bytes());
        want.extend_from_slice(&30u16.to_le_bytes());
        want.extend_from_slice(&100u16.to_le_bytes());
        want.extend_from_slice(&2u32.to_le_bytes());
        want.extend_from_slice(&1u32.to_le_bytes());
        for s in ["/tmp", "echo", "hi", "A=1"] {
            want.extend_from_slice(&(s.len() as u32).to_le_bytes());
            want.extend_from_slice(s.as_bytes());
        }
        assert_eq!(p, want);
        let none = ExecRequest::default();
        assert!(matches!(none.encode(), Err(EncodeError::Count)));
        let nul = ExecRequest {
            argv: vec!["a\0b".into()],
            ..Default::default()
        };
        assert!(matches!(nul.encode(), Err(EncodeError::Bad(_))));
        let no_eq = ExecRequest {
            argv: vec!["true".into()],
            env: vec!["A".into()],
            ..Default::default()
        };
        assert!(matches!(no_eq.encode(), Err(EncodeError::Bad(_))));
        let huge = ExecRequest {
            argv: vec!["x".repeat(MAX_PAYLOAD as usize)],
            ..Default::default()
        };
        assert!(matches!(huge.encode(), Err(EncodeError::TooLarge)));
    }

    #[test]
    fn exits_decode_and_bad_ones_are_refused() {
        assert_eq!(
            Exit::decode(&[0, 0, 0, 0, 3, 0, 0, 0]).unwrap(),
            Exit {
                signaled: false,
                timed_out: false,
                code: 3
            }
        );
        assert_eq!(
            Exit::decode(&[1, 1, 0, 0, 9, 0, 0, 0]).unwrap(),
            Exit {
                signaled: true,
                timed_out: true,
                code: 9
            }
        );
        for bad in [
            &[0u8, 0, 0, 0, 0, 1, 0, 0][..], // exit status 256
            &[2, 0, 0, 0, 0, 0, 0, 0],       // signaled = 2
            &[0, 0, 1, 0, 0, 0, 0, 0],       // reserved
            &[0, 0, 0, 0, 0, 0, 0],          // short
            &[0, 0, 0, 0, 0, 0, 0, 0, 0],    // long
        ] {
            assert!(Exit::decode(bad).is_err(), "{bad:?}");
        }
    }

    fn info_payload(n_addresses: u32, addresses: &[&str]) -> Vec<u8> {
        let mut o = Out::default();
        o.u32(1)
            .bytes(&7u64.to_le_bytes())
            .bytes(&[0xab; 16])
            .bytes(&1234u64.to_le_bytes())
            .str(b"boot")
            .str(b"0123")
            .u32(n_addresses);
        for a in addresses {
            o.str(a.as_bytes());
        }
        o.0
    }

    #[test]
    fn info_decodes_and_bounds_its_lists_and_strings() {
        let i = Info::decode(&info_payload(1, &["eth0 10.0.2.15/24"])).unwrap();
        assert_eq!(i.generation, 7);
        assert_eq!(i.generation_id, [0xab; 16]);
        assert_eq!(i.uptime_ms, 1234);
        assert_eq!(i.machine_id, "0123");
        assert_eq!(i.addresses, ["eth0 10.0.2.15/24"]);
        // A count larger than what follows, or than the bound.
        assert!(Info::decode(&info_payload(2, &["eth0 a"])).is_err());
        assert!(Info::decode(&info_payload(MAX_ADDRESSES + 1, &[])).is_err());
        // A string whose length runs past the payload.
        let mut p = info_payload(0, &[]);
        let at = 4 + 8 + 16 + 8;
        p[at..at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(Info::decode(&p).is_err());
        // Trailing bytes.
        let mut p = info_payload(0, &[]);
        p.push(0);
        assert!(Info::decode(&p).is_err());
    }

    #[test]
    fn entries_refuse_names_that_are_not_names() {
        let stat = |name: &[u8]| {
            let mut o = Out::default();
            o.u32(0o100644)
                .u32(0)
                .u32(0)
                .u32(5)
                .bytes(&9u64.to_le_bytes());
            o.bytes(&1u64.to_le_bytes()).str(name);
            o.0
        };
        let e = Entry::decode(&stat(b"file")).unwrap();
        assert_eq!(e.name, "file");
        assert_eq!(e.stat.size, 9);
        assert!(!e.stat.is_dir());
        for bad in [&b""[..], b".", b"..", b"a/b", b"a\0b", b"\xff"] {
            assert!(Entry::decode(&stat(bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_decode() {
        let mut o = Out::default();
        o.u32(2).str(b"/x: No such file or directory");
        let e = AgentErrorPayload::decode(&o.0).unwrap();
        assert_eq!(e.code, 2);
        assert!(AgentErrorPayload::decode(&o.0[..5]).is_err());
    }

    #[test]
    fn small_requests_encode_as_documented() {
        assert_eq!(encode_expose(8080), [0x90, 0x1f, 0, 0]);
        assert_eq!(encode_signal(15), [15, 0, 0, 0]);
        assert_eq!(encode_resize(24, 80), [24, 0, 80, 0]);
        assert_eq!(encode_path("/a").unwrap(), [2, 0, 0, 0, b'/', b'a']);
        let w = WriteFileRequest {
            path: "/f".into(),
            mode: 0o644,
        };
        assert_eq!(
            w.encode().unwrap(),
            [0xa4, 1, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, b'/', b'f']
        );
        let bad = WriteFileRequest {
            path: "/f".into(),
            mode: 0o10000,
        };
        assert!(bad.encode().is_err());
        let id = IdentityRequest {
            generation_id: [1; 16],
            restored: true,
            address: String::new(),
        };
        let p = id.encode().unwrap();
        assert_eq!(&p[..16], &[1; 16]);
        assert_eq!(&p[16..], &[1, 0, 0, 0, 0, 0, 0, 0]);
    }
}
