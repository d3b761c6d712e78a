/* userns.c - labs without root: a user namespace that owns its own mount
 * and network namespaces (the keeper's), and joining it.
 *
 * Inside it the caller is root over what it made: it creates network
 * namespaces (bound under a private /run), veth pairs, qdiscs and AF_PACKET
 * sockets, and returns from a lab's namespace to the keeper's network
 * namespace (never to the host's, which it could not enter again).  Both
 * calls need a single-threaded process. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <unistd.h>

#include "ethp_int.h"

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    size_t n = strlen(text);
    int rc = write(fd, text, n) == (ssize_t)n ? 0 : -errno;
    close(fd);
    return rc;
}

int ethp_userns_unshare(uint32_t uid, uint32_t gid)
{
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWNET) < 0)
        return -errno;
    char map[64];
    int rc = write_file("/proc/self/setgroups", "deny");
    if (rc)
        return rc;
    snprintf(map, sizeof(map), "0 %u 1", uid);
    if ((rc = write_file("/proc/self/uid_map", map)))
        return rc;
    snprintf(map, sizeof(map), "0 %u 1", gid);
    if ((rc = write_file("/proc/self/gid_map", map)))
        return rc;
    /* nothing mounted here reaches the host's mount namespace, and what the
     * host mounts later (where its mounts are shared) is seen here */
    if (mount("none", "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        return -errno;
    /* a /run of its own: /run/netns and /run/ethplus live here, and the
     * host's (root's labs) are out of sight */
    if (mount("ethp-run", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755") < 0)
        return -errno;
    return 0;
}

int ethp_userns_join(int pid)
{
    static const struct {
        const char *name;
        int type;
    } ns[] = {{"user", CLONE_NEWUSER}, {"mnt", CLONE_NEWNS}, {"net", CLONE_NEWNET}};
    int fds[3], rc = 0;
    char path[64];
    for (int i = 0; i < 3; i++) {
        snprintf(path, sizeof(path), "/proc/%d/ns/%s", pid, ns[i].name);
        fds[i] = open(path, O_RDONLY | O_CLOEXEC);
        if (fds[i] < 0) {
            rc = -errno;
            while (i--)
                close(fds[i]);
            return rc;
        }
    }
    for (int i = 0; i < 3 && !rc; i++)
        if (setns(fds[i], ns[i].type) < 0)
            rc = -errno;
    for (int i = 0; i < 3; i++)
        close(fds[i]);
    if (!rc && chdir("/") < 0)
        rc = -errno;
    return rc;
}
