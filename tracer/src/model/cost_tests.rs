//! The cost estimate's rules, on counters made up for each case.
use super::*;

fn traps() -> TrapCosts {
    TrapCosts {
        entry_ns: 400.0,
        return_ns: 600.0,
        single_stepped_ns: 16_000.0,
        how: "test".to_owned(),
    }
}

fn counts(programs: &[(&str, ProgramTrap, u64, u64)], stats: &[(u32, u64)]) -> Counts {
    let mut all = vec![0; stat::COUNT as usize];
    for &(index, count) in stats {
        all[index as usize] = count;
    }
    Counts {
        programs: programs
            .iter()
            .map(|&(name, trap, runs, run_time_ns)| {
                (
                    name.to_owned(),
                    (
                        trap,
                        Runs {
                            runs,
                            timed_runs: runs,
                            timed_ns: run_time_ns,
                        },
                    ),
                )
            })
            .collect(),
        stats: all,
    }
}

fn estimate(counts: &Counts, target_cpu_ns: u64) -> Cost {
    Cost::estimate(&CostInputs {
        counts,
        accounting: &ProgramAccounting::Counted,
        traps: Ok(&traps()),
        sessions: false,
        target_cpu_ns,
        pids: vec![7],
        window_s: 1.0,
    })
}

#[test]
fn added_time_is_traps_plus_programs_over_the_untraced_cpu() {
    // 1000 mallocs (entry + return) and 1000 frees.
    let counts = counts(
        &[
            (
                "malloc_enter",
                ProgramTrap::Entry(Sites::Emulated),
                1000,
                300_000,
            ),
            ("alloc_return", ProgramTrap::Return, 1000, 2_000_000),
            (
                "free_enter",
                ProgramTrap::Entry(Sites::Emulated),
                1000,
                200_000,
            ),
            ("mmap_enter", ProgramTrap::Tracepoint, 50, 5_000),
        ],
        &[(stat::ALLOCS, 1000)],
    );
    let cost = estimate(&counts, 103_900_000);
    assert_eq!(cost.probe_hits, 3000);
    assert_eq!(cost.trap_ns, 2000 * 400 + 1000 * 600);
    assert_eq!(cost.program_ns, Some(2_500_000));
    assert_eq!(cost.added_ns, 3_900_000);
    assert_eq!(cost.tracepoint_ns, Some(5_000));
    assert_eq!(cost.share, Some(0.039));
    assert_eq!(cost.ns_per_hit, 1300.0);
    assert!(!cost.is_high());
    assert_eq!(cost.lower_bound, None);
    // Twenty times the programs' time: over 20 %.
    let mut dear_counts = counts.clone();
    for (_, runs) in dear_counts.programs.values_mut() {
        runs.timed_ns *= 20;
    }
    let dear = estimate(&dear_counts, 160_000_000);
    assert_eq!(dear.added_ns, 51_400_000);
    assert_eq!(dear.share, Some(51_400_000.0 / 108_600_000.0));
    assert!(dear.is_high());
    assert_eq!(cost.lower_bound, None);
}

#[test]
fn a_target_that_used_less_cpu_than_the_estimate_has_no_share() {
    let counts = counts(
        &[(
            "malloc_enter",
            ProgramTrap::Entry(Sites::Emulated),
            10,
            1000,
        )],
        &[],
    );
    assert_eq!(estimate(&counts, 4000).share, None);
    assert_eq!(estimate(&counts, 0).share, None);
    // Less than ten ticks of CPU: no share, and too little to warn.
    let cheap = estimate(&counts, 90_000_000);
    assert_eq!(cheap.share, None);
    assert!(!cheap.is_high(), "{cheap:?}");
    // 200 ms added of 250 ms used: the targets' own work is lost in it.
    let mut dear = counts.clone();
    for (_, runs) in dear.programs.values_mut() {
        runs.timed_ns = 200_000_000;
    }
    let dear = estimate(&dear, 250_000_000);
    assert_eq!(dear.share, None);
    assert!(dear.is_high(), "{dear:?}");
}

#[test]
fn session_runs_split_into_entries_and_the_recorded_calls_returns() {
    // 1000 calls, 10 recorded: 1010 runs of the session program.
    let counts = counts(
        &[(
            "malloc_enter",
            ProgramTrap::Session(Sites::Emulated),
            1010,
            500_000,
        )],
        &[(stat::ALLOCS, 10)],
    );
    let cost = estimate(&counts, 100_000_000);
    assert_eq!(cost.probe_hits, 1010);
    assert_eq!(cost.trap_ns, 1000 * 400 + 10 * 600);
}

