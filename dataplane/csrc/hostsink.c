/* hostsink.c - a tc ingress program for lab hosts' interfaces that drops
 * IPv4/UDP frames to the NIC's ports (ETH+ over UDP, emulated RoCEv2) once
 * the AF_PACKET taps (the NIC's ring) have their copy, before the host's IP
 * stack would look up a route and a socket for each only to drop it.
 * Written as eBPF instructions: no compiler or libbpf needed at run time. */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/bpf.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "ethp_int.h"

#define I(code_, dst_, src_, off_, imm_)                                                       \
    ((struct bpf_insn){.code = (code_), .dst_reg = (dst_), .src_reg = (src_), .off = (off_),   \
                       .imm = (imm_)})
#define LD_ABS(size, at) I(BPF_LD | BPF_ABS | (size), 0, 0, 0, (at))
#define JNE(v, to) I(BPF_JMP | BPF_JNE | BPF_K, BPF_REG_0, 0, (to), (v))
#define JEQ(v, to) I(BPF_JMP | BPF_JEQ | BPF_K, BPF_REG_0, 0, (to), (v))
#define ALU(op, v) I(BPF_ALU64 | (op) | BPF_K, BPF_REG_0, 0, 0, (v))
#define RET(v) I(BPF_ALU64 | BPF_MOV | BPF_K, BPF_REG_0, 0, 0, (v)), I(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)

enum { TC_OK = 0, TC_SHOT = 2 }; /* TC_ACT_OK, TC_ACT_SHOT */

int ethp_hostsink_load(uint16_t port_a, uint16_t port_b)
{
    /* Offsets from the Ethernet header (cls_bpf pushes it back at ingress).
     * Jump offsets count instructions after the jump; PASS is at 15. */
    struct bpf_insn prog[] = {
        I(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_6, BPF_REG_1, 0, 0), /* 0: r6 = skb */
        LD_ABS(BPF_H, 12),                                         /* 1: EtherType */
        JNE(ETHP_ETHERTYPE_IPV4, 12),                              /* 2 */
        LD_ABS(BPF_B, 23),                                         /* 3: IP protocol */
        JNE(17, 10),                                               /* 4: not UDP */
        LD_ABS(BPF_H, 20),                                         /* 5: flags, offset */
        ALU(BPF_AND, 0x1fff),                                      /* 6 */
        JNE(0, 7),                                                 /* 7: a later fragment */
        LD_ABS(BPF_B, 14),                                         /* 8: version, IHL */
        ALU(BPF_AND, 0x0f),                                        /* 9 */
        ALU(BPF_LSH, 2),                                           /* 10: header bytes */
        I(BPF_ALU64 | BPF_MOV | BPF_X, BPF_REG_7, BPF_REG_0, 0, 0), /* 11: r7 = that */
        I(BPF_LD | BPF_IND | BPF_H, 0, BPF_REG_7, 0, 16),           /* 12: UDP dst port */
        JEQ(port_a, 3),                                            /* 13 -> DROP */
        JEQ(port_b, 2),                                            /* 14 -> DROP */
        RET(TC_OK),                                                /* 15, 16: PASS */
        RET(TC_SHOT),                                              /* 17, 18: DROP */
    };
    static const char license[] = "GPL";
    union bpf_attr a;
    memset(&a, 0, sizeof(a));
    a.prog_type = BPF_PROG_TYPE_SCHED_CLS;
    a.insn_cnt = sizeof(prog) / sizeof(prog[0]);
    a.insns = (uint64_t)(uintptr_t)prog;
    a.license = (uint64_t)(uintptr_t)license;
    memcpy(a.prog_name, "ethp_hostsink", sizeof("ethp_hostsink"));
    int fd = (int)syscall(SYS_bpf, BPF_PROG_LOAD, &a, sizeof(a));
    return fd < 0 ? -errno : fd;
}
