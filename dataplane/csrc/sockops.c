/* sockops.c - the SYN retransmit timeout of kernel TCP in a lab.
 *
 * Linux sends a SYN, or a SYN-ACK, again after a fixed second of real time
 * (TCP_TIMEOUT_INIT), whatever the time scale: once a lab's handshake takes
 * longer than that in real time, every SYN goes out again, and again.  Only
 * a BPF sock_ops program can give a connection another initial timeout; it
 * runs for the sockets made by the processes of the cgroup it is attached
 * to (a listener's, for the connections it accepts).  The program here
 * answers BPF_SOCK_OPS_TIMEOUT_INIT with the largest int, which the kernel
 * cuts to its largest RTO (120 s unless a socket set TCP_RTO_MAX_MS): a
 * handshake's timeout then dilates with k as far as the kernel lets any RTO. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/bpf.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ethp_int.h"

static long bpf_call(int cmd, union bpf_attr *attr)
{
    return syscall(__NR_bpf, cmd, attr, sizeof(*attr));
}

#define PROG_NAME "ethp_syn_rto"

#define INSN(c, d, s, o, i) ((struct bpf_insn){.code = (c), .dst_reg = (d), .src_reg = (s), .off = (o), .imm = (i)})

int ethp_sockops_syn_rto_max(const char *cgroup_dir)
{
    const struct bpf_insn prog[] = {
        /* r2 = ctx->op */
        INSN(BPF_LDX | BPF_MEM | BPF_W, BPF_REG_2, BPF_REG_1, offsetof(struct bpf_sock_ops, op), 0),
        /* if r2 != TIMEOUT_INIT goto out */
        INSN(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_2, 0, 2, BPF_SOCK_OPS_TIMEOUT_INIT),
        /* ctx->reply = INT32_MAX (the kernel takes the smaller of it and its largest RTO) */
        INSN(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_3, 0, 0, INT32_MAX),
        INSN(BPF_STX | BPF_MEM | BPF_W, BPF_REG_1, BPF_REG_3, offsetof(struct bpf_sock_ops, reply), 0),
        /* out: return 1 */
        INSN(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, 1),
        INSN(BPF_JMP | BPF_EXIT, 0, 0, 0, 0),
    };
    static const char license[] = "GPL";
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.prog_type = BPF_PROG_TYPE_SOCK_OPS;
    attr.insn_cnt = sizeof(prog) / sizeof(prog[0]);
    attr.insns = (uint64_t)(uintptr_t)prog;
    attr.license = (uint64_t)(uintptr_t)license;
    strncpy(attr.prog_name, PROG_NAME, sizeof(attr.prog_name) - 1);
    int prog_fd = (int)bpf_call(BPF_PROG_LOAD, &attr);
    if (prog_fd < 0)
        return -errno;
    int cg_fd = open(cgroup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cg_fd < 0) {
        int e = -errno;
        close(prog_fd);
        return e;
    }
    memset(&attr, 0, sizeof(attr));
    attr.target_fd = (uint32_t)cg_fd;
    attr.attach_bpf_fd = (uint32_t)prog_fd;
    attr.attach_type = BPF_CGROUP_SOCK_OPS;
    int rc = bpf_call(BPF_PROG_ATTACH, &attr) < 0 ? -errno : 0;
    close(cg_fd);
    close(prog_fd); /* the cgroup holds the program while it is attached */
    return rc;
}

int ethp_sockops_is_ours(const char *cgroup_dir)
{
    int cg_fd = open(cgroup_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cg_fd < 0)
        return -errno;
    uint32_t ids[8];
    union bpf_attr attr;
    memset(&attr, 0, sizeof(attr));
    attr.query.target_fd = (uint32_t)cg_fd;
    attr.query.attach_type = BPF_CGROUP_SOCK_OPS;
    attr.query.prog_ids = (uint64_t)(uintptr_t)ids;
    attr.query.prog_cnt = sizeof(ids) / sizeof(ids[0]);
    long rc = bpf_call(BPF_PROG_QUERY, &attr);
    int e = rc < 0 ? -errno : 0;
    close(cg_fd);
    if (e)
        return e;
    uint32_t n = attr.query.prog_cnt < 8 ? attr.query.prog_cnt : 8;
    int ours = 0;
    for (uint32_t i = 0; i < n && !ours; i++) {
        memset(&attr, 0, sizeof(attr));
        attr.prog_id = ids[i];
        int fd = (int)bpf_call(BPF_PROG_GET_FD_BY_ID, &attr);
        if (fd < 0)
            continue;
        struct bpf_prog_info info;
        memset(&info, 0, sizeof(info));
        memset(&attr, 0, sizeof(attr));
        attr.info.bpf_fd = (uint32_t)fd;
        attr.info.info_len = sizeof(info);
        attr.info.info = (uint64_t)(uintptr_t)&info;
        if (bpf_call(BPF_OBJ_GET_INFO_BY_FD, &attr) == 0)
            ours = info.type == BPF_PROG_TYPE_SOCK_OPS && strcmp(info.name, PROG_NAME) == 0;
        close(fd);
    }
    return ours;
}
