"""How the sandbox's processes confine themselves: rlimits, the allow-list seccomp filter,
Landlock (the fallback layer), no new privileges, death with the parent.

Standard library plus `pyseccomp` only: the server (server.py) imports it from its own
folder inside the sandbox. Every function takes the server's LIMITS (the JSON config the
layer wrote: memory_bytes, file_bytes, nproc, landlock, private_tmp, ...).
"""
import ctypes
import errno
import os
import resource
import signal
import socket
import struct


def libc():
    return ctypes.CDLL(None, use_errno=True)


def rlimits(limits, address_space=True):
    for name, value in (("RLIMIT_CORE", 0), ("RLIMIT_FSIZE", limits["file_bytes"]),
                        ("RLIMIT_NOFILE", 64), ("RLIMIT_NPROC", limits["nproc"]),
                        ("RLIMIT_RTPRIO", 0), ("RLIMIT_NICE", 0), ("RLIMIT_MEMLOCK", 0),
                        ("RLIMIT_MSGQUEUE", 0)):
        try:
            soft, hard = resource.getrlimit(getattr(resource, name))
            value = value if hard == resource.RLIM_INFINITY else min(value, hard)
            resource.setrlimit(getattr(resource, name), (value, value))
        except (ValueError, OSError):
            pass
    if address_space:
        resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"],) * 2)


# ---------------------------------------------------------------- the allow-list filter

# What Python, its standard library and the scientific packages need to compute, and
# nothing that reaches outside the process: no exec, fork, ptrace, mount, namespaces,
# keyrings, BPF, perf, io_uring, chmod/chown, clock or reboot. Measured with strace over
# importing and using numpy, scipy, pandas, scikit-learn, sympy, nltk and threads.
ALLOWED = (
    "read", "write", "readv", "writev", "pread64", "pwrite64", "preadv", "pwritev",
    "open", "openat", "close", "close_range", "creat", "stat", "fstat", "lstat", "newfstatat",
    "statx", "statfs", "fstatfs", "access", "faccessat", "faccessat2", "lseek", "getdents64",
    "getcwd", "chdir", "fchdir", "readlink", "readlinkat", "mkdir", "mkdirat", "rmdir",
    "unlink", "unlinkat", "rename", "renameat", "renameat2", "link", "linkat", "symlink",
    "symlinkat", "umask", "truncate", "ftruncate", "fallocate", "fsync", "fdatasync",
    "fadvise64", "flock", "dup", "dup2", "dup3", "fcntl", "pipe", "pipe2", "sendfile",
    "copy_file_range", "getxattr", "lgetxattr", "fgetxattr", "listxattr", "llistxattr",
    "flistxattr",
    "mmap", "munmap", "mprotect", "mremap", "madvise", "brk", "mincore", "msync",
    "membarrier", "mbind", "get_mempolicy",
    "poll", "ppoll", "select", "pselect6", "epoll_create", "epoll_create1", "epoll_ctl",
    "epoll_wait", "epoll_pwait", "epoll_pwait2", "eventfd", "eventfd2",
    "futex", "futex_waitv", "set_robust_list", "get_robust_list", "set_tid_address", "rseq",
    "sched_yield", "sched_get_priority_max", "sched_get_priority_min", "getcpu",
    "rt_sigaction", "rt_sigprocmask", "rt_sigreturn", "rt_sigpending", "rt_sigtimedwait",
    "rt_sigsuspend", "sigaltstack", "pause", "restart_syscall",
    "alarm", "getitimer", "setitimer", "timer_create", "timer_settime", "timer_gettime",
    "timer_getoverrun", "timer_delete", "timerfd_create", "timerfd_settime", "timerfd_gettime",
    "nanosleep", "clock_nanosleep", "clock_gettime", "clock_getres", "gettimeofday", "time",
    "getpid", "getppid", "gettid", "getuid", "geteuid", "getgid", "getegid", "getgroups",
    "getresuid", "getresgid", "getpgrp", "capget", "getrusage", "times", "sysinfo", "uname",
    "getrlimit", "setrlimit", "getrandom", "arch_prctl", "exit", "exit_group", "wait4",
    "waitid",
    # Sockets: the socket() rule below decides which families exist at all.
    "connect", "bind", "listen", "accept", "accept4", "sendto", "recvfrom", "sendmsg",
    "recvmsg", "sendmmsg", "recvmmsg", "shutdown", "getsockname", "getpeername",
    "setsockopt", "getsockopt",
)
IOCTLS = (0x5401, 0x5413, 0x541B, 0x5421, 0x5450, 0x5451)  # TCGETS TIOCGWINSZ FIONREAD
#                                                             FIONBIO FIONCLEX FIOCLEX
PRCTLS = (3, 15, 16, 23, 0x53564D41)  # GET_DUMPABLE SET_NAME GET_NAME CAPBSET_READ SET_VMA


