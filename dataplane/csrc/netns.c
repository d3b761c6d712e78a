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

int ethp_netns_ifindex(const char *path, const char *ifname)
{
    int saved, rc = ethp_netns_enter(path, &saved);
    if (rc)
        return rc;
    unsigned idx = if_nametoindex(ifname);
    rc = idx ? (int)idx : -errno;
    ethp_netns_leave(saved);
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

/* Is a feature (by its ethtool name) one of the offloads a lab turns off?
 * Everything on the transmit side (checksum, scatter-gather, every kind of
 * segmentation) and receive aggregation or checksum. */
static int offload_feature(const char *name)
{
    static const char *const prefixes[] = {
        "tx-checksum", "tx-scatter-gather", "tx-generic-segmentation",
        "tx-tcp", "tx-udp", "tx-gso", "tx-gre", "tx-ipxip", "tx-sctp",
        "tx-esp", "tx-tunnel", "tx-nocache-copy",
        "rx-gro", "rx-lro", "rx-checksum", "rx-udp-gro",
    };
    for (size_t i = 0; i < sizeof(prefixes) / sizeof(prefixes[0]); i++)
        if (strncmp(name, prefixes[i], strlen(prefixes[i])) == 0)
            return 1;
    return 0;
}

static int ethtool_ioctl(int sock, const char *ifname, void *data)
{
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    strcpy(ifr.ifr_name, ifname);
    ifr.ifr_data = data;
    return ioctl(sock, SIOCETHTOOL, &ifr) < 0 ? -errno : 0;
}

int ethp_if_offloads_off(int sock, const char *ifname)
{
    if (strlen(ifname) >= IFNAMSIZ)
        return -ENAMETOOLONG;
    struct {
        struct ethtool_sset_info hdr;
        uint32_t len;
    } info = {.hdr = {.cmd = ETHTOOL_GSSET_INFO, .sset_mask = 1ull << ETH_SS_FEATURES}};
    int rc = ethtool_ioctl(sock, ifname, &info);
    if (rc)
        return rc;
    uint32_t n = info.hdr.sset_mask ? info.len : 0;
    if (!n)
        return -EOPNOTSUPP;
    uint32_t words = (n + 31) / 32;
    struct ethtool_gstrings *names = calloc(1, sizeof(*names) + (size_t)n * ETH_GSTRING_LEN);
    struct ethtool_sfeatures *set =
        calloc(1, sizeof(*set) + words * sizeof(struct ethtool_set_features_block));
    if (!names || !set) {
        rc = -ENOMEM;
        goto out;
    }
    names->cmd = ETHTOOL_GSTRINGS;
    names->string_set = ETH_SS_FEATURES;
    names->len = n;
    if ((rc = ethtool_ioctl(sock, ifname, names)))
        goto out;
    set->cmd = ETHTOOL_SFEATURES;
    set->size = words;
    for (uint32_t i = 0; i < n; i++) {
        char name[ETH_GSTRING_LEN + 1];
        memcpy(name, names->data + (size_t)i * ETH_GSTRING_LEN, ETH_GSTRING_LEN);
        name[ETH_GSTRING_LEN] = 0;
        if (offload_feature(name))
            set->features[i / 32].valid |= 1u << (i % 32); /* requested bit stays 0 */
    }
    /* A positive result only flags features that are fixed on this device. */
    rc = ethtool_ioctl(sock, ifname, set);
out:
    free(names);
    free(set);
    return rc;
}

int ethp_netns_sysctl(const char *path, const char *key, const char *value)
{
    char file[256];
    if (snprintf(file, sizeof(file), "/proc/sys/%s", key) >= (int)sizeof(file))
        return -ENAMETOOLONG;
    int saved, rc = ethp_netns_enter(path, &saved);
    if (rc)
        return rc;
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
    } else {
        size_t n = strlen(value);
        if (write(fd, value, n) != (ssize_t)n)
            rc = -errno;
        close(fd);
    }
    ethp_netns_leave(saved);
    return rc;
}

int ethp_netns_proc_net(const char *path, const char *name, char *buf, int cap)
{
    char file[256];
    if (cap < 1 || strchr(name, '/') || !name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
        return -EINVAL;
    if (snprintf(file, sizeof(file), "/proc/thread-self/net/%s", name) >= (int)sizeof(file))
        return -ENAMETOOLONG;
    int saved, rc = ethp_netns_enter(path, &saved);
    if (rc)
        return rc;
    int fd = open(file, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        rc = -errno;
    } else {
        int got = 0;
        while (got < cap) {
            ssize_t n = read(fd, buf + got, (size_t)(cap - got));
            if (n < 0 && errno == EINTR)
                continue;
            if (n <= 0) {
                rc = n < 0 ? -errno : 0;
                break;
            }
            got += (int)n;
        }
        close(fd);
        if (!rc)
            rc = got;
    }
    ethp_netns_leave(saved);
    return rc;
}

int ethp_netns_move_thread(const char *path)
{
    int saved, rc = ethp_netns_enter(path, &saved);
    if (saved >= 0)
        close(saved); /* for good: nothing to go back to */
    return rc;
}

int ethp_netns_join(const char *path)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = setns(fd, CLONE_NEWNET) < 0 ? -errno : 0;
    close(fd);
    if (rc)
        return rc;
    /* A /sys that lists this namespace's interfaces, as `ip netns exec`. */
    if (unshare(CLONE_NEWNS) < 0)
        return -errno;
    if (mount("", "/", "none", MS_SLAVE | MS_REC, NULL) < 0)
        return -errno;
    umount2("/sys", MNT_DETACH);
    if (mount("sysfs", "/sys", "sysfs", 0, NULL) < 0)
        return -errno;
    return 0;
}
