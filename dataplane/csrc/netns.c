/* netns.c - network namespaces and per-interface settings without forking.
 * setns() changes only the calling thread, so every function here enters a
 * namespace, does its work, and returns to where the thread was. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/ethtool.h>
#include <linux/sockios.h>
#include <net/if.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ethp_int.h"

int ethp_netns_enter(const char *path, int *saved)
{
    *saved = -1;
    if (!path)
        return 0;
    int target = open(path, O_RDONLY | O_CLOEXEC);
    if (target < 0)
        return -errno;
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0) {
        int e = -errno;
        close(target);
        return e;
    }
    if (setns(target, CLONE_NEWNET) < 0) {
        int e = -errno;
        close(target);
        close(self);
        return e;
    }
    close(target);
    *saved = self;
    return 0;
}

void ethp_netns_leave(int saved)
{
    if (saved < 0)
        return;
    /* Cannot fail for a namespace fd we opened ourselves; if it ever did, the
     * thread would be stranded in a lab namespace, which is worse than dying. */
    if (setns(saved, CLONE_NEWNET) < 0)
        abort();
    close(saved);
}

int ethp_netns_rundir_init(const char *dir)
{
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return -errno;
    /* As iproute2: make dir a shared mount so that a namespace bound in it is
     * visible (and its unmount propagates) in every mount namespace. */
    if (mount("", dir, "none", MS_SHARED | MS_REC, NULL) == 0)
        return 0;
    if (errno != EINVAL)
        return -errno;
    if (mount(dir, dir, "none", MS_BIND | MS_REC, NULL) < 0)
        return -errno;
    if (mount("", dir, "none", MS_SHARED | MS_REC, NULL) < 0)
        return -errno;
    return 0;
}

int ethp_netns_create(const char *path)
{
    int fd = open(path, O_RDONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    close(fd);
    int self = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (self < 0)
        goto fail;
    if (unshare(CLONE_NEWNET) < 0) {
        close(self);
        goto fail;
    }
    int rc = 0;
    if (mount("/proc/thread-self/ns/net", path, "none", MS_BIND, NULL) < 0)
        rc = -errno;
    ethp_netns_leave(self);
    if (rc) {
        unlink(path);
        return rc;
    }
    return 0;
fail:;
    int e = -errno;
    unlink(path);
    return e;
}

int ethp_netns_delete(const char *path)
{
    int rc = 0;
    if (umount2(path, MNT_DETACH) < 0 && errno != EINVAL && errno != ENOENT)
        rc = -errno;
    if (unlink(path) < 0 && errno != ENOENT && !rc)
        rc = -errno;
    return rc;
}

int ethp_netns_socket(const char *path, int domain, int type, int protocol)
{
    int saved, rc = ethp_netns_enter(path, &saved);
    if (rc)
        return rc;
    int fd = socket(domain, type | SOCK_CLOEXEC, protocol);
    if (fd < 0)
        rc = -errno;
    ethp_netns_leave(saved);
    return fd < 0 ? rc : fd;
}

int ethp_if_offloads_off(int sock, const char *ifname)
{
    /* TSO needs SG and checksum offload, so switch the dependants off first. */
    static const uint32_t cmds[] = {
        ETHTOOL_STSO, ETHTOOL_SGSO, ETHTOOL_SGRO,
        ETHTOOL_SSG, ETHTOOL_STXCSUM, ETHTOOL_SRXCSUM,
    };
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    if (strlen(ifname) >= IFNAMSIZ)
        return -ENAMETOOLONG;
    strcpy(ifr.ifr_name, ifname);
    for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
        struct ethtool_value v = {.cmd = cmds[i], .data = 0};
        ifr.ifr_data = (void *)&v;
        if (ioctl(sock, SIOCETHTOOL, &ifr) < 0 && errno != EOPNOTSUPP)
            return -errno;
    }
    return 0;
}
