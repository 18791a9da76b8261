//! The thread that reads the STACK_COPIES ring buffer: it unwinds each
//! copy as soon as the kernel hands it out and passes small messages (the
//! unwound addresses, frees, restores) to the collector, in the kernel's
//! order. The ring is emptied while the collector symbolizes, snapshots or
//! hooks libraries, so a target's allocations never wait for those (nor
//! fall back to frame pointers because of them).
//!
//! It sleeps in an edge-triggered epoll on the ring: the kernel wakes it
//! once a quarter of the ring is full (records are sent without a wakeup
//! otherwise), and it reads anyway every `READ_EVERY`. A level-triggered
//! poll would return at once whenever a record waits, and spin.
use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError, channel},
    thread::JoinHandle,
    time::Duration,
};

use anyhow::{Context as _, Result};
use aya::maps::{Array, HashMap as KernelHashMap, Map, MapData, RingBuf};
use tracer_ebpf::{CopyRef, StackCopy, StackFree, stack_record};

use crate::unwind::{Unwinder, Unwound};

/// How long the reader sleeps when the kernel does not wake it.
const READ_EVERY: Duration = Duration::from_millis(5);
/// Most records read in one round: more than the largest ring holds (1 GiB
/// of 24-byte free records).
const MAX_RECORDS_PER_ROUND: usize = 1 << 26;
/// How long `CopyReader::flush` waits for the reader.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// What the reader read, in the kernel's order.
pub enum Message {
    /// A `stack_record::COPY` or `MAPPING_COPY`, unwound.
    Copy(StackCopy, Unwound),
    /// A `stack_record::FREE`, `RESTORE` or `EXEC` from the ring.
    Free(StackFree),
    /// A COPY_FREES entry: frees minus restores of one block that found
    /// the ring full, read after every ring record before it.
    Deferred(CopyRef, i64),
    /// Everything the kernel sent before flush request `n` was read.
    Flushed(u64),
}

/// The collector's end of the reader thread.
pub struct CopyReader {
    messages: Receiver<Message>,
    flush_requests: Sender<u64>,
    last_flush: u64,
    /// What the unwinder is to reread or forget at its next round.
    refreshes: Sender<UnwinderRequest>,
    thread: Option<JoinHandle<()>>,
}

/// The ring and the map the thread reads, and its unwinder.
struct Reader {
    records: RingBuf<MapData>,
    deferred: KernelHashMap<MapData, CopyRef, i64>,
    /// COPY_FREES_MADE, and its value when COPY_FREES was last walked.
    deferred_made: Array<MapData, u64>,
    deferred_seen: u64,
    unwinder: Unwinder,
    messages: Sender<Message>,
    flush_requests: Receiver<u64>,
    refreshes: Receiver<UnwinderRequest>,
}

/// A change of the processes the reader's unwinder knows.
enum UnwinderRequest {
    /// Reread the objects the process maps.
    Refresh(u32),
    /// The process is gone (`--comm`).
    Forget(u32),
}

impl CopyReader {
    /// Maps the ring and starts the thread; `copy_frees`: COPY_FREES and
    /// COPY_FREES_MADE.
    pub fn start(ring: Map, copy_frees: [Map; 2]) -> Result<CopyReader> {
        let [copy_frees, made] = copy_frees;
        let records = RingBuf::try_from(ring).context("STACK_COPIES is not a ring buffer")?;
        let deferred =
            KernelHashMap::try_from(copy_frees).context("COPY_FREES is not a hash map")?;
        let deferred_made = Array::try_from(made).context("COPY_FREES_MADE is not an array")?;
        let (message_sender, messages) = channel();
        let (flush_requests, flush_receiver) = channel();
        let (refreshes, refresh_receiver) = channel();
        let reader = Reader {
            records,
            deferred,
            deferred_made,
            deferred_seen: 0,
            unwinder: Unwinder::new(),
            messages: message_sender,
            flush_requests: flush_receiver,
            refreshes: refresh_receiver,
        };
        let thread = std::thread::Builder::new()
            .name("tracer-copies".to_owned())
            .spawn(move || reader.run())
            .context("could not start the stack-copy reader")?;
        Ok(CopyReader {
            messages,
            flush_requests,
            last_flush: 0,
            refreshes,
            thread: Some(thread),
        })
    }

    /// The messages read so far, without waiting.
    pub fn try_next(&self) -> Option<Message> {
        self.messages.try_recv().ok()
    }

    /// Has the unwinder reread the objects `pid` maps before it unwinds
    /// anything read after the next `flush` began.
    pub fn refresh(&self, pid: u32) {
        let _ = self.refreshes.send(UnwinderRequest::Refresh(pid));
    }

    /// Has the unwinder forget a process that exited.
    pub fn forget(&self, pid: u32) {
        let _ = self.refreshes.send(UnwinderRequest::Forget(pid));
    }

