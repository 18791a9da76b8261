//! The long texts of `--help`.

pub(super) const ABOUT: &str =
    "Find the call stacks that hold growing memory in a running process, with eBPF.";

pub(super) const LONG_ABOUT: &str = "\
Find the call stacks that hold growing memory in a running process, with eBPF.

tracer attaches uprobes to the allocator functions (malloc, calloc, realloc, \
reallocarray, free, posix_memalign, aligned_alloc, memalign, valloc, pvalloc) \
of a process that is already running, keeps the outstanding bytes of every \
call stack in the kernel, and reports the stacks that hold the most memory \
and how fast it grows. A --pid target is never restarted, stopped or written to. \
What the probes add to the targets' CPU (the report's cost line) is counted by \
tracer's programs themselves: the kernel's eBPF run-time stats \
(kernel.bpf_stats_enabled), which would cost every eBPF program on the host, \
stay as they were.

GPU memory is followed at the CUDA driver and runtime allocation functions \
(libcuda, libcudart, also when loaded later with dlopen) in kinds \
gpu-device, gpu-managed and gpu-host-pinned, each counted once although the \
runtime calls the driver. A CUDA context destroyed or reset (cuCtxDestroy_v2, \
cuDevicePrimaryCtxReset_v2, cudaDeviceReset) releases the GPU memory that any \
context of the process owned before it (not stream-ordered or cuMemCreate \
memory); the report says what it released. PyTorch's CUDA caching allocator \
(libc10_cuda) is seen through: each block it hands to a tensor is kind \
gpu-tensor, under the line that made the tensor, a part of the gpu-device \
segments it cudaMallocs (never added to them).

Memory that never passes through malloc is followed at the system calls \
(tracepoints on mmap, munmap, mremap, brk and mprotect, so raw syscalls are \
seen too), in kinds of its own: mmap-anon, mmap-file (with the file's name as \
the innermost frame) and heap-brk. Counted once: a mapping made while the \
thread is inside a traced allocator call (glibc's malloc mapping a large block \
or growing an arena) is the allocator's, counted as heap under the caller of \
malloc, never again as mmap. Reserved address space (PROT_NONE ranges, thread \
stacks made with MAP_STACK) is reported apart as mmap-reserved and never \
ranked: stacks rank by what they made usable. The report sets each target's \
traced live bytes next to its RSS (RssAnon, RssFile) and shows the gap.

A process without malloc or free (a pure Go program, a static binary with \
its own allocator) is traced for its mappings, with a note. Frames in JIT \
code are named from the runtime's /tmp/perf-PID.map when it writes one \
(node --perf-basic-prof, Java's perf-map-agent, python3.12 -X perf).

With `-- COMMAND`, tracer starts the command itself and traces it before the \
dynamic loader runs any library constructor, through exec (a #! script runs \
through its interpreter) and through dlopen. The text report then goes to \
stderr (or --text FILE): the command's stdout is its own. When tracing stops \
(--duration, Ctrl-C, SIGTERM) the command gets SIGINT (Ctrl-C) or SIGTERM and \
tracer waits for it, saying so; --leave-running leaves it running and prints \
its PID.";

pub(super) const EXIT_CODES: &str = "\
Exit codes:
  0  report written
  1  unexpected failure
  2  bad command line
  3  target not found, a kernel thread, a zombie, or exited during attach
  4  not root (tracer needs root, or CAP_BPF and CAP_PERFMON)
  5  kernel without BTF or uprobe support
  6  (no longer used: a target without malloc/free is traced for its mappings)
  7  the command after -- could not be started
  8  an output file cannot be written (missing or read-only directory), or the
     --listen address cannot be bound (port in use, address not on this host)
  9  recording file missing, truncated before its metadata, corrupt, or from a newer tracer";

pub(super) const SAMPLING_HELP: &str = "\
Sample allocations by bytes, like tcmalloc and heapprofd: a block of s bytes \
is recorded with probability p(s) = 1 - exp(-s/N) (a Poisson process with one \
point per N bytes; the decision is made in the entry probe, and with uprobe \
sessions an unrecorded call skips its return probe) and counts for s/p(s) \
bytes, so the live bytes of a stack are estimated without bias: \
L^ = sum over its sampled live blocks of s/p(s). Variance: \
Var(L^) = sum over its live blocks of s^2 (1-p(s))/p(s) <= N * L, so the \
standard deviation is at most sqrt(N * L): with N = 512 KiB, a stack holding \
1 GiB is within +-2.2 % (3 standard deviations). live_allocs then counts \
sampled blocks. Default: every allocation is recorded (exact mode).";

