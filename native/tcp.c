/*
 * rackfeed's TCP socket options for Deno's HTTP server, which sets none and offers no option for
 * them (src/runtime/tcp-listener-deno.ts says why each matters), called through Deno.dlopen. In
 * this library rather than through libc, so that a server allowed FFI for its own library only
 * (the Docker image) has them too. Linux.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <linux/sockios.h>
#include <unistd.h>

/* TCP_NODELAY on and TCP_USER_TIMEOUT set to `user_timeout_ms`: 0, or -errno. */
int32_t rackfeed_tcp_tune(int32_t fd, int32_t user_timeout_ms) {
  int one = 1;
  unsigned int timeout = (unsigned int)user_timeout_ms;
  if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) return -errno;
  if (setsockopt(fd, IPPROTO_TCP, TCP_USER_TIMEOUT, &timeout, sizeof timeout) != 0) return -errno;
  return 0;
}

/* The value of an integer TCP option (TCP_NODELAY 1, TCP_USER_TIMEOUT 18), or -errno. */
int32_t rackfeed_tcp_option(int32_t fd, int32_t option) {
  int value = 0;
  socklen_t len = sizeof value;
  if (getsockopt(fd, IPPROTO_TCP, option, &value, &len) != 0) return -errno;
  return value;
}

/*
 * Takes a reference of its own to the socket behind `fd`, another owner's descriptor that may be
 * closed and its number reused at any moment: a duplicate, kept only if it is the socket of
 * `inode` (exact in a double). Puts how long ago the connection last sent and last received data
 * (ms, from TCP_INFO) in quiet[0] and quiet[1], and the bytes the kernel holds for it, sent and not
 * yet acknowledged or not yet sent (SIOCOUTQ), in quiet[2]. Returns the duplicate, for
 * rackfeed_tcp_release, or -1 when `fd` is no longer that socket.
 */
int32_t rackfeed_tcp_hold(int32_t fd, double inode, uint32_t *quiet) {
  int own = dup(fd);
  if (own < 0) return -1;
  struct stat st;
  struct tcp_info info;
  socklen_t len = sizeof info;
  int queued = 0;
  if (fstat(own, &st) != 0 || !S_ISSOCK(st.st_mode) || (double)st.st_ino != inode ||
      getsockopt(own, IPPROTO_TCP, TCP_INFO, &info, &len) != 0 || ioctl(own, SIOCOUTQ, &queued) != 0) {
    close(own);
    return -1;
  }
  quiet[0] = info.tcpi_last_data_sent;
  quiet[1] = info.tcpi_last_data_recv;
  quiet[2] = (uint32_t)queued;
  return own;
}

/* Shuts down both directions of the held socket when `cut` (its owner then closes it), and lets go of the hold: 0, or -errno of the shutdown. */
int32_t rackfeed_tcp_release(int32_t own, int32_t cut) {
  int32_t rc = 0;
  if (cut && shutdown(own, SHUT_RDWR) != 0) rc = -errno;
  close(own);
  return rc;
}

/* Values per row of rackfeed_tcp_list. */
#define TCP_LIST_ROW 6

/* `v4` as its IPv4-mapped IPv6 address (::ffff:a.b.c.d), so that both families compare as one. */
static struct in6_addr mapped(const struct in_addr *v4) {
  struct in6_addr a;
  memset(&a, 0, sizeof a);
  a.s6_addr[10] = 0xff;
  a.s6_addr[11] = 0xff;
  memcpy(&a.s6_addr[12], v4, 4);
  return a;
}

/*
 * Whether a socket's local address is `want` (a listener's), which is a wildcard (0.0.0.0, ::)
 * when `any`: an IPv4 address matches its IPv4-mapped IPv6 form too (a dual-stack listener).
 */
static int same_host(const struct sockaddr_storage *a, int any, const struct in6_addr *want) {
  if (any) return 1;
  struct in6_addr got = a->ss_family == AF_INET ? mapped(&((const struct sockaddr_in *)a)->sin_addr)
                                                : ((const struct sockaddr_in6 *)a)->sin6_addr;
  return memcmp(&got, want, sizeof got) == 0;
}

/*
 * Lists this process's TCP sockets whose local address is `host` (a listener's, as an IP literal;
 * a wildcard such as 0.0.0.0 or :: takes any) and whose local port is `port`, listening (state 10)
 * or established (state 1), at most `max`, as rows of six doubles: descriptor, inode, state,
 * peer's port (0 when listening), ms since data was last sent, ms since data was last received.
 * Found by the process's descriptors (/proc/self/fd, read here: no permission of the runtime's is
 * asked). A descriptor may be closed and its number reused meanwhile: rackfeed_tcp_hold checks
 * the inode. Returns the rows written, -EINVAL for a `host` that is no IP literal, or -errno when
 * the descriptors cannot be listed.
 */
int32_t rackfeed_tcp_list(const char *host, int32_t port, double *rows, int32_t max) {
  struct in6_addr want;
  struct in_addr v4;
  int any;
  if (inet_pton(AF_INET6, host, &want) == 1) {
    any = memcmp(&want, &in6addr_any, sizeof want) == 0;
  } else if (inet_pton(AF_INET, host, &v4) == 1) {
    any = v4.s_addr == htonl(INADDR_ANY);
    want = mapped(&v4);
  } else {
    return -EINVAL;
  }
  DIR *dir = opendir("/proc/self/fd");
  if (!dir) return -errno;
  int own = dirfd(dir);
  int32_t n = 0;
  struct dirent *e;
  while (n < max && (e = readdir(dir)) != NULL) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    int fd = atoi(e->d_name);
    if (fd == own) continue;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    struct sockaddr_storage addr;
    socklen_t alen = sizeof addr;
    if (getsockname(fd, (struct sockaddr *)&addr, &alen) != 0) continue;
    int local;
    if (addr.ss_family == AF_INET) local = ntohs(((struct sockaddr_in *)&addr)->sin_port);
    else if (addr.ss_family == AF_INET6) local = ntohs(((struct sockaddr_in6 *)&addr)->sin6_port);
    else continue;
    if (local != port || !same_host(&addr, any, &want)) continue;
    struct tcp_info info;
    socklen_t ilen = sizeof info;
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &info, &ilen) != 0) continue;
    if (info.tcpi_state != 1 && info.tcpi_state != 10) continue;
    int peer = 0;
    if (info.tcpi_state == 1) {
      struct sockaddr_storage p;
      socklen_t plen = sizeof p;
      if (getpeername(fd, (struct sockaddr *)&p, &plen) != 0) continue;
      peer = p.ss_family == AF_INET ? ntohs(((struct sockaddr_in *)&p)->sin_port) : ntohs(((struct sockaddr_in6 *)&p)->sin6_port);
    }
    double *row = rows + (size_t)n * TCP_LIST_ROW;
    row[0] = fd;
    row[1] = (double)st.st_ino;
    row[2] = info.tcpi_state;
    row[3] = peer;
    row[4] = info.tcpi_last_data_sent;
    row[5] = info.tcpi_last_data_recv;
    n++;
  }
  closedir(dir);
  return n;
}
