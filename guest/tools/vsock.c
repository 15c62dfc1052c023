/* vsock: a small AF_VSOCK tool for the Ignition guest.
 *
 *   vsock cid                    print this VM's CID
 *   vsock connect CID PORT       connect; copy stdin to the connection and
 *                                the connection to stdout (stdin's end shuts
 *                                the sending side down; the peer's end exits)
 *   vsock echo-server PORT       accept connections on PORT and echo each
 *                                back until its peer stops sending (one
 *                                process per connection)
 *   vsock sink PORT              accept one connection, read it to its end,
 *                                reply with the byte count ("N\n"), exit
 *
 * Exit status: 0 on success, 1 on an error (printed), 2 on bad usage.
 */
#include <errno.h>
#include <sys/socket.h>
#include <linux/vm_sockets.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <fcntl.h>
#include <unistd.h>

#define BUF_SIZE (64 * 1024)

static void die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("vsock: ", stderr);
    vfprintf(stderr, fmt, ap);
    if (errno)
        fprintf(stderr, ": %s", strerror(errno));
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void usage(void)
{
    fputs("usage: vsock cid\n"
          "       vsock connect CID PORT\n"
          "       vsock echo-server PORT\n"
          "       vsock sink PORT\n", stderr);
    exit(2);
}

static unsigned int number(const char *s, const char *what)
{
    char *end;
    unsigned long v;
    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno || *s == '\0' || *end != '\0' || v > 0xffffffffUL) {
        fprintf(stderr, "vsock: '%s' is not a %s\n", s, what);
        exit(2);
    }
    return (unsigned int)v;
}

/* Writes all of buf; returns 0, or -1 with errno. */
static int write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

static int listen_on(unsigned int port)
{
    struct sockaddr_vm addr = {
        .svm_family = AF_VSOCK,
        .svm_port = port,
        .svm_cid = VMADDR_CID_ANY,
    };
    int fd = socket(AF_VSOCK, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket(AF_VSOCK)");
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("bind to port %u", port);
    if (listen(fd, 64) < 0)
        die("listen on port %u", port);
    return fd;
}

static int accept_one(int lfd)
{
    for (;;) {
        int fd = accept(lfd, NULL, NULL);
        if (fd >= 0)
            return fd;
        if (errno != EINTR && errno != ECONNABORTED)
            die("accept");
    }
}

static int cmd_cid(void)
{
    unsigned int cid;
    int fd = open("/dev/vsock", O_RDONLY);
    if (fd < 0)
        die("open /dev/vsock");
    if (ioctl(fd, IOCTL_VM_SOCKETS_GET_LOCAL_CID, &cid) < 0)
        die("IOCTL_VM_SOCKETS_GET_LOCAL_CID");
    printf("%u\n", cid);
    return 0;
}

/* Copies stdin to the connection and the connection to stdout. The socket
 * is non-blocking and stdin is read only once the last chunk is sent, so
 * the connection is always read while data waits to be sent (a blocking
 * send could wait for a peer that waits for us to read). */
static int cmd_connect(unsigned int cid, unsigned int port)
{
    static char in_buf[BUF_SIZE], out_buf[BUF_SIZE];
    struct sockaddr_vm addr = {
        .svm_family = AF_VSOCK,
        .svm_port = port,
        .svm_cid = cid,
    };
    size_t pend_off = 0, pend_len = 0;
    int in_open = 1;
    int fd = socket(AF_VSOCK, SOCK_STREAM, 0);
    if (fd < 0)
        die("socket(AF_VSOCK)");
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0)
        die("connect to CID %u port %u", cid, port);
    if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK) < 0)
        die("fcntl");
    for (;;) {
        struct pollfd p[2] = {
            { .fd = fd, .events = POLLIN | (pend_len ? POLLOUT : 0) },
            { .fd = 0, .events = POLLIN },
        };
        int watch_in = in_open && pend_len == 0;
        ssize_t n;
        if (poll(p, watch_in ? 2 : 1, -1) < 0) {
            if (errno == EINTR)
                continue;
            die("poll");
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            n = read(fd, out_buf, sizeof out_buf);
            if (n == 0)
                return 0;
            if (n < 0 && errno != EINTR && errno != EAGAIN)
                die("reading the connection");
            if (n > 0 && write_all(1, out_buf, (size_t)n) < 0)
                die("writing stdout");
        }
        if (pend_len && (p[0].revents & POLLOUT)) {
            n = write(fd, in_buf + pend_off, pend_len);
            if (n < 0 && errno != EINTR && errno != EAGAIN)
                die("writing the connection");
            if (n > 0) {
                pend_off += (size_t)n;
                pend_len -= (size_t)n;
            }
        }
        if (watch_in && (p[1].revents & (POLLIN | POLLHUP))) {
            n = read(0, in_buf, sizeof in_buf);
            if (n < 0 && errno != EINTR)
                die("reading stdin");
            if (n == 0) {
                in_open = 0;
                if (shutdown(fd, SHUT_WR) < 0)
                    die("shutdown");
            } else if (n > 0) {
                pend_off = 0;
                pend_len = (size_t)n;
            }
        }
    }
}

/* Reads what the connection has (blocking); 0 at its end. */
static size_t read_some(int fd, char *buf, size_t len)
{
    for (;;) {
        ssize_t n = read(fd, buf, len);
        if (n >= 0)
            return (size_t)n;
        if (errno != EINTR)
            die("reading the connection");
    }
}

static void echo(int fd)
{
    static char buf[BUF_SIZE];
    for (;;) {
        size_t n = read_some(fd, buf, sizeof buf);
        if (n == 0)
            break;
        if (write_all(fd, buf, n) < 0)
            die("writing the connection");
    }
    close(fd);
}

static int cmd_echo_server(unsigned int port)
{
    int lfd = listen_on(port);
    /* Children are reaped by the kernel. */
    signal(SIGCHLD, SIG_IGN);
    for (;;) {
        int fd = accept_one(lfd);
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0) {
            close(lfd);
            echo(fd);
            _exit(0);
        }
        close(fd);
    }
}

static int cmd_sink(unsigned int port)
{
    static char buf[BUF_SIZE];
    unsigned long long total = 0;
    char line[32];
    int lfd = listen_on(port);
    int fd = accept_one(lfd);
    close(lfd);
    for (;;) {
        size_t n = read_some(fd, buf, sizeof buf);
        if (n == 0)
            break;
        total += n;
    }
    snprintf(line, sizeof line, "%llu\n", total);
    if (write_all(fd, line, strlen(line)) < 0)
        die("writing the connection");
    close(fd);
    printf("%llu\n", total);
    return 0;
}

int main(int argc, char **argv)
{
    signal(SIGPIPE, SIG_IGN);
    errno = 0;
    if (argc == 2 && strcmp(argv[1], "cid") == 0)
        return cmd_cid();
    if (argc == 4 && strcmp(argv[1], "connect") == 0)
        return cmd_connect(number(argv[2], "CID"), number(argv[3], "port"));
    if (argc == 3 && strcmp(argv[1], "echo-server") == 0)
        return cmd_echo_server(number(argv[2], "port"));
    if (argc == 3 && strcmp(argv[1], "sink") == 0)
        return cmd_sink(number(argv[2], "port"));
    usage();
    return 2;
}