pub(super) const RESIDENT_HELP: &str = "\
Resident-growth mode: instead of trapping every malloc and free, count the \
pages the target makes resident. Each user page fault of the target is \
walked like an allocation (native, unwound and Python frames) and its page \
charged to that stack the first time it is touched, as kind `resident`; \
pages are credited back when they are unmapped, given back with madvise \
(DONTNEED, FREE, REMOVE, PAGEOUT) or cut off by a shrinking break, and move \
with mremap; a write fault a transparent huge page serves charges 2 MiB. \
The CUDA calls stay traced. Faults are far rarer than allocations (a process \
whose memory is flat faults almost never), so this costs a fraction of exact \
mode and can stay attached. What it sees: which code's resident memory keeps \
growing, with the same verdicts, plots, top, metrics and pprof. What it \
misses: memory made resident before attach, growth that reuses freed memory \
without touching a new page, and frees inside the heap that give no page \
back (the page stays charged: it is still resident). The stack is the code \
that first touched the page (often the copy that filled a block, or the \
allocator carving a new chunk under the leaking caller), not always the \
caller of malloc: run exact mode on the flagged stack for the block.";

pub(super) const UNWIND_HELP: &str = "\
How call stacks are walked. Every mode but copy walks them in the kernel at \
each allocation and aggregates them there: nothing per allocation reaches \
tracer. auto (default): objects that keep frame pointers are walked by them, \
the others through unwind tables tracer builds from their .eh_frame (and \
.debug_frame) in the background, per file, shared by every process that maps \
it; until an object's table is ready its frames go by frame pointers \
(counted as unwind_table_pending, and -v says which objects). One walk \
handles stacks that mix both. dwarf: tables for every object that has unwind \
information, frame pointers only for the rest. fp: frame pointers only \
(cheapest; stacks through code built without them lose frames or show wrong \
callers). copy: the earlier path, for comparison: the probe copies the top of \
the user stack (--stack-bytes) into a ring buffer and tracer unwinds each \
copy from .eh_frame (about 4-5 us more than fp per allocation; copies beyond \
the ring fall back to frame pointers, counted as stack_copy_ring_full). Go \
programs that call C (cgo) are copied in auto and dwarf too, counted as \
stack_copies. Where a walk stops early it is counted by reason \
(unwind_stop_*).";

pub(super) const LISTEN_HELP: &str = "\
Serve what tracer sees over HTTP while it traces: /metrics (Prometheus/\
OpenMetrics text: tracer_live_bytes and tracer_live_allocs per process and \
kind, tracer_dropped_total by reason, and for the top --top stacks by live \
bytes plus the suspected leaks tracer_stack_live_bytes, \
tracer_stack_live_allocs, tracer_stack_growth_bytes_per_second and \
tracer_stack_suspected_leak, labelled pid, comm, kind, site and stack (a \
short hash of the frames): --top bounds the label cardinality), \
/debug/pprof/heap (live memory now, a gzipped pprof profile like Go's: \
`go tool pprof http://ADDR/debug/pprof/heap`), /debug/pprof/growth (what \
grew since this client's previous fetch, or over ?seconds=N, N <= 300), \
/holders (record --holders only, on request, one scan every 10 s: the report \
as JSON with each listed stack's reachability, scanned off the collection \
from the next snapshot's live blocks; the target is never stopped) and \
/healthz; at most 16 connections per client address. Values are those of the latest snapshot; exited processes are left out. \
ADDR is PORT (binds 127.0.0.1), IP:PORT or [IPv6]:PORT. WARNING: anyone who \
can reach the address reads the traced processes' function names, source \
files and memory sizes; bind another address than loopback only on a \
trusted network. Read-only; no request touches the file system. Without \
--duration, tracer runs until SIGTERM or Ctrl-C (with --pid, also until \
every target has exited; with --comm, on while none is alive).";

pub(super) const COMM_HELP: &str = "\
Trace every process whose command name (the kernel's comm, \
/proc/PID/comm, at most 15 bytes: longer names are compared on their \
first 15) is NAME: those running at attach, and each one started later \
(a sched_process_exec tracepoint announces it; tracer attaches within \
about 100 ms plus the attach time, and what it allocated before is not \
seen), so a service stays traced across restarts and crashes. Repeat for \
several names; --comm-regex matches a pattern instead. tracer keeps \
running while none is alive; the memory of a process that exited leaves \
the model, the metrics (--listen) and the report. --max-targets bounds \
the processes traced at once.";