    /// Has the reader read everything the kernel sent until now; gives
    /// each message to `apply` (the last is `Flushed`, not given).
    pub fn flush(&mut self, mut apply: impl FnMut(Message)) {
        self.last_flush += 1;
        if self.flush_requests.send(self.last_flush).is_err() {
            return;
        }
        loop {
            match self.messages.recv_timeout(FLUSH_TIMEOUT) {
                Ok(Message::Flushed(n)) if n == self.last_flush => return,
                Ok(Message::Flushed(_)) => {}
                Ok(message) => apply(message),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }
}

impl Drop for CopyReader {
    fn drop(&mut self) {
        // The thread ends at its next wakeup, seeing the requests closed.
        let (closed, _) = channel();
        self.flush_requests = closed;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Reader {
    fn run(mut self) {
        let wakeups = Wakeups::new(self.records.as_fd().as_raw_fd());
        loop {
            wakeups.wait(READ_EVERY);
            // Requests taken before reading: what the kernel sent before
            // they were made is read by this round.
            let mut requested = None;
            loop {
                match self.flush_requests.try_recv() {
                    Ok(n) => requested = Some(n),
                    Err(TryRecvError::Empty) => break,
                    Err(TryRecvError::Disconnected) => return,
                }
            }
            // After the flush requests: a refresh asked before a flush
            // request that was taken is applied before this read.
            while let Ok(request) = self.refreshes.try_recv() {
                match request {
                    UnwinderRequest::Refresh(pid) => self.unwinder.refresh(pid),
                    UnwinderRequest::Forget(pid) => self.unwinder.forget(pid),
                }
            }
            if self.read().is_err() {
                return;
            }
            if let Some(n) = requested
                && self.messages.send(Message::Flushed(n)).is_err()
            {
                return;
            }
        }
    }

    /// Reads every record of the ring, then COPY_FREES; Err when the
    /// collector is gone.
    fn read(&mut self) -> Result<(), ()> {
        // At most a full ring of the smallest records per round, so a
        // target that keeps the ring busy cannot keep the thread from
        // seeing that the collector is gone.
        let mut budget = MAX_RECORDS_PER_ROUND;
        while budget > 0
            && let Some(item) = self.records.next()
        {
            budget -= 1;
            let record = item
                .get(..4)
                .map(|bytes| u32::from_ne_bytes(bytes.try_into().expect("4 bytes")));
            let message = match record {
                Some(stack_record::COPY | stack_record::MAPPING_COPY)
                    if item.len() >= size_of::<StackCopy>() =>
                {
                    // SAFETY: the item starts with a whole StackCopy.
                    let copy: StackCopy = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    let stack = &item[size_of::<StackCopy>()..];
                    let mut unwound = self.unwinder.unwind(&copy, stack);
                    if copy.python_stack != 0 {
                        // Its stored stack, as one more frame, its tag.
                        unwound
                            .addresses
                            .push(crate::runtimes::stored_stack_frame(copy.python_stack));
                    }
                    Message::Copy(copy, unwound)
                }
                Some(stack_record::FREE | stack_record::RESTORE | stack_record::EXEC)
                    if item.len() >= size_of::<StackFree>() =>
                {
                    // SAFETY: the item holds a whole StackFree.
                    let free: StackFree = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    if free.record == stack_record::EXEC {
                        // The copies after it are the new image's.
                        self.unwinder.refresh(free.tgid);
                    }
                    Message::Free(free)
                }
                _ => continue,
            };
            drop(item);
            self.messages.send(message).map_err(drop)?;
        }
        // Read after the ring: an entry made after this read is found at
        // the next round.
        let made = self.deferred_made.get(&0, 0).unwrap_or(0);
        if made == self.deferred_seen {
            return Ok(());
        }
        self.deferred_seen = made;
        let keys: Vec<CopyRef> = self.deferred.keys().filter_map(Result::ok).collect();
        for key in keys {
            // A failed realloc's restore added between the read and the
            // removal would be missed: rare twice over (a full ring, and
            // a realloc failing), and bounded to that block.
            let Ok(change) = self.deferred.get(&key, 0) else {
                continue;
            };
            let _ = self.deferred.remove(&key);
            self.messages
                .send(Message::Deferred(key, change))
                .map_err(drop)?;
        }
        Ok(())
    }
}

/// An edge-triggered epoll instance on the ring's descriptor: ready only
/// when the kernel wakes its readers.
struct Wakeups {
    epoll: Option<std::os::fd::OwnedFd>,
}

impl Wakeups {
    fn new(ring: std::os::fd::RawFd) -> Wakeups {
        use std::os::fd::FromRawFd as _;
        // SAFETY: plain system calls; the new descriptor is owned here.
        let epoll = unsafe {
            let epoll = libc::epoll_create1(libc::EPOLL_CLOEXEC);
            if epoll < 0 {
                return Wakeups { epoll: None };
            }
            let epoll = std::os::fd::OwnedFd::from_raw_fd(epoll);
            let mut event = libc::epoll_event {
                events: (libc::EPOLLIN | libc::EPOLLET) as u32,
                u64: 0,
            };
            if libc::epoll_ctl(epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, ring, &raw mut event) != 0 {
                return Wakeups { epoll: None };
            }
            epoll
        };
        Wakeups { epoll: Some(epoll) }
    }

    /// Sleeps until the kernel wakes the ring's readers or `timeout`
    /// passes (just `timeout` without epoll).
    fn wait(&self, timeout: Duration) {
        let Some(epoll) = &self.epoll else {
            std::thread::sleep(timeout);
            return;
        };
        let mut event = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: one event buffer, valid for the call.
        unsafe {
            libc::epoll_wait(
                epoll.as_raw_fd(),
                &raw mut event,
                1,
                timeout.as_millis() as libc::c_int,
            )
        };
    }
}
