/* LD_PRELOAD shim for bench/vendor_probe.py: this process (and the threads it starts) see an AMD CPUID on an
   Intel host, so MKL takes the dispatch it takes on AMD, at native speed.
   CPUID faulting (arch_prctl ARCH_SET_CPUID; the cpuid_fault flag) turns every CPUID instruction into SIGSEGV;
   the handler runs the real CPUID and rewrites the vendor string (leaves 0 and 0x80000000), leaf 1's
   family/model (CPUID_SHIM_LEAF1_EAX, default A00F11h: family 19h) and any register CPUID_SHIM_SET names
   ("leaf.sub.reg=hex,...", leaf in hex, sub -1 for any, reg a/b/c/d). CPUID_SHIM_LOG=<file> logs every
   answered leaf. The program's own SIGSEGV handler (Python's faulthandler) is kept and called for real faults.
   Build: gcc -O2 -shared -fPIC -o cpuid_amd.so cpuid_amd.c -ldl */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>
#include <fcntl.h>
#define ARCH_GET_CPUID 0x1011
#define ARCH_SET_CPUID 0x1012

static struct sigaction user_segv; /* whatever the program installs for SIGSEGV */
static int (*real_sigaction)(int, const struct sigaction *, struct sigaction *);
static uint32_t leaf1_eax = 0x00A00F11; /* family 19h model 11h stepping 1: EPYC Genoa (Zen 4) */

static void cpuid_real(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 1);
    __asm__ volatile("cpuid" : "=a"(r[0]), "=b"(r[1]), "=c"(r[2]), "=d"(r[3]) : "a"(leaf), "c"(sub));
    syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0);
}

struct ovr { uint32_t leaf; int64_t sub; int reg; uint32_t val; };
static struct ovr ovrs[32]; static int n_ovr = 0;
static void patch(uint32_t leaf, uint32_t sub, uint32_t r[4]) {
    for (int k = 0; k < n_ovr; k++)
        ;
    if (leaf == 0 || leaf == 0x80000000u) {
        r[1] = 0x68747541; r[3] = 0x69746e65; r[2] = 0x444d4163; /* "AuthenticAMD" */
    } else if (leaf == 1) {
        r[0] = leaf1_eax;
    }
    for (int k = 0; k < n_ovr; k++)
        if (ovrs[k].leaf == leaf && (ovrs[k].sub < 0 || ovrs[k].sub == (int64_t)sub)) r[ovrs[k].reg] = ovrs[k].val;
}

static int log_fd = -1;
static void log_leaf(uint32_t leaf, uint32_t sub, const uint32_t r[4]) {
    if (log_fd < 0) return;
    char buf[96]; int n = 0; const char *hx = "0123456789abcdef";
    uint32_t vals[6] = {leaf, sub, r[0], r[1], r[2], r[3]};
    for (int k = 0; k < 6; k++) { for (int s = 28; s >= 0; s -= 4) buf[n++] = hx[(vals[k] >> s) & 15]; buf[n++] = k == 5 ? '\n' : ' '; }
    write(log_fd, buf, n);
}
static void on_segv(int sig, siginfo_t *si, void *vctx) {
    ucontext_t *uc = vctx;
    greg_t *g = uc->uc_mcontext.gregs;
    const unsigned char *ip = (const unsigned char *)g[REG_RIP];
    if (si->si_code == SI_KERNEL && ip[0] == 0x0f && ip[1] == 0xa2) {
        uint32_t r[4];
        uint32_t leaf = (uint32_t)g[REG_RAX], sub = (uint32_t)g[REG_RCX];
        cpuid_real(leaf, sub, r);
        patch(leaf, sub, r);
        log_leaf(leaf, sub, r);
        g[REG_RAX] = r[0]; g[REG_RBX] = r[1]; g[REG_RCX] = r[2]; g[REG_RDX] = r[3];
        g[REG_RIP] += 2;
        return;
    }
    if ((user_segv.sa_flags & SA_SIGINFO) && user_segv.sa_sigaction) { user_segv.sa_sigaction(sig, si, vctx); return; }
    if (user_segv.sa_handler != SIG_DFL && user_segv.sa_handler != SIG_IGN && user_segv.sa_handler) { user_segv.sa_handler(sig); return; }
    struct sigaction dfl; memset(&dfl, 0, sizeof dfl); dfl.sa_handler = SIG_DFL;
    real_sigaction(SIGSEGV, &dfl, NULL); /* re-executes the fault with the default action */
}

int sigaction(int sig, const struct sigaction *act, struct sigaction *old) {
    if (!real_sigaction) real_sigaction = dlsym(RTLD_NEXT, "sigaction");
    if (sig != SIGSEGV) return real_sigaction(sig, act, old);
    if (old) *old = user_segv;
    if (act) user_segv = *act;
    return 0;
}

__attribute__((constructor)) static void init(void) {
    real_sigaction = dlsym(RTLD_NEXT, "sigaction");
    const char *f = getenv("CPUID_SHIM_LEAF1_EAX");
    const char *lg = getenv("CPUID_SHIM_LOG");
    if (lg) log_fd = open(lg, 01|0100|02000, 0644);
    const char *ov = getenv("CPUID_SHIM_SET"); /* leaf.sub.reg=val,... (sub -1: any; reg a b c d) */
    while (ov && *ov && n_ovr < 32) {
        char *end; struct ovr o;
        o.leaf = strtoul(ov, &end, 16); ov = end + 1;
        o.sub = strtol(ov, &end, 10); ov = end + 1;
        o.reg = *ov - 'a'; ov += 2;
        o.val = strtoul(ov, &end, 16); ov = end; if (*ov == ',') ov++;
        ovrs[n_ovr++] = o;
    }
    if (f) leaf1_eax = (uint32_t)strtoul(f, NULL, 0);
    struct sigaction sa; memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv; sa.sa_flags = SA_SIGINFO | SA_NODEFER; sigemptyset(&sa.sa_mask);
    real_sigaction(SIGSEGV, &sa, NULL);
    if (syscall(SYS_arch_prctl, ARCH_SET_CPUID, 0) != 0) { static const char m[] = "cpuid shim: no CPUID faulting\n"; write(2, m, sizeof m - 1); _exit(97); }
}