def lock_down(limits):
    """Install the allow-list filter: anything not named fails with EPERM. Calls that name a
    process (kill, prlimit, priority, scheduling, process groups) may name this one alone,
    which also stands in for a pid namespace in the fallback layer."""
    import pyseccomp as sc

    pid = os.getpid()
    allow = sc.ALLOW
    f = sc.SyscallFilter(defaction=sc.ERRNO(errno.EPERM))

    def rule(action, name, *args):
        try:
            f.add_rule(action, name, *args)
        except (ValueError, RuntimeError, OSError):  # not a syscall on this architecture
            pass

    for name in ALLOWED:
        rule(allow, name)
    # Signals to this process only (kill's 0 is the whole process group: the server too).
    rule(allow, "kill", sc.Arg(0, sc.EQ, pid))
    rule(allow, "tgkill", sc.Arg(0, sc.EQ, pid))
    for arg in (0, pid):  # 0 is the caller here
        for name in ("prlimit64", "sched_getaffinity", "sched_getparam",
                     "sched_getscheduler", "getpgid", "getsid"):
            rule(allow, name, sc.Arg(0, sc.EQ, arg))
        rule(allow, "getpriority", sc.Arg(0, sc.EQ, 0), sc.Arg(1, sc.EQ, arg))
        rule(allow, "setpriority", sc.Arg(0, sc.EQ, 0), sc.Arg(1, sc.EQ, arg))
    for cmd in IOCTLS:
        rule(allow, "ioctl", sc.Arg(1, sc.EQ, cmd))
    for option in PRCTLS:
        rule(allow, "prctl", sc.Arg(0, sc.EQ, option))
    # Threads only: clone with CLONE_THREAD (0x10000); clone3 hides its flags in memory,
    # where seccomp cannot look, so ENOSYS makes libc fall back to clone.
    rule(allow, "clone", sc.Arg(0, sc.MASKED_EQ, 0x10000, 0x10000))
    rule(sc.ERRNO(errno.ENOSYS), "clone3")
    if limits.get("private_tmp"):
        # bubblewrap's private network namespace: Unix sockets reach only this sandbox.
        # Elsewhere no socket at all (one on the host's filesystem could reach a database).
        rule(allow, "socket", sc.Arg(0, sc.EQ, socket.AF_UNIX))
        rule(allow, "socketpair", sc.Arg(0, sc.EQ, socket.AF_UNIX))
    f.load()


# ---------------------------------------------------------------- the server's own setup

def landlock(read_paths):
    """The fallback layer's filesystem and network bounds (Linux Landlock, unprivileged).

    Read and execute only under `read_paths` (the Python installation and libraries) and
    read/write on /dev/null; nothing is writable (the output file was opened before). ABI 4+
    also forbids TCP bind/connect, ABI 6+ signals and abstract sockets outside the domain.
    """
    lib = libc()
    abi = lib.syscall(444, None, 0, 1)  # landlock_create_ruleset(NULL, 0, VERSION)
    if abi < 1:
        raise OSError(ctypes.get_errno(), "Landlock is not available")
    fs = (1 << {1: 13, 2: 14, 3: 15, 4: 15}.get(abi, 16)) - 1
    attr = struct.pack("QQQ", fs, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    ruleset = lib.syscall(444, ctypes.c_char_p(attr[:size]), size, 0)
    if ruleset < 0:
        raise OSError(ctypes.get_errno(), "landlock_create_ruleset failed")
    read, file_only = 1 | 4 | 8, 1 | 2 | 4 | (1 << 14) | (1 << 15)
    rules = [(p, read) for p in read_paths] + [(os.devnull, 2 | 4)]
    for path, access in rules:
        fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        if not os.path.isdir(path):
            access &= file_only
        rule = struct.pack("=Qi", access & fs, fd)
        if lib.syscall(445, ruleset, 1, ctypes.c_char_p(rule), 0) < 0:
            raise OSError(ctypes.get_errno(), f"landlock_add_rule failed for {path}")
        os.close(fd)
    if lib.syscall(446, ruleset, 0) < 0:
        raise OSError(ctypes.get_errno(), "landlock_restrict_self failed")
    os.close(ruleset)


def die_with(parent):
    """SIGKILL when the parent goes (PR_SET_PDEATHSIG), and exit if `parent` (when known)
    already went before that was set."""
    libc().prctl(1, signal.SIGKILL, 0, 0, 0)
    if parent is not None and os.getppid() != parent:
        os._exit(0)


def no_new_privileges_and_not_dumpable():
    lib = libc()
    lib.prctl(38, 1, 0, 0, 0)  # PR_SET_NO_NEW_PRIVS
    lib.prctl(4, 0, 0, 0, 0)   # PR_SET_DUMPABLE = 0
