/* ignition-agent: the Ignition guest agent.
 *
 * Listens on vsock port 1024 (AGENT_PORT) for the host (CID 2 only) and
 * serves one request per connection, each in a process of its own: exec
 * (streamed stdout and stderr, stdin, signals, a timeout, a pty mode),
 * read_file, write_file (atomic, with a mode), stat, list, expose (a
 * guest TCP port as the connection's byte stream), info, and identity
 * (after a restore: rotate the clone's network address and machine ID,
 * publish the new generation ID). The protocol is in the book's chapter
 * "The guest agent"; the host's side is the `ignition-agent-client` crate
 * and the `ignition.agent` Python module.
 *
 *   ignition-agent [--port PORT] [--net-tools DIR]
 *
 * DIR (default /bin) holds the programs a clone's new network identity
 * runs: `ip` and `udhcpc` (busybox's or compatible), and, if present,
 * `udhcpc.script`, given to udhcpc as its event script (else udhcpc uses
 * its built-in default). A root file system without them in /bin (an OCI
 * image's, with ignition.image's init) names its own.
 *
 * Started by init (/etc/inittab, respawned if it dies). Writes nothing
 * but fatal start-up errors (to stderr).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <linux/vm_sockets.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/pidfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

/* ------------------------------------------------------------ protocol */

#define AGENT_PORT 1024u
#define HOST_CID 2u
#define PROTO_VERSION 1u
#define HEADER_LEN 8u
#define MAX_PAYLOAD (1u << 20)   /* bytes of one frame's payload */
#define CHUNK (256u << 10)       /* bytes of stdout, stderr or file per frame */
#define MAX_ARGS 4096u           /* argv entries, and env entries, of an exec */
#define MAX_CONNECTIONS 64       /* requests served at once */
#define REQUEST_TIMEOUT_S 10     /* for the request frame to arrive */
#define DATA_TIMEOUT_S 60        /* between a write_file's data frames */

/* Requests, host to agent. */
enum {
    T_EXEC = 0x01,
    T_READ_FILE = 0x02,
    T_WRITE_FILE = 0x03,
    T_STAT = 0x04,
    T_LIST = 0x05,
    T_EXPOSE = 0x06,
    T_INFO = 0x07,
    T_IDENTITY = 0x08,
    /* After a request, host to agent. */
    T_DATA = 0x10,
    T_SIGNAL = 0x11,
    T_RESIZE = 0x12,
    /* Responses, agent to host. */
    T_STARTED = 0x20,
    T_STDOUT = 0x21,
    T_STDERR = 0x22,
    T_EXIT = 0x23,
    T_FILE_DATA = 0x24,
    T_ENTRY = 0x25,
    T_OK = 0x26,
    T_ERROR = 0x27,
};

/* Error codes beside errno values (which are below 4096). */
enum {
    E_BAD_REQUEST = 4096, /* malformed or unexpected frame */
    E_BUSY = 4097,        /* MAX_CONNECTIONS requests in service */
    E_UNSUPPORTED = 4098, /* another protocol version or an unknown request */
};

/* exec flags */
#define EXEC_PTY 1u
#define EXEC_STDIN 2u
/* identity flags */
#define IDENTITY_RESTORED 1u

#define STATE_DIR "/run/ignition"
#define GENERATION_FILE STATE_DIR "/generation"
#define LOCK_FILE STATE_DIR "/.lock"
#define MACHINE_ID "/etc/machine-id"
#define DHCP_PID_FILE "/run/udhcpc.eth0.pid"

/* --net-tools: the paths of ip, udhcpc and udhcpc's event script. */
static char ip_bin[PATH_MAX] = "/bin/ip";
static char udhcpc_bin[PATH_MAX] = "/bin/udhcpc";
static char udhcpc_script[PATH_MAX] = "/bin/udhcpc.script";

static uint8_t frame_buf[HEADER_LEN + MAX_PAYLOAD];

static void put_u16(uint8_t *p, uint16_t v) { p[0] = (uint8_t)v; p[1] = (uint8_t)(v >> 8); }
static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint16_t get_u16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* A payload being built (bounded by MAX_PAYLOAD). */
struct out {
    uint8_t buf[MAX_PAYLOAD];
    size_t len;
    int overflow;
};

static void out_bytes(struct out *o, const void *b, size_t n)
{
    if (o->overflow || n > MAX_PAYLOAD - o->len) {
        o->overflow = 1;
        return;
    }
    memcpy(o->buf + o->len, b, n);
    o->len += n;
}
static void out_u32(struct out *o, uint32_t v) { uint8_t b[4]; put_u32(b, v); out_bytes(o, b, 4); }
static void out_u64(struct out *o, uint64_t v) { uint8_t b[8]; put_u64(b, v); out_bytes(o, b, 8); }
static void out_str(struct out *o, const char *s)
{
    size_t n = strlen(s);
    out_u32(o, (uint32_t)n);
    out_bytes(o, s, n);
}

/* A payload being parsed. */
struct in {
    const uint8_t *p;
    size_t left;
    int bad;
};

static const uint8_t *in_take(struct in *in, size_t n)
{
    const uint8_t *p = in->p;
    if (in->bad || n > in->left) {
        in->bad = 1;
        return NULL;
    }
    in->p += n;
    in->left -= n;
    return p;
}
static uint16_t in_u16(struct in *in) { const uint8_t *p = in_take(in, 2); return p ? get_u16(p) : 0; }
static uint32_t in_u32(struct in *in) { const uint8_t *p = in_take(in, 4); return p ? get_u32(p) : 0; }

/* A string: u32 length, then that many bytes, none of them NUL. Returns a
 * NUL-terminated copy (freed with the process), or NULL marking `in` bad. */
