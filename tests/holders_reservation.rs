//! `record --holders` on a target that reserved a terabyte with
//! MAP_NORESERVE and wrote one word of it, with real eBPF: the scan reads
//! only the pages that hold data, so it ends in seconds and reads far less
//! than the reservation, and still finds the pointer in the one page
//! written.

use crate::harness;

use harness::{Fixture, Record, field, stack_int as int};

#[test]
fn a_terabyte_reservation_is_scanned_by_its_written_pages() {
    let mut fixture = Fixture::start("holders", &[]);
    let trace = Record::pid(fixture.pid).args(["--holders"]).attach();
    let cache = fixture.cmd("cache 3");
    let reserved = fixture.cmd("reserve 1024");
    assert_eq!(field(&reserved, "bytes"), 1 << 40, "{reserved}");
    std::thread::sleep(std::time::Duration::from_millis(600));
    let stopped = std::time::Instant::now();
    let traced = trace.stop();
    let seconds = stopped.elapsed().as_secs_f64();
    fixture.cmd("quit");

    let scan = &traced.report.json["holders_scans"][0];
    assert!(scan.is_object(), "{}", traced.report);
    assert!(
        int(scan, "bytes_read") < 1 << 30,
        "read more than a GiB: {scan}"
    );
    assert!(
        int(scan, "bytes_not_resident") >= (1 << 40) - (1 << 20),
        "{scan}"
    );
    assert!(seconds < 30.0, "stopping took {seconds:.1} s: {scan}");
    // Its tracer never grew past 512 MiB (the largest of this test's
    // children: the fixture's is small).
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    assert_eq!(
        unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut usage) },
        0
    );
    assert!(
        usage.ru_maxrss < 512 << 10,
        "max RSS {} KiB",
        usage.ru_maxrss
    );

    // The newest cache entry is held from the reservation's first word
    // (as well as from g_newest); the older ones are lost.
    let stacks = traced.report.heap_stacks_with("cache_put");
    assert_eq!(stacks.len(), 1, "{}", traced.report);
    let reachability = &stacks[0]["reachability"];
    assert_eq!(
        int(reachability, "unreachable_bytes"),
        field(&cache, "lost_bytes"),
        "{reachability}"
    );
}