#[test]
fn single_stepped_sites_cost_their_own_trap_and_mixed_ones_are_a_lower_bound() {
    let stepped = counts(
        &[(
            "free_enter",
            ProgramTrap::Entry(Sites::SingleStepped),
            10,
            0,
        )],
        &[],
    );
    assert_eq!(estimate(&stepped, 1_000_000_000).trap_ns, 160_000);
    let mixed = counts(
        &[("free_enter", ProgramTrap::Entry(Sites::Mixed), 10, 0)],
        &[],
    );
    let cost = estimate(&mixed, 1_000_000_000);
    assert_eq!(cost.trap_ns, 4000);
    assert!(
        cost.lower_bound
            .is_some_and(|why| why.contains("single-stepped"))
    );
}

#[test]
fn without_program_counts_hits_come_from_the_event_counters() {
    let counts = counts(
        &[],
        &[
            (stat::ALLOCS, 100),
            (stat::NOT_RECORDED, 50),
            (stat::FREES, 120),
        ],
    );
    let cost = |sessions| {
        Cost::estimate(&CostInputs {
            counts: &counts,
            accounting: &ProgramAccounting::Unavailable("EPERM".to_owned()),
            traps: Ok(&traps()),
            sessions,
            target_cpu_ns: 1_000_000_000,
            pids: vec![7],
            window_s: 1.0,
        })
    };
    let uretprobes = cost(false);
    assert_eq!(uretprobes.probe_hits, 270 + 150);
    assert_eq!(uretprobes.program_ns, None);
    assert!(
        uretprobes
            .lower_bound
            .is_some_and(|why| why.contains("EPERM"))
    );
    assert_eq!(cost(true).probe_hits, 270 + 100);
}

#[test]
fn without_trap_costs_only_program_time_counts() {
    let counts = counts(
        &[(
            "malloc_enter",
            ProgramTrap::Entry(Sites::Emulated),
            10,
            1000,
        )],
        &[],
    );
    let cost = Cost::estimate(&CostInputs {
        counts: &counts,
        accounting: &ProgramAccounting::Counted,
        traps: Err("no uprobe_multi links"),
        sessions: false,
        target_cpu_ns: 1_000_000,
        pids: vec![7],
        window_s: 1.0,
    });
    assert_eq!((cost.trap_ns, cost.added_ns), (0, 1000));
    assert!(
        cost.lower_bound
            .is_some_and(|why| why.contains("no uprobe_multi links"))
    );
}

#[test]
fn counts_since_an_earlier_reading_are_per_program_differences() {
    let earlier = counts(
        &[("malloc_enter", ProgramTrap::Entry(Sites::Emulated), 10, 100)],
        &[(stat::ALLOCS, 5)],
    );
    let later = counts(
        &[
            ("malloc_enter", ProgramTrap::Entry(Sites::Mixed), 25, 400),
            ("gpu_return", ProgramTrap::Return, 3, 30),
        ],
        &[(stat::ALLOCS, 9)],
    );
    let delta = later.since(&earlier);
    assert_eq!(
        delta.programs["malloc_enter"],
        (
            ProgramTrap::Entry(Sites::Mixed),
            Runs {
                runs: 15,
                timed_runs: 15,
                timed_ns: 300
            }
        )
    );
    assert_eq!(delta.programs["gpu_return"].1.runs, 3);
    assert_eq!(delta.stat(stat::ALLOCS), 4);
}

#[test]
fn cpu_is_counted_from_each_process_first_reading_and_kept_after_exit() {
    let mut ledger = CpuLedger::default();
    ledger.observe(1, 100);
    let at_attach = ledger.clone();
    ledger.observe(1, 150);
    let mark = ledger.clone();
    ledger.observe(2, 1000);
    ledger.observe(1, 180);
    ledger.observe(2, 1040);
    ledger.observe(3, 7);
    assert_eq!(ledger.used_since(&at_attach), (80 + 40, vec![1, 2]));
    assert_eq!(ledger.used_since(&mark), (30 + 40, vec![1, 2]));
    // Process 1 exited: its last reading stays.
    let at_exit = ledger.clone();
    ledger.observe(2, 1100);
    assert_eq!(ledger.used_since(&at_exit), (60, vec![2]));
}

#[test]
fn a_sampled_run_time_is_scaled_to_every_run() {
    let runs = Runs {
        runs: 1600,
        timed_runs: 100,
        timed_ns: 50_000,
    };
    assert_eq!(runs.run_time_ns(), 800_000);
    // Nothing timed yet: no time rather than a guess.
    let untimed = Runs {
        runs: 3,
        ..Runs::default()
    };
    assert_eq!(untimed.run_time_ns(), 0);
    // Over a window, the timed runs and their time are differences too.
    let earlier = counts(
        &[("free_enter", ProgramTrap::Entry(Sites::Emulated), 0, 0)],
        &[],
    );
    let mut later = earlier.clone();
    later.programs.get_mut("free_enter").expect("free_enter").1 = runs;
    let delta = later.since(&earlier);
    assert_eq!(delta.programs["free_enter"].1.run_time_ns(), 800_000);
}