static char *in_str(struct in *in)
{
    uint32_t n = in_u32(in);
    const uint8_t *p = in_take(in, n);
    char *s;
    if (!p || memchr(p, 0, n)) {
        in->bad = 1;
        return NULL;
    }
    s = malloc((size_t)n + 1);
    if (!s) {
        in->bad = 1;
        return NULL;
    }
    memcpy(s, p, n);
    s[n] = 0;
    return s;
}

/* ------------------------------------------------------------ I/O */

static int write_all(int fd, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* Reads exactly len bytes: 0, or -1 at the end of the stream or an error. */
static int read_exact(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = read(fd, p, len);
        if (n == 0)
            return -1;
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The payload being built, one at a time. */
static struct out o;

/* Writes one frame: 0, or -1 with errno. */
static int write_frame(int fd, uint8_t type, const void *payload, size_t len)
{
    uint8_t h[HEADER_LEN];
    h[0] = PROTO_VERSION;
    h[1] = type;
    put_u16(h + 2, 0);
    put_u32(h + 4, (uint32_t)len);
    if (write_all(fd, h, sizeof h) < 0 || (len && write_all(fd, payload, len) < 0))
        return -1;
    return 0;
}

/* Sends one frame; on failure the connection is gone, and so is this
 * connection's process (its exit handlers kill a command it runs and
 * remove a half-written file). */
static void send_frame(int fd, uint8_t type, const void *payload, size_t len)
{
    if (write_frame(fd, type, payload, len) < 0)
        exit(1);
}

/* An ERROR payload into `o`: u32 code, str message. */
static void error_payload(uint32_t code, const char *fmt, va_list ap)
{
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    o.len = 0;
    out_u32(&o, code);
    out_str(&o, msg);
}

/* Ends the connection with an error (the request cannot go on). */
static void fail(int fd, uint32_t code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    error_payload(code, fmt, ap);
    va_end(ap);
    send_frame(fd, T_ERROR, o.buf, o.len);
    exit(1);
}

/* The listener's refusal: never waits long, never ends the listener. */
static void refuse(int fd, uint32_t code, const char *fmt, ...)
{
    struct timeval tv = { .tv_sec = 1 };
    va_list ap;
    va_start(ap, fmt);
    error_payload(code, fmt, ap);
    va_end(ap);
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    write_frame(fd, T_ERROR, o.buf, o.len);
}

/* Reads one frame into frame_buf: its type and payload length, or -1 at the
 * end of the stream. A frame of another version, with reserved bits set or
 * longer than MAX_PAYLOAD ends the connection with E_BAD_REQUEST. */
static int read_frame(int fd, uint8_t *type, uint32_t *len)
{
    uint8_t *h = frame_buf;
    if (read_exact(fd, h, HEADER_LEN) < 0)
        return -1;
    if (h[0] != PROTO_VERSION)
        fail(fd, E_UNSUPPORTED, "protocol version %u (this agent speaks %u)", h[0], PROTO_VERSION);
    if (get_u16(h + 2) != 0)
        fail(fd, E_BAD_REQUEST, "reserved header bits set");
    *type = h[1];
    *len = get_u32(h + 4);
    if (*len > MAX_PAYLOAD)
        fail(fd, E_BAD_REQUEST, "frame of %u bytes (at most %u)", *len, MAX_PAYLOAD);
    if (read_exact(fd, h + HEADER_LEN, *len) < 0)
        exit(1);
    return 0;
}

static const uint8_t *payload(void) { return frame_buf + HEADER_LEN; }

static void set_timeout(int fd, int secs)
{
    struct timeval tv = { .tv_sec = secs };
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

static void set_nonblock(int fd)
{
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

/* Runs argv (a path) with stdio on /dev/null; its exit status, or -1. */
static int run(char *const argv[])
{
    int st;
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) {
            dup2(null, 0);
            dup2(null, 1);
            dup2(null, 2);
        }
        execv(argv[0], argv);
        _exit(127);
    }
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* ------------------------------------------------------------ stat records */

/* 32 bytes: u32 st_mode, u32 uid, u32 gid, u32 mtime_nsec, u64 size,
 * i64 mtime_sec. */
static void out_stat(struct out *o, const struct stat *st)
{
    out_u32(o, st->st_mode);
    out_u32(o, st->st_uid);
    out_u32(o, st->st_gid);
    out_u32(o, (uint32_t)st->st_mtim.tv_nsec);
    out_u64(o, (uint64_t)st->st_size);
    out_u64(o, (uint64_t)st->st_mtim.tv_sec);
}

/* ------------------------------------------------------------ exec */

/* The process group of the command this connection runs, killed if the
 * connection's process ends before the command does. */
static pid_t running;
static void kill_running(void)
{
    if (running > 0)
        kill(-running, SIGKILL);
}

struct pending {
    uint8_t *buf;
    size_t off, len;
};

/* The end of stdin on a pty, as a user at the terminal gives it: the
 * terminal's EOF character (VEOF, Ctrl-D), put in buf; returns how many.
 * In canonical mode one at the start of a line makes the reader's read()
 * return 0; after a partial line (last, the last byte written, ends none)
 * the first only hands that line over, so two are sent. In raw mode the
 * command gets the character itself. None if the terminal has no VEOF. */
static size_t pty_eof(int master, uint8_t last, uint8_t *buf)
{
    struct termios t;
    int line_open;
    if (tcgetattr(master, &t) < 0 || t.c_cc[VEOF] == _POSIX_VDISABLE)
        return 0;
    line_open = last != '\n' && !(last == '\r' && (t.c_iflag & ICRNL)) && last != t.c_cc[VEOF] &&
                !(t.c_cc[VEOL] != _POSIX_VDISABLE && last == t.c_cc[VEOL]);
    buf[0] = buf[1] = t.c_cc[VEOF];
    return (t.c_lflag & ICANON) && line_open ? 2 : 1;
}

static void exec_request(int fd, struct in *in)
{
    uint32_t flags = in_u32(in), timeout_ms = in_u32(in);
    uint16_t rows = in_u16(in), cols = in_u16(in);
    uint32_t argc = in_u32(in), envc = in_u32(in);
    char *cwd, **argv, **envp;
    int pty = (flags & EXEC_PTY) != 0, want_stdin = (flags & EXEC_STDIN) != 0;
    int master = -1, out_p[2] = { -1, -1 }, err_p[2] = { -1, -1 }, in_p[2] = { -1, -1 }, status_p[2];
    int pidfd, exited = 0, wstatus = 0, timed_out = 0, stdin_open;
    pid_t pid;
    struct timespec start;
    struct pending pend = { 0 };
    uint8_t *chunk;
    const char *slave_name = NULL;

    if (in->bad || (flags & ~(EXEC_PTY | EXEC_STDIN)) || argc == 0 || argc > MAX_ARGS || envc > MAX_ARGS)
        fail(fd, E_BAD_REQUEST, "bad exec request (flags %#x, %u arguments, %u variables)", flags, argc, envc);
    cwd = in_str(in);
    argv = calloc((size_t)argc + 1, sizeof *argv);
    envp = calloc((size_t)envc + 4, sizeof *envp);
    if (!argv || !envp)
        fail(fd, ENOMEM, "out of memory");
    for (uint32_t i = 0; i < argc; i++)
        argv[i] = in_str(in);
    /* The agent's base environment, then the request's (later wins in
     * getenv's first-match: put the request's first). */
    for (uint32_t i = 0; i < envc; i++) {
        envp[i] = in_str(in);
        if (envp[i] && !strchr(envp[i], '='))
            in->bad = 1;
    }
    if (in->bad || in->left)
        fail(fd, E_BAD_REQUEST, "malformed exec request");
    {
        const char *base[] = { "PATH=/bin:/sbin:/usr/bin:/usr/sbin", "HOME=/root", pty ? "TERM=vt100" : NULL };
        size_t n = envc;
        for (size_t b = 0; b < sizeof base / sizeof *base; b++) {
            size_t klen;
            int have = 0;
            if (!base[b])
                continue;
            klen = (size_t)(strchr(base[b], '=') - base[b]) + 1;
            for (uint32_t i = 0; i < envc; i++)
                if (!strncmp(envp[i], base[b], klen))
                    have = 1;
            if (!have)
                envp[n++] = (char *)base[b];
        }
    }

    if (pty) {
        struct winsize ws = { .ws_row = rows ? rows : 24, .ws_col = cols ? cols : 80 };
        master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
        if (master < 0 || grantpt(master) < 0 || unlockpt(master) < 0 || !(slave_name = ptsname(master)))
            fail(fd, (uint32_t)errno, "cannot open a pty: %s", strerror(errno));
        ioctl(master, TIOCSWINSZ, &ws);
    } else {
        if (pipe2(out_p, O_CLOEXEC) < 0 || pipe2(err_p, O_CLOEXEC) < 0 ||
            (want_stdin && pipe2(in_p, O_CLOEXEC) < 0))
            fail(fd, (uint32_t)errno, "pipe: %s", strerror(errno));
    }
    if (pipe2(status_p, O_CLOEXEC) < 0)
        fail(fd, (uint32_t)errno, "pipe: %s", strerror(errno));

    pid = fork();
    if (pid < 0)
        fail(fd, (uint32_t)errno, "fork: %s", strerror(errno));
    if (pid == 0) {
        int e;
        setsid();
        signal(SIGPIPE, SIG_DFL);
        if (pty) {
            int s = open(slave_name, O_RDWR);
            if (s < 0)
                goto child_fail;
            ioctl(s, TIOCSCTTY, 0);
            dup2(s, 0);
            dup2(s, 1);
            dup2(s, 2);
            if (s > 2)
                close(s);
        } else {
            int null = open("/dev/null", O_RDWR);
            dup2(want_stdin ? in_p[0] : null, 0);
            dup2(out_p[1], 1);
            dup2(err_p[1], 2);
        }
        if (*cwd && chdir(cwd) < 0)
            goto child_fail;
        environ = envp;
        execvp(argv[0], argv);
child_fail:
        e = errno;
        write_all(status_p[1], &e, sizeof e);
        _exit(127);
    }
    running = pid;
    atexit(kill_running);
    close(status_p[1]);
    {
        int e;
        ssize_t n;
        while ((n = read(status_p[0], &e, sizeof e)) < 0 && errno == EINTR)
            ;
        if (n == (ssize_t)sizeof e) {
            waitpid(pid, NULL, 0);
            running = 0;
            fail(fd, (uint32_t)e, "%s: %s", argv[0], strerror(e));
        }
        close(status_p[0]);
    }
    if (!pty) {
        close(out_p[1]);
        close(err_p[1]);
        if (want_stdin) {
            close(in_p[0]);
            set_nonblock(in_p[1]);
        }
        set_nonblock(out_p[0]);
        set_nonblock(err_p[0]);
    } else {
        set_nonblock(master);
    }
    pidfd = pidfd_open(pid, 0);
    if (pidfd < 0)
        fail(fd, (uint32_t)errno, "pidfd_open: %s", strerror(errno));
    clock_gettime(CLOCK_MONOTONIC, &start);
    {
        uint8_t b[4];
        put_u32(b, (uint32_t)pid);
        send_frame(fd, T_STARTED, b, 4);
    }
    chunk = malloc(CHUNK);
    pend.buf = malloc(MAX_PAYLOAD);
    if (!chunk || !pend.buf) {
        kill(-pid, SIGKILL);
        fail(fd, ENOMEM, "out of memory");
    }
    stdin_open = pty || want_stdin;

    /* Output fds: [0] stdout (or the pty), [1] stderr. */
    int outs[2] = { pty ? master : out_p[0], pty ? -1 : err_p[0] };
    int stdin_fd = pty ? master : in_p[1];
    /* The last byte written to the command's stdin ('\n': none yet). */
    uint8_t last_in = '\n';
    int sock_open = 1;
    for (;;) {
        struct pollfd p[5];
        int np = 0, ip_sock = -1, ip_out[2] = { -1, -1 }, ip_in = -1, ip_pid = -1, wait_ms = -1;
        if (sock_open && pend.len == 0) {
            ip_sock = np;
            p[np++] = (struct pollfd){ .fd = fd, .events = POLLIN };
        }
        for (int i = 0; i < 2; i++)
            if (outs[i] >= 0) {
                ip_out[i] = np;
                p[np++] = (struct pollfd){ .fd = outs[i], .events = POLLIN };
            }
        if (pend.len && !pty && stdin_fd >= 0) {
            ip_in = np;
            p[np++] = (struct pollfd){ .fd = stdin_fd, .events = POLLOUT };
        }
        if (pend.len && pty) {
            ip_in = np;
            p[np++] = (struct pollfd){ .fd = master, .events = POLLOUT };
        }
        if (!exited) {
            ip_pid = np;
            p[np++] = (struct pollfd){ .fd = pidfd, .events = POLLIN };
        }
        if (exited)
            break;
        if (timeout_ms && !timed_out) {
            struct timespec now;
            int64_t el;
            clock_gettime(CLOCK_MONOTONIC, &now);
            el = (int64_t)(now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
            wait_ms = el >= (int64_t)timeout_ms ? 0 : (int)((int64_t)timeout_ms - el);
        }
        if (poll(p, (nfds_t)np, wait_ms) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        if (timeout_ms && !timed_out && wait_ms == 0) {
            struct timespec now;
            clock_gettime(CLOCK_MONOTONIC, &now);
            if ((int64_t)(now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000 >=
                (int64_t)timeout_ms) {
                timed_out = 1;
                kill(-pid, SIGKILL);
            }
        }
        for (int i = 0; i < 2; i++) {
            if (ip_out[i] < 0 || !(p[ip_out[i]].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            ssize_t n = read(outs[i], chunk, CHUNK);
            if (n > 0)
                send_frame(fd, i ? T_STDERR : T_STDOUT, chunk, (size_t)n);
            else if (n == 0 || (errno != EINTR && errno != EAGAIN)) {
                /* The end (a pty's master reads EIO once the slave is gone). */
                if (!pty)
                    close(outs[i]);
                outs[i] = -1;
            }
        }
        if (ip_in >= 0 && (p[ip_in].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t n = write(stdin_fd, pend.buf + pend.off, pend.len);
            if (n > 0) {
                pend.off += (size_t)n;
                pend.len -= (size_t)n;
                last_in = pend.buf[pend.off - 1];
            } else if (n < 0 && errno != EINTR && errno != EAGAIN) {
                /* The command closed its stdin: drop what it did not take. */
                pend.len = 0;
                if (!pty) {
                    close(stdin_fd);
                    stdin_fd = -1;
                }
            }
        }
        if (ip_sock >= 0 && (p[ip_sock].revents & (POLLIN | POLLHUP | POLLERR))) {
            uint8_t type;
            uint32_t len;
            if (read_frame(fd, &type, &len) < 0) {
                /* The host went away: the command goes too. */
                sock_open = 0;
                kill(-pid, SIGKILL);
                continue;
            }
            if (type == T_DATA) {
                if (!stdin_open)
                    fail(fd, E_BAD_REQUEST, "stdin data, but stdin was not asked for or has ended");
                if (len == 0) {
                    stdin_open = 0;
                    if (pty)
                        pend.len = pty_eof(master, last_in, pend.buf);
                    else if (stdin_fd >= 0) {
                        close(stdin_fd);
                        stdin_fd = -1;
                    }
                    pend.off = 0;
                } else if (stdin_fd >= 0) {
                    memcpy(pend.buf, payload(), len);
                    pend.off = 0;
                    pend.len = len;
                }
            } else if (type == T_SIGNAL && len == 4) {
                uint32_t sig = get_u32(payload());
                if (sig == 0 || sig >= 65)
                    fail(fd, E_BAD_REQUEST, "signal %u", sig);
                kill(-pid, (int)sig);
            } else if (type == T_RESIZE && len == 4 && pty) {
                struct winsize ws = { .ws_row = get_u16(payload()), .ws_col = get_u16(payload() + 2) };
                ioctl(master, TIOCSWINSZ, &ws);
            } else {
                kill(-pid, SIGKILL);
                fail(fd, E_BAD_REQUEST, "unexpected frame type %#x (%u bytes) during exec", type, len);
            }
        }
        if (ip_pid >= 0 && (p[ip_pid].revents & POLLIN)) {
            while (waitpid(pid, &wstatus, 0) < 0 && errno == EINTR)
                ;
            exited = 1;
            running = 0;
        }
    }
    /* What the command wrote before it ended is in the pipes: send it. What
     * processes it left behind write later is not sent. */
    for (int i = 0; i < 2; i++) {
        while (outs[i] >= 0) {
            ssize_t n = read(outs[i], chunk, CHUNK);
            if (n > 0)
                send_frame(fd, i ? T_STDERR : T_STDOUT, chunk, (size_t)n);
            else if (n < 0 && errno == EINTR)
                continue;
            else
                break;
        }
    }
    {
        uint8_t b[8];
        b[0] = WIFSIGNALED(wstatus) ? 1 : 0;
        b[1] = (uint8_t)timed_out;
        put_u16(b + 2, 0);
        put_u32(b + 4, (uint32_t)(WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : WEXITSTATUS(wstatus)));
        send_frame(fd, T_EXIT, b, 8);
    }
}

/* ------------------------------------------------------------ files */

static void read_file_request(int fd, struct in *in)
{
    char *path = in_str(in);
    uint8_t *chunk = malloc(CHUNK);
    uint64_t total = 0;
    uint8_t b[8];
    int f;
    if (in->bad || in->left || !*path)
        fail(fd, E_BAD_REQUEST, "malformed read_file request");
    if (!chunk)
        fail(fd, ENOMEM, "out of memory");
    f = open(path, O_RDONLY | O_CLOEXEC);
    if (f < 0)
        fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
    for (;;) {
        ssize_t n = read(f, chunk, CHUNK);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
        if (n == 0)
            break;
        send_frame(fd, T_FILE_DATA, chunk, (size_t)n);
        total += (uint64_t)n;
    }
    put_u64(b, total);
    send_frame(fd, T_OK, b, 8);
}

static char write_tmp[4096];
static void remove_tmp(void)
{
    if (write_tmp[0])
        unlink(write_tmp);
}

/* Writes path's directory's name into dir (at most size bytes). */
static void dir_of(const char *path, char *dir, size_t size)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, size, ".");
    else if (slash == path)
        snprintf(dir, size, "/");
    else
        snprintf(dir, size, "%.*s", (int)(slash - path), path);
}

static void write_file_request(int fd, struct in *in)
{
    uint32_t mode = in_u32(in), flags = in_u32(in);
    char *path = in_str(in), dir[4096];
    uint64_t total = 0;
    uint8_t b[8];
    int f, d;
    if (in->bad || in->left || !*path || (mode & ~07777u) || flags)
        fail(fd, E_BAD_REQUEST, "malformed write_file request");
    if (strlen(path) + 32 > sizeof write_tmp)
        fail(fd, ENAMETOOLONG, "%s: %s", path, strerror(ENAMETOOLONG));
    /* A temporary file beside the target, renamed over it once complete. */
    snprintf(write_tmp, sizeof write_tmp, "%s.ignition-XXXXXX", path);
    f = mkostemp(write_tmp, O_CLOEXEC);
    if (f < 0) {
        write_tmp[0] = 0;
        fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
    }
    atexit(remove_tmp);
    set_timeout(fd, DATA_TIMEOUT_S);
    for (;;) {
        uint8_t type;
        uint32_t len;
        if (read_frame(fd, &type, &len) < 0)
            exit(1); /* the host went away or stalled: nothing is written */
        if (type != T_DATA)
            fail(fd, E_BAD_REQUEST, "unexpected frame type %#x during write_file", type);
        if (len == 0)
            break;
        if (write_all(f, payload(), len) < 0)
            fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
        total += len;
    }
    if (fchmod(f, mode) < 0 || fsync(f) < 0 || close(f) < 0)
        fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
    if (rename(write_tmp, path) < 0)
        fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
    write_tmp[0] = 0;
    dir_of(path, dir, sizeof dir);
    d = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (d >= 0) {
        fsync(d);
        close(d);
    }
    put_u64(b, total);
    send_frame(fd, T_OK, b, 8);
}

static void stat_request(int fd, struct in *in)
{
    char *path = in_str(in);
    struct stat st;
    if (in->bad || in->left || !*path)
        fail(fd, E_BAD_REQUEST, "malformed stat request");
    if (stat(path, &st) < 0)
        fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
    o.len = 0;
    out_stat(&o, &st);
    send_frame(fd, T_OK, o.buf, o.len);
}

static void list_request(int fd, struct in *in)
{
    char *path = in_str(in);
    uint32_t count = 0;
    struct dirent *e;
    DIR *dir;
    uint8_t b[4];
    if (in->bad || in->left || !*path)
        fail(fd, E_BAD_REQUEST, "malformed list request");
    dir = opendir(path);
    if (!dir)
        fail(fd, (uint32_t)errno, "%s: %s", path, strerror(errno));
    while ((e = readdir(dir))) {
        struct stat st;
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        if (fstatat(dirfd(dir), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
            continue; /* gone meanwhile */
        o.len = 0;
        out_stat(&o, &st);
        out_str(&o, e->d_name);
        send_frame(fd, T_ENTRY, o.buf, o.len);
        count++;
    }
    put_u32(b, count);
    send_frame(fd, T_OK, b, 4);
}

/* ------------------------------------------------------------ expose */

/* Copies between the connection and a guest TCP connection until both
 * directions have ended; each direction's end is passed on as a shutdown. */
static void expose_request(int fd, struct in *in)
{
    uint16_t port = in_u16(in), reserved = in_u16(in);
    struct sockaddr_in addr = { .sin_family = AF_INET, .sin_port = htons(port) };
    struct { uint8_t buf[64 << 10]; size_t off, len; int eof; } dir[2] = { 0 };
    int fds[2], t, one = 1;
    if (in->bad || in->left || reserved || port == 0)
        fail(fd, E_BAD_REQUEST, "malformed expose request");
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (t < 0)
        fail(fd, (uint32_t)errno, "socket: %s", strerror(errno));
    if (connect(t, (struct sockaddr *)&addr, sizeof addr) < 0)
        fail(fd, (uint32_t)errno, "127.0.0.1:%u: %s", port, strerror(errno));
    setsockopt(t, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    send_frame(fd, T_OK, NULL, 0);
    /* dir[0]: connection -> TCP; dir[1]: TCP -> connection. */
    fds[0] = fd;
    fds[1] = t;
    set_nonblock(fd);
    set_nonblock(t);
    while (!(dir[0].eof && dir[0].len == 0 && dir[1].eof && dir[1].len == 0)) {
        struct pollfd p[2] = { { .fd = fd }, { .fd = t } };
        for (int i = 0; i < 2; i++) {
            if (!dir[i].eof && dir[i].len == 0)
                p[i].events |= POLLIN;       /* read side of direction i */
            if (dir[i].len)
                p[1 - i].events |= POLLOUT;  /* write side of direction i */
        }
        if (poll(p, 2, -1) < 0) {
            if (errno == EINTR)
                continue;
            break;
        }
        for (int i = 0; i < 2; i++) {
            int src = fds[i], dst = fds[1 - i];
            if (!dir[i].eof && dir[i].len == 0 && (p[i].revents & (POLLIN | POLLHUP | POLLERR))) {
                ssize_t n = read(src, dir[i].buf, sizeof dir[i].buf);
                if (n > 0) {
                    dir[i].off = 0;
                    dir[i].len = (size_t)n;
                } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                    dir[i].eof = 1;
                    shutdown(dst, SHUT_WR);
                }
            }
            if (dir[i].len && (p[1 - i].revents & (POLLOUT | POLLERR | POLLHUP))) {
                ssize_t n = write(dst, dir[i].buf + dir[i].off, dir[i].len);
                if (n > 0) {
                    dir[i].off += (size_t)n;
                    dir[i].len -= (size_t)n;
                    if (dir[i].len == 0 && dir[i].eof)
                        shutdown(dst, SHUT_WR);
                } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                    /* The receiving side is gone: so is this direction. */
                    dir[i].len = 0;
                    dir[i].eof = 1;
                }
            }
        }
    }
    close(t);
}

/* ------------------------------------------------------------ info, identity */

struct generation {
    uint8_t id[16];
    uint64_t counter;
    int known;
};

static void hex(const uint8_t *b, size_t n, char *s)
{
    static const char d[] = "0123456789abcdef";
    for (size_t i = 0; i < n; i++) {
        s[2 * i] = d[b[i] >> 4];
        s[2 * i + 1] = d[b[i] & 15];
    }
    s[2 * n] = 0;
}

static int unhex(const char *s, uint8_t *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned int v;
        if (sscanf(s + 2 * i, "%2x", &v) != 1)
            return -1;
        b[i] = (uint8_t)v;
    }
    return 0;
}

/* The published generation: GENERATION_FILE, one line
 * "<generation ID, 32 lowercase hex digits> <counter>\n". */
static void read_generation(struct generation *g)
{
    char line[128], idhex[40];
    unsigned long long counter;
    FILE *f = fopen(GENERATION_FILE, "re");
    memset(g, 0, sizeof *g);
    if (!f)
        return;
    if (fgets(line, sizeof line, f) && sscanf(line, "%32s %llu", idhex, &counter) == 2 && strlen(idhex) == 32 &&
        unhex(idhex, g->id, 16) == 0) {
        g->counter = counter;
        g->known = 1;
    }
    fclose(f);
}

/* Writes `text` to path through a temporary file and a rename, so readers
 * see the old or the new content, never a mix. */
static int replace_file(const char *path, const char *text, mode_t mode)
{
    char tmp[256];
    int f;
    snprintf(tmp, sizeof tmp, "%s.ignition-XXXXXX", path);
    f = mkostemp(tmp, O_CLOEXEC);
    if (f < 0)
        return -1;
    if (write_all(f, text, strlen(text)) < 0 || fchmod(f, mode) < 0 || fsync(f) < 0) {
        close(f);
        unlink(tmp);
        return -1;
    }
    close(f);
    if (rename(tmp, path) < 0) {
        unlink(tmp);
        return -1;
    }
    return 0;
}

static int publish_generation(const struct generation *g)
{
    char text[80], idhex[33];
    hex(g->id, 16, idhex);
    snprintf(text, sizeof text, "%s %llu\n", idhex, (unsigned long long)g->counter);
    return replace_file(GENERATION_FILE, text, 0644);
}

static void read_text(const char *path, char *buf, size_t size)
{
    FILE *f = fopen(path, "re");
    buf[0] = 0;
    if (!f)
        return;
    if (!fgets(buf, (int)size, f))
        buf[0] = 0;
    fclose(f);
    buf[strcspn(buf, "\n")] = 0;
}

/* The info payload: u32 protocol version, u64 generation counter, 16 bytes
 * generation ID (zero until the host sent one), u64 uptime in ms, str
 * boot ID, str machine ID (empty without /etc/machine-id), u32 address
 * count, then per address a str "IFNAME ADDRESS/PREFIX" (loopback left
 * out). */
static void send_info(int fd)
{
    struct generation g;
    struct timespec up;
    char boot_id[64], machine_id[64];
    struct ifaddrs *ifa = NULL;
    uint32_t naddr = 0;
    size_t count_at;
    read_generation(&g);
    clock_gettime(CLOCK_BOOTTIME, &up);
    read_text("/proc/sys/kernel/random/boot_id", boot_id, sizeof boot_id);
    read_text(MACHINE_ID, machine_id, sizeof machine_id);
    o.len = 0;
    out_u32(&o, PROTO_VERSION);
    out_u64(&o, g.counter);
    out_bytes(&o, g.id, 16);
    out_u64(&o, (uint64_t)up.tv_sec * 1000 + (uint64_t)up.tv_nsec / 1000000);
    out_str(&o, boot_id);
    out_str(&o, machine_id);
    count_at = o.len;
    out_u32(&o, 0);
    if (getifaddrs(&ifa) == 0) {
        for (struct ifaddrs *a = ifa; a; a = a->ifa_next) {
            char addr[INET6_ADDRSTRLEN], entry[IF_NAMESIZE + INET6_ADDRSTRLEN + 8];
            const void *src;
            int prefix = 0;
            if (!a->ifa_addr || (a->ifa_flags & IFF_LOOPBACK))
                continue;
            if (a->ifa_addr->sa_family == AF_INET) {
                src = &((struct sockaddr_in *)a->ifa_addr)->sin_addr;
                if (a->ifa_netmask)
                    prefix = __builtin_popcount(((struct sockaddr_in *)a->ifa_netmask)->sin_addr.s_addr);
            } else if (a->ifa_addr->sa_family == AF_INET6) {
                src = &((struct sockaddr_in6 *)a->ifa_addr)->sin6_addr;
                if (a->ifa_netmask)
                    for (int i = 0; i < 16; i++)
                        prefix += __builtin_popcount(((struct sockaddr_in6 *)a->ifa_netmask)->sin6_addr.s6_addr[i]);
            } else {
                continue;
            }
            if (!inet_ntop(a->ifa_addr->sa_family, src, addr, sizeof addr))
                continue;
            snprintf(entry, sizeof entry, "%s %s/%d", a->ifa_name, addr, prefix);
            out_str(&o, entry);
            naddr++;
        }
        freeifaddrs(ifa);
    }
    put_u32(o.buf + count_at, naddr);
    if (o.overflow)
        fail(fd, E_BAD_REQUEST, "info does not fit a frame");
    send_frame(fd, T_OK, o.buf, o.len);
}

/* Kills the udhcpc that keeps eth0's lease, if any. */
static void stop_dhcp(void)
{
    char pid_s[32];
    long pid;
    read_text(DHCP_PID_FILE, pid_s, sizeof pid_s);
    pid = strtol(pid_s, NULL, 10);
    if (pid > 1 && kill((pid_t)pid, SIGTERM) == 0) {
        /* Until it is gone (a few ms), at most 2 s. */
        for (int i = 0; i < 200 && kill((pid_t)pid, 0) == 0; i++)
            usleep(10000);
    }
    unlink(DHCP_PID_FILE);
}

/* Writes `text` to the sysfs attribute `path`. */
static int write_attr(const char *path, const char *text)
{
    int f = open(path, O_WRONLY | O_CLOEXEC);
    int r;
    if (f < 0)
        return -1;
    r = write_all(f, text, strlen(text));
    close(f);
    return r;
}

/* eth0 probed again by its driver (unbound, then bound), so that its MAC
 * is the one the network device offers now: a restore may give a clone a
 * MAC of its own (boot --mac), and the driver reads it only when it
 * probes. Then eth0 is up, without an address. Returns 0, or an error
 * message. */
static const char *reprobe_eth0(void)
{
    char dev[PATH_MAX], driver[PATH_MAX], attr[PATH_MAX + 16];
    const char *name;
    if (!realpath("/sys/class/net/eth0/device", dev) || !realpath("/sys/class/net/eth0/device/driver", driver))
        return "eth0 has no device or driver in /sys";
    name = strrchr(dev, '/') + 1;
    snprintf(attr, sizeof attr, "%s/unbind", driver);
    if (write_attr(attr, name) < 0)
        return "unbinding eth0's device failed";
    snprintf(attr, sizeof attr, "%s/bind", driver);
    if (write_attr(attr, name) < 0)
        return "binding eth0's device again failed";
    /* The driver registers eth0 again as it probes (a few ms), at most 2 s. */
    for (int i = 0; i < 200 && access("/sys/class/net/eth0", F_OK) < 0; i++)
        usleep(10000);
    if (access("/sys/class/net/eth0", F_OK) < 0)
        return "eth0 did not come back after its driver probed again";
    if (run((char *[]){ ip_bin, "link", "set", "eth0", "up", NULL }) != 0)
        return "ip link set eth0 up failed";
    return NULL;
}

/* A clone's new network identity on eth0: its MAC read again from the
 * device (reprobe_eth0), then the host's address ("ADDR/PREFIX[,GATEWAY]")
 * or a new DHCP lease asked for with a client ID made from the new machine
 * ID. Returns 0, or an error message. */
static const char *readdress(const char *address, const char *client_id)
{
    const char *err;
    if (access("/sys/class/net/eth0", F_OK) < 0)
        return NULL;
    stop_dhcp();
    if ((err = reprobe_eth0()))
        return err;
    if (*address) {
        char addr[128], *gw;
        snprintf(addr, sizeof addr, "%s", address);
        gw = strchr(addr, ',');
        if (gw)
            *gw++ = 0;
        else
            gw = addr + strlen(addr);
        run((char *[]){ ip_bin, "addr", "flush", "dev", "eth0", NULL });
        if (run((char *[]){ ip_bin, "addr", "add", addr, "dev", "eth0", NULL }) != 0)
            return "ip addr add failed";
        run((char *[]){ ip_bin, "link", "set", "eth0", "up", NULL });
        if (*gw && run((char *[]){ ip_bin, "route", "replace", "default", "via", gw, "dev", "eth0", NULL }) != 0)
            return "ip route replace failed";
        return NULL;
    }
    {
        char opt[64];
        char *argv[] = { udhcpc_bin, "-i", "eth0", "-b", "-S", "-t", "5", "-T", "1", "-p", DHCP_PID_FILE,
                         "-x", opt, NULL, NULL, NULL };
        snprintf(opt, sizeof opt, "0x3d:00%s", client_id);
        if (access(udhcpc_script, X_OK) == 0) {
            argv[13] = "-s";
            argv[14] = udhcpc_script;
        }
        /* In the foreground until a lease is bound (then it keeps it in the
         * background), or in the background after 5 tries a second apart. */
        if (run(argv) != 0)
            return "udhcpc failed";
    }
    return NULL;
}

static void identity_request(int fd, struct in *in)
{
    const uint8_t *id = in_take(in, 16);
    uint32_t flags = in_u32(in);
    char *address = in_str(in);
    struct generation g;
    int lock;
    if (in->bad || in->left || (flags & ~IDENTITY_RESTORED))
        fail(fd, E_BAD_REQUEST, "malformed identity request");
    {
        /* At once: the host learns that this connection reached the agent
         * (one made while the guest handles a restore's transport reset
         * may be reset in the guest without the host seeing it). */
        uint8_t b[4];
        put_u32(b, (uint32_t)getpid());
        send_frame(fd, T_STARTED, b, 4);
    }
    lock = open(LOCK_FILE, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (lock < 0 || flock(lock, LOCK_EX) < 0)
        fail(fd, (uint32_t)errno, "%s: %s", LOCK_FILE, strerror(errno));
    read_generation(&g);
    if (!g.known || memcmp(g.id, id, 16) != 0) {
        int rotate = g.known || (flags & IDENTITY_RESTORED);
        uint8_t mid[16];
        char mid_hex[33];
        const char *err;
        if (getrandom(mid, sizeof mid, 0) != (ssize_t)sizeof mid)
            fail(fd, (uint32_t)errno, "getrandom: %s", strerror(errno));
        /* Even if clones shared their random state, they differ here. */
        for (int i = 0; i < 16; i++)
            mid[i] ^= id[i];
        hex(mid, 16, mid_hex);
        if (rotate) {
            if (access(MACHINE_ID, F_OK) == 0) {
                char text[40];
                snprintf(text, sizeof text, "%s\n", mid_hex);
                if (replace_file(MACHINE_ID, text, 0444) < 0)
                    fail(fd, (uint32_t)errno, "%s: %s", MACHINE_ID, strerror(errno));
            }
            /* The DHCP client ID: the new machine ID (or, without one, as
             * random). */
            if ((err = readdress(address, mid_hex)))
                fail(fd, EIO, "eth0: %s", err);
            g.counter++;
        }
        memcpy(g.id, id, 16);
        if (publish_generation(&g) < 0)
            fail(fd, (uint32_t)errno, "%s: %s", GENERATION_FILE, strerror(errno));
    }
    close(lock);
    send_info(fd);
}

/* ------------------------------------------------------------ serving */

static void serve(int fd)
{
    static uint8_t req[MAX_PAYLOAD];
    uint8_t type;
    uint32_t len;
    struct in in;
    set_timeout(fd, REQUEST_TIMEOUT_S);
    if (read_frame(fd, &type, &len) < 0)
        _exit(1);
    set_timeout(fd, 0);
    /* The request's payload, kept while frame_buf takes the next frames. */
    memcpy(req, payload(), len);
    in = (struct in){ .p = req, .left = len };
    switch (type) {
    case T_EXEC: exec_request(fd, &in); break;
    case T_READ_FILE: read_file_request(fd, &in); break;
    case T_WRITE_FILE: write_file_request(fd, &in); break;
    case T_STAT: stat_request(fd, &in); break;
    case T_LIST: list_request(fd, &in); break;
    case T_EXPOSE: expose_request(fd, &in); break;
    case T_INFO:
        if (len)
            fail(fd, E_BAD_REQUEST, "malformed info request");
        send_info(fd);
        break;
    case T_IDENTITY: identity_request(fd, &in); break;
    default: fail(fd, E_UNSUPPORTED, "unknown request type %#x", type);
    }
}

int main(int argc, char **argv)
{
    unsigned int port = AGENT_PORT;
    struct sockaddr_vm addr = { .svm_family = AF_VSOCK, .svm_cid = VMADDR_CID_ANY };
    int lfd, active = 0;

    for (int i = 1; i < argc; i += 2) {
        if (i + 1 < argc && !strcmp(argv[i], "--port")) {
            char *end;
            unsigned long v = strtoul(argv[i + 1], &end, 10);
            if (*argv[i + 1] == 0 || *end || v == 0 || v > 0xffffffffUL) {
                fprintf(stderr, "ignition-agent: bad port '%s'\n", argv[i + 1]);
                return 2;
            }
            port = (unsigned int)v;
        } else if (i + 1 < argc && !strcmp(argv[i], "--net-tools") && argv[i + 1][0] == '/'
                   && strlen(argv[i + 1]) < PATH_MAX - 16) {
            snprintf(ip_bin, sizeof ip_bin, "%s/ip", argv[i + 1]);
            snprintf(udhcpc_bin, sizeof udhcpc_bin, "%s/udhcpc", argv[i + 1]);
            snprintf(udhcpc_script, sizeof udhcpc_script, "%s/udhcpc.script", argv[i + 1]);
        } else {
            fputs("usage: ignition-agent [--port PORT] [--net-tools /DIR]\n", stderr);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    umask(022);
    if (chdir("/") < 0 || (mkdir(STATE_DIR, 0755) < 0 && errno != EEXIST)) {
        perror("ignition-agent: " STATE_DIR);
        return 1;
    }
    addr.svm_port = port;
    lfd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(lfd, 64) < 0) {
        perror("ignition-agent: vsock");
        return 1;
    }
    for (;;) {
        struct sockaddr_vm peer;
        socklen_t plen = sizeof peer;
        pid_t pid;
        int fd = accept4(lfd, (struct sockaddr *)&peer, &plen, SOCK_CLOEXEC);
        while (waitpid(-1, NULL, WNOHANG) > 0)
            active--;
        if (fd < 0)
            continue;
        if (plen < sizeof peer || peer.svm_family != AF_VSOCK || peer.svm_cid != HOST_CID) {
            close(fd);
            continue;
        }
        if (active >= MAX_CONNECTIONS) {
            /* One at a time: no process for this, a bounded answer. */
            refuse(fd, E_BUSY, "%d requests in service", MAX_CONNECTIONS);
            close(fd);
            continue;
        }
        pid = fork();
        if (pid == 0) {
            close(lfd);
            signal(SIGPIPE, SIG_IGN);
            serve(fd);
            _exit(0);
        }
        if (pid > 0)
            active++;
        close(fd);
    }
}
